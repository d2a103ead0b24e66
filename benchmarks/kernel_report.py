"""A few plain launches of each step kernel at one phase, to run under Nsight Compute for its sections.

Builds one layer of each sweep's shape (Mamba-2: the Nemotron-3-Super layer; GDN: the Qwen3.5-122B layer) at
one batch and launches each step kernel at the chosen phase (non-flush rows spread over the fills a
staggered stream has, or every row flushing), without a CUDA graph, so that ncu sees one kernel per launch
(compile_report.py gives registers and the instruction mix without a GPU):

    ncu --clock-control none -k regex:'(decode|replay)_kernel' --section SpeedOfLight --section Occupancy \\
        --section WarpStateStats python benchmarks/kernel_report.py --batch 256 --launches 1
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = ("decode", "replay-nonflush", "replay-flush", "split-bf16-nonflush")


def _fills(case: str, batch: int, window: int) -> list[int]:
    """Non-flush rows spread over every fill below W - 1, as a staggered stream has them; flush rows at W - 1."""
    if case.endswith("nonflush"):
        return [r % (window - 1) for r in range(batch)]
    return [window - 1] * batch


def run(op: str, case: str, batch: int, launches: int, launch: dict, device: str) -> None:
    import torch

    sweep = __import__("sweep_mamba2" if op == "mamba2" else "sweep_gdn")
    kernel = {"decode": "decode", "split-bf16-nonflush": "split-bf16"}.get(case, "replay")
    stack = sweep.Stack(kernel, batch, 1, launch, device)
    if kernel != "decode":
        fills = torch.tensor(_fills(case, batch, sweep.WINDOW), dtype=torch.int32, device=device)
        stack.start = torch.empty_like(fills)
        stack.start[stack.slots.long()] = fills
    for _ in range(launches):
        stack.rewind()
        stack.step()
    torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("mamba2", "gdn", "both"), default="both")
    parser.add_argument("--case", action="append", choices=CASES, help="case (repeat); default: all")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--launches", type=int, default=2, help="launches per case (default 2)")
    parser.add_argument("--launch", default="", help="launch overrides for every case, key=value,...")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU visible; this script compiles and launches the kernels on one", file=sys.stderr)
        return 2
    launch = {k: int(v) for k, v in (item.split("=") for item in filter(None, args.launch.split(",")))}
    ops = ("mamba2", "gdn") if args.op == "both" else (args.op,)
    for op in ops:
        for case in args.case or CASES:
            run(op, case, args.batch, args.launches, launch, "cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
