"""precompile.run and bench.compile_point: the jobs a pool is given, what one line says, when it is skipped, and that a
compile-only run launches every kernel specialization the timed run launches (under Triton's interpreter)."""

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


def test_run_counts_a_failed_worker_in_its_line_and_does_not_raise(monkeypatch):
    points = _points(3)
    compiled, done = [], []

    def compile_point(point, context):
        if point == points[1]:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        compiled.append((point, context))

    monkeypatch.setattr(bench, "compile_point", compile_point)
    pool = Serial()
    result = precompile.run(points, seed=7, on_done=lambda i, label: done.append((i, label)), executor=pool)
    assert [fn for fn, _ in pool.jobs] == [precompile.compile_one] * 3 and pool.closed
    assert compiled == [(points[0], {"device": "cuda", "seed": 7}), (points[2], {"device": "cuda", "seed": 7})]
    assert (result.done, result.failed) == (2, 1)
    assert [i for i, _ in done] == [1, 2, 3] and {label for _, label in done} == {p.label() for p in points}
    line = result.line()
    assert "\n" not in line and "2 of 3 configurations" in line and "1 failed (the first: OutOfMemoryError: CUDA out of memory" in line


def test_workers_are_spawned_with_the_parents_triton_cache_and_gpu(monkeypatch, tmp_path):
    made = {}
    monkeypatch.setattr("concurrent.futures.ProcessPoolExecutor", lambda **kw: made.update(kw) or Serial())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    precompile._pool(5)
    assert made["max_workers"] == 5 and made["mp_context"].get_start_method() == "spawn"
    assert made["initializer"] is precompile._init
    (env,) = made["initargs"]
    assert env == {"TRITON_CACHE_DIR": str(tmp_path / "triton"), "CUDA_VISIBLE_DEVICES": "3"}
    # A worker started with another environment takes the parent's; a variable the parent lacks is dropped.
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere")
    monkeypatch.setattr("signal.signal", lambda *a: None)
    precompile._init({"CUDA_VISIBLE_DEVICES": "3"})
    assert "TRITON_CACHE_DIR" not in os.environ and os.environ["CUDA_VISIBLE_DEVICES"] == "3"


@pytest.mark.parametrize("cpus, points, want", [(16, 52, 12), (16, 3, 3), (4, 52, 3), (1, 52, 1), (None, 52, 1)])
def test_workers_leave_a_core_and_stop_at_the_cap(monkeypatch, cpus, points, want):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert precompile.workers(points) == want


@pytest.mark.parametrize("cuda, interpret, runs", [(False, None, False), (True, "1", False), (True, None, True)],
                         ids=["no-cuda", "interpreter", "cuda"])
def test_tune_precompiles_only_on_a_cuda_device(monkeypatch, capsys, cuda, interpret, runs):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    if interpret:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(precompile, "run", lambda points, **kw: calls.append(points) or precompile.Compiled(2, 0, 1.5, 2))
    tuning._precompile(_points(2), seed=0)
    assert bool(calls) == runs
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pre-compiled")]
    assert lines == (["pre-compiled the kernels of 2 of 2 configurations in 1.5 s on 2 workers, none failed"] if runs else [])


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
