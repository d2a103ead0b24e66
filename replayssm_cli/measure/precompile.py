"""Compile the kernels of the grid points about to be timed, in worker processes, while the parent times the points
already compiled: compiling (LLVM, ptxas) is CPU work the timed loop would otherwise do one point at a time. A worker
touches the GPU only to build a point's tensors, never while a run is timed, and launches nothing."""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Callable, Iterator

# Workers at most, however many cores: each holds a CUDA context and, while it builds one, a point's tensors.
MAX_WORKERS = 12
# What a worker takes from the parent's environment: where Triton's cache is, and which GPU.
ENV = ("TRITON_CACHE_DIR", "CUDA_VISIBLE_DEVICES")
# How often (seconds) a wait rechecks that the workers are alive, and reports progress.
POLL_S = 0.5


@dataclass(frozen=True)
class Compiled:
    """What a pre-compile did: points compiled, points whose worker failed (and the first one's error), seconds from
    the pool's start to the last compile, workers, and the seconds the timed runs waited for compiles."""

    done: int
    failed: int
    seconds: float
    workers: int
    first_error: str | None = None
    waited: float = 0.0
    # Configurations timed before any worker was up, each compiling its own kernels.
    early: int = 0
    # Kernel quality runs (quality.stepwise_outputs of one config) compiled, and failed; counted apart from the above.
    quality_done: int = 0
    quality_failed: int = 0
    # Kernels this process compiled itself (not found in Triton's cache) while the pool was open.
    own: int = 0

    def line(self) -> str:
        failed = (f", {self.failed + self.quality_failed} failed (the first: {self.first_error}; a run that meets the "
                  "error says it)" if self.failed + self.quality_failed else ", none failed")
        early = f"; {self.early} timed before a worker was up compiled their own" if self.early else ""
        runs = self.quality_done + self.quality_failed
        runs = f" and {self.quality_done} of {runs} kernel quality runs" if runs else ""
        return (f"pre-compiled the kernels of {self.done} of {self.done + self.failed} configurations{runs} in "
                f"{self.seconds:.1f} s on {self.workers} worker{'s' if self.workers != 1 else ''} beside the timed runs "
                f"(which waited {self.waited:.1f} s for them; this process compiled {self.own} "
                f"kernel{'s' if self.own != 1 else ''} itself){failed}{early}")


def wanted() -> bool:
    """Whether there is anything to compile: a CUDA device, and Triton compiling (not its interpreter)."""
    import torch

    return os.environ.get("TRITON_INTERPRET") != "1" and torch.cuda.is_available()


def workers(points: int) -> int:
    return max(1, min(points, (os.cpu_count() or 2) - 1, MAX_WORKERS))


class Gate:
    """The GPU shared between the parent's timed runs and the workers: a timed run has it alone (it waits for the
    workers on it to finish, and none starts meanwhile); the workers share it with one another."""

    def __init__(self, ctx):
        self._cond = ctx.Condition()
        self._workers = ctx.RawValue("i", 0)
        self._timing = ctx.RawValue("i", 0)

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        """In a worker, around its GPU work: waits while a run is timed (and exits if the parent is gone)."""
        import multiprocessing

        with self._cond:
            while self._timing.value:
                parent = multiprocessing.parent_process()
                if not self._cond.wait(POLL_S) and parent is not None and not parent.is_alive():
                    raise SystemExit("the parent process is gone")
            self._workers.value += 1
        try:
            yield
        finally:
            with self._cond:
                self._workers.value -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def alone(self, dead: Callable[[], bool] = lambda: False) -> Iterator[None]:
        """In the parent, around a timed run: no worker on the GPU meanwhile. `dead()` says the workers are gone
        (one died holding the gate: the pool is broken and every worker stopped)."""
        with self._cond:
            self._timing.value = 1
            try:
                while self._workers.value:
                    if not self._cond.wait(POLL_S) and dead():
                        self._workers.value = 0
            except BaseException:
                self._timing.value = 0
                self._cond.notify_all()
                raise
        try:
            yield
        finally:
            with self._cond:
                self._timing.value = 0
                self._cond.notify_all()


# A worker's gate (set by _init); None in the parent and in tests that run jobs in-process.
_GATE: Gate | None = None


def _init(env: dict[str, str], gate: Gate | None = None) -> None:
    """A worker's start: the parent's Triton cache and GPU; Ctrl-C is the parent's to handle; torch, Triton and the
    benchmark imported and CUDA initialized now, while the parent runs the quality harness."""
    import signal

    global _GATE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for key in ENV:
        if key in env:
            os.environ[key] = env[key]
        else:
            os.environ.pop(key, None)
    _GATE = gate
    if gate is None:
        return
    import torch
    import triton

    from replayssm_cli.measure import bench  # noqa: F401

    with gate.shared():
        torch.cuda.init()
        torch.empty(1, device="cuda")
        triton.runtime.driver.active.get_current_target()


def _ready() -> int:
    """A job that only makes the pool start a worker (ProcessPoolExecutor spawns them one per pending job)."""
    return os.getpid()


def _pool(n: int, gate: Gate) -> Executor:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    env = {k: os.environ[k] for k in ENV if k in os.environ}
    return ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"), initializer=_init,
                               initargs=(env, gate))


@contextlib.contextmanager
def deferred() -> Iterator[dict[tuple[int, str], Callable[[], Any]]]:
    """Within: a Triton launch neither compiles nor launches; what it would compile is kept, keyed by (kernel, Triton's
    key), as a call that compiles it. The call passes JITFunction._do_compile the arguments JITFunction.run gave it (the
    specialization of the launch's own arguments), so the on-disk cache key is the one a launch computes."""
    from triton.runtime.jit import JITFunction

    pending: dict[tuple[int, str], Callable[[], Any]] = {}
    run, do_compile = JITFunction.run, JITFunction._do_compile

    def unlaunched(self, *args, grid, warmup, **kwargs):
        return run(self, *args, grid=grid, warmup=True, **kwargs)

    def keep(self, key, signature, device, constexprs, options, attrs, warmup):
        pending.setdefault((id(self), key), lambda: do_compile(self, key, signature, device, constexprs, options, attrs,
                                                               True))
        # None: JITFunction.run returns before its launch.
        return None

    JITFunction.run, JITFunction._do_compile = unlaunched, keep
    try:
        yield pending
    finally:
        JITFunction.run, JITFunction._do_compile = run, do_compile


def compile_one(point: Any, seed: int) -> int:
    """In a worker: every kernel the timed run of `point` (a grid.Point) launches, compiled into Triton's cache. The case
    is built and stepped (bench.compile_point) on the GPU while no run is timed, its launches held back; then the
    kernels they would have compiled are compiled, on the CPU alone. The number of kernels compiled."""
    from replayssm_cli.measure import bench

    return _compile_deferred(lambda: bench.compile_point(point, {"device": "cuda", "seed": seed}))


def _compile_deferred(launch: Callable[[], Any]) -> int:
    """Run `launch` on the GPU while no run is timed, its Triton launches held back (`deferred`), then compile what
    they would have compiled, on the CPU alone. The number of kernels compiled."""
    with _GATE.shared() if _GATE is not None else contextlib.nullcontext(), deferred() as pending:
        launch()
    for compile_kernel in pending.values():
        compile_kernel()
    return len(pending)


# Generated tokens a compile-only quality run steps besides two windows: every 16-byte offset a token's slice of the
# inputs can start at (rows of 4 bytes or more).
OFFSETS = 16


def short_inputs(inputs: Any, config: Any) -> Any:
    """Quality inputs (quality.Inputs) cut to a one-token prompt and OFFSETS + 2W generated tokens, copied: the kernels
    `config` steps through see the same shapes but the token count, and token slices at every offset the whole run's
    take, so they launch at the same specializations."""
    import dataclasses

    steps = 1 + OFFSETS + 2 * (config.window or 1)
    start = max(inputs.prompt - 1, 0)
    tensors = {k: v[start:start + steps].clone() if v.dim() >= 2 and v.shape[0] == inputs.steps else v.clone()
               for k, v in inputs.tensors.items()}
    return dataclasses.replace(inputs, tensors=tensors, prompt=inputs.prompt - start)


def compile_quality(inputs: Any, config: Any) -> int:
    """In a worker: every kernel the kernel quality run of `config` launches (quality.stepwise_outputs on the GPU),
    compiled into Triton's cache from a short run of `inputs` (short_inputs), its launches held back as compile_one's
    are. The number of kernels compiled."""
    import torch

    from replayssm_cli.measure import quality

    def launch() -> None:
        quality.stepwise_outputs(inputs, config, device="cuda")
        torch.cuda.synchronize()

    return _compile_deferred(launch)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]


class Pool:
    """Workers that compile the kernels of grid points beside the parent's timed runs. Started before the quality
    harness (their start-up, importing torch and creating CUDA contexts, overlaps it); `submit` every point in the order
    it will be timed; before timing one, `wait` for its own compile and time it inside `alone()`; then
    `submit_quality` the configs whose kernel quality runs may follow, and `wait_quality` before running them; `close`
    says what was done. A job whose worker fails is counted, not raised: its run meets the error itself. `executor`
    replaces the process pool (tests)."""

    def __init__(self, size: int | None = None, *, executor: Executor | None = None):
        import multiprocessing

        self.size = size or workers(MAX_WORKERS)
        self.gate = Gate(multiprocessing.get_context("spawn"))
        self.started = time.monotonic()
        self.executor = executor if executor is not None else _pool(self.size, self.gate)
        self.futures: dict[Any, Future] = {}
        self.quality: dict[Any, Future] = {}
        self.finished: dict[Any, float] = {}
        self.waited = 0.0
        self.early = 0
        self.closed = False
        self.ready: list[Future] = []
        self._count_own_compiles()
        try:
            self.ready = [self.executor.submit(_ready) for _ in range(self.size)]
        except BaseException:
            self.close(cancel=True)
            raise

    def _count_own_compiles(self) -> None:
        """Count the kernels this process compiles (Triton's compilation listener, chained to any already set)."""
        from triton import knobs

        self.own, self._listener = 0, knobs.compilation.listener

        def count(**kwargs):
            if not kwargs.get("cache_hit"):
                self.own += 1
            if self._listener is not None:
                self._listener(**kwargs)

        knobs.compilation.listener = count

    def submit(self, points: list[Any], *, seed: int = 0) -> None:
        """Queue the compile of each point, in this order (the order the points will be timed)."""
        for point in points:
            if point not in self.futures:
                future = self.executor.submit(compile_one, point, seed)
                future.add_done_callback(lambda _f, point=point: self.finished.setdefault(point, time.monotonic()))
                self.futures[point] = future

    def submit_quality(self, inputs: Any, configs: list[Any]) -> None:
        """Queue, after the points, the compile of each config's kernel quality run on `inputs` (short_inputs of them)."""
        for config in configs:
            if config not in self.quality:
                future = self.executor.submit(compile_quality, short_inputs(inputs, config), config)
                future.add_done_callback(lambda _f, c=config: self.finished.setdefault(("quality", c), time.monotonic()))
                self.quality[config] = future

    def wait_quality(self, configs: list[Any]) -> None:
        """Until the compiles of these configs' kernel quality runs finished (none while no worker is up)."""
        futures = [self.quality[c] for c in configs if c in self.quality]
        if futures and self.up():
            wait_futures(futures)

    def compiled(self) -> int:
        """Points whose compile finished (or failed) so far."""
        return sum(f.done() for f in self.futures.values())

    def up(self) -> bool:
        """Whether a worker has started (imported torch and Triton, initialized CUDA)."""
        return any(f.done() and not f.cancelled() and f.exception() is None for f in self.ready)

    def wait(self, point: Any, on_wait: Callable[[], None] | None = None) -> bool:
        """Until `point`'s compile finished; `on_wait()` every POLL_S meanwhile. Not for a point never submitted, nor
        while no worker is up yet: then the timed run compiles what it needs (as without a pool) rather than wait for a
        start-up that alone may take longer. Whether the point's compile finished."""
        future = self.futures.get(point)
        if future is None:
            return False
        if future.done():
            return True
        if not self.up():
            # Its compile is dropped where it has not reached a worker yet: the timed run compiles the same kernels.
            future.cancel()
            self.early += 1
            return False
        start = time.monotonic()
        try:
            while not wait_futures([future], timeout=POLL_S).done:
                if on_wait is not None:
                    on_wait()
        finally:
            self.waited += time.monotonic() - start
        return True

    def alone(self):
        """The GPU to the parent alone (a timed run), no worker on it meanwhile."""
        return self.gate.alone(dead=self._broken)

    def _broken(self) -> bool:
        from concurrent.futures.process import BrokenProcessPool

        return any(f.done() and not f.cancelled() and isinstance(f.exception(), BrokenProcessPool)
                   for f in [*self.ready, *self.futures.values(), *self.quality.values()])

    def close(self, *, cancel: bool = False) -> Compiled | None:
        """Stop the workers once every compile finished (with `cancel`: at once, those not started dropped), not
        waiting for them to exit; what was compiled, None if nothing was submitted or the pool was closed before."""
        from triton import knobs

        if self.closed:
            return None
        self.closed = True
        knobs.compilation.listener = self._listener
        if not cancel:
            wait_futures([*self.futures.values(), *self.quality.values()])
        self.executor.shutdown(wait=False, cancel_futures=cancel)
        if not self.futures and not self.quality:
            return None

        def ended(futures):
            done = [f for f in futures if f.done() and not f.cancelled()]
            return done, [_error(exc) for f in done if (exc := f.exception()) is not None]

        points, errors = ended(self.futures.values())
        runs, run_errors = ended(self.quality.values())
        last = max(self.finished.values(), default=self.started)
        first = (errors or run_errors or [None])[0]
        return Compiled(len(points) - len(errors), len(errors), last - self.started, self.size, first, self.waited,
                        self.early, len(runs) - len(run_errors), len(run_errors), self.own)
