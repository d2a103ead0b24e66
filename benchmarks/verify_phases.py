"""Where a speculative step spends its time on a GPU: each of its launches timed alone by the profiler's device
clock (Mamba-2's B·C pass, verify and accept at the Nemotron-3-Super layer shape; GDN's list of the heads that
fold and their folds (FOLD_PASS), key-product pass, weights, verify and accept at the Qwen3.5-122B one), and the whole
step in a CUDA graph, with every row at one fill (a fill of W or more folds), T = 4, an fp32 checkpoint.

    python benchmarks/verify_phases.py --batch 64 --batch 256 [--launch rows=32,...] --out FILE.json
    python benchmarks/verify_phases.py --op gdn --batch 256 [--launch key_pass=1,...] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402
import sweep_gdn  # noqa: E402
import sweep_mamba2  # noqa: E402
from replayssm_cli.measure.timing import graph_samples  # noqa: E402

WINDOW, DRAFT = sweep_mamba2.WINDOW, sweep_mamba2.DRAFT
assert (WINDOW, DRAFT) == (sweep_gdn.WINDOW, sweep_gdn.DRAFT)
# each op's layer shape and the kernels of its speculative step, in launch order
OPS = {
    "mamba2": (sweep_mamba2.SHAPE, ("mamba2_verify_bc_kernel", "mamba2_verify_kernel", "mamba2_accept_kernel")),
    "gdn": (sweep_gdn.SHAPE, ("_verify_list_kernel", "_verify_fold_kernel", "_verify_gram_kernel",
                              "_verify_weights_kernel", "_verify_kernel", "_accept_kernel")),
}
# None: the rows' fills spread over the window and left to advance, as in a served batch
FILLS = (0, 8, 15, WINDOW, WINDOW + DRAFT - 1, None)


def kernel_times(prof, steps: int, names: tuple[str, ...]) -> dict[str, float]:
    """Mean device µs per step of each of the speculative step's kernels `names` in a profiler run of `steps`
    steps."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for event in prof.events():
        name = event.name
        if event.device_type.name == "CUDA" and name in times:
            times[name].append(event.time_range.elapsed_us())
    return {name: sum(v) / steps for name, v in times.items() if v}


def time_fill(m, cache, inp, slots, n, fill: int | None, launch: dict, steps: int, names: tuple[str, ...],
              kw: dict) -> tuple[dict[str, float], float]:
    """Each launch of `steps` speculative steps with every row starting at `fill` (restored before each step), or
    with row r at fill r mod W and the fills left to advance (`fill` None); kw the verify's own arguments. Also the
    mean µs per step of `steps` more captured in a CUDA graph (a fill's restore among them; launched one by one, a
    step this size waits on the host): launches that overlap (FSTREAM) count once there, each in full in the
    first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    start = cache.fill.clone()
    if fill is None:
        spread = torch.arange(slots.shape[0], dtype=start.dtype, device=start.device) % WINDOW
        start[slots.long()] = spread[:, None].expand(-1, start.shape[1])
    else:
        start.fill_(fill)
    kw = dict(kw, slots=slots, check=False)
    cache.fill.copy_(start)
    for _ in range(3):
        if fill is not None:
            cache.fill.copy_(start)
        m.verify(cache, **inp, **launch_kw(m, cache, slots.shape[0], launch), **kw)
        m.accept(cache, n, slots, check=False)
    torch.cuda.synchronize()
    def run_steps():
        for _ in range(steps):
            if fill is not None:
                cache.fill.copy_(start)
            m.verify(cache, **inp, **launch_kw(m, cache, slots.shape[0], launch), **kw)
            m.accept(cache, n, slots, check=False)

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_steps()
        torch.cuda.synchronize()
    # the profiled run above was the eager one
    [us] = graph_samples(run_steps, replays=1, warmup=1, eager=lambda: None)
    return kernel_times(prof, steps, names), us / steps


def launch_kw(m, cache, batch: int, launch: dict) -> dict:
    """The verify's launch configuration: the row it chooses with `launch`'s fields put in."""
    import importlib

    from replayssm_kernels import common as kc

    if m.__name__.endswith("mamba2"):
        mv = importlib.import_module("replayssm_kernels.mamba2.verify")
        return {"config": kc.override(mv.VERIFY_LAUNCH[mv.select(cache, batch)], launch)}
    gv = importlib.import_module("replayssm_kernels.gdn.verify")
    return {"config": kc.override(gv.VERIFY_LAUNCH[gv.select_verify(cache, batch)], launch)}


def check_launch(op: str, launch: dict) -> None:
    """Raise ValueError for verify launch keys or values that op's verify would refuse."""
    if op == "mamba2":
        from replayssm_kernels import common as kc
        from replayssm_kernels.mamba2.verify import VERIFY_LAUNCH

        # the row of an fp32 checkpoint, the one timed here
        kc.override(VERIFY_LAUNCH["verify-fp32"], launch)
    else:
        from replayssm_kernels import common as kc
        from replayssm_kernels.gdn.verify import VERIFY_LAUNCH

        kc.override(VERIFY_LAUNCH["verify"], launch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_phases.py", description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=sorted(OPS), default="mamba2")
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 64 and 256)")
    parser.add_argument("--launch", action="append", default=[],
                        help="verify launch overrides KEY=V,... (repeat to time several)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)

    import torch

    from replayssm_kernels import gdn, mamba2

    try:
        launches = [common.parse_launch(f"verify:{text}")[1] for text in opts.launch] or [{}]
        for launch in launches:
            # the verify's own check of its launch keys and values, as its first call would make it
            check_launch(opts.op, launch)
    except ValueError as exc:
        print(f"verify_phases.py: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("verify_phases.py needs a CUDA GPU", file=sys.stderr)
        return 2
    shape, names = OPS[opts.op]
    rows = []
    for batch in opts.batch or [64, 256]:
        slots = common.row_slots(batch, "cuda")
        n = torch.full((batch,), DRAFT - 1, dtype=torch.int32, device="cuda")
        if opts.op == "mamba2":
            m, kw = mamba2, {"dt_softplus": True}
            H, P, N, G = shape["H"], shape["P"], shape["N"], shape["G"]
            inp = mamba2.random_inputs(batch, H, P, N, G, T=DRAFT, io_dtype=torch.bfloat16, device="cuda")
            cache = mamba2.ReplayCache.create(batch, H, P, N, G, WINDOW, io_dtype="bf16", max_draft=DRAFT,
                                              device="cuda")
            cache.load(torch.randn(batch, H, P, N, device="cuda") * 0.5)
        else:
            m, kw = gdn, {"use_qk_l2norm_in_kernel": True}
            H, HV, K, V = shape["H"], shape["HV"], shape["K"], shape["V"]
            inp = gdn.random_inputs(batch, H, HV, K, V, T=DRAFT, io_dtype=torch.bfloat16, device="cuda")
            cache = gdn.ReplayCache.create(batch, H, HV, K, V, WINDOW, state_dtype="fp32", io_dtype="bf16",
                                           max_draft=DRAFT, device="cuda")
            cache.load(torch.randn(batch, HV, V, K, device="cuda") * 0.05)
        # every buffered entry a real one: fill the buffer through verify and accept once per entry position
        for _ in range(cache.capacity // (DRAFT - 1) + 1):
            m.verify(cache, **inp, **kw, slots=slots)
            m.accept(cache, n, slots)
        for launch in launches:
            for fill in FILLS:
                us, step_us = time_fill(m, cache, inp, slots, n, fill, launch, opts.steps, names, kw)
                folds = fill is not None and fill >= WINDOW
                row = {"batch": batch, "launch": launch, "fill": fill, "folds": folds, "us": us,
                       "total_us": sum(us.values()), "step_us": step_us}
                rows.append(row)
                parts = "  ".join(f"{k.removeprefix('mamba2_').strip('_').removesuffix('_kernel')} {v:8.1f}"
                                  for k, v in us.items())
                label = "mix" if fill is None else fill
                total = row['total_us']
                print(f"batch {batch:4d} fill {label:>3} {launch or 'shipped'}: {parts}  total {total:8.1f} µs"
                      f"  step {step_us:8.1f} µs", flush=True)
        del cache
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    env = common.environment(props, getattr(props, "L2_cache_size", 0))
    with open(opts.out, "w") as fh:
        json.dump({"op": opts.op, "shape": shape, "window": WINDOW, "draft": DRAFT, "environment": env, "rows": rows},
                  fh, indent=1)
    print(f"results: {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
