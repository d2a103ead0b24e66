"""Sweep the Gated DeltaNet kernels' launch settings on a GPU at the Qwen3.5-122B layer shape: time, GB/s, ratio."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

SHAPE = {"H": 16, "HV": 64, "K": 128, "V": 128}
BATCHES = (1, 16, 64, 256)
QUICK_BATCHES = (1, 256)
WINDOW = 16
DRAFT = 4
ACCEPTED = 3
IO_BYTES = 2
L2_BYTES = 60 * 2**20
L2_MULTIPLE = 4
MAX_LAYERS = 128
KERNELS = ("decode", "replay", "replay-nonflush", "replay-flush", "split-bf16", "decode-multi", "verify")
BASELINE = {"replay": "decode", "replay-nonflush": "decode", "replay-flush": "decode", "split-bf16": "decode",
            "verify": "decode-multi"}
GRID = {
    "decode": [{"BV": 8, "num_warps": 2}, {"BV": 16, "num_warps": 4}, {"BV": 32, "num_warps": 4},
               {"BV": 32, "num_warps": 8}, {"BV": 64, "num_warps": 8}],
    "replay": [{"BV": bv, "num_warps": nw} for bv in (128, 64) for nw in (2, 4, 8)]
    + [{"BV": 128, "BVF": 16, "num_warps": 4}, {"BV": 128, "BVF": 64, "num_warps": 4}],
    "split-bf16": [{"BV": bv, "num_warps": nw} for bv in (128, 64) for nw in (2, 4, 8)]
    + [{"BV": 128, "BVF": 16, "num_warps": 4}],
    "decode-multi": [{"BV": 16, "num_warps": 4}, {"BV": 32, "num_warps": 4}, {"BV": 32, "num_warps": 8}],
    "verify": [{"BV": 32, "num_warps": 4}, {"BV": 16, "num_warps": 4}, {"BV": 32, "num_warps": 8},
               {"BV": 64, "num_warps": 8}],
}
GRID["replay-nonflush"] = GRID["replay-flush"] = GRID["replay"]
QUICK_GRID = {
    "decode": [{"BV": 16, "num_warps": 4}, {"BV": 32, "num_warps": 4}],
    "replay": [{"BV": 128, "num_warps": 4}, {"BV": 64, "num_warps": 2}],
    "split-bf16": [{"BV": 128, "num_warps": 4}],
    "decode-multi": [{"BV": 32, "num_warps": 4}],
    "verify": [{"BV": 32, "num_warps": 4}],
}
QUICK_GRID["replay-nonflush"] = QUICK_GRID["replay-flush"] = QUICK_GRID["replay"]


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


def parse_launch(text: str) -> tuple[str, dict]:
    """'replay:BV=64,num_warps=8' -> ('replay', {'BV': 64, 'num_warps': 8})."""
    kernel, sep, body = text.partition(":")
    if not sep or kernel not in KERNELS:
        raise ValueError(f"--launch {text!r}: expected KERNEL:key=value,... with KERNEL one of {', '.join(KERNELS)}")
    settings = {}
    for item in filter(None, body.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not value.strip().isdigit():
            raise ValueError(f"--launch {text!r}: {item!r} is not key=integer")
        settings[key.strip()] = int(value)
    return kernel, settings


def plan(kernels: list[str], quick: bool, overrides: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """The launch settings to time per kernel: those given on the command line, else the built-in grid."""
    given: dict[str, list[dict]] = {}
    for kernel, settings in overrides:
        given.setdefault(kernel, []).append(settings)
    grid = QUICK_GRID if quick else GRID
    return {k: given.get(k, grid[k]) for k in kernels}


def _row_bytes(kernel: str, fill: int, state_size: int, read_size: int | None) -> float:
    """DRAM bytes one row moves in one step at this fill: state tiles, buffer entries, counters, inputs, outputs.

    Keys are read by every value head of a key head but counted once; a buffered entry is u (HV·V),
    k (H·K), G and, under split precision, beta (HV) in fp32.
    """
    H, HV, K, V = SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"]
    S = HV * V * K
    inputs = 2 * H * K * IO_BYTES + HV * V * IO_BYTES + HV * 4 + HV * IO_BYTES
    output = HV * V * IO_BYTES
    entry = 4 * (HV * V + H * K + HV + (HV if read_size else 0))
    counters = 2 * HV * 4
    if kernel == "decode":
        return 2 * S * state_size + inputs + output
    if kernel == "decode-multi":
        return S * state_size + DRAFT * (S * state_size + inputs + output)
    tile = S * (read_size or state_size)
    # A flush reads the full checkpoint (and, under split precision, the copy to correct the buffered
    # updates) and writes both.
    fold = S * state_size + (S * read_size if read_size else 0) + S * state_size + (S * read_size if read_size else 0)
    if kernel == "verify":
        folding = fill >= WINDOW
        total = (fold + fill * entry) if folding else (tile + fill * entry)
        total += DRAFT * (inputs + output + entry) + counters + 2 * H * 4
        return total + counters
    if fill + 1 < WINDOW:
        return tile + fill * entry + entry + counters + inputs + output
    return fill * entry + fold + counters + inputs + output


def fill_trajectory(kernel: str, start: int, steps: int) -> list[int]:
    """The fill a row has at the start of each of `steps` steps."""
    fills, f = [], start
    for _ in range(steps):
        fills.append(f)
        if kernel == "verify":
            f = (0 if f >= WINDOW else f) + ACCEPTED
        elif kernel in ("replay", "split-bf16", "replay-nonflush", "replay-flush"):
            f = 0 if f + 1 >= WINDOW else f + 1
    return fills


def start_fills(kernel: str, batch: int) -> list[int]:
    if kernel == "replay-nonflush":
        return [0] * batch
    if kernel == "replay-flush":
        return [WINDOW - 1] * batch
    return [r % WINDOW for r in range(batch)]


def graph_steps(kernel: str) -> int:
    return {"replay-nonflush": WINDOW - 1, "replay-flush": 1}.get(kernel, WINDOW)


def sizes(kernel: str, state: str = "fp32") -> tuple[int, int | None]:
    state_size = {"fp32": 4, "bf16": 2, "fp16": 2}[state]
    return state_size, (2 if kernel == "split-bf16" else None)


def bytes_per_layer_step(kernel: str, batch: int) -> float:
    """Mean bytes per layer-step over the graph's steps, rows at their starting fills (staggered by default)."""
    state_size, read_size = sizes(kernel)
    steps = graph_steps(kernel)
    total = 0.0
    for start in start_fills(kernel, batch):
        total += sum(_row_bytes(kernel, f, state_size, read_size) for f in fill_trajectory(kernel, start, steps))
    return total / steps


def layer_count(kernel: str, batch: int, l2_bytes: int) -> int:
    """Enough layers, each with its own state pool, that the pools together hold over 4x the L2."""
    pool = batch * SHAPE["HV"] * SHAPE["V"] * SHAPE["K"] * sizes(kernel)[0]
    return max(1, min(MAX_LAYERS, L2_MULTIPLE * l2_bytes // pool + 1))


def _cache(gdn, kernel: str, batch: int, device: str):
    H, HV, K, V = SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"]
    return gdn.ReplayCache.create(batch, H, HV, K, V, WINDOW, state_dtype="fp32",
                                  read_dtype="bf16" if kernel == "split-bf16" else None, io_dtype="bf16",
                                  max_draft=DRAFT if kernel == "verify" else 0, device=device)


class Stack:
    """L layers of one kernel at one batch: their state pools or caches, shared inputs, and one step."""

    def __init__(self, kernel: str, batch: int, layers: int, launch: dict, device: str):
        import torch

        from replayssm_kernels import gdn

        self.m, self.torch = gdn, torch
        self.kernel, self.batch, self.launch = kernel, batch, launch
        H, HV, K, V = SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"]
        T = DRAFT if kernel in ("decode-multi", "verify") else None
        self.inp = gdn.random_inputs(batch, H, HV, K, V, T=T, io_dtype=torch.bfloat16, device=device)
        self.slots = torch.randperm(batch, device=device).to(torch.int32)
        self.n = torch.full((batch,), ACCEPTED, dtype=torch.int32, device=device)
        self.layers = []
        for _ in range(layers):
            if kernel in ("decode", "decode-multi"):
                state = torch.randn(batch, HV, V, K, device=device) * 0.5
                snaps = torch.empty(batch, DRAFT, HV, V, K, device=device) if kernel == "decode-multi" else None
                self.layers.append((state, snaps))
            else:
                cache = _cache(gdn, kernel, batch, device)
                cache.load(torch.randn(batch, HV, V, K, device=device) * 0.5)
                self.layers.append(cache)
        fills = torch.tensor(start_fills(kernel, batch), dtype=torch.int32, device=device)
        # row r starts at fill start_fills[r]; the fills are indexed by its slot
        self.start = torch.empty_like(fills)
        self.start[self.slots.long()] = fills
        if kernel == "verify":
            for cache in self.layers:
                self.m.verify(cache, **self.inp, use_qk_l2norm_in_kernel=True, slots=self.slots)

    def rewind(self) -> None:
        """Put every row back at its starting fill (between timed replays, outside the timing)."""
        for layer in self.layers:
            if not isinstance(layer, tuple):
                layer.fill.copy_(self.start[:, None].expand_as(layer.fill))

    def step(self) -> None:
        m, kw = self.m, dict(use_qk_l2norm_in_kernel=True, slots=self.slots, launch=self.launch, check=False)
        for layer in self.layers:
            if self.kernel == "decode":
                m.decode(layer[0], **self.inp, **kw)
            elif self.kernel == "decode-multi":
                m.decode_multi(layer[0], layer[1], **self.inp, **kw)
            elif self.kernel == "verify":
                m.verify(layer, **self.inp, **kw)
                m.accept(layer, self.n, self.slots, check=False)
            else:
                m.replay(layer, **self.inp, **kw)


def check_config(kernel: str, launch: dict, device: str) -> float:
    """Max relative error of the kernel with these settings against its reference over a window (3 rows)."""
    import torch

    from replayssm_kernels import gdn

    H, HV, K, V = SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"]
    rows = torch.tensor([2, -1, 0], dtype=torch.int32, device=device)
    live = rows >= 0
    kw = dict(use_qk_l2norm_in_kernel=True, slots=rows)
    err = 0.0

    def rel(a, b):
        return ((a[live].float() - b[live].float()).abs().max() / b[live].float().abs().max()).item()

    if kernel in ("decode", "decode-multi"):
        state = torch.randn(3, HV, V, K, device=device) * 0.5
        want = state.clone()
        for _ in range(3):
            if kernel == "decode":
                inp = gdn.random_inputs(3, H, HV, K, V, device=device)
                y = gdn.decode(state, **inp, **kw, launch=launch)
                err = max(err, rel(y, gdn.decode_ref(want, **inp, **kw)), rel(state, want))
            else:
                inp = gdn.random_inputs(3, H, HV, K, V, T=DRAFT, device=device)
                snaps, want_snaps = (torch.zeros(3, DRAFT, HV, V, K, device=device) for _ in range(2))
                y = gdn.decode_multi(state, snaps, **inp, **kw, launch=launch)
                y_ref = gdn.decode_multi_ref(state, want_snaps, **inp, **kw)
                err = max(err, rel(y, y_ref), rel(snaps, want_snaps))
        return err
    cache = _cache(gdn, kernel, 3, device)
    cache.load(torch.randn(3, HV, V, K, device=device) * 0.5)
    want = cache.clone()
    for step in range(WINDOW + 2):
        if kernel == "verify":
            inp = gdn.random_inputs(3, H, HV, K, V, T=DRAFT, device=device)
            y = gdn.verify(cache, **inp, **kw, launch=launch)
            err = max(err, rel(y, gdn.verify_ref(want, **inp, **kw)))
            n = torch.randint(0, DRAFT + 1, (3,), dtype=torch.int32, device=device)
            gdn.accept(cache, n, rows)
            gdn.accept_ref(want, n, rows)
        else:
            inp = gdn.random_inputs(3, H, HV, K, V, device=device)
            y = gdn.replay(cache, **inp, **kw, launch=launch)
            err = max(err, rel(y, gdn.replay_ref(want, **inp, **kw)))
    got, ref = gdn.materialize(cache), gdn.materialize_ref(want)
    return max(err, ((got - ref).abs().max() / ref.abs().max()).item())


def time_config(kernel: str, batch: int, launch: dict, device: str, l2_bytes: int, replays: int) -> Result:
    import torch

    layers = layer_count(kernel, batch, l2_bytes)
    steps = graph_steps(kernel)
    result = Result(kernel, batch, launch, layers, steps, bytes_per_layer_step(kernel, batch), check_ok=False)
    result.check_error = check_config(kernel, launch, device)
    # bf16 inputs and outputs: a few bf16 units of roundoff is agreement, anything larger is a wrong kernel.
    result.check_ok = result.check_error < 2e-2
    if not result.check_ok:
        return result
    stack = Stack(kernel, batch, layers, launch, device)
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


def print_table(results: list[Result], out) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"Gated DeltaNet H{SHAPE['H']}-HV{SHAPE['HV']}-K{SHAPE['K']}-V{SHAPE['V']}, W={WINDOW}, "
                        "fp32 state, bf16 io; ratio = baseline's best / this "
                        "(verify vs decode-multi, others vs decode)")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep_gdn.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  python benchmarks/sweep_gdn.py --quick --out runs/sweep_gdn_quick.json\n"
            "  python benchmarks/sweep_gdn.py --kernel replay --kernel decode --batch 256 \\\n"
            "      --launch replay:BV=64,num_warps=8 --launch decode:BV=32,num_warps=4 --out runs/sweep_gdn.json\n"
            "  python benchmarks/sweep_gdn.py --dry-run   # the plan, layer counts and bytes; no GPU needed"
        ),
    )
    parser.add_argument("--kernel", action="append", choices=KERNELS, help="kernels to time (default: all)")
    parser.add_argument("--batch", action="append", type=int, help=f"batch sizes (default: {BATCHES})")
    parser.add_argument("--launch", action="append", default=[], metavar="KERNEL:key=value,...",
                        help="launch settings to time instead of the built-in grid (repeatable)")
    parser.add_argument("--quick", action="store_true", help="a smaller grid: batches 1 and 256, 1-2 settings each")
    parser.add_argument("--replays", type=int, default=7, help="timed graph replays per config (median reported)")
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--dry-run", action="store_true", help="print the plan without touching a GPU")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        overrides = [parse_launch(text) for text in args.launch]
    except ValueError as exc:
        print(f"sweep_gdn: {exc}", file=sys.stderr)
        return 2
    kernels = args.kernel or list(KERNELS)
    batches = args.batch or list(QUICK_BATCHES if args.quick else BATCHES)
    if any(b < 1 for b in batches):
        print("sweep_gdn: --batch must be at least 1", file=sys.stderr)
        return 2
    grid = plan(kernels, args.quick, overrides)
    if args.dry_run:
        for kernel in kernels:
            for batch in batches:
                print(f"{kernel:16s} batch {batch:4d}  layers {layer_count(kernel, batch, L2_BYTES):4d}  "
                      f"{bytes_per_layer_step(kernel, batch) / 2**20:9.2f} MiB/layer-step  "
                      f"{len(grid[kernel])} launch settings")
        return 0

    import torch

    if not torch.cuda.is_available():
        print("sweep_gdn: needs a CUDA GPU and found none; nothing measured (--dry-run shows the plan)",
              file=sys.stderr)
        return 2
    from rich.progress import Progress

    device = "cuda"
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or L2_BYTES
    results = []
    started = time.time()
    jobs = [(k, b, s) for k in kernels for b in batches for s in grid[k]]
    with Progress(transient=True) as progress:
        task = progress.add_task("sweeping", total=len(jobs))
        for kernel, batch, settings in jobs:
            progress.update(task, description=f"{kernel} b{batch} {settings}")
            try:
                results.append(time_config(kernel, batch, settings, device, l2, args.replays))
            except ValueError as exc:
                print(f"sweep_gdn: {kernel} batch {batch} {settings}: {exc}", file=sys.stderr)
            progress.advance(task)
    add_ratios(results)
    print_table(results, sys.stdout)
    print(f"{len(results)} configs in {time.time() - started:.0f} s", file=sys.stderr)
    if args.out:
        import triton

        env = {"gpu": props.name, "torch": torch.__version__, "triton": triton.__version__, "l2_bytes": l2}
        payload = {"shape": SHAPE, "window": WINDOW, "draft": DRAFT, "accepted": ACCEPTED, "environment": env,
                   "results": [asdict(r) for r in results]}
        with open(args.out, "w") as fh:
            json.dump(payload, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
