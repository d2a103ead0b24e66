"""Every shipped launch row of both ops, run through the public API for compute-sanitizer (benchmarks/sanitize.sh).

Each case builds one layer's cache at the Nemotron-3-Super (Mamba-2) or Qwen3.5-122B (GDN) shape, at a batch that
selects its launch row on the GPU in hand (a small, medium or large grid, counted in programs per SM), with a random
slot table and staggered fills (every flush phase within one window), and runs two windows of steps plus one, so
that every row flushes at least twice. Nothing is timed or checked here: the sanitizer reports what it sees, and
`tests/test_gpu_stress.py` compares the states with the references.

    python benchmarks/sanitize.py --list
    python benchmarks/sanitize.py                       # every case, in one process
    python benchmarks/sanitize.py --case mamba2-replay-replay-fp32-split-large --steps 20
    python benchmarks/sanitize.py --case replay-bf16-large --set mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=0

--set puts settings into a launch row before the cases are built, as benchmarks/profile_rows.py does.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profile_rows  # noqa: E402

MAMBA2 = {"H": 128, "P": 64, "N": 128, "G": 8}
GDN = {"H": 16, "HV": 64, "K": 128, "V": 128}
W, T = 16, 4


# The batches tried for a row: the largest that the kernel's `select` answers with the row runs it (the most programs
# at once); a row no batch selects at this shape (decode's and materialize's rows for other N and P) runs at FORCED,
# passed as config.
BATCHES, FORCED = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96), 64


def _modules(op: str):
    import importlib

    names = ("decode", "replay", "verify")
    return [importlib.import_module(f"replayssm_kernels.{op}.{name}") for name in names]


def _entries(op: str) -> list[tuple[str, str, object, str, str | None]]:
    """(entry, row, table, state dtype, read dtype) of every shipped launch row of `op`, from its tables."""
    decode, replay, verify = _modules(op)
    out = []
    if op == "mamba2":
        for row in decode.DECODE_LAUNCH:
            state = "bf16" if "-bf16" in row else "fp32"
            out.append(("decode", row, decode.DECODE_LAUNCH, state, None))
            if not row.endswith("-small"):
                out.append(("snapshots", row, decode.DECODE_LAUNCH, state, None))
        for row in replay.STEP_LAUNCH:
            state = "bf16" if "-bf16" in row else "fp32"
            copies = ["bf16", "fp8"] if state == "fp32" else ["fp8"]
            reads = copies if "-split" in row else [None] + copies if row.endswith("-small") else [None]
            out += [("replay", row, replay.STEP_LAUNCH, state, read) for read in reads]
        for row in replay.MATERIALIZE_LAUNCH:
            out.append(("materialize", row, replay.MATERIALIZE_LAUNCH, "bf16" if "-bf16" in row else "fp32", None))
        for row in verify.VERIFY_LAUNCH:
            out.append(("verify", row, verify.VERIFY_LAUNCH, "bf16" if "-bf16" in row else "fp32", None))
        return out
    for row in decode.DECODE_LAUNCH:
        state = "bf16" if "-bf16" in row else "fp32"
        entry = {"decode-multi": "snapshots", "accept-snapshot": "snapshots"}.get(row, "decode")
        out.append((entry, row, decode.DECODE_LAUNCH, state, None))
    for row in replay.REPLAY_LAUNCH:
        read = "fp8" if "-fp8" in row else "bf16" if "-split" in row else None
        states = ["fp32"] if read else ["fp32", "bf16"]
        out += [("replay", row, replay.REPLAY_LAUNCH, state, read) for state in states]
    for row in verify.VERIFY_LAUNCH:
        read = "fp8" if "-fp8" in row else "bf16" if "-split" in row else None
        out.append(("verify", row, verify.VERIFY_LAUNCH, "fp32", read))
    out.append(("materialize", "-", None, "fp32", None))
    return out


def _chooses(op: str, entry: str, row: str, state: str, read, batch: int) -> bool:
    """Whether the kernel's `select` takes `row` for a `batch`-row call at the layer shape on this GPU."""
    decode, replay, verify = _modules(op)
    if entry in ("decode", "snapshots"):
        dims = (1, MAMBA2["H"], MAMBA2["P"], MAMBA2["N"]) if op == "mamba2" else (1, GDN["HV"], GDN["V"], GDN["K"])
        pool = torch.empty(dims, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[state], device="cuda")
        if entry == "snapshots" and op == "gdn":
            return True
        return decode.select(pool, batch if entry == "decode" else None) == row
    if entry == "materialize":
        return op == "gdn" or replay.select_materialize(_cache(op, 1, state, read, 0)) == row
    cache = _cache(op, 1, state, read, T if entry == "verify" else 0)
    if entry == "verify":
        return (verify.select if op == "mamba2" else verify.select_verify)(cache, batch) == row
    return replay.select(cache, batch) == row


def _cache(op: str, nslots: int, state: str, read, max_draft: int, rounding: str | None = None):
    from replayssm_kernels import gdn, mamba2

    m, dims = (mamba2, tuple(MAMBA2[k] for k in "HPNG")) if op == "mamba2" else (gdn, tuple(GDN[k] for k in
                                                                                          ("H", "HV", "K", "V")))
    return m.ReplayCache.create(nslots, *dims, W, state_dtype=state, read_dtype=read, io_dtype="bf16",
                                max_draft=max_draft, rounding=rounding or "nearest", device="cuda")


# Each replay row that stores a 2-byte checkpoint also runs it rounded stochastically, and an int8 checkpoint so
# (its rows and scales, on the same rows): the stores' random draws and the store counts the launches advance.
STOCHASTIC_STATES = ("bf16", "int8")


def cases() -> list[dict]:
    """Every shipped launch row of both ops, each at the largest batch that selects it (or passed at FORCED); the
    replay rows of a bf16 checkpoint also with bf16 and int8 checkpoints rounded stochastically (names ending -sr)."""
    out = []
    for op in ("mamba2", "gdn"):
        for entry, row, table, state, read in _entries(op):
            variants = [(state, None)]
            if entry == "replay" and state == "bf16" and read is None:
                variants += [(s, "stochastic") for s in STOCHASTIC_STATES]
            for st, rounding in variants:
                batch = max((b for b in BATCHES if _chooses(op, entry, row, st, read, b)), default=None)
                name = f"{op}-{entry}-{row}-{st}" + (f"-{read}" if read else "") + ("-sr" if rounding else "")
                out.append({"name": name, "op": op, "kind": entry, "state": st, "read": read, "rounding": rounding,
                            "batch": batch or FORCED, "config": None if table is None else table[row],
                            "forced": batch is None})
    return out


def _slots(batch: int, nslots: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(nslots, generator=gen)[:batch].to(torch.int32).cuda()


def _stagger(cache, slots: torch.Tensor) -> None:
    """Row r's fill r mod W (its buffer entries are the zeros a new cache holds): rows flush on different steps."""
    fill = cache.fill
    for r, s in enumerate(slots.tolist()):
        fill[s] = r % W


def run(case: dict, steps: int) -> None:
    op, kind, batch, config = case["op"], case["kind"], case["batch"], case["config"]
    gen = torch.Generator().manual_seed(0)
    nslots = batch + 8
    if op == "mamba2":
        from replayssm_kernels import mamba2 as m

        H, P, N, G = (MAMBA2[k] for k in "HPNG")

        def inputs(tokens=None):
            return m.random_inputs(batch, H, P, N, G, T=tokens, device="cuda", generator=gen)

        extra = {"dt_softplus": True}
        state_shape = (nslots, H, P, N)
    else:
        from replayssm_kernels import gdn as m

        H, HV, K, V = (GDN[k] for k in ("H", "HV", "K", "V"))

        def inputs(tokens=None):
            return m.random_inputs(batch, H, HV, K, V, T=tokens, device="cuda", generator=gen)

        extra = {"use_qk_l2norm_in_kernel": True}
        state_shape = (nslots, HV, V, K)
    slots = _slots(batch, nslots, gen)
    if kind in ("decode", "snapshots"):
        state = torch.randn(state_shape, generator=gen).to("cuda", {"fp32": torch.float32,
                                                                    "bf16": torch.bfloat16}[case["state"]])
        multi = config if op == "mamba2" or case["name"].endswith(("decode-multi-fp32", "decode-multi-bf16")) else None
        accept = config if op == "mamba2" or "accept-snapshot" in case["name"] else None
        for _ in range(steps):
            if kind == "decode":
                m.decode(state, **inputs(), **extra, slots=slots, check=False, config=config)
            else:
                snaps = torch.empty((nslots, T, *state_shape[1:]), dtype=state.dtype, device="cuda")
                m.decode_multi(state, snaps, **inputs(T), **extra, slots=slots, check=False, config=multi)
                n = torch.randint(0, T + 1, (batch,), generator=gen).to(torch.int32).cuda()
                m.accept_snapshot(state, snaps, n, slots=slots, check=False, config=accept)
        return
    cache = _cache(op, nslots, case["state"], case["read"], T if kind == "verify" else 0, case["rounding"])
    cache.load(torch.randn(state_shape, generator=gen).cuda())
    _stagger(cache, slots)
    for _ in range(steps):
        if kind == "verify":
            m.verify(cache, **inputs(T), **extra, slots=slots, check=False, config=config)
            n = torch.randint(0, T + 1, (batch,), generator=gen).to(torch.int32).cuda()
            m.accept(cache, n, slots=slots, check=False)
        elif kind == "materialize":
            m.replay(cache, **inputs(), **extra, slots=slots, check=False)
            if op == "mamba2":
                m.materialize(cache, slots, config=config)
            else:
                m.materialize(cache, slots)
        else:
            m.replay(cache, **inputs(), **extra, slots=slots, check=False, config=config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    parser.add_argument("--case", action="append", default=[], help="run only the cases whose name contains this")
    parser.add_argument("--steps", type=int, default=2 * W + 1, help="steps per case (default two windows and one)")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE:TABLE:ROW:key=value,...",
                        help="settings to put in a launch row first (repeatable; see benchmarks/profile_rows.py)")
    opts = parser.parse_args(argv)
    try:
        for text in opts.set:
            print(f"{text.rsplit(':', 1)[0]}: {profile_rows.apply_set(*profile_rows.parse_set(text))}", flush=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: sanitize.py runs the kernels on a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    chosen = [c for c in cases() if not opts.case or any(part in c["name"] for part in opts.case)]
    if opts.list:
        for c in chosen:
            print(f"{c['name']:48s} batch {c['batch']}" + (" (row passed as config)" if c["forced"] else ""))
        return 0
    if not chosen:
        print(f"error: no case matches {opts.case}; see --list", file=sys.stderr)
        return 2
    for c in chosen:
        start = time.time()
        # the case's name on stdout, where the sanitizer prints its reports, so that each report follows its case
        print(f"== case {c['name']} (batch {c['batch']}, {opts.steps} steps"
              + (", row passed as config" if c["forced"] else "") + ")", flush=True)
        run(c, opts.steps)
        torch.cuda.synchronize()
        print(f"== done {c['name']} in {time.time() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
