"""Recorded serving traffic projected onto measured kernel times: cohorts by concurrency, the gain of the recommended
configuration in each, the traffic-weighted gain, and where to switch ReplaySSM on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from replayssm_cli.advise import engine_flags, tuner
from replayssm_cli.errors import UserError
from replayssm_cli.advise.traffic import Traffic
from replayssm_cli.advise.tuner import Candidate, Timing
from replayssm_cli.report.results import rounding_of

DEFAULT_COHORTS = (1, 16, 64, 128, 256)
DEFAULT_ERROR_BUDGET = tuner.DEFAULT_ERROR_BUDGET
# The quality run covers the traffic's long generations, within these bounds (its cost grows with the length).
MIN_QUALITY_STEPS, MAX_QUALITY_STEPS = 128, 4096


@dataclass
class TimeFile:
    """One results file's rows for the preset, with the label every figure taken from it carries."""

    label: str
    rows: list[dict[str, Any]]
    environment: dict[str, Any]


@dataclass
class TimeSource:
    """Where kernel and whole-model step times come from: result files, newest first, each with its label."""

    describe: str
    files: list[TimeFile]

    @property
    def environment(self) -> dict[str, Any]:
        return self.files[0].environment if self.files else {}

    @property
    def gpu_name(self) -> str:
        gpu = self.environment.get("gpu") if isinstance(self.environment.get("gpu"), dict) else {}
        return gpu.get("name") or self.environment.get("device_name") or "unknown GPU"

    @property
    def memory_bytes(self) -> int | None:
        gpu = self.environment.get("gpu") if isinstance(self.environment.get("gpu"), dict) else {}
        return gpu.get("memory_total") or self.environment.get("total_memory")


def load_source(results_path: Path | None, preset_name: str) -> TimeSource:
    """The rows for the preset from --results, else from the shipped H200 reference profiles (newest file first)."""
    from replayssm_cli.report import results as results_mod
    from replayssm_cli.report.provenance import file_label

    if results_path is not None:
        res = results_mod.load(results_path)
        loaded, describe = [res], str(results_path)
    else:
        loaded = results_mod.reference_profiles("h200")
        describe = "the shipped H200 reference profiles (profiles/reference/h200-*.json), newest file first"
    files = [TimeFile(file_label(r), [row for row in r.rows if row.get("preset") == preset_name], r.environment) for r in loaded]
    files = [f for f in files if f.rows]
    if not files:
        where = str(results_path) if results_path else "the shipped H200 reference"
        have = sorted({str(row.get("preset")) for r in loaded for row in r.rows})
        raise UserError(f"{where} has no rows for preset {preset_name}",
                        f"it has: {', '.join(have) or 'no rows'}; or pass --results FILE from `replayssm profile`")
    return TimeSource(describe, files)


def measured_candidates(source: TimeSource) -> list[Candidate]:
    """The plain-decode configurations the source timed (kernel rows, window average), conventional first."""
    seen: dict[tuple, Candidate] = {}
    for f in source.files:
        for r in f.rows:
            if r.get("kind", "kernel") != "kernel" or r.get("phase", "avg") != "avg" or (r.get("draft") or 0):
                continue
            if r.get("variant") not in tuner.CONVENTIONAL + tuner.REPLAY or r.get("status") != "ok":
                continue
            replay = r["variant"] in tuner.REPLAY
            c = Candidate(r["variant"], r["state_dtype"], r.get("window") if replay else None, r.get("read_dtype"),
                          rounding=rounding_of(r))
            seen.setdefault((c.variant, c.state_dtype, c.window, c.read_dtype, c.rounding), c)
    return sorted(seen.values(), key=lambda c: (c.is_replay, c.label()))


@dataclass
class Point:
    """A measured time at one batch and the file it came from."""

    batch: int
    timing: Timing
    label: str


class Times:
    """Per-candidate step times at any batch: the measured batch itself, else linear in batch between the measured
    batches either side (a memory-bound step's time grows linearly with the rows it moves), else extrapolated from
    the two largest; each Timing's note says which and from where."""

    def __init__(self, source: TimeSource, preset: str, kind: str = "kernel", energy: bool = False):
        self.source = source
        self.preset = preset
        self.kind = kind
        self.energy = energy
        self._points: dict[Candidate, list[Point]] = {}

    def _rows(self, f: TimeFile) -> list[dict[str, Any]]:
        rows = [r for r in f.rows if r.get("kind", "kernel") == self.kind]
        # The tuner matches kernel rows only; a whole-model row names its configuration the same way.
        rows = [{**r, "kind": "kernel"} for r in rows] if self.kind != "kernel" else rows
        if not self.energy:
            return rows
        # Energy through the same matching and interpolation: microjoules per layer-step (or model step) as the "time".
        key = "j_per_layer_step" if self.kind == "kernel" else "j_per_model_step"
        out = []
        for r in rows:
            e = r.get("x_energy") if isinstance(r.get("x_energy"), dict) else {}
            if isinstance(e.get(key), (int, float)):
                uj = e[key] * 1e6
                out.append({**r, "us": uj, "us_per_token": uj, "spread": e.get("spread") or 0.0})
        return out

    def points(self, c: Candidate) -> list[Point]:
        if c not in self._points:
            found: dict[int, Point] = {}
            for f in self.source.files:
                rows = self._rows(f)
                for b in sorted({int(r["batch"]) for r in rows} - set(found)):
                    t = tuner.timing_from_rows(rows, c, b, preset=self.preset)
                    if t is not None and t.status == "ok":
                        found[b] = Point(b, t, f.label)
            self._points[c] = [found[b] for b in sorted(found)]
        return self._points[c]

    def __call__(self, c: Candidate, batch: int) -> Timing | None:
        pts = self.points(c)
        if not pts:
            return None
        exact = next((p for p in pts if p.batch == batch), None)
        if exact is not None:
            t = exact.timing
            return Timing(t.us, t.us_per_token, t.spread, t.source, t.status, _join(t.note, f"batch {batch} of {exact.label}"))
        below = [p for p in pts if p.batch < batch]
        above = [p for p in pts if p.batch > batch]
        if below and above:
            a, b = below[-1], above[0]
            how = f"interpolated between batch {a.batch} and {b.batch} of " + (a.label if a.label == b.label else f"{a.label} and {b.label}")
            spread = max(a.timing.spread, b.timing.spread)
        elif len(below) >= 2:
            a, b = below[-2], below[-1]
            how = f"extrapolated beyond batch {b.batch} of {b.label} (linear in batch from {a.batch} and {b.batch})"
            spread = max(a.timing.spread, b.timing.spread, tuner.PREDICTED_SPREAD)
        else:
            return None
        f = (batch - a.batch) / (b.batch - a.batch)
        us = a.timing.us + f * (b.timing.us - a.timing.us)
        per_token = a.timing.us_per_token + f * (b.timing.us_per_token - a.timing.us_per_token)
        if not us > 0 or not per_token > 0:
            return None
        return Timing(us, per_token, spread, "measured", note=how)

    def batches(self, c: Candidate) -> list[int]:
        return [p.batch for p in self.points(c)]


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def pct(values: np.ndarray, weights: np.ndarray, q: float) -> float | None:
    """The weighted q-quantile (0-1) of values, or None without weight."""
    if values.size == 0 or weights.sum() <= 0:
        return None
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cum = np.cumsum(w)
    return float(v[min(np.searchsorted(cum, q * cum[-1]), len(v) - 1)])


@dataclass
class Load:
    """The traffic reduced to what the projection needs: seconds and tokens at each integer concurrency n."""

    time_at: np.ndarray
    tokens_at: np.ndarray | None
    itl_sum_at: np.ndarray | None
    token_n: np.ndarray | None
    token_out_len: np.ndarray | None
    idle_s: float
    duration: float
    note: str

    @property
    def peak(self) -> int:
        nz = np.flatnonzero(self.time_at[1:] > 0)
        return int(nz[-1] + 1) if nz.size else 0


def load_of(t: Traffic) -> Load | None:
    """Time and tokens per concurrency level, from the timeline (and each inter-token gap where the file has them)."""
    if t.timeline is None:
        if t.mean_concurrency is None or t.duration is None:
            return None
        n = max(1, int(round(t.mean_concurrency)))
        time_at = np.zeros(n + 1)
        time_at[n] = t.duration
        load = Load(time_at, None, None, None, None, 0.0, t.duration,
                    f"one level at the mean concurrency {t.mean_concurrency:.1f} (decode time over duration)")
        if t.itl_values is not None:
            # Every gap at that one level: the file's own ITL, without knowing when each came.
            load.tokens_at, load.itl_sum_at = np.zeros(n + 1), np.zeros(n + 1)
            load.tokens_at[n], load.itl_sum_at[n] = t.itl_values.size, t.itl_values.sum()
            load.token_n = np.full(t.itl_values.size, n)
            if t.output_lens is not None:
                load.token_out_len = t.output_lens[t.itl_request]
        return load
    edges, running = t.timeline
    n_seg = np.rint(running).astype(np.int64)
    dur = np.diff(edges)
    time_at = np.bincount(n_seg, weights=dur)
    idle = float(time_at[0]) if time_at.size else 0.0
    load = Load(time_at, None, None, None, None, idle, float(edges[-1] - edges[0]), t.timeline_note)
    if t.itl_times is not None:
        seg = np.clip(np.searchsorted(edges, t.itl_times, side="right") - 1, 0, len(n_seg) - 1)
        tok_n = np.maximum(n_seg[seg], 1)
        size = max(time_at.size, int(tok_n.max()) + 1)
        load.time_at = np.pad(time_at, (0, size - time_at.size))
        load.tokens_at = np.bincount(tok_n, minlength=size).astype(float)
        load.itl_sum_at = np.bincount(tok_n, weights=t.itl_values, minlength=size)
        load.token_n = tok_n
        if t.output_lens is not None:
            load.token_out_len = t.output_lens[t.itl_request]
    return load


@dataclass
class Cohort:
    """One range of concurrency [lo, hi) and what the traffic did in it."""

    lo: int
    hi: int | None
    time_s: float
    time_share: float
    token_share: float | None
    mean_n: float
    p50_n: int | None
    p95_n: int | None
    peak_n: int
    batch: int
    out_len_p50: float | None = None
    out_len_p95: float | None = None
    decision: tuner.Decision | None = None
    rows: dict[str, Any] = field(default_factory=dict)

    def label(self) -> str:
        return f"{self.lo}+" if self.hi is None else (f"{self.lo}" if self.hi == self.lo + 1 else f"{self.lo}-{self.hi - 1}")


def cohorts_of(load: Load, edges: Sequence[int]) -> list[Cohort]:
    """The non-empty cohorts [edges[i], edges[i+1]) and [edges[-1], inf) of decoding time."""
    if list(edges) != sorted(set(edges)) or not edges or edges[0] < 1:
        raise ValueError(f"cohort edges must be increasing positive integers, got {list(edges)}")
    n_all = np.arange(load.time_at.size)
    busy = load.time_at[1:].sum()
    out = []
    bounds = list(edges) + [None]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        m = (n_all >= lo) & (n_all < (hi if hi is not None else np.inf))
        secs = float(load.time_at[m].sum())
        if secs <= 0:
            continue
        n, w = n_all[m], load.time_at[m]
        c = Cohort(
            lo, hi, secs, secs / load.duration if load.duration else 0.0, None,
            float((n * w).sum() / w.sum()), int(pct(n, w, 0.5)), int(pct(n, w, 0.95)), int(n[w > 0].max()), 0,
        )
        c.batch = max(1, int(round(c.mean_n)))
        if load.tokens_at is not None:
            tok = load.tokens_at[m]
            c.token_share = float(tok.sum() / load.tokens_at.sum()) if load.tokens_at.sum() else None
            if tok.sum() > 0:
                c.batch = max(1, int(round((n * tok).sum() / tok.sum())))
            if load.token_n is not None:
                sel = (load.token_n >= lo) & (load.token_n < (hi if hi is not None else np.inf))
                if load.token_out_len is not None and sel.any():
                    ones = np.ones(int(sel.sum()))
                    c.out_len_p50 = pct(load.token_out_len[sel].astype(float), ones, 0.5)
                    c.out_len_p95 = pct(load.token_out_len[sel].astype(float), ones, 0.95)
        elif busy > 0:
            # Without ITLs, tokens taken as time x concurrency (one ITL at every level).
            c.token_share = float((n * w).sum() / (n_all * load.time_at).sum())
        out.append(c)
    return out


def bucket_for(length: float | None, labels: Sequence[str]) -> str | None:
    """The quality bucket (quality.BUCKETS) that a generation length falls in, capped at the longest that ran."""
    from replayssm_cli.measure.quality import BUCKETS

    if not labels:
        return None
    if length is None:
        return labels[-1]
    for label, first, last in BUCKETS:
        if label in labels and (last is None or length <= last):
            return label
    return labels[-1]


def quality_steps(t: Traffic) -> int:
    """Generated tokens the quality run decodes: the traffic's 99th-percentile generation length, within bounds."""
    if t.output_lens is None or t.output_lens.size == 0:
        return MAX_QUALITY_STEPS
    p99 = float(np.percentile(t.output_lens, 99))
    return int(min(max(p99, MIN_QUALITY_STEPS), MAX_QUALITY_STEPS))


def run_quality(preset, cands: Sequence[Candidate], *, steps: int, heads: int, seed: int = 0, progress: bool = True):
    """The long-decode quality run (replayssm_cli.measure.quality) for the stored precisions of the candidates."""
    from replayssm_cli.measure import quality
    from replayssm_cli.model import ops

    a_range = preset.a_log_range or ops.named(preset.kind).a_log_range
    inputs = quality.synthetic_inputs(preset.shape, a_range=a_range, dt_softplus=preset.dt_softplus, steps=steps,
                                      heads=heads, seed=seed)
    configs = list(dict.fromkeys(quality.Config(*c.quality_key()) for c in cands))
    if not progress:
        return quality.run(inputs, configs)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.console import err

    bar = Progress(TextColumn("[bold]quality[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err,
                   transient=True)
    with bar:
        task = bar.add_task("quality", total=inputs.generated)
        return quality.run(inputs, configs, on_step=lambda n: bar.update(task, completed=n))


@dataclass
class Plan:
    """Everything `replayssm plan` reports."""

    traffic: Traffic
    load: Load | None
    preset: Any
    source: TimeSource
    cohorts: list[Cohort]
    candidates: list[Candidate]
    error_budget: float
    memory_budget: float | None
    memory_note: str
    quality: Any
    switch: list[dict[str, Any]]
    totals: dict[str, Any]
    notes: list[str]

    def to_dict(self) -> dict[str, Any]:
        p = self.preset
        return {
            "traffic": self.traffic.to_dict(),
            "preset": {"name": p.name, "kind": p.kind, "shape": p.label(), "ssm_layers": p.ssm_layers, "tp": p.tp},
            "times": {"describe": self.source.describe, "gpu": self.source.gpu_name, "files": [f.label for f in self.source.files]},
            "candidates": [c.label() for c in self.candidates],
            "error_budget": self.error_budget,
            "memory_budget_bytes": self.memory_budget,
            "memory_budget_note": self.memory_note,
            "load": None if self.load is None else {
                "duration_s": self.load.duration,
                "idle_share": self.load.idle_s / self.load.duration if self.load.duration else None,
                "peak_concurrency": self.load.peak,
                "how": self.load.note,
                "seconds_at_concurrency": {int(n): float(s) for n, s in enumerate(self.load.time_at) if s > 0 and n > 0},
            },
            "cohorts": [c.rows for c in self.cohorts],
            "switch": self.switch,
            "engine_flags": engine_flags.settings(self.preset.kind, [c.decision for c in self.cohorts if c.decision]),
            "totals": self.totals,
            "quality": self.quality.to_dict() if self.quality is not None else None,
            "notes": self.notes,
        }


def _memory(preset):
    def memory(c: Candidate):
        try:
            return tuner.memory_of(preset.shape, c)
        except ValueError:
            return None

    return memory


def _error_at(quality, labels: Sequence[str]):
    """error(candidate) for the tuner: the config's error in the bucket `labels` picks, or None without a run."""
    from replayssm_cli.measure.quality import Config

    def error(c: Candidate, bucket: str | None = None):
        if quality is None:
            return None
        e = quality.get(Config(*c.quality_key()))
        if e is None:
            return None
        return e.buckets.get(bucket or labels[-1], e.longest)

    return error


def _saved_us(times: Times, base: Candidate, choice: Candidate, n: np.ndarray, layers: int) -> tuple[np.ndarray, ...]:
    """Microseconds per model step that `choice` saves over `base` at each concurrency in n: point, low, high."""
    point, lo, hi = (np.zeros(n.size) for _ in range(3))
    if choice == base:
        return point, lo, hi
    for i, b in enumerate(n):
        tb, tc = times(base, int(b)), times(choice, int(b))
        if tb is None or tc is None:
            point[i] = lo[i] = hi[i] = math.nan
            continue
        point[i] = layers * (tb.us_per_token - tc.us_per_token)
        lo[i] = layers * (tb.lo - tc.hi)
        hi[i] = layers * (tb.hi - tc.lo)
    return point, lo, hi


def _e2e_step_us(e2e: Times, n: np.ndarray) -> np.ndarray | None:
    """The whole-model conventional step at each concurrency, from the e2e rows of the source; None without them."""
    conv = next((c for c in [Candidate("conventional", "fp32"), Candidate("conventional", "bf16")] if e2e.points(c)), None)
    if conv is None:
        return None
    return np.array([t.us if (t := e2e(conv, int(b))) is not None else math.nan for b in n])


def build(
    traffic: Traffic,
    preset,
    source: TimeSource,
    *,
    cohort_edges: Sequence[int] = DEFAULT_COHORTS,
    error_budget: float = DEFAULT_ERROR_BUDGET,
    memory_budget: float | None = None,
    quality=None,
) -> Plan:
    """Project the traffic onto the source's times: per cohort the tuner's decision at its token-weighted
    concurrency, and over the whole traffic the gain in ITL and tokens per second."""
    notes = list(traffic.missing)
    cands = measured_candidates(source)
    if not any(not c.is_replay for c in cands):
        raise UserError(f"the times ({source.describe}) hold no conventional rows for {preset.name}",
                        "profile both variants: `replayssm profile --preset NAME`")
    times = Times(source, preset.name)
    e2e_times = Times(source, preset.name, kind="e2e")
    memory_note = "none (pass --memory-budget GiB for what weights and KV cache leave to SSM states)"
    if memory_budget is None and source.memory_bytes:
        memory_budget = float(source.memory_bytes)
        memory_note = (f"{memory_budget / 2**30:.0f} GiB, the whole {source.gpu_name}; pass --memory-budget for what "
                       "weights and KV cache leave")
    elif memory_budget is not None:
        memory_note = f"{memory_budget / 2**30:g} GiB (--memory-budget)"
    labels = quality.bucket_labels if quality is not None else []
    error = _error_at(quality, labels)
    overall_bucket = bucket_for(float(np.percentile(traffic.output_lens, 95)) if traffic.output_lens is not None else None, labels)
    if quality is None:
        notes.append("quality margins: no quality run (--steps 0)")
    conventional = [c for c in cands if not c.is_replay]
    base_cand = next((c for c in conventional if c.state_dtype == preset.state_dtype and c.rounding == "nearest"), conventional[0])
    baseline = base_cand.state_dtype

    memory = _memory(preset)

    def decide(batch: int, bucket: str | None, peak: int | None = None) -> tuner.Decision:
        """The tuner at `batch`; with `peak`, among the candidates whose memory fits `peak` sequences (the tuner's
        own memory check is at the batch it decides for, the right one for a single concurrency level)."""
        group = cands
        if peak is not None and memory_budget:
            group = [c for c in cands if (m := memory(c)) is None or peak * m["total"] * preset.ssm_layers <= memory_budget]
        return tuner.decide(batch, group or cands, timing=times, error=lambda c: error(c, bucket), memory=memory,
                            layers=preset.ssm_layers, error_budget=error_budget,
                            memory_budget=None if peak is not None else memory_budget, baseline_dtype=baseline)

    load = load_of(traffic)
    if load is None:
        return Plan(traffic, None, preset, source, [], cands, error_budget, memory_budget, memory_note, quality, [], {}, notes)
    n_levels = np.arange(load.time_at.size)
    e2e_conv = _e2e_step_us(e2e_times, n_levels)
    e2e_label = next((f.label for f in source.files if any(r.get("kind") == "e2e" for r in f.rows)), None)
    # The concurrency level's ITL: the traffic's own mean where it has gaps, else the shipped whole-model step.
    itl_at = None
    itl_how = None
    if load.itl_sum_at is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            itl_at = load.itl_sum_at / load.tokens_at * 1e6
        itl_how = "your ITL (the traffic's inter-token gaps at each concurrency)"
    elif e2e_conv is not None:
        itl_at = e2e_conv
        itl_how = f"the whole-model conventional step of {e2e_label} (the traffic has no ITLs)"
        ok = np.isfinite(itl_at) & (itl_at > 0)
        load.tokens_at = np.where(ok, load.time_at * n_levels / np.where(ok, itl_at, 1.0) * 1e6, 0.0)
        load.tokens_at[0] = 0.0
        notes.append("tokens per concurrency level: estimated as time x concurrency / the whole-model step (the traffic "
                     "has no inter-token gaps)")
    cohorts = cohorts_of(load, cohort_edges)
    level_choice: dict[int, Candidate] = {}
    for c in cohorts:
        bucket = bucket_for(c.out_len_p95, labels) if c.out_len_p95 is not None else overall_bucket
        d = decide(c.batch, bucket, peak=c.peak_n)
        c.decision = d
        choice = d.choice
        m = (n_levels >= c.lo) & (n_levels < (c.hi if c.hi is not None else np.inf)) & (load.time_at > 0)
        for n in n_levels[m]:
            level_choice[int(n)] = choice.candidate if choice else base_cand
        c.rows = _cohort_row(c, d, preset, times, load, n_levels[m], itl_at, itl_how, e2e_conv, e2e_label, memory_budget,
                             error_budget, quality, bucket, error)
    switch = _switch(decide, load.peak, overall_bucket)
    totals = _totals(load, times, base_cand, level_choice, preset.ssm_layers, itl_at, itl_how)
    totals["energy"] = _energy_totals(load, Times(source, preset.name, energy=True), Times(source, preset.name, "e2e", energy=True),
                                      base_cand, level_choice, preset.ssm_layers)
    return Plan(traffic, load, preset, source, cohorts, cands, error_budget, memory_budget, memory_note, quality, switch,
                totals, notes)


def _cohort_row(c: Cohort, d: tuner.Decision, preset, times: Times, load: Load, levels: np.ndarray, itl_at, itl_how,
                e2e_conv, e2e_label, memory_budget, error_budget, quality, bucket, error) -> dict[str, Any]:
    a = d.choice
    row: dict[str, Any] = {
        "cohort": c.label(), "lo": c.lo, "hi": c.hi, "seconds": c.time_s, "time_share": c.time_share,
        "token_share": c.token_share, "mean_concurrency": c.mean_n, "p50_concurrency": c.p50_n,
        "p95_concurrency": c.p95_n, "peak_concurrency": c.peak_n, "batch": c.batch,
        "output_len_p50": c.out_len_p50, "output_len_p95": c.out_len_p95,
        "summary": d.summary, "replay_pays": d.replay_pays,
    }
    if a is None:
        row["recommended"] = None
        return row
    cand = a.candidate
    t = a.timing
    base = d.baseline.candidate if d.baseline else None
    row.update({
        "recommended": cand.to_dict(),
        "kernel_speedup": a.speedup, "kernel_speedup_lo": a.speedup_lo, "kernel_speedup_hi": a.speedup_hi,
        "speedup_over": base.label() if base else None,
        "us_per_token_layer": a.us_per_token,
        "time_from": t.note if t else None,
        "baseline_time_from": d.baseline.timing.note if d.baseline and d.baseline.timing else None,
    })
    # Flushes: one per W tokens per sequence, so a step at batch n flushes about n / W rows (staggered).
    if cand.is_replay and cand.window:
        itl_us = itl_at[c.batch] if itl_at is not None and c.batch < len(itl_at) and np.isfinite(itl_at[c.batch]) else None
        row["flush"] = {
            "every_tokens": cand.window,
            "rows_per_step": c.batch / cand.window,
            "every_ms": itl_us * cand.window / 1e3 if itl_us else None,
        }
    mem = a.mem_per_seq
    row["mem_per_seq_model"] = mem
    if mem is not None and memory_budget:
        need = c.peak_n * mem
        row["peak_need_bytes"] = need
        row["peak_fits"] = need <= memory_budget
        row["memory_headroom"] = 1 - need / memory_budget
        row["seqs_fit"] = int(memory_budget // mem)
    err = error(cand, bucket) if quality is not None else None
    row["quality_bucket"] = bucket
    row["quality_error"] = err
    row["quality_margin"] = (error_budget / err) if err else None
    if base is not None and base != cand:
        saved, saved_lo, saved_hi = _saved_us(times, base, cand, levels, preset.ssm_layers)
        if itl_at is not None:
            w = load.tokens_at[levels]
            itl = itl_at[levels]
            ok = np.isfinite(saved) & np.isfinite(itl) & (w > 0)
            if ok.any():
                before = (w[ok] * itl[ok]).sum()
                row["e2e_speedup"] = float(before / (w[ok] * (itl[ok] - saved[ok])).sum())
                row["e2e_speedup_lo"] = float(before / (w[ok] * (itl[ok] - saved_lo[ok])).sum())
                row["e2e_speedup_hi"] = float(before / (w[ok] * (itl[ok] - saved_hi[ok])).sum())
                row["e2e_from"] = f"{itl_how}, less the SSM time the configuration saves per step"
                row["itl_ms"] = float(before / w[ok].sum() / 1e3)
        if e2e_conv is not None and itl_how and not itl_how.startswith("the whole-model") and np.isfinite(e2e_conv[c.batch]):
            step = e2e_conv[c.batch]
            s = _saved_us(times, base, cand, np.array([c.batch]), preset.ssm_layers)[0][0]
            if np.isfinite(s):
                row["model_step_speedup"] = float(step / (step - s))
                row["model_step_from"] = f"the whole-model conventional step of {e2e_label} at batch {c.batch}, less the SSM time saved"
    else:
        row["e2e_speedup"] = 1.0 if itl_at is not None else None
    return row


def _switch(decide, peak: int, bucket: str | None) -> list[dict[str, Any]]:
    """Ranges of concurrency 1..peak over which one configuration is recommended, from the tuner at every level."""
    out: list[dict[str, Any]] = []
    for n in range(1, max(peak, 1) + 1):
        d = decide(n, bucket)
        label = d.choice.candidate.label() if d.choice else "none"
        if out and out[-1]["run"] == label:
            out[-1]["to"] = n
            continue
        out.append({"from": n, "to": n, "run": label, "replay": bool(d.choice and d.choice.candidate.is_replay)})
    return out


def switch_line(switch: list[dict[str, Any]]) -> str:
    """One sentence: where ReplaySSM is switched on, from the ranges of `_switch`."""
    if not switch:
        return "no decoding in the traffic: nothing to switch"
    replay = [s for s in switch if s["replay"]]
    if not replay:
        return f"conventional decode throughout (1-{switch[-1]['to']} running sequences): ReplaySSM does not pay on this traffic"
    first = replay[0]["from"]
    if all(s["replay"] for s in switch if s["from"] >= first):
        runs = ", ".join(f"{s['run']} at {s['from']}-{s['to']}" for s in switch if s["replay"])
        if first == 1:
            return f"ReplaySSM at every concurrency in the traffic ({runs})"
        return f"ReplaySSM at {first} or more running sequences ({runs}), conventional below {first}"
    parts = ", ".join(f"{s['from']}-{s['to']}: {s['run']}" for s in switch)
    return f"by running sequences: {parts}"


def _totals(load: Load, times: Times, base: Candidate, choice: dict[int, Candidate], layers: int, itl_at, itl_how) -> dict[str, Any]:
    """Traffic-weighted gains: mean ITL over every generated token, and tokens per second over the decoding time."""
    if itl_at is None:
        return {"note": "no ITL: the traffic has no inter-token gaps and the times hold no whole-model step"}
    levels = np.array(sorted(choice))
    saved = np.zeros((3, levels.size))
    for cand in set(choice.values()):
        m = np.array([choice[int(n)] == cand for n in levels])
        saved[:, m] = np.vstack(_saved_us(times, base, cand, levels[m], layers))
    itl = itl_at[levels]
    secs = load.time_at[levels]
    tokens = load.tokens_at[levels]
    ok = np.isfinite(itl) & np.all(np.isfinite(saved), axis=0) & (tokens > 0)
    if not ok.any():
        return {"note": "no concurrency level has both an ITL and the configurations' times"}
    out: dict[str, Any] = {"itl_from": itl_how, "levels_left_out": int((~ok).sum())}
    itl, secs, tokens, saved, levels = itl[ok], secs[ok], tokens[ok], saved[:, ok], levels[ok]
    before = (tokens * itl).sum() / tokens.sum()
    out["itl_ms_before"] = float(before / 1e3)
    for name, s in (("", saved[0]), ("_lo", saved[1]), ("_hi", saved[2])):
        after = (tokens * (itl - s)).sum() / tokens.sum()
        if name == "":
            out["itl_ms_after"] = float(after / 1e3)
        out[f"itl_speedup{name}"] = float(before / after)
        # Over the same decoding time, a level's tokens per second scale as concurrency over ITL.
        out[f"tokens_per_s_gain{name}"] = float((secs * levels / (itl - s)).sum() / (secs * levels / itl).sum())
    out["tokens_per_s_before"] = float((secs * levels / itl * 1e6).sum() / secs.sum())
    out["tokens_per_s_after"] = out["tokens_per_s_before"] * out["tokens_per_s_gain"]
    return out


def _energy_totals(load: Load, energy: Times, e2e: Times, base: Candidate, choice: dict[int, Candidate], layers: int) -> dict[str, Any]:
    """Traffic-weighted joules per token: of the SSM layers (profile --energy rows), and of the whole model step where
    the times hold its energy (e2e --energy), less what the SSM layers save."""
    levels = np.array(sorted(choice))
    if levels.size == 0 or not energy.points(base):
        return {"note": "the times hold no energy measurements; `replayssm profile --energy` measures them"}
    before, after = np.full(levels.size, math.nan), np.full(levels.size, math.nan)
    for i, n in enumerate(levels):
        eb, ec = energy(base, int(n)), energy(choice[int(n)], int(n))
        if eb is not None and ec is not None:
            before[i], after[i] = layers * eb.us_per_token / n / 1e6, layers * ec.us_per_token / n / 1e6
    tokens = load.tokens_at[levels] if load.tokens_at is not None else load.time_at[levels] * levels
    ok = np.isfinite(before) & np.isfinite(after) & (tokens > 0)
    if not ok.any():
        return {"note": "no concurrency level has energy measurements of both configurations"}
    w = tokens[ok] / tokens[ok].sum()
    out: dict[str, Any] = {
        "ssm_j_per_token_before": float((w * before[ok]).sum()), "ssm_j_per_token_after": float((w * after[ok]).sum()),
        "from": f"{energy.points(base)[0].label} and the other files' x_energy, interpolated in batch as the times are",
    }
    out["ssm_tokens_per_j_gain"] = out["ssm_j_per_token_before"] / out["ssm_j_per_token_after"]
    conv = next((c for c in (Candidate("conventional", "fp32"), Candidate("conventional", "bf16")) if e2e.points(c)), None)
    if conv is not None:
        whole = np.array([t.us / n / 1e6 if (t := e2e(conv, int(n))) is not None else math.nan for n in levels])
        good = ok & np.isfinite(whole)
        if good.any():
            w = tokens[good] / tokens[good].sum()
            b = (w * whole[good]).sum()
            a = (w * (whole[good] - (before[good] - after[good]))).sum()
            out.update(model_j_per_token_before=float(b), model_j_per_token_after=float(a), model_tokens_per_j_gain=float(b / a))
    return out


def _x(value: float | None, lo: float | None = None, hi: float | None = None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if lo is None or hi is None:
        return f"{value:.2f}x"
    return f"{value:.2f}x ({lo:.2f}-{hi:.2f})"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _len(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def render(plan: Plan, console) -> None:
    """The plan for people: the load, one row per cohort, the traffic-weighted gain, where to switch, and where every
    figure came from."""
    from rich import box
    from rich.table import Table

    t, p, load = plan.traffic, plan.preset, plan.load
    failed = f" ({t.failed} failed, left out)" if t.failed else ""
    span = f", {t.duration:,.0f} s" if t.duration else ""
    console.print(
        f"[bold]replayssm plan[/] · {p.display} ({p.label()}, {p.ssm_layers} SSM layers, tp {p.tp}) · {plan.source.gpu_name}\n"
        f"traffic: {t.path.name}, {t.describe}: {t.requests:,} requests{failed}{span}"
        + (f"; {load.note}" if load else "") + "\n"
        f"times: {plan.source.describe}; between measured batches they are interpolated, and each row says so below\n"
        f"error budget {plan.error_budget:.0e} · memory budget {plan.memory_note}",
        highlight=False,
    )
    if load is None:
        for n in plan.notes:
            console.print(f"could not compute {n}", highlight=False)
        return
    idle = f"; idle (nothing decoding) {_share(load.idle_s / load.duration)} of the time" if load.duration else ""
    console.print(f"peak {load.peak} sequences decoding{idle}", highlight=False)
    dist = Table(title="Sequences decoding over time, by cohort", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("cohort", "time", "tokens", "mean", "p95", "peak", "gen. len p50", "p95"):
        dist.add_column(name, justify="left" if name == "cohort" else "right", no_wrap=True)
    for c in plan.cohorts:
        dist.add_row(c.label(), _share(c.time_share), _share(c.token_share), f"{c.mean_n:.1f}", str(c.p95_n), str(c.peak_n),
                     _len(c.out_len_p50), _len(c.out_len_p95))
    console.print(dist)
    tab = Table(title="Per cohort: what to run at its token-weighted concurrency, and its gain", title_justify="left",
                box=box.SIMPLE_HEAD)
    for name in ("cohort", "at", "run", "kernel", "end-to-end"):
        tab.add_column(name, justify="left" if name in ("cohort", "run") else "right", no_wrap=name != "run")
    cost = Table(title="Per cohort: flushes, memory at its peak, quality at its lengths", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("cohort", "flush every", "rows/step", "MiB/seq", "peak needs", "free", "error", "margin"):
        cost.add_column(name, justify="left" if name == "cohort" else "right", no_wrap=True)
    foot: list[str] = []
    for c in plan.cohorts:
        r = c.rows
        rec = r.get("recommended")
        if rec is None:
            tab.add_row(c.label(), str(c.batch), "[red]nothing within the budgets[/]", "-", "-")
            continue
        run = rec["label"] if r["replay_pays"] or rec["variant"] not in tuner.CONVENTIONAL else f"{rec['label']} [dim](ReplaySSM does not pay)[/]"
        tab.add_row(c.label(), str(c.batch), run, _x(r.get("kernel_speedup"), r.get("kernel_speedup_lo"), r.get("kernel_speedup_hi")),
                    _x(r.get("e2e_speedup"), r.get("e2e_speedup_lo"), r.get("e2e_speedup_hi")))
        flush = r.get("flush")
        every = "-" if not flush else f"{flush['every_tokens']} tok" + (f", {flush['every_ms'] / 1e3:.2g} s" if flush.get("every_ms") else "")
        mem = r.get("mem_per_seq_model")
        need = r.get("peak_need_bytes")
        free = "-" if "peak_fits" not in r else (_share(r["memory_headroom"]) if r["peak_fits"] else "[red]does not fit[/]")
        margin = r.get("quality_margin")
        cost.add_row(c.label(), every, f"{flush['rows_per_step']:.1f}" if flush else "-", "-" if mem is None else f"{mem / 2**20:,.0f}",
                     "-" if need is None else f"{need / 2**30:,.1f} GiB", free,
                     "-" if r.get("quality_error") is None else f"{r['quality_error']:.1e}",
                     f"{margin:.1f}x ({r['quality_bucket']})" if margin else "-")
        foot.append(f"{c.label()}: {rec['label']}: {r.get('time_from') or '-'}; over {r.get('speedup_over')}: "
                    f"{r.get('baseline_time_from') or '-'}")
        if r.get("e2e_from"):
            foot.append(f"{c.label()}: end-to-end: {r['e2e_from']} (ITL {r['itl_ms']:.1f} ms)"
                        + (f"; the whole-model step: {_x(r['model_step_speedup'])} ({r['model_step_from']})" if r.get("model_step_speedup") else ""))
    console.print(tab)
    console.print(cost)
    legend = {f.label: f"#{k}" for k, f in enumerate(plan.source.files, 1)}
    tot = plan.totals
    if "itl_speedup" in tot:
        console.print(
            f"traffic-weighted: mean ITL {tot['itl_ms_before']:.2f} -> {tot['itl_ms_after']:.2f} ms "
            f"({_x(tot['itl_speedup'], tot['itl_speedup_lo'], tot['itl_speedup_hi'])}), decode tokens/s "
            f"{_x(tot['tokens_per_s_gain'], tot['tokens_per_s_gain_lo'], tot['tokens_per_s_gain_hi'])}, over {tot['itl_from']}",
            highlight=False,
        )
    else:
        console.print(f"traffic-weighted gain: not computed ({tot.get('note')})", highlight=False)
    en = tot.get("energy") or {}
    if "ssm_tokens_per_j_gain" in en:
        whole = (f"; whole model {en['model_j_per_token_before']:.3g} -> {en['model_j_per_token_after']:.3g} J/token "
                 f"({_x(en['model_tokens_per_j_gain'])} tokens/J)") if "model_tokens_per_j_gain" in en else ""
        console.print(f"energy: SSM layers {en['ssm_j_per_token_before']:.3g} -> {en['ssm_j_per_token_after']:.3g} J/token "
                      f"({_x(en['ssm_tokens_per_j_gain'])} tokens/J){whole}, from {en['from']}", highlight=False)
    elif en:
        console.print(f"energy: not computed ({en['note']})", style="dim", highlight=False)
    console.print(f"[bold]switch[/]: {switch_line(plan.switch)}", highlight=False)
    decisions = [c.decision for c in plan.cohorts if c.decision]
    for line in engine_flags.lines(plan.preset.kind, decisions):
        console.print(line.replace("(batch ", "(cohorts at "), highlight=False)
    console.print("kernel speedups: over the conventional step at the same state precision (split: over fp32 conventional); "
                  "ranges from each time's interquartile spread", style="dim", highlight=False)
    for label, ref in legend.items():
        foot = [line.replace(label, ref) for line in foot]
    for line in foot:
        console.print(line, style="dim", highlight=False)
    for label, ref in legend.items():
        if any(ref in line for line in foot):
            console.print(f"{ref} {label}", style="dim", highlight=False)
    q = plan.quality
    if q is not None and any(c.out_len_p95 and c.out_len_p95 > q.steps for c in plan.cohorts):
        console.print(f"quality: the run decoded {q.steps:,} tokens ({q.source}); a cohort generating longer is taken at its "
                      "longest bucket (--steps runs longer)", style="dim", highlight=False)
    for n in plan.notes:
        console.print(f"could not compute {n}", style="yellow", highlight=False)
