"""Timing in CUDA graphs: the one graph timer, percentiles and sample statistics, and the out-of-memory test."""

from __future__ import annotations

import math
import sys
from typing import Callable


def _sleep_ahead() -> None:
    import torch

    # Keep the GPU busy while the host queues the timed replays, so no launch gap lands inside a timing.
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(2_000_000)


def graph_samples(run: Callable[[], None], *, replays: int, warmup: int = 2, eager: Callable[[], None] | None = None,
                  before_capture: Callable[[], None] | None = None,
                  on_graph: Callable[[Callable[[], None]], None] | None = None) -> list[float]:
    """µs of each of `replays` back-to-back replays of `run` captured in one CUDA graph.

    `eager` (default `run`) runs once on a side stream first (compiles, allocates), then `before_capture`
    (a rewind of what it advanced), the capture, `warmup` untimed replays and the timed ones, each between
    two CUDA events; then `on_graph` (energy.GraphMeter) is given the graph's replay.
    """
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        (eager or run)()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    if before_capture is not None:
        before_capture()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    _sleep_ahead()
    for start, end in zip(starts, ends):
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    if on_graph is not None:
        on_graph(graph.replay)
    del graph
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)]


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics, as numpy's default."""
    s = sorted(values)
    if not s:
        return math.nan
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def sample_stats(samples: list[float]) -> dict[str, float]:
    """Median, percentiles and spread ((p75 - p25) / median) of per-step samples in µs."""
    med = percentile(samples, 50)
    p25, p75 = percentile(samples, 25), percentile(samples, 75)
    return {
        "us": med,
        "us_p50": med,
        "us_p95": percentile(samples, 95),
        "us_p99": percentile(samples, 99),
        "spread": (p75 - p25) / med if med > 0 else math.nan,
        "x_us_p25": p25,
        "x_us_p75": p75,
    }


def is_oom(exc: BaseException) -> bool:
    """Whether `exc` is CUDA running out of memory (torch's error, or a kernel's message saying so)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
