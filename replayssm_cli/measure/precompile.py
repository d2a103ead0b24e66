"""Compile the kernels of the grid points about to be timed, in worker processes, so that Triton's on-disk cache holds
them before the timed runs: compiling (LLVM, ptxas) is CPU work the timed loop would otherwise do one point at a time."""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, as_completed
from dataclasses import dataclass
from typing import Any, Callable

# Workers at most, however many cores: each holds a CUDA context and one point's tensors on the GPU.
MAX_WORKERS = 12
# What a worker takes from the parent's environment: where Triton's cache is, and which GPU.
ENV = ("TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES")


@dataclass(frozen=True)
class Compiled:
    """What a pre-compile did: points compiled, points whose worker failed (and the first one's error), seconds,
    workers."""

    done: int
    failed: int
    seconds: float
    workers: int
    first_error: str | None = None

    def line(self) -> str:
        failed = (f", {self.failed} failed (the first: {self.first_error}; a timed run that meets the error says it)"
                  if self.failed else ", none failed")
        return (f"pre-compiled the kernels of {self.done} of {self.done + self.failed} configurations in "
                f"{self.seconds:.1f} s on {self.workers} worker{'s' if self.workers != 1 else ''}{failed}")


def wanted() -> bool:
    """Whether there is anything to compile: a CUDA device, and Triton compiling (not its interpreter)."""
    import torch

    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


def workers(points: int) -> int:
    return max(1, min(points, (os.cpu_count() or 2) - 1, MAX_WORKERS))


def _init(env: dict[str, str]) -> None:
    """A worker's start: the parent's Triton cache and GPU; Ctrl-C is the parent's to handle."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for key in ENV:
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)


def _pool(n: int) -> Executor:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    env = {k: os.environ[k] for k in ENV if k in os.environ}
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                               initargs=(env,))


def compile_one(point: Any, seed: int) -> None:
    """In a worker: every kernel the timed run of `point` (a grid.Point) launches, compiled (bench.compile_point)."""
    from replayssm_cli.measure import bench

    bench.compile_point(point, {"device": "cuda", "seed": seed})


def run(points: list[Any], *, seed: int = 0, on_done: Callable[[int, str], None] | None = None,
        executor: Executor | None = None) -> Compiled:
    """Compile the kernels of `points` in a pool of worker processes (spawned), waiting for all. A point whose worker
    fails (out of memory, a compile error) is counted, not raised: its timed run meets the error itself.
    `on_done(finished, label)` after each point; `executor` replaces the pool (tests)."""
    n = workers(len(points))
    start = time.monotonic()
    errors = []
    pool = executor if executor is not None else _pool(n)
    try:
        futures = {pool.submit(compile_one, point, seed): point for point in points}
        for i, future in enumerate(as_completed(futures), 1):
            if (exc := future.exception()) is not None:
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160])
            if on_done is not None:
                on_done(i, futures[future].label())
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return Compiled(len(points) - len(errors), len(errors), time.monotonic() - start, n, errors[0] if errors else None)
