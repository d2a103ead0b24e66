"""Where Mamba-2's speculative step spends its time on a GPU: each of its launches (the B·C pass, the verify, the
accept) timed alone by the profiler's device clock, with every row at one fill (a fill of W or more folds), at the
Nemotron-3-Super layer shape, T = 4, an fp32 checkpoint.

    python benchmarks/verify_phases.py --batch 64 --batch 256 [--launch BPF=32,...] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402
from sweep_mamba2 import DRAFT, SHAPE, WINDOW  # noqa: E402

KERNEL_NAMES = ("mamba2_verify_bc_kernel", "mamba2_verify_kernel", "mamba2_accept_kernel")
# None: the rows' fills spread over the window and left to advance, as in a served batch
FILLS = (0, 8, 15, WINDOW, WINDOW + DRAFT - 1, None)


def kernel_times(prof, steps: int) -> dict[str, float]:
    """Mean device µs per step of each of the speculative step's kernels in a profiler run of `steps` steps."""
    times: dict[str, list[float]] = {name: [] for name in KERNEL_NAMES}
    for event in prof.events():
        name = event.name
        if event.device_type.name == "CUDA" and name in times:
            times[name].append(event.time_range.elapsed_us())
    return {name: sum(v) / steps for name, v in times.items() if v}


def time_fill(m, cache, inp, slots, n, fill: int | None, launch: dict, steps: int) -> dict[str, float]:
    """Each launch of `steps` speculative steps with every row starting at `fill` (restored before each step), or
    with row r at fill r mod W and the fills left to advance (`fill` None)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    start = cache.fill.clone()
    if fill is None:
        spread = torch.arange(slots.shape[0], dtype=start.dtype, device=start.device) % WINDOW
        start[slots.long()] = spread[:, None].expand(-1, start.shape[1])
    else:
        start.fill_(fill)
    kw = dict(dt_softplus=True, slots=slots, check=False)
    cache.fill.copy_(start)
    for _ in range(3):
        if fill is not None:
            cache.fill.copy_(start)
        m.verify(cache, **inp, launch=launch, **kw)
        m.accept(cache, n, slots, check=False)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            if fill is not None:
                cache.fill.copy_(start)
            m.verify(cache, **inp, launch=launch, **kw)
            m.accept(cache, n, slots, check=False)
        torch.cuda.synchronize()
    return kernel_times(prof, steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="verify_phases.py", description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 64 and 256)")
    parser.add_argument("--launch", action="append", default=[],
                        help="verify launch overrides KEY=V,... (repeat to time several)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", required=True)
    opts = parser.parse_args(argv)

    import torch

    from replayssm_kernels import mamba2
    from replayssm_kernels.mamba2.args import pick_launch
    from replayssm_kernels.mamba2.verify import VERIFY_KEYS, VERIFY_LAUNCH

    try:
        launches = [common.parse_launch(f"verify:{text}")[1] for text in opts.launch] or [{}]
        for launch in launches:
            # the verify's own check of its launch keys and values, as its first call would make it
            pick_launch(VERIFY_LAUNCH, 4, SHAPE["P"], SHAPE["N"], launch, VERIFY_KEYS)
    except ValueError as exc:
        print(f"verify_phases.py: {exc}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("verify_phases.py needs a CUDA GPU", file=sys.stderr)
        return 2
    H, P, N, G = SHAPE["H"], SHAPE["P"], SHAPE["N"], SHAPE["G"]
    rows = []
    for batch in opts.batch or [64, 256]:
        inp = mamba2.random_inputs(batch, H, P, N, G, T=DRAFT, io_dtype=torch.bfloat16, device="cuda")
        slots = common.row_slots(batch, "cuda")
        n = torch.full((batch,), DRAFT - 1, dtype=torch.int32, device="cuda")
        cache = mamba2.ReplayCache.create(batch, H, P, N, G, WINDOW, io_dtype="bf16", max_draft=DRAFT, device="cuda")
        cache.load(torch.randn(batch, H, P, N, device="cuda") * 0.5)
        # every buffered entry a real one: fill the buffer through verify and accept once per entry position
        for _ in range(cache.capacity // (DRAFT - 1) + 1):
            mamba2.verify(cache, **inp, dt_softplus=True, slots=slots)
            mamba2.accept(cache, n, slots)
        for launch in launches:
            for fill in FILLS:
                us = time_fill(mamba2, cache, inp, slots, n, fill, launch, opts.steps)
                folds = fill is not None and fill >= WINDOW
                row = {"batch": batch, "launch": launch, "fill": fill, "folds": folds, "us": us,
                       "total_us": sum(us.values())}
                rows.append(row)
                parts = "  ".join(f"{k.removeprefix('mamba2_').removesuffix('_kernel')} {v:8.1f}"
                                  for k, v in us.items())
                label = "mix" if fill is None else fill
                total = row['total_us']
                print(f"batch {batch:4d} fill {label:>3} {launch or 'shipped'}: {parts}  total {total:8.1f} µs",
                      flush=True)
        del cache
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    env = common.environment(props, getattr(props, "L2_cache_size", 0))
    with open(opts.out, "w") as fh:
        json.dump({"shape": SHAPE, "window": WINDOW, "draft": DRAFT, "environment": env, "rows": rows}, fh, indent=1)
    print(f"results: {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
