"""What `replayssm tune` does: each candidate's time (a results file, the shipped reference, a prediction or a
measured profile), its quality and memory, the decisions and the report, and the tables that show them."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replayssm_cli.errors import UserError
from replayssm_cli.model.dtypes import StateDtype

# A non-terminal progress log prints at most one line this often (seconds), and the last one always.
LOG_EVERY_S = 2.0
# Graph replays a candidate is first timed with on the GPU; the profile's full count only where that leaves it close
# to the best and noisier than a repeat measurement's floor.
QUICK_REPEATS = 5
STATE_DTYPES = tuple(d.value for d in StateDtype)
MAX_WINDOW = 64
MAX_DRAFT = 8
WIDE = 200


def _check_options(batches, windows, drafts, accept_rate, error_budget, memory_budget, steps, heads, tp) -> None:
    for b in batches:
        if b < 1:
            raise UserError(f"--batch {b} is not a batch size", "batch sizes are positive integers, e.g. --batch 1,64,256")
    for w in windows:
        if not 1 <= w <= MAX_WINDOW:
            raise UserError(f"--window {w} is out of range", f"the window W takes 1 to {MAX_WINDOW}")
    for t in drafts:
        if not 1 <= t <= MAX_DRAFT:
            raise UserError(f"--draft {t} is out of range", f"speculative widths take 1 to {MAX_DRAFT}")
    if not 0 < accept_rate <= 1:
        raise UserError(f"--accept-rate {accept_rate} is not a probability in (0, 1]", "e.g. --accept-rate 0.8")
    if not error_budget > 0:
        raise UserError(f"--error-budget {error_budget} must be positive", "e.g. --error-budget 1e-3")
    if not error_budget <= 1:
        raise UserError(f"--error-budget {error_budget} is not a relative error", "pass a value in (0, 1], e.g. --error-budget 1e-3")
    if memory_budget is not None and not 0 < memory_budget < math.inf:
        raise UserError(f"--memory-budget {memory_budget} must be a positive, finite number of GiB", "e.g. --memory-budget 40")
    if steps < 1:
        raise UserError(f"--steps {steps} must be at least 1", "e.g. --steps 4096")
    if heads < 1:
        raise UserError(f"--heads {heads} must be at least 1", "e.g. --heads 4")
    if tp < 1:
        raise UserError(f"--tp {tp} is not a tensor-parallel degree", "pass a positive integer")


def _print_engines(p, decisions) -> None:
    from replayssm_cli.advise import engine_flags, verdict
    from replayssm_cli.console import out

    text = [w for line in engine_flags.lines(p.kind, decisions) for w in verdict.wrap(line, indent="      ")]
    out.print("\n" + "\n".join(text), highlight=False, markup=False, soft_wrap=True)


def _print_verdict(p, source, lines, error_budget, budget_note, baseline, drafts) -> None:
    from replayssm_cli.advise import verdict
    from replayssm_cli.console import out

    title = f"replayssm tune: {p.name}" + (f" (tp {p.tp})" if p.tp != 1 else "") + f" on {source['gpu']}: does ReplaySSM pay?"
    over = (f"Kernel speedup over conventional {baseline} at the same batch, with its interval"
            + ("; verify rows over the snapshot-writing verify." if drafts else "."))
    notes = [*verdict.column_notes(error_budget, p.ssm_layers, budget_note), f"times: {source['describe']}."]
    text = verdict.render(lines, title=title, over=over, notes=notes)
    out.print(text, highlight=False, markup=False, soft_wrap=True)


def _gpu_total_memory() -> int | None:
    import torch

    try:
        return int(torch.cuda.get_device_properties(0).total_memory)
    except (RuntimeError, AssertionError):
        return None


def _check_out(path: Path) -> None:
    """Refuse, before any work, an --out that cannot be written or that would replace something not a report."""
    import json

    path = Path(path)
    if str(path) in ("", "-"):
        raise UserError(f"--out {str(path)!r} is not a file name", "pass a file path, e.g. --out tune.json")
    if path.is_dir():
        raise UserError(f"--out {path} is a directory", "pass a file path inside it, e.g. --out tune.json")
    if path.exists():
        if not path.is_file():
            raise UserError(f"--out {path} is not a regular file", "pass a new file path")
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            doc = None
        if not (isinstance(doc, dict) and "decisions" in doc and "verdict" in doc):
            raise UserError(f"--out {path} exists and is not a tune report; it is not overwritten", "pass a new file path")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"--out {path}: the directory {parent} does not exist", "create it first, or pass another path")
    import os

    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"--out {path} cannot be written (permission denied)", "pass a writable path")


def _write_report(path: Path, report: dict[str, Any]) -> None:
    from replayssm_cli.console import note
    from replayssm_cli.report.results import write_atomic

    try:
        write_atomic(Path(path), report)
    except OSError as exc:
        raise UserError(f"cannot write {path} ({exc.strerror or exc})", "pass a writable --out") from None
    note(f"report: {path}")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _timing_source(p, preset_arg: str, cands, batches, results: Path | None, gpu: str | None, io: str | None, accept_rate: float,
                   measured_only: bool = False, allowed=None, energy: bool = False, pool=None,
                   then_compile=None) -> dict[str, Any]:
    """Where candidate times come from: a results file (predicting what it lacks unless measured_only), a measurement
    here (with NVML's energy when `energy`, its kernels compiled beside the timed runs by `pool`), the shipped
    H200 reference profile when there is no GPU and the GPU is the H200, or the cost model. "energy_rows" are the
    measured rows with energy figures the verdict reads: the file's, this run's, or the shipped H200 energy profiles
    beside the reference."""
    from replayssm_cli.model import gpus
    from replayssm_cli.advise import tuner
    from replayssm_cli.report import results as results_mod
    from replayssm_cli.console import note

    cuda = _cuda_available()
    if results is not None:
        res = results_mod.load(results)
        rows = _annotated(res, _preset_rows(res, p))
        if not rows:
            have = sorted({str(r.get("preset")) for r in res.rows})
            raise UserError(f"results file {results} has no rows for preset {p.name}", f"it has: {', '.join(have) or 'no rows'}")
        _check_file_gpu(res, results, gpu)
        if not res.complete:
            from replayssm_cli.console import err

            err.print(f"[yellow]warning:[/] {results} is incomplete (its run was cut short): its {len(rows)} rows for "
                      f"{p.name} are used, the configurations it lacks are predicted", highlight=False, soft_wrap=True)
        found = _from_results(p, cands, res, rows, "results", f"times from {results}", str(results), gpu, io, measured_only,
                              cuda)
        found["e2e_rows"] = _annotated(res, [r for r in res.rows if r.get("kind") == "e2e"])
        found["energy_rows"] = rows
        return found
    io_used = io or "bf16"
    if cuda:
        rows, gpu_name, mem, path = _measure(p, preset_arg, cands, batches, io_used, accept_rate,
                                             allowed=allowed(io_used) if allowed else None, energy=energy,
                                             pool=pool, then_compile=then_compile)
        note(f"measured results: {path}")

        def timing(c, b):
            return tuner.timing_from_rows(rows, c, b, preset=p.name, io_dtype=io_used)

        return {
            "mode": "measured", "describe": f"measured on this {gpu_name} (results in {path})", "results_file": str(path),
            "gpu": gpu_name, "timing": timing, "io_dtype": io_used, "cuda": True, "memory_bytes": mem, "energy_rows": rows,
        }
    spec = gpus.load_gpu(gpu or "h200")
    if spec.key == "h200":
        ref = results_mod.load_reference("h200")
        merged = _reference_rows("h200") if ref is not None else []
        rows = [r for r in merged if r.get("preset") == p.name and r.get("kind", "kernel") == "kernel"]
        if rows:
            note(f"no CUDA GPU here: times from the shipped {spec.name} reference profile ({ref.path}), the candidates it "
                 "lacks predicted (--gpu picks another GPU)")
            found = _from_results(p, cands, ref, rows, "reference", f"times from the shipped {spec.name} reference profile",
                                  str(ref.path), None, io, False, cuda)
            found["e2e_rows"] = [r for r in merged if r.get("kind") == "e2e"]
            found["energy_rows"] = results_mod.energy_reference_rows("h200")
            return found
    ceilings = gpus.ceilings_for(spec)
    note(f"no CUDA GPU here: predicting every time from the cost model and the {spec.name} {ceilings.source} figures (--gpu picks another)")

    def predicted(c, b):
        return _predict(p, c, b, ceilings, io_used)

    return {
        "mode": "predicted", "describe": f"predicted from the cost model and the {spec.name} {ceilings.source} ceilings, nothing measured",
        "gpu": spec.name, "timing": predicted, "io_dtype": io_used, "cuda": False, "memory_bytes": int(spec.memory_gib * 2**30),
    }


def _preset_rows(res, p) -> list[dict[str, Any]]:
    return [r for r in res.rows if r.get("preset") == p.name and r.get("kind", "kernel") == "kernel"]


def _annotated(res, rows) -> list[dict[str, Any]]:
    """Copies of rows that say which file they came from (x_origin, as a merged reference's rows do)."""
    from replayssm_cli.report import results as results_mod

    origin = results_mod.origin_of(res)
    return [r if isinstance(r.get("x_origin"), dict) else {**r, "x_origin": origin} for r in rows]


def _reference_rows(gpu_key: str) -> list[dict[str, Any]]:
    """The shipped reference rows of one GPU, each configuration from the newest file that measured it, each
    row saying which file that was (x_origin)."""
    from replayssm_cli.report import results as results_mod

    ref = results_mod.load_reference(gpu_key)
    return list(ref.rows) if ref is not None else []


def _check_file_gpu(res, path: Path, gpu: str | None) -> None:
    """--gpu with a results file measured on another GPU is an error: its times are that GPU's."""
    from replayssm_cli.model import gpus

    if not gpu:
        return
    env_gpu = res.environment.get("gpu") if isinstance(res.environment.get("gpu"), dict) else {}
    wanted = gpus.load_gpu(gpu)
    spec = _file_gpu(env_gpu)
    if spec is not None and spec.key != wanted.key:
        raise UserError(
            f"results file {path} was measured on {env_gpu.get('name') or spec.name}, not the {wanted.name} that --gpu names",
            f"drop --gpu to tune for the {spec.name}, or pass a results file measured on the {wanted.name}",
        )


def _from_results(p, cands, res, rows, mode: str, describe: str, results_file: str, gpu: str | None, io: str | None,
                  measured_only: bool, cuda: bool) -> dict[str, Any]:
    """Times from a loaded results file's rows for the preset, and (unless measured_only) predictions for the
    candidates it lacks, scaled by how far its measured candidates of the same variant and batch ran from their
    predictions."""
    from replayssm_cli.model import gpus
    from replayssm_cli.advise import tuner

    io_used = io or _most_common(r.get("io_dtype") for r in rows) or "bf16"
    env_gpu = res.environment.get("gpu") if isinstance(res.environment.get("gpu"), dict) else {}
    spec = gpus.load_gpu(gpu) if gpu else _file_gpu(env_gpu)
    # The ceilings that predict what the file lacks: none with measured_only; else the file's measured ones,
    # unless --gpu names another GPU or the file has none (then the datasheet's).
    ceilings = None
    if not measured_only:
        if isinstance(res.environment.get("ceilings"), dict) and not gpu:
            ceilings = gpus.Ceilings.from_dict(res.environment["ceilings"])
        elif spec is not None:
            ceilings = gpus.datasheet_ceilings(spec)
    gpu_name = env_gpu.get("name") or (spec.name if spec else "unknown GPU")

    def measured(c, b):
        return tuner.timing_from_rows(rows, c, b, preset=p.name, io_dtype=io_used)

    def timing(c, b):
        t = measured(c, b)
        if t is not None or ceilings is None:
            return t
        if spec is not None:
            seen = c.window is None or any(r.get("window") == c.window and r.get("variant") == c.variant for r in rows)
            t = _calibrated_prediction(p, c, b, spec.key, io_used, unmeasured=None if seen else f"W{c.window} never measured")
            if t is not None:
                return t
        t = _predict(p, c, b, ceilings, io_used)
        if t is None:
            return None
        same = [o for o in cands if _family(o) == _family(c) and o.draft == c.draft]
        pairs = [(m, q) for o in same if (m := measured(o, b)) and m.source == "measured" and (q := _predict(p, o, b, ceilings, io_used))]
        return tuner.calibrated(t, pairs, f"{_family(c)} at batch {b}")

    what = describe + (
        "; candidates it lacks are not timed (--measured-only)" if measured_only else
        "; candidates it lacks predicted (calibrated on the shipped H200 measurements where a calibration holds "
        f"their kernel, else the cost model over the {ceilings.source} ceilings scaled by measured neighbours)" if ceilings else ""
    )
    return {
        "mode": mode, "describe": what, "results_file": results_file, "gpu": gpu_name, "timing": timing,
        "io_dtype": io_used, "cuda": cuda, "memory_bytes": _gpu_memory(env_gpu, spec),
    }


def _calibrated_prediction(p, c, b, gpu_key: str, io: str, unmeasured: str | None = None):
    """The calibrated predictor's time for a candidate on a GPU (None where no calibration holds its kernel).
    `unmeasured` says what of the candidate no measurement covered (its window): then it counts as borrowed."""
    from replayssm_cli.model import calibration
    from replayssm_cli.advise import tuner

    try:
        pred = calibration.predict_step(p, c.variant, batch=b, window=c.window if c.is_replay else None,
                                        state_dtype=c.state_dtype, read_dtype=c.read_dtype, io_dtype=io, draft=c.draft,
                                        accepted=c.accepted if c.draft else None, gpu=gpu_key,
                                        rounding=c.rounding)
    except (ValueError, KeyError):
        return None
    if pred.method != "calibrated" or pred.error is None:
        return None
    row = {"source": "predicted", "x_prediction": pred.x_prediction()}
    per_token = pred.us / (1.0 + (c.accepted or 0.0)) if c.draft else pred.us
    # Its interval is the fit's error, never narrower than a repeat measurement's, nor than BORROWED_ERROR where
    # the efficiency is another configuration's.
    borrowed = [x for x in (pred.basis, unmeasured) if x]
    error = max(pred.error, tuner.MIN_SPREAD, tuner.BORROWED_ERROR if borrowed else 0.0)
    origin = ", ".join([_prediction_label(row), *borrowed])
    return tuner.Timing(pred.us, per_token, 2 * error, "predicted", note=pred.basis or "", origin=origin)


def _prediction_label(row) -> str:
    from replayssm_cli.report import provenance

    return provenance.prediction_label(row, error=False).removeprefix("predicted (").removesuffix(")")


def _family(c) -> str:
    """Kernels that miss their predictions alike: split is replay reading a narrower copy."""
    return "replay" if c.variant == "split" else c.variant


def _predict(p, c, b, ceilings, io: str):
    from replayssm_cli.advise import tuner

    try:
        return tuner.predicted_timing(p.shape, c, b, ceilings, io_dtype=io, has_z=p.has_z)
    except ValueError:
        return None


def _most_common(values) -> str | None:
    counts: dict[str, int] = {}
    for v in values:
        if v:
            counts[v] = counts.get(v, 0) + 1
    return max(counts, key=counts.get) if counts else None


def _file_gpu(env_gpu: dict[str, Any]):
    """The spec of the GPU a results file was measured on, when there is one."""
    from replayssm_cli.model import gpus

    if env_gpu.get("key") in gpus.gpu_keys():
        return gpus.load_gpu(env_gpu["key"])
    return gpus.match_spec(env_gpu["name"]) if env_gpu.get("name") else None


def _gpu_memory(env_gpu: dict[str, Any], spec) -> int | None:
    if env_gpu.get("memory_total"):
        return int(env_gpu["memory_total"])
    if env_gpu.get("memory_gib"):
        return int(env_gpu["memory_gib"] * 2**30)
    return int(spec.memory_gib * 2**30) if spec is not None else None


def _memory_budget(gib: float | None, source: dict[str, Any]) -> tuple[float | None, str]:
    if gib is not None:
        return gib * 2**30, f"{gib:g} GiB (--memory-budget)"
    mem = source.get("memory_bytes")
    if mem:
        return float(mem), f"{mem / 2**30:.0f} GiB, the whole GPU ({source['gpu']}); pass --memory-budget for what weights and KV cache leave"
    return None, "none (GPU memory unknown; pass --memory-budget)"


class NotInReach(Exception):
    """A configuration the model puts out of reach of the best: the profiler records it as skipped, with this reason."""


def _run_point(point, context):
    from replayssm_cli.measure import bench

    return bench.run_point(point, context)


def _point_candidate(point, by_key):
    """The candidate a profile point times, or None."""
    key = (point.variant, point.state_dtype, point.window if point.variant in ("replay", "split", "spec-replay") else None,
           point.read_dtype, point.draft, point.rounding)
    return by_key.get(key)


def _avg_stats(measurements) -> dict[str, float] | None:
    """Median and spread of a runner's window-average measurement, None where it failed."""
    from replayssm_cli.measure.timing import sample_stats

    m = next((m for m in measurements if m.get("phase", "avg") == "avg"), None)
    if m is None or not m.get("ok", True) or not m.get("samples_us"):
        return None
    return sample_stats(m["samples_us"])


def _close_and_noisy(measurements, best_hi: float | None) -> bool:
    """Whether a quick measurement needs the full repeats: its spread is wider than a repeat measurement's floor and
    its interval still reaches the best one's (so more samples could change the decision)."""
    from replayssm_cli.advise import tuner

    stats = _avg_stats(measurements)
    if stats is None or stats["spread"] <= tuner.MIN_SPREAD:
        return False
    return best_hi is None or stats["us"] * (1 - stats["spread"] / 2) <= best_hi


def _reach_model(p, cands, io: str):
    """How `tune` guesses times before measuring: the shipped H200 reference (calibrated predictions for what it
    lacks) on an H200, else the cost model over this GPU's datasheet; (timing function, what it is)."""
    import torch

    from replayssm_cli.model import gpus
    from replayssm_cli.report import results as results_mod

    try:
        name = torch.cuda.get_device_name(0)
    except (RuntimeError, AssertionError):
        name = ""
    spec = gpus.match_spec(name) if name else None
    if spec is not None and spec.key == "h200":
        ref = results_mod.load_reference("h200")
        rows = [r for r in _reference_rows("h200") if r.get("preset") == p.name and r.get("kind", "kernel") == "kernel"]
        if ref is not None and rows:
            found = _from_results(p, cands, ref, rows, "reference", "", "", None, io, False, True)
            return found["timing"], "the shipped H200 reference profile"
    if spec is None:
        return (lambda c, b: None), "nothing (an unknown GPU: every candidate is measured)"
    ceilings = gpus.datasheet_ceilings(spec)
    return (lambda c, b: _predict(p, c, b, ceilings, io)), f"the cost model over the {spec.name} datasheet"


def _measure(p, preset_arg: str, cands, batches, io: str, accept_rate: float, *, allowed=None, out: Path | None = None,
             energy: bool = False, pool=None, then_compile=None):
    """Time on this GPU, through the profiler, the candidates that `allowed` keeps and the model puts within reach
    of the best (tuner.within_reach); the rest are recorded as skipped with the reason. With `pool` (a
    precompile.Pool), the kernels of every point to time are queued to compile in its workers, in the order the points
    are timed, then `then_compile(io, candidates to time)` queues what follows; each point waits for its own compile and
    is timed with no worker on the GPU. The results file is written as rows finish. Returns (rows, GPU name, memory,
    path)."""
    from replayssm_cli.measure import grid
    from replayssm_cli.measure import profile as prof
    from replayssm_cli.advise import tuner
    from replayssm_cli.console import note

    guess, model = _reach_model(p, cands, io)
    measure: dict[int, set] = {}
    for b in batches:
        keep = [c for c in cands if allowed is None or allowed(c, b)]
        guessed = {c: guess(c, b) for c in keep}
        baseline = next((c for c in keep if c.variant == "conventional" and c.state_dtype == p.state_dtype), None)
        measure[b] = set(tuner.within_reach(guessed, always=[baseline] if baseline else []))
    total = sum(len(v) for v in measure.values())
    note(f"measuring {total} of {len(cands) * len(batches)} configurations: those within reach of the best by "
         f"{model}, within the error and memory budgets")
    by_key = {(c.variant, c.state_dtype, c.window if c.is_replay else None, c.read_dtype, c.draft, c.rounding): c for c in cands}
    ticker = Ticker("measure", total, "configurations")
    state = {"done": 0}

    best: dict[tuple[int, int], float] = {}

    def timed(point) -> bool:
        c = _point_candidate(point, by_key)
        return c is not None and c in measure.get(point.batch, ())

    def runner(point, context):
        if not timed(point):
            raise NotInReach("not measured: the model puts it out of reach of the best, or over a budget")
        group = (point.batch, point.draft)
        if pool is not None:
            pool.wait(point, on_wait=lambda: ticker.update(state["done"], f"compiling {point.label()} "
                                                                           f"({pool.compiled()}/{total} compiled)"))
            context = {**context, "alone": pool.alone}
        found = _run_point(point, {**context, "repeats": QUICK_REPEATS})
        if _close_and_noisy(found, best.get(group)):
            found = _run_point(point, context)
        stats = _avg_stats(found)
        if stats is not None:
            best[group] = min(best.get(group, math.inf), stats["us"] * (1 + max(stats["spread"], tuner.MIN_SPREAD) / 2))
        state["done"] += 1
        ticker.update(state["done"], point.label())
        return found

    specs = [_profile_spec(preset_arg, p, [c for c in cands if c.rounding == rounding], batches, io, accept_rate, rounding,
                           energy)
             # One profile per rounding the candidates store with (a profile rounds all its 16-bit and 8-bit states one way).
             for rounding in dict.fromkeys(c.rounding for c in cands)]
    if pool is not None:
        points = [pt for spec in specs for pt in grid.plan(spec, [p]) if timed(pt)]
        if not points:
            _close_pool(pool, cancel=True)
        else:
            pool.submit(points, seed=specs[0].seed)
            if then_compile is not None:
                then_compile(io, set().union(*measure.values()))
    rows: list[dict[str, Any]] = []
    for spec in specs:
        with ticker:
            run = prof.run_profile(spec, require_gpu=True, progress=False, runner=runner, out=out if not rows else None)
        if run.interrupted:
            raise UserError("interrupted while measuring", f"the rows finished so far are in {run.path}; pass it with --results")
        rows += run.results.rows
    gpu = run.results.environment.get("gpu") or {}
    return rows, run.gpu_name, gpu.get("memory_total"), run.path


def _profile_spec(preset_arg: str, p, group, batches, io: str, accept_rate: float, rounding: str, energy: bool):
    """The profile that times a group of candidates rounding one way: their windows, dtypes and drafts at every batch."""
    from replayssm_cli.measure import grid

    state_dtypes = {c.state_dtype for c in group}
    return grid.ProfileSpec(
        presets=(preset_arg,),
        batches=tuple(batches),
        windows=tuple(sorted({c.window for c in group if c.window})),
        # Split candidates read a copy of an fp32 checkpoint, so fp32 is profiled whenever a read dtype is.
        state_dtypes=tuple(d for d in STATE_DTYPES
                           if d in state_dtypes or (d == "fp32" and any(c.read_dtype for c in group))),
        read_dtypes=tuple(dict.fromkeys(c.read_dtype for c in group if c.read_dtype)),
        io_dtype=io,
        drafts=tuple(sorted({c.draft for c in group if c.draft})),
        accept_rate=accept_rate,
        tp=p.tp,
        phases=False,
        rounding=rounding,
        energy=energy,
    )


def _start_pool(spec: TuneSpec):
    """The pre-compile's workers, started as soon as tune knows it will measure on this GPU (no --results, a CUDA device,
    Triton compiling, not --no-precompile), so that their start-up overlaps the quality harness; else None."""
    from replayssm_cli.measure import precompile

    if spec.results is not None or not spec.precompile or not precompile.wanted():
        return None
    return precompile.Pool()


@contextlib.contextmanager
def _precompile_pool(spec: TuneSpec):
    """The pre-compile's pool (_start_pool) for a block: closed at its end with one line saying what it compiled, or at
    once on an error, its queued compiles dropped."""
    pool = _start_pool(spec)
    try:
        yield pool
    except BaseException:
        _close_pool(pool, cancel=True)
        raise
    _close_pool(pool)


def _close_pool(pool, *, cancel: bool = False) -> None:
    """Stop the pool's workers; one line says what they compiled (none when nothing was queued, or on an error)."""
    from replayssm_cli.console import err

    if pool is None:
        return
    done = pool.close(cancel=cancel)
    if done is not None and not cancel:
        err.print(done.line(), highlight=False, soft_wrap=True)


def _load_trace(path: Path | None, p):
    """The trace file, checked against the preset's kind; None without --trace."""
    if path is None:
        return None
    from replayssm_cli.measure import trace as trace_mod
    from replayssm_cli.console import note

    tr = trace_mod.read(path)
    if tr.op != p.kind:
        raise UserError(f"trace {path} is from a {tr.op} layer but preset {p.name} is {p.kind}", "record a trace of the preset's model")
    model_shape = p.full_shape or p.shape
    if tr.shape.label() != model_shape.label():
        note(f"trace {path} has shape {tr.shape.label()}, the preset {model_shape.label()}: quality runs the trace's dimensions")
    return tr


class Ticker:
    """Progress of one task: a rich bar on a terminal; elsewhere (a log, CI, nohup) plain lines on stderr, one per
    finished item but at most one every LOG_EVERY_S seconds, and always the last."""

    def __init__(self, what: str, total: int, unit: str):
        from replayssm_cli.console import err

        self.what, self.total, self.unit, self.console = what, total, unit, err
        self.terminal = err.is_terminal
        self.start = self.last = 0.0
        self.bar = None

    def __enter__(self) -> Ticker:
        import time

        self.start = self.last = time.monotonic()
        if self.terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn(f"[bold]{self.what}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.description}"), console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("", total=self.total)
        else:
            self.console.print(f"{self.what}: {self.total:,} {self.unit}", highlight=False, soft_wrap=True)
        return self

    def update(self, done: int, label: str = "") -> None:
        import time

        if self.bar is not None:
            self.bar.update(self.task, completed=done, description=label)
            return
        now = time.monotonic()
        if done < self.total and now - self.last < LOG_EVERY_S:
            return
        self.last = now
        tail = f": {label}" if label else ""
        self.console.print(f"{self.what} {done:,}/{self.total:,} {self.unit}, {now - self.start:.1f} s{tail}",
                           highlight=False, soft_wrap=True)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()


def _quality(p, cands, *, steps: int, heads: int, seed: int, trace, io_dtype: str):
    """The long-decode quality run for every stored precision the candidates use, each config's errors kept on disk
    so that a second run with the same inputs does not recompute them; (report, inputs, configs, cache key)."""
    from replayssm_cli.measure import quality
    from replayssm_cli.model import ops
    from replayssm_cli.console import note

    if trace is not None:
        inputs = quality.trace_inputs(trace, heads=heads, steps=steps)
    else:
        a_range = p.a_log_range or ops.named(p.kind).a_log_range
        inputs = quality.synthetic_inputs(
            p.shape, a_range=a_range, dt_softplus=p.dt_softplus, steps=steps, heads=heads, seed=seed, io_dtype=io_dtype,
        )
    configs = list(dict.fromkeys(quality.Config(*c.quality_key()) for c in cands))
    key = quality.inputs_key(inputs)
    if quality.uncached(inputs, configs, key):
        with Ticker(f"quality ({len(configs)} configs, {inputs.source})", inputs.generated, "tokens") as tick:
            report, kept = quality.cached_run(inputs, configs, key=key, on_step=tick.update)
    else:
        report, kept = quality.cached_run(inputs, configs, key=key)
    if kept:
        note(f"quality: {kept} of {len(configs)} configs from the cache ({quality.cache_dir()})")
    return report, inputs, configs, key


def _kernel_quality(report, inputs, configs, key: str) -> None:
    """The same quality run stepped through the GPU kernels, its errors beside the reference's (cached likewise)."""
    from replayssm_cli.measure import quality

    with Ticker("quality on the GPU kernels", len(configs), "configs") as tick:
        found, _ = quality.cached_kernels(inputs, configs, device="cuda", key=key,
                                          on_config=lambda n: tick.update(n, configs[n - 1].label()))
    for e in report.errors:
        if e.config in found:
            e.kernel = found[e.config]
    report.kernel_device = "cuda"


def _source(t) -> str:
    if t is None:
        return "-"
    return f"{t.source} ({t.note.split(',')[0]})" if t.source == "predicted" and t.note else t.source


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _fmt(value: float | None, spec: str = ".3g") -> str:
    import math

    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


# The detail tables' columns that go first when the terminal is narrow (first listed, first gone); the preset is in
# the heading, and batch, variant, T, W, state→read and speedup always stay. A wrapped column breaks between words.
MEMORY = "MiB/seq (state+copy+buffers)"
RECOMMENDATION_DROP = ("µs/token (model)", "seqs fit", "time", MEMORY, "error", "µs/token/layer", "mode")
CANDIDATES_DROP = ("time", "MiB/seq", "error", "µs/token")
WRAPPED = ("variant", "speedup", MEMORY, "time", "verdict")
# The verdict column is a sentence: narrower than this, secondary columns go first.
VERDICT_WIDTH = 32
LEFT = ("mode", "variant", "T", "W", "state→read", "time", "verdict", "config")


def _run_cells(c) -> dict[str, str]:
    """A candidate's identity, one column each: variant, draft width, window, state and read precision."""
    from replayssm_cli.model.dtypes import precision_label

    return {"variant": c.variant, "T": str(c.draft) if c.draft else "-", "W": str(c.window) if c.window else "-",
            "state→read": precision_label(c.state_dtype, c.read_dtype, c.rounding)}


def _recommendation_cells(p, d) -> dict[str, str]:
    c = d.choice
    if c is None:
        return {"batch": str(d.batch), "mode": d.mode, "variant": "[red]nothing within the budgets[/]"}
    m = c.memory or {}
    parts = "+".join(f"{m.get(k, 0) * p.ssm_layers / 2**20:.3g}" for k in ("state", "read_copy", "buffers") if m.get(k)) or "-"
    cells = {"batch": str(d.batch), "mode": d.mode, **_run_cells(c.candidate)}
    if not (d.replay_pays or c.candidate.is_replay):
        cells["variant"] += " [dim](ReplaySSM does not pay)[/]"
    return cells | {
        "µs/token/layer": _us(c.us_per_token),
        "µs/token (model)": _us(c.us_per_token * p.ssm_layers if c.us_per_token else None),
        "speedup": f"{_fmt(c.speedup, '.2f')}x ({_fmt(c.speedup_lo, '.2f')}-{_fmt(c.speedup_hi, '.2f')})" if c.speedup else "-",
        MEMORY: f"{_fmt(c.mem_per_seq / 2**20 if c.mem_per_seq else None)} ({parts})",
        "seqs fit": _fmt(c.seqs_fit, ","),
        "error": _fmt(c.error, ".1e"),
        "time": _source(c.timing),
    }


def _candidate_cells(a) -> dict[str, str]:
    verdict = f"[green]recommended[/]: {a.reason}" if a.verdict == "recommended" else f"[dim]{a.rejected_for}[/]: {a.reason}"
    return _run_cells(a.candidate) | {
        "µs/token": _us(a.us_per_token),
        "speedup": f"{_fmt(a.speedup, '.2f')}x" if a.speedup else "-",
        "MiB/seq": _fmt(a.mem_per_seq / 2**20 if a.mem_per_seq else None),
        "error": _fmt(a.error, ".1e"),
        "time": _source(a.timing),
        "verdict": verdict,
    }


def _render(p, source, quality, decisions, error_budget, budget, budget_note, baseline, *, wide: bool = False) -> None:
    """The detail tables: the recommendation per batch size, every candidate of each, and the error by bucket; on a
    narrow terminal (unless `wide`) their secondary columns are left out, and each caption says which."""
    from replayssm_cli.advise.tuner import fmt_bytes
    from replayssm_cli.console import out, sized
    from replayssm_cli.report.columns import fitted_table

    console = sized(out, WIDE, wide=wide)
    width = None if wide or not console.is_terminal else console.width
    pieces = {name: str.split for name in WRAPPED}
    console.print(
        f"[bold]replayssm tune[/] · {p.display} ({p.label()}, {p.ssm_layers} SSM layers, tp {p.tp}) · {source['gpu']}\n"
        f"times: {source['describe']}\n"
        f"error budget {error_budget:.0e} (longest bucket) · memory budget {budget_note} · speedups over conventional {baseline}",
        highlight=False,
    )

    def draft_columns(runs) -> list[str]:
        return ["T"] if any(c.draft for c in runs) else []

    chosen = [d.choice.candidate for d in decisions if d.choice is not None]
    names = ["batch", "mode", "variant", *draft_columns(chosen), "W", "state→read", "µs/token/layer", "µs/token (model)",
             "speedup", MEMORY, "seqs fit", "error", "time"]
    console.print(fitted_table(names, [_recommendation_cells(p, d) for d in decisions], width=width, title="Recommendation",
                               drop_order=RECOMMENDATION_DROP, pieces=pieces, left=LEFT,
                               caption=[f"µs/token (model): over the {p.ssm_layers} SSM layers"]))
    for d in decisions:
        order = sorted(d.assessments, key=lambda a: (a.verdict != "recommended", a.us_per_token is None, a.us_per_token or 0))
        names = ["variant", *draft_columns(a.candidate for a in order), "W", "state→read", "µs/token", "speedup",
                 "MiB/seq", "error", "time", "verdict"]
        console.print(fitted_table(names, [_candidate_cells(a) for a in order], width=width, drop_order=CANDIDATES_DROP,
                                   pieces=pieces, floors={"verdict": VERDICT_WIDTH}, left=LEFT,
                                   title=f"batch {d.batch}, {d.mode}: every candidate"))
    dims = " ".join(f"{k}={v}" for k, v in quality.dims.items())
    console.print(
        f"output error by generated tokens: {quality.source}, {dims} (a head subset of one layer), "
        f"after {quality.prompt} prompt tokens run in fp64",
        highlight=False,
    )
    kernels = f"kernels ({quality.kernel_device}), longest"
    rows = []
    for e in quality.errors:
        over = e.longest > error_budget
        row = {"config": e.config.label()}
        row |= {label: ("[red]" if over and label == e.longest_bucket else "") + f"{v:.1e}" for label, v in e.buckets.items()}
        if quality.kernel_device:
            row[kernels] = _fmt((e.kernel or {}).get(e.longest_bucket), ".1e")
        rows.append(row)
    names = ["config", *quality.bucket_labels, *([kernels] if quality.kernel_device else [])]
    console.print(fitted_table(names, rows, width=width, drop_order=(kernels,), left=LEFT, title="Output error vs fp64"))
    if budget:
        console.print(f"[dim]MiB/seq: bytes per sequence over all SSM layers; seqs fit: in {fmt_bytes(budget)}[/]", highlight=False)


@dataclass(frozen=True)
class TuneSpec:
    """What `replayssm tune` decides over: the preset, the candidates' grid, the budgets, where times come from, and
    the quality run's inputs; `out` also receives the report."""

    preset: str
    batches: tuple[int, ...]
    windows: tuple[int, ...]
    state_dtypes: tuple[str, ...]
    read_dtypes: tuple[str, ...]
    drafts: tuple[int, ...] = ()
    io_dtype: str | None = None
    accept_rate: float = 0.8
    error_budget: float = 1e-3
    memory_budget: float | None = None
    results: Path | None = None
    measured_only: bool = False
    gpu: str | None = None
    tp: int = 1
    steps: int = 4096
    heads: int = 4
    trace: Path | None = None
    seed: int = 0
    out: Path | None = None
    # Whether state_dtypes were asked for (--state-dtype) rather than the defaults.
    state_dtypes_given: bool = False
    # "stochastic": each 16-bit and 8-bit state is a candidate rounded both ways (to nearest and stochastically).
    rounding: str = "nearest"
    # Also measure energy per step (NVML) on a GPU, for the verdict's tokens per joule.
    energy: bool = False
    # On a GPU, compile the kernels of the candidates to measure in parallel worker processes before timing them.
    precompile: bool = True

    def validate(self) -> None:
        """Raise UserError (one line) for a value out of range."""
        from replayssm_cli.measure.grid import refuse_rounding

        _check_options(self.batches, self.windows, self.drafts, self.accept_rate, self.error_budget, self.memory_budget,
                       self.steps, self.heads, self.tp)
        refuse_rounding(self.state_dtypes, self.rounding)

    @property
    def roundings(self) -> tuple[str, ...]:
        return ("nearest", "stochastic") if self.rounding == "stochastic" else ("nearest",)


@dataclass
class TuneRun:
    """What a tune run decided, with what the verdict and the tables show: the report is its JSON form."""

    preset: Any
    source: dict[str, Any]
    lines: list[Any]
    quality: Any
    decisions: list[Any]
    budget: float | None
    budget_note: str
    baseline: str
    drafts: tuple[int, ...]
    error_budget: float
    report: dict[str, Any]


def _with_fp8_where_it_runs(state_dtypes: tuple[str, ...], gpu: str | None, *, given: bool) -> tuple[str, ...]:
    """The candidate state dtypes, less fp8 where the GPU (this one, else --gpu's datasheet) is older than sm_89; a
    --state-dtype fp8 asked for there is one line (exit 2)."""
    from replayssm_cli.console import note

    if "fp8" not in state_dtypes:
        return state_dtypes
    arch = _target_arch(gpu)
    if arch is None or arch >= (8, 9):
        return state_dtypes
    if given:
        raise UserError(f"fp8 checkpoints need sm_89 or newer (float8 e4m3 conversions); the GPU here is sm_{arch[0]}{arch[1]}",
                        "pass --state-dtype int8 (the same bytes, an fp32 scale per row) or bf16")
    note(f"fp8 checkpoints left out: they need sm_89 or newer and the GPU is sm_{arch[0]}{arch[1]} (int8 stays)")
    return tuple(d for d in state_dtypes if d != "fp8")


def _target_arch(gpu: str | None) -> tuple[int, int] | None:
    """The compute capability of the GPU tune decides for: this CUDA device, else --gpu's datasheet (None: unknown)."""
    if _cuda_available():
        import torch

        return tuple(torch.cuda.get_device_capability(0))
    from replayssm_cli.model import gpus

    cc = gpus.load_gpu(gpu or "h200").compute_capability
    try:
        major, minor = (int(v) for v in str(cc).split("."))
    except ValueError:
        return None
    return major, minor


def run(spec: TuneSpec) -> TuneRun:
    """Time, check and decide every candidate at every batch of `spec` (written to spec.out when given)."""
    from replayssm_cli.advise import engine_flags, tuner, verdict
    from replayssm_cli.measure import quality as quality_mod
    from replayssm_cli.model import ops, presets as presets_mod

    spec.validate()
    preset, batches, windows, drafts, tp = spec.preset, spec.batches, spec.windows, spec.drafts, spec.tp
    state_dtypes, read_dtypes, accept_rate, error_budget = spec.state_dtypes, spec.read_dtypes, spec.accept_rate, spec.error_budget
    memory_budget, results, measured_only, gpu, out = spec.memory_budget, spec.results, spec.measured_only, spec.gpu, spec.out
    steps, heads, seed, trace = spec.steps, spec.heads, spec.seed, spec.trace
    io = (spec.io_dtype,) if spec.io_dtype else None
    p = presets_mod.resolve(preset, tp)
    if "stochastic" in spec.roundings and (why := ops.of(p.shape).rounding_problem(p.shape)):
        raise UserError(f"--stochastic-rounding with {p.name}: {why}", "drop --stochastic-rounding for this preset")
    state_dtypes = _with_fp8_where_it_runs(state_dtypes, gpu, given=spec.state_dtypes_given)
    cands = tuner.candidates(windows=windows, state_dtypes=state_dtypes, read_dtypes=read_dtypes, drafts=drafts, accept_rate=accept_rate,
                             roundings=spec.roundings)
    recorded = _load_trace(trace, p)
    quality_mod.check_size(p, recorded, cands, steps, heads)

    if measured_only and results is None:
        raise UserError("--measured-only needs --results", "pass the results file whose measurements to keep to")
    if out is not None:
        _check_out(out)

    runs: dict[str, Any] = {}

    def run_quality(io_dtype: str, kernels: bool):
        if io_dtype not in runs:
            runs[io_dtype] = _quality(p, cands, steps=steps, heads=heads, seed=seed, trace=recorded, io_dtype=io_dtype)
        report, inputs, configs, key = runs[io_dtype]
        if kernels:
            check_kernels(io_dtype, {c.key() for c in configs})
        return report

    def check_kernels(io_dtype: str, keys) -> bool:
        """Run the kernels for the configs with these keys not run yet; whether any was."""
        report, inputs, configs, key = runs[io_dtype]
        todo = [c for c in configs if c.key() in keys and report.get(c).kernel is None]
        if todo:
            if pool is not None:
                pool.wait_quality(todo)
            _kernel_quality(report, inputs, todo, key)
        return bool(todo)

    def queue_kernel_quality(io_dtype: str, timed) -> None:
        """Queue the compiles of the kernel quality runs a recommendation among the candidates `timed` may need: those
        within the error budget whose kernel errors are not on disk yet."""
        report, inputs, configs, key = runs[io_dtype]
        keys = {c.quality_key() for c in timed}
        within = [c for c in configs if c.key() in keys and (report.error_of(c.key()) or 0.0) <= error_budget]
        pool.submit_quality(inputs, quality_mod.kernels_uncached(inputs, within, device="cuda", key=key))

    def memory(c, io_dtype=None):
        try:
            return tuner.memory_of(p.shape, c, io_dtype=io_dtype or io_used)
        except ValueError:
            return None

    def allowed(io_dtype: str):
        """Whether a candidate at a batch is within the error and memory budgets, before it is measured."""
        first = run_quality(io_dtype, False)
        cap = memory_budget * 2**30 if memory_budget is not None else _gpu_total_memory()

        def ok(c, b):
            err = first.error_of(c.quality_key())
            mem = memory(c, io_dtype)
            return (err is None or err <= error_budget) and (mem is None or not cap or b * mem["total"] * p.ssm_layers <= cap)

        return ok

    io_used = io[0] if io else None
    with _precompile_pool(spec) as pool:
        source = _timing_source(p, preset, cands, batches, results, gpu, io_used, accept_rate, measured_only, allowed=allowed,
                                energy=spec.energy, pool=pool, then_compile=queue_kernel_quality)
        io_used = source["io_dtype"]
        quality = run_quality(io_used, False)
        budget, budget_note = _memory_budget(memory_budget, source)

        baseline = p.state_dtype if p.state_dtype in state_dtypes else state_dtypes[0]

        def decide():
            return tuner.tune(
                batches,
                cands,
                timing=source["timing"],
                error=lambda c: quality.error_of(c.quality_key()),
                memory=memory,
                layers=p.ssm_layers,
                error_budget=error_budget,
                memory_budget=budget,
                baseline_dtype=baseline,
            )

        decisions = decide()
        # On a GPU the kernels rerun the quality inputs for each recommendation; one they push over the budget loses it.
        while source["cuda"] and check_kernels(io_used, {d.choice.candidate.quality_key() for d in decisions if d.choice}):
            decisions = decide()
    lines = verdict.lines_from(decisions, preset=p.name, error_budget=error_budget, e2e_rows=source.get("e2e_rows", ()),
                               energy_rows=source.get("energy_rows", ()),
                               tp=p.tp, io_dtype=io_used, accept_rate=accept_rate if drafts else None)
    report = {
        "preset": {"name": p.name, "kind": p.kind, "shape": p.label(), "ssm_layers": p.ssm_layers, "state_dtype": p.state_dtype, "tp": p.tp},
        "verdict": [ln.to_dict() for ln in lines],
        "engines": engine_flags.settings(p.kind, decisions),
        "timing": {k: v for k, v in source.items() if k in ("mode", "describe", "results_file", "gpu", "io_dtype")},
        "error_budget": error_budget,
        "memory_budget_bytes": budget,
        "memory_budget_note": budget_note,
        "baseline": f"conventional {baseline}",
        "quality": quality.to_dict(),
        "decisions": [d.to_dict() for d in decisions],
    }
    if out is not None:
        _write_report(out, report)
    return TuneRun(p, source, lines, quality, decisions, budget, budget_note, baseline, drafts, error_budget, report)


def print_run(run: TuneRun, *, details: bool = False, wide: bool = False) -> None:
    """The verdict, the engines' settings and, with details, every candidate's table and the error by bucket (every
    column with `wide`, else those that fit the terminal)."""
    _print_verdict(run.preset, run.source, run.lines, run.error_budget, run.budget_note, run.baseline, run.drafts)
    _print_engines(run.preset, run.decisions)
    if details:
        _render(run.preset, run.source, run.quality, run.decisions, run.error_budget, run.budget, run.budget_note, run.baseline,
                wide=wide)
