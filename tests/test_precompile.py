"""precompile.Pool, Gate, deferred and bench.compile_point: the jobs a pool is given, waiting for one point's compile,
the GPU kept from the workers while a run is timed, compiles deferred with the launch's own arguments, what one line
says, when no pool starts, and that a compile-only run launches every kernel specialization the timed run launches
(under Triton's interpreter)."""

from __future__ import annotations

import inspect
import os
import pickle
from concurrent.futures import Executor, Future
from types import SimpleNamespace

import pytest
import torch

from replayssm_cli.advise import tuning
from replayssm_cli.measure import bench, grid, precompile
from replayssm_cli.model import presets

SUPER = "nemotron-3-super-120b-a12b"


class Serial(Executor):
    """Runs each job as it is submitted, after a pickle round trip of what a spawned worker would be sent."""

    def __init__(self):
        self.jobs, self.closed = [], False

    def submit(self, fn, *args, **kwargs):
        fn, args = pickle.loads(pickle.dumps((fn, args)))
        self.jobs.append((fn, args))
        future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.closed = True


def _points(n: int = 3) -> list[grid.Point]:
    spec = grid.ProfileSpec(presets=(SUPER,), batches=(1, 64), windows=(16,), state_dtypes=("fp32",), phases=False)
    return grid.plan(spec, [presets.resolve(SUPER, 1)])[:n]


def test_pool_counts_a_failed_worker_in_its_line_and_does_not_raise(monkeypatch):
    points = _points(3)
    compiled = []

    def compile_point(point, context):
        if point == points[1]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        compiled.append((point, context))

    monkeypatch.setattr(bench, "compile_point", compile_point)
    from triton import knobs

    heard = []
    monkeypatch.setattr(knobs.compilation, "listener", lambda **kw: heard.append(kw["cache_hit"]))
    original = knobs.compilation.listener
    pool = Serial()
    workers = precompile.Pool(2, executor=pool)
    # The parent's own compiles are counted (a cache hit is not), and a listener already set still hears them.
    for hit in (False, True, False):
        knobs.compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=hit)
    assert heard == [False, True, False]
    assert [fn for fn, _ in pool.jobs] == [precompile._ready] * 2 and workers.up()
    workers.submit(points, seed=7)
    assert [fn for fn, _ in pool.jobs[2:]] == [precompile.compile_one] * 3 and workers.compiled() == 3
    assert all(workers.wait(p) for p in points)
    result = workers.close()
    assert pool.closed and workers.close() is None and knobs.compilation.listener is original and result.own == 2
    assert compiled == [(points[0], {"device": "cuda", "seed": 7}), (points[2], {"device": "cuda", "seed": 7})]
    assert (result.done, result.failed, result.workers, result.early) == (2, 1, 2, 0)
    line = result.line()
    assert "\n" not in line and "2 of 3 configurations" in line and "on 2 workers beside the timed runs" in line
    assert "this process compiled 2 kernels itself" in line
    assert "1 failed (the first: OutOfMemoryError: CUDA out of memory" in line


class Manual(Executor):
    """Start-up jobs done at once; every other job left pending until the test runs it (`finish`)."""

    def __init__(self, up: bool = True):
        self.pending, self.up, self.shut = [], up, None

    def submit(self, fn, *args):
        future = Future()
        if fn is precompile._ready:
            if self.up:
                future.set_result(fn())
        else:
            self.pending.append((future, fn, args))
        return future

    def finish(self, n: int = 1) -> None:
        for future, fn, args in self.pending[:n]:
            future.set_result(fn(*args))
        del self.pending[:n]

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.shut = {"wait": wait, "cancel_futures": cancel_futures}


def test_pool_waits_for_a_points_own_compile_only(monkeypatch):
    """wait(point) returns once that point's compile finished, while later points' compiles are still pending; a point
    reached before any worker is up is not waited for (its timed run compiles its own kernels) and is counted."""
    import threading

    monkeypatch.setattr(precompile, "POLL_S", 0.01)
    monkeypatch.setattr(bench, "compile_point", lambda point, context: None)
    points = _points(3)
    executor = Manual()
    pool = precompile.Pool(2, executor=executor)
    pool.submit(points)
    polls = []
    finisher = threading.Timer(0.1, executor.finish)
    finisher.start()
    assert pool.wait(points[0], on_wait=lambda: polls.append(1))
    finisher.join()
    assert polls and pool.waited > 0 and len(executor.pending) == 2 and pool.compiled() == 1
    executor.finish(2)
    assert pool.wait(points[1]) and pool.wait(points[2]) and not pool.wait(_points(4)[3])
    done = pool.close()
    assert (done.done, done.failed, done.early) == (3, 0, 0) and executor.shut == {"wait": False, "cancel_futures": False}

    cold = precompile.Pool(2, executor=Manual(up=False))
    cold.submit(points)
    assert not cold.up() and not cold.wait(points[0]) and cold.early == 1 and cold.futures[points[0]].cancelled()
    assert "1 timed before a worker was up compiled their own" in precompile.Compiled(2, 0, 1.0, 2, early=1).line()
    assert cold.close(cancel=True).done == 0


def test_gate_keeps_workers_off_the_gpu_while_a_run_is_timed(monkeypatch):
    """alone() waits for the workers on the GPU to leave it, and a worker waits while a run is timed; a worker that died
    holding the gate (the pool broken) does not hold the timed run forever."""
    import multiprocessing
    import threading

    monkeypatch.setattr(precompile, "POLL_S", 0.01)
    gate = precompile.Gate(multiprocessing.get_context("spawn"))
    log, on_gpu, leave = [], threading.Event(), threading.Event()

    def worker():
        with gate.shared():
            log.append("worker on")
            on_gpu.set()
            leave.wait(5)
            log.append("worker off")

    first = threading.Thread(target=worker)
    first.start()
    on_gpu.wait(5)
    threading.Timer(0.05, leave.set).start()
    with gate.alone():
        log.append("timed")
        second = threading.Thread(target=lambda: gate.shared().__enter__() or log.append("second on"))
        second.start()
        second.join(0.1)
        log.append("timed end")
    second.join(5)
    first.join(5)
    assert log == ["worker on", "worker off", "timed", "timed end", "second on"]
    # The second worker never left: only a dead pool lets a timed run through.
    with gate.alone(dead=lambda: True):
        log.append("after a dead worker")
    assert log[-1] == "after a dead worker"


def test_deferred_launches_nothing_and_compiles_with_the_arguments_the_launch_gave(monkeypatch):
    """Within deferred(), JITFunction.run is a warmup (no launch) and its _do_compile is kept, not run; the kept call is
    _do_compile with the very arguments run passed, so Triton builds the same source and options (the cache key)."""
    from triton.runtime.jit import JITFunction

    calls = []

    def run(self, *args, grid, warmup, **kwargs):
        calls.append(("run", args, warmup))
        kernel = self._do_compile("key", "signature", "device", {(0,): 16}, "options", {(1,): [["tt.divisibility", 16]]},
                                  warmup)
        if kernel is None:
            return None
        if not warmup:
            calls.append(("launch",))
        return kernel

    monkeypatch.setattr(JITFunction, "run", run)
    monkeypatch.setattr(JITFunction, "_do_compile", lambda self, *args: calls.append(("compile", args)) or "kernel")
    fn = JITFunction.__new__(JITFunction)
    with precompile.deferred() as pending:
        assert fn.run(1, 2, grid=(4,), warmup=False) is None
        fn.run(1, 2, grid=(4,), warmup=False)
    assert calls == [("run", (1, 2), True)] * 2 and len(pending) == 1
    assert JITFunction.run is run
    (compile_kernel,) = pending.values()
    assert compile_kernel() == "kernel"
    assert calls[-1] == ("compile", ("key", "signature", "device", {(0,): 16}, "options", {(1,): [["tt.divisibility", 16]]}, True))
    fn.run(3, grid=(1,), warmup=False)
    assert calls[-1] == ("launch",)


def test_triton_run_passes_do_compile_what_deferred_keeps():
    """The installed Triton's JITFunction.run compiles through _do_compile(key, signature, device, constexprs, options,
    attrs, warmup) and launches only after it returns a kernel and when not a warmup: what deferred() relies on."""
    from triton.runtime.jit import JITFunction

    assert list(inspect.signature(JITFunction._do_compile).parameters) == [
        "self", "key", "signature", "device", "constexprs", "options", "attrs", "warmup"]
    source = inspect.getsource(JITFunction.run)
    compile_at = source.index("kernel = self._do_compile(key, signature, device, constexprs, options, attrs, warmup)")
    returns_at = source.index("if kernel is None:\n                return None", compile_at)
    assert compile_at < returns_at < source.index("if not warmup:") < source.index("kernel.run(")
    assert "device_caches[device]" in inspect.getsource(JITFunction._do_compile)


def test_workers_are_spawned_with_the_parents_triton_cache_and_gpu(monkeypatch, tmp_path):
    import multiprocessing

    made = {}
    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", lambda **kw: made.update(kw) or Serial())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    gate = precompile.Gate(multiprocessing.get_context("spawn"))
    precompile._pool(5, gate)
    assert made["max_workers"] == 5 and made["mp_context"].get_start_method() == "spawn"
    assert made["initializer"] is precompile._init
    env, given = made["initargs"]
    assert env == {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "CUDA_VISIBLE_DEVICES": "3"} and given is gate
    # A worker started with another environment takes the parent's; a variable the parent lacks is dropped.
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    monkeypatch.setattr("signal.signal", lambda *a: None)
    precompile._init({"CUDA_VISIBLE_DEVICES": "3"})
    assert "TRITON_CACHE_DIR" not in os.environ and os.environ["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize("cpus, points, want", [(16, 52, 12), (16, 3, 3), (4, 52, 3), (1, 52, 1), (None, 52, 1)])
def test_workers_leave_a_core_and_stop_at_the_cap(monkeypatch, cpus, points, want):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert precompile.workers(points) == want


@pytest.mark.parametrize("cuda, interpret, results, flag, starts", [
    (False, None, False, True, False), (True, "1", False, True, False), (True, None, True, True, False),
    (True, None, False, False, False), (True, None, False, True, True),
], ids=["no-cuda", "interpreter", "results-file", "no-precompile", "cuda"])
def test_tune_starts_the_pool_only_when_it_will_measure_on_a_cuda_device(monkeypatch, tmp_path, cuda, interpret, results,
                                                                         flag, starts):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(precompile, "Pool", lambda: "pool")
    spec = tuning.TuneSpec(SUPER, (1,), (16,), ("fp32",), (), results=tmp_path / "r.json" if results else None,
                           precompile=flag)
    assert tuning._start_pool(spec) == ("pool" if starts else None)


MAMBA2 = {"op": "mamba2", "H": 1, "P": 4, "N": 8, "G": 1}
CASES = {
    "conventional-B1-fp32": dict(variant="conventional", batch=1, window=None, state_dtype="fp32"),
    "split-B3-W2-fp32-bf16": dict(variant="split", batch=3, window=2, state_dtype="fp32", read_dtype="bf16"),
    "spec-replay-B1-W2-T2-bf16": dict(variant="spec-replay", batch=1, window=2, state_dtype="bf16", draft=2,
                                      accept=[0.2, 0.3, 0.5]),
}


def _record_launches(monkeypatch) -> dict[str, set]:
    """Each launch from here on, added to the set under "into", as Triton's JIT keys it: the kernel, each argument's
    specialization (Triton's own: its type and 16-divisibility, an int equal to 1; a constexpr's value) and the launch
    options."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.runtime.interpreter import InterpretedFunction

    record = {"into": set()}
    run = InterpretedFunction.run

    def recording(self, *args, grid, warmup, **kwargs):
        params = inspect.signature(self.fn).parameters
        bound = inspect.signature(self.fn).bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
        spec = tuple((name, v if "constexpr" in str(params[name].annotation) else native_specialize_impl(BaseBackend, v, False, True, True))
                     for name, v in bound.arguments.items())
        record["into"].add((self.fn.__name__, spec, tuple(sorted((k, v) for k, v in kwargs.items() if k not in params))))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording)
    return record


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records launches through Triton's interpreter")
@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_compile_point_launches_every_specialization_the_timed_run_launches(monkeypatch, case):
    """The timed run (run_point: a stack of two layers, checked, 2W steps in its graph, run here eagerly) launches no
    kernel at a specialization that compile_point (one layer, checked, one step) did not."""
    spec = {"shape": MAMBA2, "ssm_layers": 2, "io_dtype": "bf16", "read_dtype": None, "draft": 0, **case}
    point = SimpleNamespace(variant=case["variant"], phases=False, case_spec=lambda seed=0, phase="avg": {**spec, "seed": seed})

    def eager_steps(c, *, steps, repeats, on_graph=None):
        c.rewind()
        for _ in range(steps):
            c.step()
        return [1.0] * repeats

    monkeypatch.setattr(bench, "time_graph", eager_steps)
    record = _record_launches(monkeypatch)
    compiled = record["into"]
    bench.compile_point(point, {"device": "cpu", "seed": 0})
    timed = record["into"] = set()
    (found,) = bench.run_point(point, {"device": "cpu", "seed": 0, "repeats": 3})
    assert found["ok"] and found["layers"] == 2, found
    assert timed and timed <= compiled, sorted(timed - compiled)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="records launches through Triton's interpreter")
@pytest.mark.parametrize("config", [("conventional", "bf16", None, None), ("split", "fp32", 3, "bf16"), ("replay", "int8", 2, None)],
                         ids=["conventional-bf16", "split-W3-fp32-bf16", "replay-W2-int8"])
def test_short_quality_inputs_launch_every_specialization_of_the_whole_run(monkeypatch, config):
    """The kernel quality run of a config on short_inputs (a one-token prompt, OFFSETS + 2W tokens) launches every
    kernel specialization the run on the whole inputs launches (here 24 generated tokens after 5 prompt tokens, 3
    heads: token rows of 12 bytes, so a token's slice starts at every 4-byte offset mod 16)."""
    from replayssm_cli.measure import quality
    from replayssm_cli.model.shapes import Mamba2Shape

    inputs = quality.synthetic_inputs(Mamba2Shape(H=3, P=4, N=8, G=1), steps=24, prompt=5, heads=3, seed=1)
    c = quality.Config(*config)
    short = precompile.short_inputs(inputs, c)
    assert (short.prompt, short.generated) == (1, precompile.OFFSETS + 2 * (c.window or 1))
    assert short.tensors["A"].shape == inputs.tensors["A"].shape and short.tensors["x"].shape[1:] == inputs.tensors["x"].shape[1:]
    record = _record_launches(monkeypatch)
    compiled = record["into"]
    quality.stepwise_outputs(short, c, device="cpu")
    whole = record["into"] = set()
    quality.stepwise_outputs(inputs, c, device="cpu")
    assert whole and whole <= compiled, sorted(whole - compiled)
