"""The harness shared by the launch-setting sweeps: plan, fill model, CUDA-graph timing, table, JSON, command line."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

from replayssm_cli.model import cost
from replayssm_cli.model.dtypes import itemsize

BATCHES = (1, 16, 64, 256)
QUICK_BATCHES = (1, 256)
# The dtype of every kernel's inputs and outputs.
IO_DTYPE = "bf16"
L2_BYTES = 60 * 2**20
L2_MULTIPLE = 4
MAX_LAYERS = 128
# A "-nonflush" kernel times steps 0..W-2 of every row's window, a "-flush" one the step that fills it.
KERNELS = ("decode", "replay", "replay-nonflush", "replay-flush", "split-bf16", "split-bf16-nonflush",
           "split-bf16-flush", "split-fp8", "decode-multi", "verify")
BASELINE = {"replay": "decode", "replay-nonflush": "decode", "replay-flush": "decode", "split-bf16": "decode",
            "split-bf16-nonflush": "decode", "split-bf16-flush": "decode", "split-fp8": "decode",
            "verify": "decode-multi", "fla": "decode", "fla-inplace": "decode", "decode-direct": "decode"}
# The kernel of ours whose bytes an outside kernel (fla's decode) or a variant of ours moves: a conventional step's.
COST_KERNEL = {"fla": "decode", "fla-inplace": "decode", "decode-direct": "decode"}


@dataclass
class Result:
    kernel: str
    batch: int
    launch: dict
    layers: int
    steps: int
    bytes_per_layer_step: float
    check_ok: bool
    check_error: float | None = None
    us_per_layer_step: float | None = None
    gbps: float | None = None
    ratio: float | None = None
    samples_us: list = field(default_factory=list)


# The values a launch field takes besides integers: a register cap of none, a flush's product precision.
WORDS = {"none": None, "ieee": "ieee", "tf32x3": "tf32x3", "tf32": "tf32"}


def parse_launch(text: str, kernels: tuple = KERNELS) -> tuple[str, dict]:
    """'KERNEL:field=value,...' -> (KERNEL, {field: value, ...}), each value an integer or one of WORDS."""
    kernel, sep, body = text.partition(":")
    if not sep or kernel not in kernels:
        raise ValueError(f"--launch {text!r}: expected KERNEL:field=value,... with KERNEL one of {', '.join(kernels)}")
    settings = {}
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        value = value.strip()
        if not eq or not (value.isdigit() or value in WORDS):
            raise ValueError(f"--launch {text!r}: {item!r} is not field=integer (or {', '.join(WORDS)})")
        settings[key.strip()] = int(value) if value.isdigit() else WORDS[value]
    return kernel, settings


def plan(kernels: list[str], grid: dict[str, list[dict]], overrides: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """The launch settings to time per kernel: those given on the command line, else `grid`'s."""
    given: dict[str, list[dict]] = {}
    for kernel, settings in overrides:
        given.setdefault(kernel, []).append(settings)
    return {k: given.get(k, grid[k]) for k in kernels}


def fill_trajectory(kernel: str, start: int, steps: int, window: int, accepted: int) -> list[int]:
    """The fill a row has at the start of each of `steps` steps."""
    fills, f = [], start
    for _ in range(steps):
        fills.append(f)
        if kernel == "verify":
            f = (0 if f >= window else f) + accepted
        elif kernel.startswith(("replay", "split-")):
            f = 0 if f + 1 >= window else f + 1
    return fills


def start_fills(kernel: str, batch: int, window: int) -> list[int]:
    if kernel.endswith("-nonflush"):
        return [0] * batch
    if kernel.endswith("-flush"):
        return [window - 1] * batch
    return [r % window for r in range(batch)]


def graph_steps(kernel: str, window: int) -> int:
    if kernel.endswith("-nonflush"):
        return window - 1
    return 1 if kernel.endswith("-flush") else window


# The state dtype of every stack and check in this process (--state-dtype).
STATE = {"dtype": "fp32", "slots": "random"}


def row_slots(batch: int, device: str):
    """The state slot of each row: a random permutation of the batch, or row i in slot i (--slots)."""
    import torch

    if STATE["slots"] == "identity":
        return torch.arange(batch, device=device, dtype=torch.int32)
    return torch.randperm(batch, device=device).to(torch.int32)


def state_torch_dtype():
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[STATE["dtype"]]


def read_dtype(kernel: str) -> str | None:
    """The read copy's dtype of a split-precision kernel ("split-bf16-flush" -> "bf16"), None for the others."""
    return kernel.split("-")[1] if kernel.startswith("split-") else None


def bytes_per_layer_step(kernel: str, batch: int, shape, window: int, draft: int, accepted: int) -> float:
    """Mean bytes per layer-step over the graph's steps, rows at their starting fills (staggered by default), each
    step's as the cost model counts it (`cost.kernel_step_bytes` of `shape`, a Mamba2Shape or GDNShape, at every row's
    fill); ValueError where the cost model refuses the kernel at this state (or buffer) dtype."""
    steps = graph_steps(kernel, window)
    rows = [fill_trajectory(kernel, start, steps, window, accepted) for start in start_fills(kernel, batch, window)]
    total = sum(cost.kernel_step_bytes(shape, COST_KERNEL.get(kernel, kernel), [fills[i] for fills in rows],
                                       state_dtype=STATE["dtype"], io_dtype=IO_DTYPE, window=window, draft=draft,
                                       accepted=accepted, buffer_dtype=STATE.get("buffer"))
                for i in range(steps))
    return total / steps


def layer_count(kernel: str, batch: int, l2_bytes: int, state_elements: int) -> int:
    """Enough layers, each with its own state pool, that the pools together hold over 4x the L2."""
    pool = batch * state_elements * itemsize(STATE["dtype"])
    return max(1, min(MAX_LAYERS, L2_MULTIPLE * l2_bytes // pool + 1))


CHECK_ROWS = 8


def check_rows(batch: int) -> list[int]:
    """The slots of a check's rows for a timed batch: as many rows as the batch, up to CHECK_ROWS, so that a grid
    small at the timed batch is small in the check and a large one large (the kernels pick their launch rows by
    grid size); from 3 rows on, row 1 is padding (-1) and the rest are out of order."""
    n = min(batch, CHECK_ROWS)
    if n < 3:
        return list(range(n))[::-1]
    return [2, -1, 0] + list(range(3, n))


def time_config(op, kernel: str, batch: int, launch: dict, device: str, l2_bytes: int, replays: int,
                checked: dict | None) -> Result:
    """Check the config against the reference on rows that take the timed batch's launch row (`check_rows`; once
    per kernel, settings and row count when `checked` is a dict, else every time), then time a graph of its steps.
    `op` is the sweep script's module (see `main`)."""
    import torch

    layers = op.layer_count(kernel, batch, l2_bytes)
    steps = op.graph_steps(kernel)
    result = Result(kernel, batch, launch, layers, steps, op.bytes_per_layer_step(kernel, batch), check_ok=False)
    rows = check_rows(batch)
    if checked is None:
        result.check_error = op.check_config(kernel, launch, device, rows)
    else:
        key = (kernel, tuple(sorted(launch.items())), len(rows))
        if key not in checked:
            checked[key] = op.check_config(kernel, launch, device, rows)
        result.check_error = checked[key]
    # bf16 inputs and outputs: a few bf16 units of roundoff is agreement, anything larger is a wrong kernel.
    result.check_ok = result.check_error < 2e-2
    if not result.check_ok:
        return result
    stack = op.Stack(kernel, batch, layers, launch, device)
    stack.rewind()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(steps):
            stack.step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    stack.rewind()
    with torch.cuda.graph(graph):
        for _ in range(steps):
            stack.step()
    samples = []
    for i in range(replays + 2):
        stack.rewind()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        if i >= 2:
            samples.append(start.elapsed_time(end) * 1e3 / (steps * layers))
    del graph, stack
    torch.cuda.empty_cache()
    result.samples_us = samples
    result.us_per_layer_step = statistics.median(samples)
    result.gbps = result.bytes_per_layer_step / result.us_per_layer_step / 1e3
    return result


def add_ratios(results: list[Result]) -> None:
    """Each kernel's best time over its baseline's best time at the same batch (baseline / kernel)."""
    best: dict[tuple[str, int], float] = {}
    for r in results:
        if r.us_per_layer_step is not None:
            key = (r.kernel, r.batch)
            best[key] = min(best.get(key, math.inf), r.us_per_layer_step)
    for r in results:
        base = best.get((BASELINE.get(r.kernel, r.kernel), r.batch))
        if r.us_per_layer_step is not None and base is not None:
            r.ratio = base / r.us_per_layer_step


def print_table(results: list[Result], out, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("kernel", "batch", "launch", "layers", "µs/layer-step", "GB/s", "ratio", "check"):
        table.add_column(col, justify="left" if col in ("kernel", "launch") else "right")
    for r in results:
        launch = ",".join(f"{k}={v}" for k, v in r.launch.items())
        timed = r.us_per_layer_step is not None
        table.add_row(r.kernel, str(r.batch), launch, str(r.layers),
                      f"{r.us_per_layer_step:.2f}" if timed else "-", f"{r.gbps:.0f}" if timed else "-",
                      f"{r.ratio:.2f}x" if r.ratio is not None else "-",
                      "ok" if r.check_ok else f"FAILED ({r.check_error:.2g})")
    Console(file=out, width=160).print(table)


def build_parser(prog: str, description: str, epilog: str, extra: tuple = ()) -> argparse.ArgumentParser:
    """The sweeps' command line; `extra` kernels (outside ones) are timed only when named."""
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    parser.add_argument("--kernel", action="append", choices=KERNELS + extra,
                        help=f"kernels to time (default: {', '.join(KERNELS)})")
    parser.add_argument("--batch", action="append", type=int, help=f"batch sizes (default: {BATCHES})")
    parser.add_argument("--launch", action="append", default=[], metavar="KERNEL:key=value,...",
                        help="launch settings to time instead of the built-in grid (repeatable)")
    parser.add_argument("--quick", action="store_true", help="a smaller grid: batches 1 and 256, 1-2 settings each")
    parser.add_argument("--state-dtype", choices=("fp32", "bf16", "fp16"), default="fp32",
                        help="state (checkpoint) dtype of every kernel (default fp32)")
    parser.add_argument("--slots", choices=("random", "identity"), default="random",
                        help="rows' state slots: a random permutation, as a server's would be, or row i in slot i")
    parser.add_argument("--replays", type=int, default=7, help="timed graph replays per config (median reported)")
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--dry-run", action="store_true", help="print the plan without touching a GPU")
    return parser


def environment(props, l2_bytes: int) -> dict:
    """What a results file records of the machine: the GPU (its UUID: H200s differ from one another by a few
    percent, benchmarks/notes/run-55.md, so runs compare on one GPU), torch and triton."""
    import torch
    import triton

    uuid = getattr(props, "uuid", None)
    return {"gpu": props.name, "uuid": f"GPU-{uuid}" if uuid is not None else None, "torch": torch.__version__,
            "triton": triton.__version__, "l2_bytes": l2_bytes}


def main(op, argv: list[str] | None, reuse_checks: bool) -> int:
    """Run a sweep script's command line.

    `op` is the script's module: its build_parser, GRID, QUICK_GRID, SHAPE, WINDOW, DRAFT, ACCEPTED, layer_count,
    graph_steps, bytes_per_layer_step, check_config, Stack and print_table. With `reuse_checks`, each kernel and
    launch settings are checked against the reference once, not once per batch.
    """
    parser = op.build_parser()
    name = parser.prog.removesuffix(".py")
    args = parser.parse_args(argv)
    try:
        overrides = [parse_launch(text, KERNELS + getattr(op, "EXTRA_KERNELS", ())) for text in args.launch]
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    STATE["dtype"] = args.state_dtype
    STATE["slots"] = args.slots
    STATE["buffer"] = getattr(args, "buffer_dtype", None)
    if STATE["buffer"] not in (None, "fp32", args.state_dtype):
        print(f"{name}: --buffer-dtype must be fp32 or the state dtype ({args.state_dtype}); got {STATE['buffer']}",
              file=sys.stderr)
        return 2
    kernels = args.kernel or list(KERNELS)
    for kernel in list(kernels):
        reason = getattr(op, "unavailable", lambda k: None)(kernel)
        if reason:
            print(f"{name}: skipping {reason}", file=sys.stderr)
            kernels.remove(kernel)
            continue
        try:
            op.bytes_per_layer_step(kernel, 1)
        except ValueError as exc:
            print(f"{name}: skipping {kernel} at a {args.state_dtype} state: {exc}", file=sys.stderr)
            kernels.remove(kernel)
    batches = args.batch or list(QUICK_BATCHES if args.quick else BATCHES)
    if any(b < 1 for b in batches):
        print(f"{name}: --batch must be at least 1", file=sys.stderr)
        return 2
    grid = plan(kernels, op.QUICK_GRID if args.quick else op.GRID, overrides)
    if args.dry_run:
        for kernel in kernels:
            for batch in batches:
                print(f"{kernel:16s} batch {batch:4d}  layers {op.layer_count(kernel, batch, L2_BYTES):4d}  "
                      f"{op.bytes_per_layer_step(kernel, batch) / 2**20:9.2f} MiB/layer-step  "
                      f"{len(grid[kernel])} launch settings")
        return 0

    import torch

    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU and found none; nothing measured (--dry-run shows the plan)",
              file=sys.stderr)
        return 2
    from rich.progress import Progress

    device = "cuda"
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or L2_BYTES
    results = []
    checked = {} if reuse_checks else None
    started = time.time()
    jobs = [(k, b, s) for k in kernels for b in batches for s in grid[k]]
    stopped = None  # a fault (a CUDA error leaves the context unusable) or an interrupt ends the sweep there
    with Progress(transient=True) as progress:
        task = progress.add_task("sweeping", total=len(jobs))
        for index, (kernel, batch, settings) in enumerate(jobs):
            progress.update(task, description=f"{kernel} b{batch} {settings}")
            try:
                results.append(time_config(op, kernel, batch, settings, device, l2, args.replays, checked))
            except ValueError as exc:
                print(f"{name}: {kernel} batch {batch} {settings}: {exc}", file=sys.stderr)
            except (Exception, KeyboardInterrupt) as exc:
                why = str(exc).splitlines()[0] if str(exc) else ""
                stopped = (f"{kernel} batch {batch} {settings}: {type(exc).__name__}: {why}; "
                           f"{len(jobs) - index - 1} configs after it not run")
                break
            progress.advance(task)
    add_ratios(results)
    op.print_table(results, sys.stdout)
    print(f"{len(results)} configs in {time.time() - started:.0f} s", file=sys.stderr)
    if stopped:
        print(f"{name}: stopped at {stopped}", file=sys.stderr)
    if args.out:
        payload = {"shape": op.SHAPE, "window": op.WINDOW, "draft": op.DRAFT, "accepted": op.ACCEPTED,
                   "environment": environment(props, l2), "results": [asdict(r) for r in results],
                   "stopped_at": stopped}
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)
    return 1 if stopped else 0
