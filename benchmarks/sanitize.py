"""Every shipped launch row of both ops, run through the public API for compute-sanitizer (benchmarks/sanitize.sh).

Each case builds one layer's cache at the Nemotron-3-Super (Mamba-2) or Qwen3.5-122B (GDN) shape, at a batch that
selects its launch row on the GPU in hand (a small, medium or large grid, counted in programs per SM), with a random
slot table and staggered fills (every flush phase within one window), and runs two windows of steps plus one, so
that every row flushes at least twice. Nothing is timed or checked here: the sanitizer reports what it sees, and
`tests/test_gpu_stress.py` compares the states with the references.

    python benchmarks/sanitize.py --list
    python benchmarks/sanitize.py                       # every case, in one process
    python benchmarks/sanitize.py --case mamba2-split-bf16-large --steps 20
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

MAMBA2 = {"H": 128, "P": 64, "N": 128, "G": 8}
GDN = {"H": 16, "HV": 64, "K": 128, "V": 128}
W, T = 16, 4


def _batches(op: str, kind: str) -> dict[str, int]:
    """A batch per grid class that has rows of its own on this GPU, from the kernels' own grid tests."""
    from replayssm_kernels import common

    sms = common.sm_count(torch.device("cuda"))
    if op == "mamba2":
        heads = MAMBA2["H"]
        if kind == "verify":
            # under 12 (row, head) pairs per SM a verify keeps B·C in its own programs
            return {"few": max(1, 12 * sms // heads - 1), "medium": 64}
        return {"small": 1, "medium": 64, "large": 80 * sms // heads + 8}
    heads = GDN["HV"]
    return {"small": 1, "medium": max(1, 16 * sms // heads - 1), "large": 64}


def cases() -> list[dict]:
    out = []
    for op in ("mamba2", "gdn"):
        for kind, dtypes in (("decode", ("fp32", "bf16")), ("snapshots", ("fp32",)), ("replay", ("fp32", "bf16")),
                             ("split", ("bf16", "fp8")), ("verify", ("fp32", "bf16") if op == "mamba2" else
                                                            ("fp32", "split-bf16", "fp8"))):
            for dtype in dtypes:
                for grid, batch in _batches(op, "verify" if kind == "verify" else kind).items():
                    out.append({"name": f"{op}-{kind}-{dtype}-{grid}", "op": op, "kind": kind, "dtype": dtype,
                                "batch": batch})
        out.append({"name": f"{op}-materialize", "op": op, "kind": "materialize", "dtype": "fp32", "batch": 64})
    return out


def _slots(batch: int, nslots: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(nslots, generator=gen)[:batch].to(torch.int32).cuda()


def _stagger(cache, slots: torch.Tensor) -> None:
    """Row r's fill r mod W (its buffer entries are the zeros a new cache holds): rows flush on different steps."""
    fill = cache.fill
    for r, s in enumerate(slots.tolist()):
        fill[s] = r % W


def run(case: dict, steps: int) -> None:
    op, kind, dtype, batch = case["op"], case["kind"], case["dtype"], case["batch"]
    gen = torch.Generator().manual_seed(0)
    nslots = batch + 8
    if op == "mamba2":
        from replayssm_kernels import mamba2 as m

        H, P, N, G = (MAMBA2[k] for k in "HPNG")

        def inputs(tokens=None):
            return m.random_inputs(batch, H, P, N, G, T=tokens, device="cuda", generator=gen)

        extra = {"dt_softplus": True}
        state_shape = (nslots, H, P, N)
        ref = m
    else:
        from replayssm_kernels import gdn as m

        H, HV, K, V = (GDN[k] for k in ("H", "HV", "K", "V"))

        def inputs(tokens=None):
            return m.random_inputs(batch, H, HV, K, V, T=tokens, device="cuda", generator=gen)

        extra = {"use_qk_l2norm_in_kernel": True}
        state_shape = (nslots, HV, V, K)
        ref = m
    slots = _slots(batch, nslots, gen)
    if kind in ("decode", "snapshots"):
        state = torch.randn(state_shape, generator=gen).to("cuda", {"fp32": torch.float32,
                                                                    "bf16": torch.bfloat16}[dtype])
        for _ in range(steps):
            if kind == "decode":
                ref.decode(state, **inputs(), **extra, slots=slots, check=False)
            else:
                snaps = torch.empty((nslots, T, *state_shape[1:]), dtype=state.dtype, device="cuda")
                ref.decode_multi(state, snaps, **inputs(T), **extra, slots=slots, check=False)
                n = torch.randint(0, T + 1, (batch,), generator=gen).to(torch.int32).cuda()
                ref.accept_snapshot(state, snaps, n, slots=slots, check=False)
        return
    state_dtype, read = {"fp32": ("fp32", None), "bf16": ("bf16", None), "fp8": ("fp32", "fp8"),
                         "split-bf16": ("fp32", "bf16")}[dtype]
    if kind == "split":
        state_dtype, read = "fp32", dtype
    dims = (nslots, *(MAMBA2[k] for k in "HPNG")) if op == "mamba2" else (nslots, *(GDN[k] for k in
                                                                                    ("H", "HV", "K", "V")))
    cache = m.ReplayCache.create(*dims, W, state_dtype=state_dtype, read_dtype=read, io_dtype="bf16",
                                 max_draft=T if kind == "verify" else 0, device="cuda")
    cache.load(torch.randn(state_shape, generator=gen).cuda())
    _stagger(cache, slots)
    for _ in range(steps):
        if kind == "verify":
            m.verify(cache, **inputs(T), **extra, slots=slots, check=False)
            n = torch.randint(0, T + 1, (batch,), generator=gen).to(torch.int32).cuda()
            m.accept(cache, n, slots=slots, check=False)
        elif kind == "materialize":
            m.replay(cache, **inputs(), **extra, slots=slots, check=False)
            m.materialize(cache, slots)
        else:
            m.replay(cache, **inputs(), **extra, slots=slots, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--case", action="append", default=[], help="run only the cases whose name contains this")
    parser.add_argument("--steps", type=int, default=2 * W + 1, help="steps per case (default two windows and one)")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: sanitize.py runs the kernels on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    chosen = [c for c in cases() if not opts.case or any(part in c["name"] for part in opts.case)]
    if opts.list:
        for c in chosen:
            print(f"{c['name']:40s} batch {c['batch']}")
        return 0
    if not chosen:
        print(f"error: no case matches {opts.case}; see --list", file=sys.stderr)
        return 2
    for c in chosen:
        start = time.time()
        # the case's name on stdout, where the sanitizer prints its reports, so that each report follows its case
        print(f"== case {c['name']} (batch {c['batch']}, {opts.steps} steps)", flush=True)
        run(c, opts.steps)
        torch.cuda.synchronize()
        print(f"== done {c['name']} in {time.time() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
