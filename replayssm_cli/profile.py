"""The profile grid: what to run, one results row per measurement or prediction, the run loop and the table."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from replayssm_cli.dtypes import IODtype, ReadDtype, StateDtype
from replayssm_cli.errors import UserError

DEFAULT_BATCHES = (1, 16, 64, 256)
DEFAULT_WINDOWS = (16,)
DEFAULT_ACCEPT_RATE = 0.8
MAX_WINDOW = 64
MAX_DRAFT = 8
NOISY_SPREAD = 0.10
PHASED_VARIANTS = ("replay", "split")
INTERRUPTED = "not run: interrupted"
LOG_EVERY_S = 10.0
# The row fields that say which configuration a row measured; compare matches rows on them.
CONFIG_KEYS = (
    "kind", "op", "preset", "variant", "phase", "batch", "window", "state_dtype",
    "read_dtype", "io_dtype", "draft", "tp", "flush",
)


@dataclass(frozen=True)
class ProfileSpec:
    """What a profile runs: the grid's axes and the timing settings; written whole into the results file."""

    presets: tuple[str, ...]
    batches: tuple[int, ...] = DEFAULT_BATCHES
    windows: tuple[int, ...] = DEFAULT_WINDOWS
    state_dtypes: tuple[str, ...] = ()
    read_dtypes: tuple[str, ...] = ()
    io_dtype: str = "bf16"
    drafts: tuple[int, ...] = ()
    accept_rate: float = DEFAULT_ACCEPT_RATE
    accept_dist: tuple[float, ...] = ()
    tp: int = 1
    layers: int | None = None
    aligned_flush: bool = False
    phases: bool = True
    windows_per_graph: int = 2
    repeats: int = 30
    seed: int = 0
    baselines: tuple[str, ...] = ()
    energy: bool = False

    def validate(self) -> None:
        """Raise UserError (one line) for an option the kernels or the grid cannot take."""
        if not self.presets:
            raise UserError("no preset to profile", "pass --preset NAME (see `replayssm presets`)")
        for b in self.batches:
            if b < 1:
                raise UserError(f"--batch {b} is not a batch size", "batch sizes are positive integers, e.g. --batch 1,16,64,256")
        for w in self.windows:
            if not 1 <= w <= MAX_WINDOW:
                raise UserError(f"--window {w} is out of range", f"the window W takes 1 to {MAX_WINDOW}")
        for t in self.drafts:
            if not 1 <= t <= MAX_DRAFT:
                raise UserError(f"--draft {t} is out of range", f"speculative widths take 1 to {MAX_DRAFT}")
        for d in self.state_dtypes:
            _enum(StateDtype, d, "--state-dtype")
        for d in self.read_dtypes:
            _enum(ReadDtype, d, "--read-dtype")
        _enum(IODtype, self.io_dtype, "--io-dtype")
        if not 0.0 <= self.accept_rate <= 1.0:
            raise UserError(f"--accept-rate {self.accept_rate} is not a probability", "pass a value in [0, 1]")
        if self.accept_dist:
            if len(self.drafts) != 1 or len(self.accept_dist) != self.drafts[0] + 1:
                raise UserError(
                    "--accept-dist needs exactly one --draft T and T+1 weights (for 0..T drafts accepted)",
                    "e.g. --draft 4 --accept-dist 0.1,0.1,0.2,0.3,0.3",
                )
            if any(w < 0 for w in self.accept_dist) or sum(self.accept_dist) <= 0:
                raise UserError("--accept-dist weights must be non-negative and not all zero")
        if self.drafts and any(mean_accepted(accept_probs(t, self.accept_rate, self.accept_dist)) <= 0 for t in self.drafts):
            raise UserError("the acceptance given accepts no draft at all", "pass an --accept-rate or --accept-dist that accepts some")
        if self.tp < 1:
            raise UserError(f"--tp {self.tp} is not a tensor-parallel degree", "pass a positive integer")
        if self.layers is not None and self.layers < 1:
            raise UserError(f"--layers {self.layers} is not a layer count", "pass a positive integer")
        if self.repeats < 3:
            raise UserError(f"--repeats {self.repeats} is too few to give percentiles", "pass 3 or more")
        from replayssm_cli import baselines

        for name in self.baselines:
            if name != baselines.ALL and name not in baselines.REGISTRY:
                raise UserError(f"--baseline {name!r} is not a baseline this replayssm knows", f"choose from {', '.join(baselines.names())} or all")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _enum(enum: type, value: str, option: str) -> str:
    try:
        return enum(value).value
    except ValueError:
        choices = ", ".join(e.value for e in enum)
        raise UserError(f"{option} {value!r} is not a dtype the kernels take", f"choose from {choices}") from None


def accept_probs(draft: int, rate: float = DEFAULT_ACCEPT_RATE, dist: tuple[float, ...] = ()) -> list[float]:
    """Probabilities of accepting n = 0..draft drafts in one verify step.

    With `dist`, its weights normalised. Otherwise each draft is accepted with probability `rate`
    and the first rejection ends the run, as in speculative decoding: P(n) = rate^n (1 - rate) for
    n < draft and rate^draft for n = draft.
    """
    if dist:
        total = float(sum(dist))
        return [w / total for w in dist]
    probs = [rate**n * (1.0 - rate) for n in range(draft)]
    probs.append(rate**draft)
    return probs


def mean_accepted(probs: list[float]) -> float:
    return sum(n * p for n, p in enumerate(probs))


@dataclass(frozen=True)
class Point:
    """One configuration of the grid; it gives one row, or three (avg, nonflush, flush) for ReplaySSM."""

    preset: str
    source_name: str
    op: str
    variant: str
    batch: int
    window: int | None
    state_dtype: str
    read_dtype: str | None
    io_dtype: str
    draft: int = 0
    accept: tuple[float, ...] = ()
    tp: int = 1
    layers_cap: int | None = None
    flush: str = "staggered"
    phases: bool = False
    competes: str | None = None

    @property
    def cost_variant(self) -> str:
        """The variant whose cost model the row uses: ours, or the one a baseline competes with."""
        return self.competes or self.variant

    def label(self) -> str:
        parts = [self.preset, self.variant, f"B{self.batch}"]
        if self.window:
            parts.append(f"W{self.window}")
        parts.append(self.state_dtype + (f"-{self.read_dtype}" if self.read_dtype else ""))
        if self.draft:
            parts.append(f"T{self.draft}")
        return " ".join(parts)

    def case_spec(self, seed: int = 0, phase: str = "avg") -> dict[str, Any]:
        """What `bench.make_case` takes: JSON-able, so a child process can rebuild the case (at one phase's fill)."""
        return {
            "preset": self.source_name,
            "op": self.op,
            "phase": phase,
            "tp": self.tp,
            "variant": self.variant,
            "batch": self.batch,
            "window": self.window,
            "state_dtype": self.state_dtype,
            "read_dtype": self.read_dtype,
            "io_dtype": self.io_dtype,
            "draft": self.draft,
            "accept": list(self.accept),
            "flush": self.flush,
            "layers": self.layers_cap,
            "seed": seed,
        }


def plan(spec: ProfileSpec, presets: list[Any], left_out: list[dict[str, str]] | None = None, baselines: list[Any] = ()) -> list[Point]:
    """The grid in run order: within a preset, state dtype and batch, the conventional kernel first (the speedup baseline).

    A split read copy that is not narrower than the state is left out (appended to `left_out` with why).
    `baselines` (replayssm_cli.baselines adapters, already found importable) add a point after ours for
    each configuration of their op and variant that they can run; the others go to `left_out`.
    """
    from replayssm_cli.dtypes import itemsize

    points: list[Point] = []
    flush = "aligned" if spec.aligned_flush else "staggered"
    for given, preset in zip(spec.presets, presets):
        state_dtypes = spec.state_dtypes or (preset.state_dtype,)
        common = dict(preset=preset.name, source_name=given, op=preset.kind, io_dtype=spec.io_dtype, tp=spec.tp, layers_cap=spec.layers)
        for sd in state_dtypes:
            for b in spec.batches:
                points.append(Point(**common, variant="conventional", batch=b, window=None, state_dtype=sd, read_dtype=None))
                for w in spec.windows:
                    points.append(
                        Point(**common, variant="replay", batch=b, window=w, state_dtype=sd, read_dtype=None, flush=flush, phases=spec.phases)
                    )
                    for rd in spec.read_dtypes:
                        if itemsize(rd) >= itemsize(sd):
                            if left_out is not None and b == spec.batches[0] and w == spec.windows[0]:
                                left_out.append({"what": f"{preset.name} split {sd}-{rd}", "why": f"a {rd} read copy is not narrower than a {sd} state"})
                            continue
                        points.append(
                            Point(**common, variant="split", batch=b, window=w, state_dtype=sd, read_dtype=rd, flush=flush, phases=spec.phases)
                        )
                for t in spec.drafts:
                    acc = tuple(accept_probs(t, spec.accept_rate, spec.accept_dist))
                    points.append(
                        Point(**common, variant="spec-conventional", batch=b, window=None, state_dtype=sd, read_dtype=None, draft=t, accept=acc)
                    )
                    for w in spec.windows:
                        points.append(
                            Point(**common, variant="spec-replay", batch=b, window=w, state_dtype=sd, read_dtype=None, draft=t, accept=acc, flush=flush)
                        )
                for bl in baselines:
                    if bl.op != preset.kind:
                        continue
                    for w in spec.windows if bl.variant == "replay" else (None,):
                        why = bl.unsupported(window=w, state_dtype=sd, io_dtype=spec.io_dtype, shape=preset.shape)
                        if why:
                            if left_out is not None and b == spec.batches[0]:
                                left_out.append({"what": f"{preset.name} baseline:{bl.name}" + (f" W{w}" if w else "") + f" {sd}", "why": why})
                            continue
                        points.append(
                            Point(**common, variant=f"baseline:{bl.name}", batch=b, window=w, state_dtype=sd, read_dtype=None,
                                  flush=flush if w else "staggered", competes=bl.variant)
                        )
    return points


def nonflush_fill(window: int) -> int:
    """The fill at which the nonflush phase is measured: the middle of 0..W-2."""
    return (window - 2) // 2


def point_phases(point: Point) -> list[str]:
    """The rows a point gives: avg, and for ReplaySSM with phases the non-flush (W > 1) and flush steps alone."""
    if point.variant in PHASED_VARIANTS and point.phases:
        return ["avg", "nonflush", "flush"] if point.window and point.window > 1 else ["avg", "flush"]
    return ["avg"]


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


def _cost(point: Point, preset: Any, phase: str, accepted: float | None):
    from replayssm_cli import cost

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
    )


def memory_fields(point: Point, preset: Any, free_bytes: int | None) -> dict[str, Any]:
    """mem_per_seq (one layer), mem_per_seq_model (all the preset's SSM layers), the parts as x_mem_* and how many
    sequences fit in free_bytes."""
    from replayssm_cli import cost

    mem = cost.memory_per_seq(
        preset.shape,
        point.cost_variant,
        window=point.window,
        state_dtype=point.state_dtype,
        read_dtype=point.read_dtype,
        io_dtype=point.io_dtype,
        draft=point.draft,
    )
    per_seq = int(mem["total"])
    fields: dict[str, Any] = {"mem_per_seq": per_seq, "mem_per_seq_model": per_seq * preset.ssm_layers}
    fields.update({f"x_mem_{k}": int(v) for k, v in mem.items() if k != "total"})
    fields["seqs_fit"] = int(free_bytes // (per_seq * preset.ssm_layers)) if free_bytes and per_seq else None
    return fields


def base_row(point: Point, preset: Any, phase: str, *, source: str, status: str, layers: int | None) -> dict[str, Any]:
    """Every ROW_FIELDS key (None where it does not apply), the configuration filled in."""
    from replayssm_cli.results import ROW_FIELDS

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
    from replayssm_cli import calibration

    accepted = mean_accepted(list(point.accept)) if point.draft else None
    rows = []
    for phase in point_phases(point):
        row = base_row(point, preset, phase, source="predicted", status="ok", layers=preset.ssm_layers)
        pred = calibration.predict_step(
            preset, point.cost_variant, batch=point.batch, phase=phase, window=point.window, state_dtype=point.state_dtype,
            read_dtype=point.read_dtype, io_dtype=point.io_dtype, draft=point.draft, accepted=accepted, fill=row["x_fill"],
            gpu=gpu,
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
    as `row` unless `state_dtype` names another."""
    want = {k: row.get(k) for k in ("preset", "batch", "state_dtype", "io_dtype", "tp", "source")}
    if state_dtype is not None:
        want["state_dtype"] = state_dtype
    for r in rows:
        if (
            r["variant"] == variant
            and r["phase"] == "avg"
            and r["status"] == "ok"
            and r.get("draft", 0) == draft
            and all(r.get(k) == v for k, v in want.items())
        ):
            return r
    return None


def attach_speedup(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """speedup (per token, with a range from the quartiles) over the row's own baseline, named in speedup_over.

    ReplaySSM and baseline kernels: over the conventional step at the same state precision ("conventional"); split
    precision: over the fp32 conventional step ("fp32-conventional"; the same-precision one where the run has no
    fp32 conventional row); spec-replay: over the snapshot-writing spec-conventional step at the same draft width
    ("snapshots"). Speculative rows also get speedup_vs_decode, over plain conventional decode; conventional and
    spec-conventional rows are baselines (speedup None). A baseline row also gets x_vs_ours: its µs per token over
    that of our kernel of the variant it competes with (same window), so above 1 ours is faster.
    """
    for key in ("speedup", "speedup_over", "speedup_lo", "speedup_hi", "speedup_vs_decode"):
        row.setdefault(key, None)
    if row["variant"] == "conventional" or row["status"] != "ok":
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


def _is_oom(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(exc, getattr(torch.cuda, "OutOfMemoryError", ())):
        return True
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


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
        from replayssm_cli import bench

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


def _run_point(point, preset, writer, run: ProfileRun, mode, ceilings, free_bytes, runner, context) -> None:
    try:
        if mode == "predicted":
            rows = predicted_rows(point, preset, ceilings, free_bytes, gpu=context.get("gpu", "h200"), reference=context.get("reference"))
        else:
            rows = measured_rows(point, preset, runner(point, context), ceilings, free_bytes)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        if _is_oom(exc):
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
    from replayssm_cli import presets as presets_mod
    from replayssm_cli.results import ResultsWriter

    spec.validate()
    resolved = [presets_mod.resolve(name, spec.tp) for name in spec.presets]
    mode = "predicted" if predict else detect_mode(require_gpu)
    left_out: list[dict[str, str]] = []
    points = plan(spec, resolved, left_out, usable_baselines(spec, resolved, mode, left_out))
    if not points:
        raise UserError("the options leave nothing to profile", "; ".join(f"{s['what']}: {s['why']}" for s in left_out))
    setup = predicted_setup(gpu) if mode == "predicted" else measured_setup(gpu, spec)
    path = Path(out) if out else default_out(setup["gpu_key"])
    spec_doc = {**spec.to_dict(), "mode": mode, "gpu": setup["gpu_key"], "presets_resolved": [p.name for p in resolved]}
    try:
        writer = ResultsWriter(path, setup["environment"], spec_doc, exclusive=not out)
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
    return run


def usable_baselines(spec: ProfileSpec, presets: list[Any], mode: str, left_out: list[dict[str, str]]) -> list[Any]:
    """The baselines asked for that import here and have a preset of their op; the others go to `left_out` with why.

    Baselines are measured only: a predicted profile leaves them all out, in one entry.
    """
    from replayssm_cli import baselines

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
    from replayssm_cli.environment import cuda_runtime, software

    return {**software(), **cuda_runtime()}


def _plain(obj: Any) -> Any:
    return asdict(obj) if is_dataclass(obj) else obj


def predicted_setup(gpu: str | None) -> dict[str, Any]:
    """Environment, ceilings and free memory of a GPU named by its spec (default h200), for predicted rows."""
    from replayssm_cli import gpus

    spec = gpus.load_gpu(gpu or "h200")
    ceilings = gpus.ceilings_for(spec)
    env = _environment()
    env.update(
        mode="predicted",
        gpu={"name": spec.name, "key": spec.key, "memory_gib": spec.memory_gib, "l2_mib": spec.l2_mib, "sm_count": spec.sm_count, "source": "spec"},
        ceilings=_plain(ceilings),
    )
    from replayssm_cli import calibration

    context = {"gpu": spec.key, "reference": calibration.reference_index(spec.key)}
    return {"environment": env, "ceilings": ceilings, "free_bytes": int(spec.memory_gib * 2**30), "gpu_key": spec.key,
            "gpu_name": spec.name, "context": context}


def measured_setup(gpu: str | None, spec: ProfileSpec) -> dict[str, Any]:
    """Environment (software, CUDA, the detected GPU, its ceilings), free memory, the clock sampler and the runner's context."""
    import torch

    from replayssm_cli import energy, gpus
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


def default_out(gpu_key: str | None, directory: str | Path = "runs") -> Path:
    """A results path unique to this run: local time to the millisecond and a random suffix, then the GPU key
    (runs/20261130-224658.123-k3f9-h200.json); the writer creates it exclusively."""
    import secrets

    now = datetime.now()
    stamp = now.strftime("%Y%m%d-%H%M%S") + f".{now.microsecond // 1000:03d}-{secrets.token_hex(2)}"
    return Path(directory) / f"{stamp}-{gpu_key or 'gpu'}.json"


def _fmt(value: Any, spec: str = ".3g", none: str = "–") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return none
    return format(value, spec)


def _num(value: Any) -> str:
    """Up to four significant digits, thousands written out (no exponent) for µs."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _mib(value: Any) -> str:
    return "–" if value is None else f"{value / 2**20:.3g}"


# The profile table's columns that are never left out, and the others in the order they go when the terminal is
# narrow (first listed, first gone); a wrapped column breaks between words, never inside a number.
KEPT_COLUMNS = ("preset", "variant", "B", "W", "speedup")
DROP_ORDER = ("TFLOP/s", "AI", "µs/model step", "flush cost/share", "seqs fit", "GB/s", "MiB/seq", "%BW", "from",
              "µs/tok/layer", "measured", "T/acc", "state→read")
WRAPPED_COLUMNS = ("speedup", "from")
SEGMENT = " · "


def render_table(rows: list[dict[str, Any]], *, title: str, caption: str | None = None, layers_of: dict[str, int] | None = None,
                 width: int | None = None):
    """The rich table of profile rows: times next to bandwidth and share of the ceiling; noisy times flagged.

    With `width` (the terminal's columns) the secondary columns are left out, DROP_ORDER first, until the table fits
    without cutting a cell; the caption then names them and says that --wide shows them. KEPT_COLUMNS always stay.
    `layers_of` (SSM layers by preset) gives MiB/seq for rows that lack mem_per_seq_model.
    """
    from rich import box
    from rich.table import Table

    from replayssm_cli.provenance import reference_label, row_label

    labels = [row_label(r, error=False) for r in rows]
    mixed = len(set(labels)) > 1
    lines = [f"figures: {labels[0]}"] if labels and not mixed else []
    lines += [caption] if caption else []
    references = list(dict.fromkeys(reference_label(r["x_reference"]) for r in rows if r.get("x_reference")))
    has_draft = any(r.get("draft") for r in rows)
    names = ["preset", "variant", "B", "W", "state→read", *(["T/acc"] if has_draft else []), "µs/tok/layer",
             *(["measured"] if references else []), "µs/model step", "GB/s", "%BW", "TFLOP/s", "AI", "speedup",
             "flush cost/share", "MiB/seq", "seqs fit", *(["from"] if mixed else [])]
    cells = [_row_cells(r, label, has_draft, references, layers_of) for r, label in zip(rows, labels)]
    previous = None
    for r, row_cells in zip(rows, cells):
        if r["preset"] == previous:
            row_cells["preset"] = ""
        previous = r["preset"]
    dropped, needed = _columns_to_drop(names, cells, width) if width else ([], {})
    if references and "measured" not in dropped:
        lines.append("measured: µs per token and speedup of the same configuration in the shipped reference, " + "; ".join(
            f"[{i}] {label}" for i, label in enumerate(references, 1)))
    if dropped:
        lines.append(f"left out for the terminal's width: {', '.join(dropped)} (--wide shows every column)")
    table = Table(title=title, caption="\n".join(lines) or None, caption_justify="left", header_style="bold",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    kept = [n for n in names if n not in dropped]
    for name in kept:
        table.add_column(name, justify="left" if name in ("preset", "variant", "state→read", "from") else "right",
                         no_wrap=name not in WRAPPED_COLUMNS, min_width=needed.get(name) if name in WRAPPED_COLUMNS else None)
    previous = None
    for r, row_cells in zip(rows, cells):
        if previous is not None and r["preset"] != previous:
            table.add_section()
        previous = r["preset"]
        table.add_row(*(row_cells.get(name, "") for name in kept))
    return table


def _model_mem(r: dict[str, Any], layers_of: dict[str, int] | None) -> int | None:
    """Bytes per sequence over all the preset's SSM layers: mem_per_seq_model, else mem_per_seq times `layers_of`'s
    count; None rather than one layer's figure in a column of whole-model ones."""
    if r.get("mem_per_seq_model") is not None:
        return r["mem_per_seq_model"]
    layers = (layers_of or {}).get(r["preset"])
    return r["mem_per_seq"] * layers if r.get("mem_per_seq") is not None and layers else None


def _row_cells(r: dict[str, Any], label: str, has_draft: bool, references: list[str],
               layers_of: dict[str, int] | None = None) -> dict[str, str]:
    cells = {
        "preset": r["preset"],
        "variant": r["variant"] if r["phase"] == "avg" else f"  ↳ {r['phase']}",
        "B": str(r["batch"]),
        "W": _fmt(r.get("window"), "d"),
        "state→read": r["state_dtype"] + (f"→{r['read_dtype']}" if r.get("read_dtype") else ""),
        "MiB/seq": _mib(_model_mem(r, layers_of)),
        "seqs fit": _fmt(r.get("seqs_fit"), "d"),
        "from": label,
    }
    if has_draft:
        cells["T/acc"] = f"{r['draft']}/{_fmt(r.get('accepted'), '.2f')}" if r.get("draft") else "–"
    if r["status"] != "ok":
        cells["µs/tok/layer"] = f"[red]FAILED[/] (err {_fmt(r.get('check_max_err'), '.1e')})"
        return cells
    cells.update({
        "µs/tok/layer": _us_cell(r),
        "measured": _reference_cell(r, references) if references else "",
        "µs/model step": _num(r.get("us_model_step")),
        "GB/s": _fmt(r.get("gbs"), ".0f"),
        "%BW": _fmt(r.get("pct_copy_bw"), ".0f"),
        "TFLOP/s": _fmt(r["flops_per_s"] / 1e12 if r.get("flops_per_s") else None, ".3g"),
        "AI": _fmt(r.get("intensity"), ".3g"),
        "speedup": _speedup_cell(r),
        "flush cost/share": _flush_cell(r),
    })
    return cells


def _columns_to_drop(names: list[str], cells: list[dict[str, str]], width: int) -> tuple[list[str], dict[str, int]]:
    """The secondary columns to leave out, in DROP_ORDER, so that the others fit `width` with no cell cut, and the
    width each column needs.

    A column needs its widest cell and its header; speedup breaks only between its ' · ' parts and `from` between
    words. The table adds three columns of padding and rule per column, less one.
    """
    from rich.text import Text

    def need(name: str) -> int:
        texts = [Text.from_markup(c.get(name, "")).plain for c in cells]
        if name == "speedup":
            texts = [part for t in texts for part in t.split(SEGMENT)]
        elif name in WRAPPED_COLUMNS:
            texts = [word for t in texts for word in t.split()]
        return max([len(name), *(len(t) for t in texts)])

    widths = {name: need(name) for name in names}
    kept = list(names)
    dropped = []
    for name in DROP_ORDER:
        if sum(widths[n] for n in kept) + 3 * len(kept) - 1 <= width:
            break
        if name in kept:
            kept.remove(name)
            dropped.append(name)
    return dropped, widths


def _reference_cell(r: dict[str, Any], references: list[str]) -> str:
    """A predicted row's shipped measurement: µs per token, speedup and which file ([n] in the caption)."""
    from replayssm_cli.provenance import reference_label

    ref = r.get("x_reference")
    if not ref:
        return "–"
    tokens = r.get("tokens_per_step") or 1.0
    speed = f" {ref['speedup']:.2f}x" if ref.get("speedup") else ""
    return f"{_num(ref['us'] / tokens)}{speed} [dim][{references.index(reference_label(ref)) + 1}][/]"


def _us_cell(r: dict[str, Any]) -> str:
    us = _num(r.get("us_per_token"))
    fit = (r.get("x_prediction") or {}).get("fit_error")
    if fit is not None:
        from replayssm_cli.provenance import percent

        return us + f" [dim]±{percent(fit)}[/]"
    spread = r.get("spread")
    if spread is None:
        return us
    if spread > NOISY_SPREAD:
        return us + f" [yellow]±{100 * spread / 2:.0f}% noisy[/]"
    return us + f" [dim]±{100 * spread / 2:.0f}%[/]"


def _speedup_cell(r: dict[str, Any]) -> str:
    """The speedup over the row's own baseline first (over snapshots for spec-replay), then the speculative rows'
    figure over plain decode."""
    cell = "–"
    if r.get("speedup") is not None:
        cell = f"{r['speedup']:.2f}x"
        if r.get("speedup_lo") is not None and r.get("speedup_hi") is not None and r["speedup_lo"] != r["speedup_hi"]:
            cell += f" [dim]({r['speedup_lo']:.2f}–{r['speedup_hi']:.2f})[/]"
        if r.get("speedup_over") == "snapshots":
            cell += " vs snapshots"
    if r.get("speedup_vs_decode") is not None:
        cell += f" [dim]· {r['speedup_vs_decode']:.2f}x vs decode[/]"
    if r.get("x_vs_ours") is not None:
        cell += f" [dim]· ours {r['x_vs_ours']:.2f}x[/]"
    return cell


def _flush_cell(r: dict[str, Any]) -> str:
    if r.get("x_flush_cost_us") is None:
        return "–"
    return f"{_num(r['x_flush_cost_us'])} µs / {100 * (r.get('x_flush_share') or 0):.0f}%"
