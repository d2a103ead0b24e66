"""`profile --gpus`: the grid split across the visible GPUs, one process each, rows merged into one results file as they
finish, each row naming the GPU it ran on; every ratio is taken within one GPU."""

from __future__ import annotations

import os
import queue as queue_mod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from replayssm_cli.errors import UserError
from replayssm_cli.measure import profile as prof
from replayssm_cli.measure.grid import Point, ProfileSpec, plan
from replayssm_cli.measure.tensor_parallel import stop

# How often the parent looks for a worker that died without a word while it waits for rows.
POLL_S = 1.0
# How long the parent waits for a worker to end after its last group.
END_WAIT_S = 30


def gpu_count(value: str | None, visible: int) -> int:
    """--gpus as a number of GPUs: 'all' the visible ones, else an integer from 1 to `visible`; UserError otherwise."""
    if value is None:
        return 1
    text = str(value).strip().lower()
    if text == "all":
        n = visible
        if n < 1:
            raise UserError("--gpus all found 0 GPUs visible", "run it on a machine with NVIDIA GPUs (CUDA_VISIBLE_DEVICES selects them)")
    else:
        try:
            n = int(text)
        except ValueError:
            raise UserError(f"--gpus {value!r} is not a number of GPUs", "pass --gpus all, or a count such as --gpus 4") from None
        if n < 1:
            raise UserError(f"--gpus {n} is not a number of GPUs", "pass --gpus all, or a count such as --gpus 4")
    if n > visible:
        raise UserError(f"--gpus {text} asks for {n} GPUs, and {visible} {'is' if visible == 1 else 'are'} visible",
                        f"pass --gpus {visible}" if visible else "run it on a machine with NVIDIA GPUs (CUDA_VISIBLE_DEVICES selects them)")
    return n


def groups(points: list[Point]) -> list[list[Point]]:
    """The points that must share a GPU: one group per preset and batch (every speedup pairs rows of one preset and
    batch: a variant and its baseline, a split step and the fp32 conventional one, a serving-stack kernel and ours),
    the costliest first (most rows, then the largest batch), in the grid's order within a group."""
    by_key: dict[tuple[str, int], list[Point]] = {}
    for p in points:
        by_key.setdefault((p.preset, p.batch), []).append(p)
    return sorted(by_key.values(), key=lambda g: (-sum(1 + 2 * p.phases for p in g), -g[0].batch))


def visible_devices(n: int) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entry each of the first n visible GPUs has (what this process calls 0..n-1)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is None or not given.strip():
        return [str(i) for i in range(n)]
    return [d.strip() for d in given.split(",") if d.strip()][:n]


@dataclass
class _Worker:
    """What the worker process is given: its index and device entry, the presets and the work queue."""

    index: int
    device: str
    presets: dict[str, Any]
    work: Any
    results: Any
    setup: Callable[..., dict[str, Any]]
    runner: Any
    spec: ProfileSpec


@dataclass
class _Collect:
    """A stand-in for the results writer inside a worker: rows kept for this GPU's speedups, every row and skip sent on."""

    gpu: dict[str, Any]
    send: Callable[[tuple], None]
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: dict[str, Any]) -> None:
        row.update(x_gpu_index=self.gpu["index"], x_gpu_uuid=self.gpu.get("uuid"), x_gpu_name=self.gpu.get("name"))
        self.rows.append(row)
        self.send(("row", row))

    def skip(self, what: str, why: str) -> None:
        self.send(("skip", what, f"{why} (GPU {self.gpu['index']})"))


def _work(w: _Worker) -> None:
    """One GPU: its setup, then group after group from the queue, each point through the profiler's own point runner."""
    send = w.results.put
    try:
        setup = w.setup(None, w.spec)
    except BaseException as exc:  # noqa: BLE001 - the parent reports it in one line; nothing else may leave silently
        send(("failed", w.index, f"{type(exc).__name__}: {exc}"))
        return
    env = setup["environment"]
    index = _nvml_index() if w.setup is prof.measured_setup else None
    if index:
        # measured_setup asked NVML for its GPU 0, which is not this process's GPU: the name, UUID and clocks of this one.
        from replayssm_cli.model import gpus

        env["gpu"].update(gpus.detect(index).to_dict())
        setup["sampler"] = gpus.ClockSampler(index=index, required=False)
    gpu = {"index": w.index, "device": w.device, "name": env["gpu"].get("name"), "uuid": env["gpu"].get("uuid")}
    send(("ready", w.index, {k: setup[k] for k in ("environment", "ceilings", "free_bytes", "gpu_key", "gpu_name")}))
    sink = _Collect(gpu, send)
    if w.runner is None:
        from replayssm_cli.measure import bench

        w.runner = bench.run_point
    run = prof.ProfileRun(results=None, path=Path("."))
    sampler = setup.get("sampler")
    try:
        if sampler is not None:
            sampler.__enter__()
        # Groups until this worker's end mark (a blocking get: a multiprocessing queue can look empty before it is).
        for group in iter(w.work.get, None):
            for point in group:
                prof._run_point(point, w.presets[point.preset], sink, run, "measured", setup["ceilings"], setup["free_bytes"],
                                w.runner, setup.get("context") or {})
                send(("point", w.index, point.label()))
    except KeyboardInterrupt:
        send(("stopped", w.index))
        return
    finally:
        clocks = sampler.summary() if sampler is not None else None
        if sampler is not None:
            sampler.__exit__(None, None, None)
    send(("done", w.index, {"clocks": clocks} if clocks is not None else {}))


def _nvml_index() -> int | None:
    """NVML's index of the one GPU this process sees (CUDA device 0), matched by UUID: NVML ignores CUDA_VISIBLE_DEVICES."""
    import torch

    want = str(getattr(torch.cuda.get_device_properties(0), "uuid", "") or "")
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: the environment stays as measured_setup found it
        return None
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            if want and want in (uuid.decode() if isinstance(uuid, bytes) else str(uuid)):
                return i
        return None
    finally:
        pynvml.nvmlShutdown()


def _start(workers: list[_Worker], start_method: str) -> list[Any]:
    """One process per worker, each seeing only its GPU (CUDA_VISIBLE_DEVICES set for it alone)."""
    import multiprocessing as mp

    ctx = mp.get_context(start_method)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    procs = []
    try:
        for w in workers:
            os.environ["CUDA_VISIBLE_DEVICES"] = w.device
            proc = ctx.Process(target=_work, args=(w,), name=f"replayssm-profile-gpu{w.index}", daemon=True)
            proc.start()
            procs.append(proc)
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before
    return procs


def run_profile_gpus(
    spec: ProfileSpec,
    n: int,
    *,
    out: str | Path | None = None,
    progress: bool = True,
    setup: Callable[..., dict[str, Any]] | None = None,
    runner: Any = None,
    start_method: str = "spawn",
) -> prof.ProfileRun:
    """Measure the grid of `spec` on n GPUs at once: the points grouped by preset and batch (groups), the groups taken from
    one queue by one process per GPU as each finishes the last, rows written to one results file as they arrive.

    Every row carries x_gpu_index (the GPU among the visible ones), x_gpu_uuid and x_gpu_name; its speedup was taken in
    its own process, over a baseline row measured on the same GPU. The file's environment is GPU 0's, with every GPU's
    under x_gpus. Ctrl-C stops every worker; the file keeps every row that arrived. setup (measured_setup by default)
    and runner (bench.run_point) are what each worker calls.
    """
    import multiprocessing as mp

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.console import err
    from replayssm_cli.model import presets as presets_mod
    from replayssm_cli.report import results as results_mod

    spec.validate()
    if spec.energy:
        raise UserError("--energy reads one GPU's energy counter; --gpus runs several", "drop --gpus, or --energy")
    resolved = [presets_mod.resolve(name, spec.tp) for name in spec.presets]
    left_out: list[dict[str, str]] = []
    points = plan(spec, resolved, left_out, prof.usable_baselines(spec, resolved, "measured", left_out))
    if not points:
        raise UserError("the options leave nothing to profile", "; ".join(f"{s['what']}: {s['why']}" for s in left_out))
    path = Path(out) if out else results_mod.default_out(f"{n}gpu")
    spec_doc = {**spec.to_dict(), "mode": "measured", "gpus": n, "presets_resolved": [p.name for p in resolved]}
    env: dict[str, Any] = {**prof._environment(), "mode": "measured"}
    try:
        writer = results_mod.ResultsWriter(path, env, spec_doc, exclusive=not out)
    except FileExistsError:
        raise UserError(f"the results file {path} was created by another run meanwhile", "run again (names are unique per run)") from None
    except OSError as exc:
        raise UserError(f"cannot write the results file {path} ({exc.strerror or exc})", "pass a writable --out") from None
    for s in left_out:
        writer.skip(s["what"], s["why"])

    ctx = mp.get_context(start_method)
    work, results = ctx.Queue(), ctx.Queue()
    for g in groups(points):
        work.put(g)
    for _ in range(n):
        work.put(None)
    presets = {p.name: p for p in resolved}
    workers = [_Worker(i, d, presets, work, results, setup or prof.measured_setup, runner, spec) for i, d in enumerate(visible_devices(n))]
    run = prof.ProfileRun(results=writer.results, path=path, mode="measured")
    done: set[str] = set()
    ready: dict[int, dict[str, Any]] = {}
    finished: set[int] = set()
    lost: dict[int, int] = {}
    bar = Progress(TextColumn(f"[bold]profile[/] on {n} GPUs"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=err, transient=True, disable=not progress or not err.is_terminal)
    procs = _start(workers, start_method)
    # Where stderr is no terminal (a log, CI), plain lines instead of the bar: at most one every LOG_EVERY_S, and the last.
    log = progress and not err.is_terminal
    started = last_line = time.monotonic()
    try:
        with bar, prof.stop_signals_interrupt():
            task = bar.add_task("", total=len(points))
            while len(finished) < n:
                try:
                    msg = results.get(timeout=POLL_S)
                except queue_mod.Empty:
                    # A worker that died without its last word (a crash): the others go on, its points are skipped with why.
                    for w, proc in zip(workers, procs):
                        if w.index not in finished and proc.exitcode not in (None, 0):
                            finished.add(w.index)
                            lost[w.index] = proc.exitcode
                    continue
                kind = msg[0]
                if kind == "row":
                    writer.add(msg[1])
                    if msg[1]["status"] == "failed":
                        run.failed.append(f"{msg[1]['preset']} {msg[1]['variant']} B{msg[1]['batch']} (GPU {msg[1]['x_gpu_index']})")
                elif kind == "skip":
                    writer.skip(msg[1], msg[2])
                elif kind == "point":
                    done.add(msg[2])
                    bar.update(task, advance=1, description=f"GPU {msg[1]}: {msg[2]}")
                    now = time.monotonic()
                    if log and (now - last_line >= prof.LOG_EVERY_S or len(done) == len(points)):
                        err.print(f"profile: {len(done)}/{len(points)} done on {n} GPUs, {now - started:.0f} s: GPU {msg[1]}: {msg[2]}",
                                  highlight=False, soft_wrap=True)
                        last_line = now
                elif kind == "ready":
                    ready[msg[1]] = msg[2]
                    _environment(writer, ready, workers)
                elif kind == "done":
                    finished.add(msg[1])
                    if msg[2]:
                        writer.results.environment.setdefault("x_clocks", {})[str(msg[1])] = msg[2]["clocks"]
                elif kind in ("stopped", "failed"):
                    finished.add(msg[1])
                    if kind == "failed":
                        raise UserError(f"the profile could not start on GPU {msg[1]} ({msg[2]})", "run again without --gpus to see it alone")
                    raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        run.interrupted = True
        run.stop_signal = getattr(exc, "signal_name", "SIGINT")
        stop(procs)
        with prof.signals_held():
            _drain(results, writer, done)
            for point in points:
                if point.label() not in done:
                    writer.skip(point.label(), prof.INTERRUPTED)
            run.results = writer.close(complete=False)
        writer.release()
        return _finish(run, ready, resolved)
    except BaseException:
        stop(procs)
        writer.release()
        raise
    for proc in procs:
        proc.join(END_WAIT_S)
    why = "; ".join(f"the process on GPU {i} ended with exit code {code}" for i, code in sorted(lost.items()))
    missing = [p for p in points if p.label() not in done]
    for point in missing:
        writer.skip(point.label(), f"not run: {why or 'no GPU process took it'}")
    run.results = writer.close(complete=not missing)
    writer.release()
    return _finish(run, ready, resolved)


def _environment(writer: Any, ready: dict[int, dict[str, Any]], workers: list[_Worker]) -> None:
    """The file's environment: GPU 0's (the first ready until it is), and every ready GPU's under x_gpus."""
    first = ready.get(0) or next(iter(ready.values()))
    writer.results.environment.update(first["environment"])
    writer.results.environment["x_gpus"] = [
        {"index": i, "device": workers[i].device, **ready[i]["environment"]["gpu"]} for i in sorted(ready)
    ]


def _drain(results: Any, writer: Any, done: set[str]) -> None:
    """The rows and skips the workers sent before they stopped."""
    while True:
        try:
            msg = results.get(timeout=0.5)
        except queue_mod.Empty:
            return
        if msg[0] == "row":
            writer.add(msg[1])
        elif msg[0] == "skip":
            writer.skip(msg[1], msg[2])
        elif msg[0] == "point":
            done.add(msg[2])


def _finish(run: prof.ProfileRun, ready: dict[int, dict[str, Any]], resolved: list[Any]) -> prof.ProfileRun:
    first = ready.get(0) or (next(iter(ready.values())) if ready else None)
    names = sorted({r["environment"]["gpu"].get("name") or "?" for r in ready.values()})
    run.gpu_name = f"{len(ready)} x " + " + ".join(names) if ready else "no GPU started"
    run.ceilings = first["ceilings"] if first else None
    run.layers_of = {p.name: p.ssm_layers for p in resolved}
    run.presets = resolved
    for row in run.results.rows:
        if row.get("status") == "ok":
            key = f"{row['preset']} {row['variant']}"
            run.largest_fit[key] = max(run.largest_fit.get(key, 0), row["batch"])
    run.skipped = list(run.results.skipped)
    return run
