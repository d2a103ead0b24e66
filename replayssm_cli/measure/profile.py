"""The profile run: one results row per measurement or prediction, their speedups, and the loop over the grid."""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable

from replayssm_cli.errors import UserError
from replayssm_cli.measure.grid import Point, ProfileSpec, mean_accepted, nonflush_fill, plan, point_phases, rounding_for
from replayssm_cli.report.results import rounding_of
from replayssm_cli.measure.timing import is_oom, sample_stats

INTERRUPTED = "not run: interrupted"
LOG_EVERY_S = 10.0


def _cost(point: Point, preset: Any, phase: str, accepted: float | None):
    from replayssm_cli.model import cost

    fill = None
    if phase == "nonflush":
        fill = nonflush_fill(point.window)
    elif phase == "flush":
        fill = point.window - 1
    return cost.step_cost(
        preset.shape,
        point.cost_variant,
        phase,
        batch=point.batch,
        window=point.window,
        fill=fill,
        state_dtype=point.state_dtype,
        read_dtype=point.read_dtype,
        io_dtype=point.io_dtype,
        draft=point.draft,
        accepted=accepted,
        has_z=getattr(preset, "has_z", True),
        rounding=point.rounding,
    )


def memory_fields(point: Point, preset: Any, free_bytes: int | None) -> dict[str, Any]:
    """mem_per_seq (one layer), mem_per_seq_model (all the preset's SSM layers), the parts as x_mem_* and how many
    sequences fit in free_bytes."""
    from replayssm_cli.model import cost

    mem = cost.memory_per_seq(
        preset.shape,
        point.cost_variant,
        window=point.window,
        state_dtype=point.state_dtype,
        read_dtype=point.read_dtype,
        io_dtype=point.io_dtype,
        draft=point.draft,
        rounding=point.rounding,
    )
    per_seq = int(mem["total"])
    fields: dict[str, Any] = {"mem_per_seq": per_seq, "mem_per_seq_model": per_seq * preset.ssm_layers}
    fields.update({f"x_mem_{k}": int(v) for k, v in mem.items() if k != "total"})
    fields["seqs_fit"] = int(free_bytes // (per_seq * preset.ssm_layers)) if free_bytes and per_seq else None
    return fields


def base_row(point: Point, preset: Any, phase: str, *, source: str, status: str, layers: int | None) -> dict[str, Any]:
    """Every ROW_FIELDS key (None where it does not apply), the configuration filled in."""
    from replayssm_cli.report.results import ROW_FIELDS

    return {
        **dict.fromkeys(ROW_FIELDS),
        "kind": "kernel",
        "op": point.op,
        "preset": point.preset,
        "variant": point.variant,
        "phase": phase,
        "batch": point.batch,
        "window": point.window,
        "state_dtype": point.state_dtype,
        "read_dtype": point.read_dtype,
        "io_dtype": point.io_dtype,
        "rounding": point.rounding,
        "draft": point.draft,
        "accepted": None,
        "tp": point.tp,
        "layers": layers,
        "flush": "aligned" if phase != "avg" else point.flush,
        "source": source,
        "status": status,
        "x_fill": nonflush_fill(point.window) if phase == "nonflush" else (point.window - 1 if phase == "flush" else None),
        **({"x_competes": point.competes} if point.competes else {}),
    }


def timing_fields(row: dict[str, Any], point: Point, preset: Any, us: float, accepted: float | None, ceilings: Any, phase: str) -> None:
    """Fill the figures that follow from one time: per token, per model step, bytes, FLOPs, bandwidth, share of the ceiling."""
    c = _cost(point, preset, phase, accepted)
    tokens = (accepted + 1.0) if point.draft else 1.0
    row["accepted"] = accepted
    row["us"] = us
    row["tokens_per_step"] = tokens
    row["us_per_token"] = us / tokens
    row["us_model_step"] = us * preset.ssm_layers
    row["bytes_read"] = int(c.bytes_read)
    row["bytes_written"] = int(c.bytes_written)
    row["flops"] = int(c.flops)
    row["int_ops"] = int(c.int_ops)
    row["intensity"] = c.intensity
    row["gbs"] = c.total_bytes / (us * 1e-6) / 1e9 if us > 0 else None
    copy_gbs = getattr(ceilings, "copy_gbs", None) if ceilings is not None else None
    row["pct_copy_bw"] = 100.0 * row["gbs"] / copy_gbs if row["gbs"] and copy_gbs else None
    row["flops_per_s"] = c.flops / (us * 1e-6) if us > 0 else None


def predicted_rows(point: Point, preset: Any, ceilings: Any, free_bytes: int | None, *, gpu: str = "h200",
                   reference: dict[tuple, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The rows predicted for one point on `gpu` (a GPU spec key), every row marked predicted, with x_prediction.

    Times come from calibration.predict_step: the cost model's bytes and FLOPs over the GPU's datasheet ceilings
    divided by the efficiency fitted to the shipped measured profiles (the roofline over `ceilings` where no
    calibration covers the kernel). `reference` (calibration.reference_index) adds x_reference to a row whose
    configuration a shipped file measured on this GPU: its µs, speedup and file, GPU, date and commit.
    """
    from replayssm_cli.model import calibration

    accepted = mean_accepted(list(point.accept)) if point.draft else None
    rows = []
    for phase in point_phases(point):
        row = base_row(point, preset, phase, source="predicted", status="ok", layers=preset.ssm_layers)
        pred = calibration.predict_step(
            preset, point.cost_variant, batch=point.batch, phase=phase, window=point.window, state_dtype=point.state_dtype,
            read_dtype=point.read_dtype, io_dtype=point.io_dtype, draft=point.draft, accepted=accepted, fill=row["x_fill"],
            gpu=gpu, rounding=point.rounding,
        )
        timing_fields(row, point, preset, pred.us, accepted, ceilings, phase)
        row.update(us_p50=pred.us, us_p95=pred.us, us_p99=pred.us, spread=None, check_max_err=None)
        row["x_prediction"] = pred.x_prediction()
        row.update(memory_fields(point, preset, free_bytes))
        measured = (reference or {}).get(calibration.reference_key({**row, "source": "measured"}))
        if measured is not None:
            row["x_reference"] = {"us": measured["us"], "speedup": measured.get("speedup"), **measured.get("x_origin", {})}
        rows.append(row)
    return _derived_fields(rows)


def measured_rows(point: Point, preset: Any, measurements: list[dict[str, Any]], ceilings: Any, free_bytes: int | None) -> list[dict[str, Any]]:
    """Rows from a runner's measurements (one per phase; see bench.run_point); a failed check gives a failed row, untimed."""
    rows = []
    for m in measurements:
        phase = m.get("phase", "avg")
        ok = m.get("ok", True)
        row = base_row(point, preset, phase, source="measured", status="ok" if ok else "failed", layers=m.get("layers"))
        row["check_max_err"] = m.get("check_max_err")
        row["x_case"] = point.case_spec(phase=phase)
        # Per-token figures use the acceptance distribution's mean, so both speculative variants divide by the same tokens.
        accepted = mean_accepted(list(point.accept)) if point.draft else None
        if point.draft:
            row["x_accepted_drawn"] = m.get("accepted")
        if ok:
            stats = sample_stats(m["samples_us"])
            timing_fields(row, point, preset, stats["us"], accepted, ceilings, phase)
            row.update(stats)
            row["x_samples_us"] = [round(s, 4) for s in m["samples_us"]]
            for key in ("steps", "repeats", "clocks", "tolerance", "note", "stack_bytes", "settings", "settings_tried", "kernel", "energy"):
                if m.get(key) is not None:
                    row[f"x_{key}"] = m[key]
        else:
            row["accepted"] = accepted
            row["x_error"] = m.get("error")
            row["x_tolerance"] = m.get("tolerance")
            for key in ("settings_tried", "kernel", "note"):
                if m.get(key) is not None:
                    row[f"x_{key}"] = m[key]
        row.update(memory_fields(point, preset, free_bytes))
        rows.append(row)
    return _derived_fields(rows)


SPEC_CONVENTIONAL_NOTE = "decode_multi alone: its accept is a pointer move, as in vLLM, and is not timed"


def _derived_fields(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Notes on spec-conventional rows; on the avg row: the extra time of a flush step over a non-flush step, and that cost's share of the average step."""
    for r in rows:
        if r["variant"] == "spec-conventional":
            r["x_note"] = SPEC_CONVENTIONAL_NOTE
    by_phase = {r["phase"]: r for r in rows if r["status"] == "ok"}
    avg, flush, nonflush = by_phase.get("avg"), by_phase.get("flush"), by_phase.get("nonflush")
    if avg and flush and avg.get("window"):
        base = nonflush["us"] if nonflush else 0.0
        cost_us = flush["us"] - base
        avg["x_flush_us"] = flush["us"]
        avg["x_nonflush_us"] = nonflush["us"] if nonflush else None
        avg["x_flush_cost_us"] = cost_us
        avg["x_flush_share"] = cost_us / avg["window"] / avg["us"] if avg["us"] else None
    return rows


def _baseline(row: dict[str, Any], rows: list[dict[str, Any]], variant: str, draft: int = 0, state_dtype: str | None = None) -> dict[str, Any] | None:
    """The avg row of `variant` (at `draft`) of the same preset, batch, io dtype, tp and source; the same state dtype
    and rounding as `row` unless `state_dtype` names another (an fp32 state's, rounded to nearest: stored exactly)."""
    want = {k: row.get(k) for k in ("preset", "batch", "state_dtype", "io_dtype", "tp", "source")}
    rounding = rounding_of(row)
    if state_dtype is not None:
        want["state_dtype"] = state_dtype
        rounding = rounding_for(state_dtype, rounding)
    for r in rows:
        if (
            r["variant"] == variant
            and r["phase"] == "avg"
            and r["status"] == "ok"
            and r.get("draft", 0) == draft
            and all(r.get(k) == v for k, v in want.items())
            and rounding_of(r) == rounding
        ):
            return r
    return None


def _twin(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The same configuration's row rounded to nearest (same variant, window, draft, dtypes and source)."""
    from replayssm_cli.measure.grid import config_key

    want = config_key({**row, "rounding": "nearest"})
    return next((r for r in rows if r.get("status") == "ok" and config_key(r) == want), None)


def attach_speedup(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """speedup (per token, with a range from the quartiles) over the row's own baseline, named in speedup_over.

    ReplaySSM and baseline kernels: over the conventional step at the same state precision ("conventional"); split
    precision: over the fp32 conventional step ("fp32-conventional"; the same-precision one where the run has no
    fp32 conventional row); spec-replay: over the snapshot-writing spec-conventional step at the same draft width
    ("snapshots"). A row at the same rounding: a stochastically rounded step over the stochastically rounded
    conventional step. Speculative rows also get speedup_vs_decode, over plain conventional decode; every row of a
    16-bit or 8-bit state, or of stochastic rounding, gets speedup_vs_fp32, over the fp32 conventional step where the
    run measured one (a conventional row too: what the precision alone gains); a stochastically rounded row gets
    x_vs_nearest, its µs per token over the same configuration's rounded to nearest (above 1: what the rounding
    costs). Conventional and spec-conventional rows are baselines (speedup None). A baseline row also gets x_vs_ours: its µs per token over
    that of our kernel of the variant it competes with (same window), so above 1 ours is faster.
    """
    for key in ("speedup", "speedup_over", "speedup_lo", "speedup_hi", "speedup_vs_decode", "speedup_vs_fp32"):
        row.setdefault(key, None)
    if row["status"] != "ok":
        return
    if row.get("state_dtype") not in (None, "fp32") and not row.get("read_dtype"):
        fp32 = _baseline(row, rows, "conventional", state_dtype="fp32")
        if fp32 is not None:
            row["speedup_vs_fp32"] = fp32["us_per_token"] / row["us_per_token"]
    if rounding_of(row) == "stochastic":
        nearest = _twin(row, rows)
        if nearest is not None:
            row["x_vs_nearest"] = row["us_per_token"] / nearest["us_per_token"]
    if row["variant"] == "conventional":
        return
    conv = _baseline(row, rows, "conventional")
    if row["variant"] in ("spec-conventional", "spec-replay"):
        if conv is not None:
            row["speedup_vs_decode"] = conv["us_per_token"] / row["us_per_token"]
        snap = _baseline(row, rows, "spec-conventional", row.get("draft", 0)) if row["variant"] == "spec-replay" else None
        if snap is not None:
            _ratio(row, snap, "snapshots")
        return
    if row["variant"] == "split":
        fp32 = _baseline(row, rows, "conventional", state_dtype="fp32")
        if fp32 is not None:
            _ratio(row, fp32, "fp32-conventional")
            return
    if conv is not None:
        _ratio(row, conv, "conventional")
    if row["variant"].startswith("baseline:") and row.get("x_competes"):
        ours = next((r for r in rows if r["variant"] == row["x_competes"] and r["window"] == row.get("window")
                     and _baseline(row, [r], r["variant"]) is not None), None)
        if ours is not None:
            row["x_vs_ours"] = row["us_per_token"] / ours["us_per_token"]
            row["x_ours_us"] = ours["us_per_token"]


def _ratio(row: dict[str, Any], base: dict[str, Any], over: str) -> None:
    tok, btok = row["tokens_per_step"], base["tokens_per_step"]
    row["speedup"] = base["us_per_token"] / row["us_per_token"]
    row["speedup_over"] = over
    if row.get("x_us_p75") and base.get("x_us_p25"):
        row["speedup_lo"] = (base["x_us_p25"] / btok) / (row["x_us_p75"] / tok)
        row["speedup_hi"] = (base["x_us_p75"] / btok) / (row["x_us_p25"] / tok)
    else:
        row["speedup_lo"] = row["speedup_hi"] = row["speedup"]


@dataclass
class ProfileRun:
    """What a run did: the results (as written), everything skipped with its reason, and whether it was cut short."""

    results: Any
    path: Path
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    largest_fit: dict[str, int] = field(default_factory=dict)
    interrupted: bool = False
    stop_signal: str | None = None
    mode: str = "predicted"
    gpu_name: str = ""
    ceilings: Any = None
    layers_of: dict[str, int] = field(default_factory=dict)
    # the presets the run resolved (from names or files), as the rows name them
    presets: list[Any] = field(default_factory=list)


Runner = Callable[[Point, dict[str, Any]], list[dict[str, Any]]]


def run_grid(
    points: list[Point],
    presets: dict[str, Any],
    writer: Any,
    *,
    mode: str,
    ceilings: Any,
    free_bytes: int | None,
    runner: Runner | None = None,
    context: dict[str, Any] | None = None,
    progress: bool = True,
    on_close: Callable[[], dict[str, Any]] | None = None,
) -> ProfileRun:
    """Run every point, writing rows as they finish; an out-of-memory point is skipped, Ctrl-C closes the file incomplete.

    mode is "measured" (each point through `runner`, bench.run_point by default) or "predicted"
    (the cost model and `ceilings`). on_close gives environment entries known only at the end (clocks).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.console import err

    if mode == "measured" and runner is None:
        from replayssm_cli.measure import bench

        runner = bench.run_point
    run = ProfileRun(results=writer.results, path=writer.results.path)
    done: set[str] = set()
    bar = Progress(
        TextColumn("[bold]profile[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        console=err, transient=True, disable=not progress or not err.is_terminal,
    )
    # Where stderr is no terminal (a log, CI), plain lines instead of the bar: at most one every LOG_EVERY_S, and the last.
    log = progress and not err.is_terminal
    started = last_line = time.monotonic()
    try:
        with bar, stop_signals_interrupt():
            task = bar.add_task("", total=len(points))
            for i, point in enumerate(points, 1):
                bar.update(task, description=point.label())
                _run_point(point, presets[point.preset], writer, run, mode, ceilings, free_bytes, runner, context or {})
                done.add(point.label())
                bar.advance(task)
                now = time.monotonic()
                if log and (now - last_line >= LOG_EVERY_S or i == len(points)):
                    err.print(f"profile: {i}/{len(points)} done, {now - started:.0f} s: {point.label()}", highlight=False, soft_wrap=True)
                    last_line = now
    except KeyboardInterrupt as exc:
        run.interrupted = True
        run.stop_signal = getattr(exc, "signal_name", "SIGINT")
        # The skipped list and the closing write happen once, with a second Ctrl-C or SIGTERM held off until done.
        with signals_held():
            for point in points:
                if point.label() not in done:
                    writer.skip(point.label(), INTERRUPTED)
            _finish(writer, on_close)
            run.results = writer.close(complete=False)
        run.skipped = list(run.results.skipped)
        return run
    _finish(writer, on_close)
    run.results = writer.close(complete=True)
    run.skipped = list(run.results.skipped)
    return run


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is as Ctrl-C's KeyboardInterrupt is, so that both stop a run the same way."""

    signal_name = "SIGTERM"


@contextlib.contextmanager
def stop_signals_interrupt():
    """While the block runs (in the main thread), SIGTERM raises Terminated, as Ctrl-C raises KeyboardInterrupt."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def signals_held():
    """Ctrl-C and SIGTERM ignored while the block runs (the final write of a stopped run), in the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _finish(writer: Any, on_close: Callable[[], dict[str, Any]] | None) -> None:
    if on_close is not None:
        try:
            writer.results.environment.update(on_close())
        except Exception as exc:
            writer.results.environment["x_close_error"] = f"{type(exc).__name__}: {exc}"


def does_not_fit(point: Point, preset: Any, free_bytes: int | None, gpu: str) -> str | None:
    """Why a predicted point could not run on the GPU it is predicted for (one layer's cache for the batch is past its
    memory, where a measured run would be out of memory), else None."""
    if not free_bytes:
        return None
    per_seq = memory_fields(point, preset, free_bytes)["mem_per_seq"]
    if point.batch * per_seq <= free_bytes:
        return None
    model = f"; all {preset.ssm_layers} SSM layers hold {free_bytes // (per_seq * preset.ssm_layers):,}" if preset.ssm_layers > 1 else ""
    return (f"does not fit on the {gpu}: one layer's state and buffers for batch {point.batch:,} take "
            f"{point.batch * per_seq / 2**30:,.0f} GiB of its {free_bytes / 2**30:,.0f} (at most {free_bytes // per_seq:,} "
            f"sequences{model})")


def _run_point(point, preset, writer, run: ProfileRun, mode, ceilings, free_bytes, runner, context) -> None:
    if mode == "predicted" and (why := does_not_fit(point, preset, free_bytes, context.get("gpu", "h200"))):
        writer.skip(point.label(), why)
        return
    try:
        if mode == "predicted":
            rows = predicted_rows(point, preset, ceilings, free_bytes, gpu=context.get("gpu", "h200"), reference=context.get("reference"))
        else:
            rows = measured_rows(point, preset, runner(point, context), ceilings, free_bytes)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if is_oom(exc):
            why = f"out of memory at batch {point.batch}"
        else:
            text = str(exc).splitlines()[0] if str(exc) else ""
            why = f"{type(exc).__name__}: {text}"
        writer.skip(point.label(), why)
        return
    for row in rows:
        attach_speedup(row, writer.rows)
        writer.add(row)
        if row["status"] == "failed" and point.label() not in run.failed:
            run.failed.append(point.label())
    if rows and rows[0]["status"] == "ok":
        key = f"{point.preset} {point.variant}"
        run.largest_fit[key] = max(run.largest_fit.get(key, 0), point.batch)


def run_profile(
    spec: ProfileSpec,
    *,
    out: str | Path | None = None,
    predict: bool = False,
    require_gpu: bool = False,
    gpu: str | None = None,
    progress: bool = True,
    runner: Runner | None = None,
) -> ProfileRun:
    """Validate the spec, plan the grid, measure it on the CUDA GPU (or predict it for `gpu`), write the results file.

    Without a CUDA GPU (or with predict) the rows come from the cost model and the ceilings of `gpu`
    (default h200), marked predicted; require_gpu makes a missing GPU a UserError instead. Rows are
    written to `out` (default ./runs/<time>-<gpu>.json) as they finish. Returns what was run, with the
    loaded results; an interrupted run comes back with interrupted=True and an incomplete file.
    """
    from replayssm_cli.model import presets as presets_mod
    from replayssm_cli.report import results as results_mod

    spec.validate()
    resolved = [presets_mod.resolve(name, spec.tp) for name in spec.presets]
    mode = "predicted" if predict else detect_mode(require_gpu)
    left_out: list[dict[str, str]] = []
    points = plan(spec, resolved, left_out, usable_baselines(spec, resolved, mode, left_out))
    if not points:
        raise UserError("the options leave nothing to profile", "; ".join(f"{s['what']}: {s['why']}" for s in left_out))
    setup = predicted_setup(gpu) if mode == "predicted" else measured_setup(gpu, spec)
    path = Path(out) if out else results_mod.default_out(setup["gpu_key"])
    spec_doc = {**spec.to_dict(), "mode": mode, "gpu": setup["gpu_key"], "presets_resolved": [p.name for p in resolved]}
    try:
        writer = results_mod.ResultsWriter(path, setup["environment"], spec_doc, exclusive=not out)
    except FileExistsError:
        raise UserError(f"the results file {path} was created by another run meanwhile", "run again (names are unique per run)") from None
    except OSError as exc:
        raise UserError(f"cannot write the results file {path} ({exc.strerror or exc})", "pass a writable --out") from None
    if writer.replaced:
        from replayssm_cli.console import note

        note(f"replacing the results file {path} of an earlier run")
    for s in left_out:
        writer.skip(s["what"], s["why"])
    sampler = setup.get("sampler")
    try:
        with sampler if sampler is not None else contextlib.nullcontext():
            run = run_grid(
                points, {p.name: p for p in resolved}, writer, mode=mode, ceilings=setup["ceilings"],
                free_bytes=setup["free_bytes"], runner=runner, context=setup.get("context"), progress=progress,
                on_close=(lambda: {"clocks": sampler.summary()}) if sampler is not None else None,
            )
    finally:
        writer.release()
    run.mode, run.gpu_name, run.ceilings = mode, setup["gpu_name"], setup["ceilings"]
    run.layers_of = {p.name: p.ssm_layers for p in resolved}
    run.presets = resolved
    return run


def usable_baselines(spec: ProfileSpec, presets: list[Any], mode: str, left_out: list[dict[str, str]]) -> list[Any]:
    """The baselines asked for that import here and have a preset of their op; the others go to `left_out` with why.

    Baselines are measured only: a predicted profile leaves them all out, in one entry.
    """
    from replayssm_cli.measure import baselines

    if not spec.baselines:
        return []
    if mode == "predicted":
        left_out.append({"what": "baselines", "why": "outside kernels are measured, not predicted: they need a CUDA GPU"})
        return []
    ops = {p.kind for p in presets}
    explicit = baselines.ALL not in spec.baselines
    usable = []
    for bl in baselines.resolve(spec.baselines):
        if bl.op not in ops:
            if explicit:
                left_out.append({"what": f"baseline:{bl.name}", "why": f"it runs {bl.op} layers and no {bl.op} preset is profiled"})
            continue
        ok, why = bl.available()
        if ok:
            usable.append(bl)
        else:
            left_out.append({"what": f"baseline:{bl.name}", "why": why})
    return usable


def detect_mode(require_gpu: bool) -> str:
    """'measured' where torch sees a CUDA GPU; otherwise 'predicted' with one line on stderr, or a UserError with require_gpu."""
    import torch

    if torch.cuda.is_available():
        return "measured"
    if require_gpu:
        raise UserError("no CUDA GPU is available and --require-gpu was given", "run on a machine with an NVIDIA GPU, or drop --require-gpu")
    from replayssm_cli.console import note

    note("no CUDA GPU: writing the profile predicted for --gpu by the cost model calibrated on the shipped H200 measurements "
         "(every row marked predicted; --require-gpu makes this an error)")
    return "predicted"


def _environment() -> dict[str, Any]:
    from replayssm_cli.measure.environment import cuda_runtime, software

    return {**software(), **cuda_runtime()}


def _plain(obj: Any) -> Any:
    return asdict(obj) if is_dataclass(obj) else obj


def predicted_setup(gpu: str | None) -> dict[str, Any]:
    """Environment, ceilings and free memory of a GPU named by its spec (default h200), for predicted rows."""
    from replayssm_cli.model import gpus

    spec = gpus.load_gpu(gpu or "h200")
    ceilings = gpus.ceilings_for(spec)
    env = _environment()
    env.update(
        mode="predicted",
        gpu={"name": spec.name, "key": spec.key, "memory_gib": spec.memory_gib, "l2_mib": spec.l2_mib, "sm_count": spec.sm_count, "source": "spec"},
        ceilings=_plain(ceilings),
    )
    from replayssm_cli.model import calibration

    context = {"gpu": spec.key, "reference": calibration.reference_index(spec.key)}
    return {"environment": env, "ceilings": ceilings, "free_bytes": int(spec.memory_gib * 2**30), "gpu_key": spec.key,
            "gpu_name": spec.name, "context": context}


def measured_setup(gpu: str | None, spec: ProfileSpec) -> dict[str, Any]:
    """Environment (software, CUDA, the detected GPU, its ceilings), free memory, the clock sampler and the runner's context."""
    import torch

    from replayssm_cli.measure import energy
    from replayssm_cli.model import gpus
    from replayssm_cli.console import warn

    if gpu:
        warn("--gpu names the GPU to predict for; on a GPU the detected one is measured (add --predict to predict instead)")
    detected = gpus.detect()
    gspec = detected.spec
    ceilings = gpus.ceilings_for(gspec, detected) if gspec is not None else gpus.cached_ceilings(detected.name, detected.driver)
    if ceilings is None:
        warn(f"{detected.name} has no spec file and no measured ceilings: % of ceiling is left empty (run `replayssm gpu --measure`)")
    elif ceilings.source == "datasheet":
        warn("no measured ceilings for this GPU and driver: % of ceiling uses the datasheet bandwidth (run `replayssm gpu --measure` first)")
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    l2 = getattr(props, "L2_cache_size", 0) or int((gspec.l2_mib if gspec else 50) * 2**20)
    env = _environment()
    env.update(
        mode="measured",
        gpu={
            **detected.to_dict(),
            "key": gspec.key if gspec else None,
            "memory_total": total,
            "memory_free": free,
            "sm_count": props.multi_processor_count,
            "l2_bytes": l2,
        },
        ceilings=_plain(ceilings),
    )
    return {
        "environment": env,
        "ceilings": ceilings,
        "free_bytes": free,
        "gpu_key": gspec.key if gspec else "gpu",
        "gpu_name": detected.name,
        "sampler": gpus.ClockSampler(required=False),
        "context": {"device": "cuda", "l2_bytes": l2, "repeats": spec.repeats, "windows_per_graph": spec.windows_per_graph, "seed": spec.seed,
                    "energy": energy.Session.start() if spec.energy else None},
    }


def check_reference(gpu_key: str = "h200") -> list[dict[str, Any]]:
    """Every speedup the shipped reference of `gpu_key` holds (newest file per configuration, our kernels) beside the
    speedup a no-GPU profile of the same grid predicts: dicts with the row's configuration, file, measured, predicted
    and error (predicted / measured - 1)."""
    from replayssm_cli.model import calibration
    from replayssm_cli.model import presets as presets_mod
    from replayssm_cli.report import results

    merged = results.load_reference(gpu_key)
    if merged is None:
        return []
    wanted = {calibration.reference_key(r): r for r in merged.rows
              if r.get("kind") == "kernel" and r.get("speedup") is not None and r["variant"] in calibration.VARIANTS}
    fields = set(ProfileSpec.__dataclass_fields__)
    out = []
    for profile in results.reference_profiles(gpu_key):
        mine = [k for k, r in wanted.items() if r["x_origin"]["file"] == profile.path.name]
        if not mine:
            continue
        spec = ProfileSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in profile.spec.items() if k in fields})
        presets = {name: presets_mod.resolve(name, spec.tp) for name in spec.presets}
        rows: list[dict[str, Any]] = []
        for point in plan(replace(spec, baselines=()), list(presets.values())):
            for row in predicted_rows(point, presets[point.preset], None, None, gpu=gpu_key):
                attach_speedup(row, rows)
                rows.append(row)
        predicted = {calibration.reference_key({**r, "source": "measured"}): r for r in rows}
        for key in mine:
            measured, got = wanted[key], predicted.get(key)
            speedup = got.get("speedup") if got else None
            out.append({
                **{k: measured.get(k) for k in ("op", "preset", "variant", "phase", "batch", "window", "state_dtype",
                                                 "read_dtype", "draft", "speedup_over")},
                "file": profile.path.name, "measured": measured["speedup"], "predicted": speedup,
                "error": speedup / measured["speedup"] - 1 if speedup else None,
            })
    return out
