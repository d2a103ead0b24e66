"""Which variant, window and state precision to run at each batch size, and why every other candidate lost; no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

# A prediction scaled by measured neighbours counts as this wide (relative, whole interval) at the least.
PREDICTED_SPREAD = 0.05
# A calibrated prediction that borrows another configuration's efficiency curve is not known better than this (±).
BORROWED_ERROR = 0.10
# The cost model alone is a roofline bound: measured kernels miss it by up to about this much (relative, ±).
UNCALIBRATED_ERROR = 0.30
# Repeat runs of one measurement differ by about this much even when its own samples agree.
MIN_SPREAD = 0.02
DEFAULT_WINDOWS = (4, 8, 16, 32, 64)
DEFAULT_STATE_DTYPES = ("fp32", "bf16", "fp16", "int8", "fp8")
# 8-bit states: no narrower read copy, and no snapshot-writing decode_multi for them.
EIGHT_BIT = ("fp8", "int8")
DEFAULT_READ_DTYPES = ("bf16", "fp16", "fp8")
DEFAULT_ERROR_BUDGET = 1e-3
GIB = 1024**3

CONVENTIONAL = ("conventional", "spec-conventional")
REPLAY = ("replay", "split", "spec-replay")


@dataclass(frozen=True)
class Candidate:
    """One way to run the SSM layers: a variant with its window, dtypes and (speculative) draft width."""

    variant: str
    state_dtype: str
    window: int | None = None
    read_dtype: str | None = None
    draft: int = 0
    accepted: float | None = None
    # How the stored state rounds: "nearest", or "stochastic" (16-bit and 8-bit states only).
    rounding: str = "nearest"

    @property
    def is_replay(self) -> bool:
        return self.variant in REPLAY

    def label(self) -> str:
        parts = [self.variant]
        if self.draft:
            parts.append(f"T{self.draft}")
        if self.window:
            parts.append(f"W{self.window}")
        parts.append(f"{self.state_dtype}+{self.read_dtype}" if self.read_dtype else self.state_dtype)
        if self.rounding == "stochastic":
            parts.append("SR")
        return " ".join(parts)

    def quality_key(self) -> tuple[str, str, int | None, str | None, str]:
        """The quality-harness config with the same stored precision (replayssm_cli.measure.quality.Config.key())."""
        if self.variant in CONVENTIONAL:
            return ("conventional", self.state_dtype, None, None, self.rounding)
        return ("split" if self.read_dtype else "replay", self.state_dtype, self.window, self.read_dtype, self.rounding)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label(),
            "variant": self.variant,
            "window": self.window,
            "state_dtype": self.state_dtype,
            "read_dtype": self.read_dtype,
            "rounding": self.rounding,
            "draft": self.draft,
            "accepted": self.accepted,
        }


def mean_accepted(draft: int, accept_rate: float) -> float:
    """Mean drafts accepted per verify when each is accepted with probability accept_rate until the first
    rejection (as `replayssm profile --accept-rate` draws them): rate + rate^2 + ... + rate^T."""
    return sum(accept_rate**n for n in range(1, draft + 1))


def candidates(
    *,
    windows: Sequence[int] = DEFAULT_WINDOWS,
    state_dtypes: Sequence[str] = DEFAULT_STATE_DTYPES,
    read_dtypes: Sequence[str] = DEFAULT_READ_DTYPES,
    drafts: Sequence[int] = (),
    accept_rate: float = 0.8,
    roundings: Sequence[str] = ("nearest",),
) -> list[Candidate]:
    """Conventional per state dtype, replay per window and state dtype, split per window and read dtype (fp32
    checkpoint); per draft width T, spec-conventional per state dtype and spec-replay per window and state dtype
    (16-bit and fp32 states). Each 16-bit or 8-bit state comes at every rounding of `roundings`; fp32 at nearest."""
    if not state_dtypes:
        raise ValueError("at least one state dtype is needed")
    if any(w < 1 for w in windows):
        raise ValueError(f"windows must be positive, got {list(windows)}")
    if any(t < 1 for t in drafts):
        raise ValueError(f"draft widths must be positive, got {list(drafts)}")
    if drafts and not 0 < accept_rate <= 1:
        raise ValueError(f"the acceptance rate must be in (0, 1], got {accept_rate!r}")
    stored = [(s, r) for s in state_dtypes for r in roundings if s != "fp32" or r == "nearest"]
    out = [Candidate("conventional", s, rounding=r) for s, r in stored]
    out += [Candidate("replay", s, w, rounding=r) for w in windows for s, r in stored]
    out += [Candidate("split", "fp32", w, r) for w in windows for r in read_dtypes]
    spec = [(s, r) for s, r in stored if s not in EIGHT_BIT]
    for T in drafts:
        a = round(mean_accepted(T, accept_rate), 4)
        out += [Candidate("spec-conventional", s, draft=T, accepted=a, rounding=r) for s, r in spec]
        out += [Candidate("spec-replay", s, w, draft=T, accepted=a, rounding=r) for w in windows for s, r in spec]
    return out


@dataclass(frozen=True)
class Timing:
    """Time of one step of one SSM layer, per token committed, with the relative width of its interval."""

    us: float
    us_per_token: float
    spread: float
    source: str
    status: str = "ok"
    note: str = ""
    origin: str = ""

    @property
    def lo(self) -> float:
        return self.us_per_token * (1 - self.spread / 2)

    @property
    def hi(self) -> float:
        return self.us_per_token * (1 + self.spread / 2)

    @property
    def measured(self) -> bool:
        return self.source == "measured"

    def label(self) -> str:
        """Where the time came from, in a few words: measured (where), or predicted (how, and how far off)."""
        if self.measured:
            return "measured here" if self.origin in ("", "here") else f"measured, {self.origin}"
        how = self.origin or "the cost model"
        return f"predicted ({how}, ±{self.spread / 2:.0%})"


def _tokens(c: Candidate) -> float:
    return 1.0 + (c.accepted or 0.0) if c.draft else 1.0


def timing_from_rows(
    rows: Iterable[dict[str, Any]],
    candidate: Candidate,
    batch: int,
    *,
    preset: str | None = None,
    io_dtype: str | None = None,
) -> Timing | None:
    """The candidate's window-averaged time at `batch` from results rows, or None when no row matches.

    Staggered-flush rows are preferred over aligned ones and measured over predicted. Per token: the
    step time over 1 + accepted drafts at the candidate's acceptance (the row's own `accepted` only
    changes how often a speculative flush comes, which the row's time already holds). A row whose check
    against the reference failed gives a Timing with status 'failed'.
    """
    c = candidate
    found = []
    for r in rows:
        if r.get("kind", "kernel") != "kernel" or r.get("variant") != c.variant or r.get("phase", "avg") != "avg":
            continue
        if r.get("batch") != batch or r.get("state_dtype") != c.state_dtype or r.get("read_dtype") != c.read_dtype:
            continue
        if (r.get("rounding") or "nearest") != c.rounding:
            continue
        if c.is_replay and r.get("window") != c.window:
            continue
        if (r.get("draft") or 0) != c.draft:
            continue
        if preset is not None and r.get("preset") != preset:
            continue
        if io_dtype is not None and r.get("io_dtype") not in (None, io_dtype):
            continue
        found.append(r)
    if not found:
        return None
    ok = [r for r in found if r.get("status") == "ok" and r.get("us") is not None]
    if not ok:
        err = found[0].get("check_max_err")
        note = f"failed its check against the reference (max error {err:.1e})" if err is not None else "failed its check against the reference"
        return Timing(math.nan, math.nan, 0.0, found[0].get("source", "measured"), status="failed", note=note)
    ok.sort(key=lambda r: (r.get("flush") == "aligned", r.get("source") != "measured"))
    r = ok[0]
    us = float(r["us"])
    if c.draft:
        per_token = us / _tokens(c)
    else:
        per_token = float(r.get("us_per_token") or us)
    measured = r.get("source") == "measured"
    if measured:
        spread = max(float(r.get("spread") or 0.0), MIN_SPREAD)
    else:
        fit = (r.get("x_prediction") or {}).get("fit_error") if isinstance(r.get("x_prediction"), dict) else None
        # A prediction is never surer than a repeat measurement.
        spread = max(2 * float(fit), MIN_SPREAD) if isinstance(fit, (int, float)) and fit >= 0 else 2 * UNCALIBRATED_ERROR
    note = "aligned flush" if r.get("flush") == "aligned" else ""
    return Timing(us, per_token, spread, "measured" if measured else "predicted", note=note, origin=_row_origin(r))


def _row_origin(row: dict[str, Any]) -> str:
    """Where a row's time came from, for Timing.label: the file it was measured in, or how it was predicted."""
    from replayssm_cli.report import provenance

    if row.get("source") == "predicted":
        return provenance.prediction_label(row, error=False).removeprefix("predicted (").removesuffix(")")
    if isinstance(row.get("x_origin"), dict):
        return provenance.row_label(row)
    return "here"


def predicted_timing(shape, candidate: Candidate, batch: int, ceilings, *, io_dtype: str = "bf16", has_z: bool = False) -> Timing:
    """The cost model's time for a candidate: modelled bytes and FLOPs over the GPU's ceilings, plus launches."""
    from replayssm_cli.model import cost

    c = candidate
    step = cost.step_cost(
        shape,
        c.variant,
        "avg",
        batch=batch,
        window=c.window if c.is_replay else None,
        state_dtype=c.state_dtype,
        read_dtype=c.read_dtype,
        io_dtype=io_dtype,
        draft=c.draft,
        accepted=c.accepted if c.draft else None,
        rounding=c.rounding,
        has_z=has_z,
    )
    us = cost.predict_us(step, ceilings, cost.launches_per_step(c.variant, "avg"))
    return Timing(us, us / _tokens(c), 2 * UNCALIBRATED_ERROR, "predicted", origin="the cost model")


def calibrated(prediction: Timing, pairs: Sequence[tuple[Timing, Timing]], like: str) -> Timing:
    """A prediction scaled by the median measured / predicted time of `pairs` (measured candidates of the same
    variant at the same batch, each with its own prediction), since the cost model is a roofline bound that
    real kernels miss by a variant-dependent margin. Without pairs, the prediction as it is.

    Its interval is as wide as the pairs' ratios stray from their median (at least PREDICTED_SPREAD); with
    one pair nothing says how far it strays, so it keeps the uncalibrated model's error.
    """
    ratios = sorted(m.us / p.us for m, p in pairs if m.status == "ok" and p.us > 0)
    if not ratios:
        return prediction
    k = ratios[len(ratios) // 2] if len(ratios) % 2 else (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
    stray = max(abs(r / k - 1) for r in ratios)
    spread = max(PREDICTED_SPREAD, 2 * stray) if len(ratios) > 1 else 2 * UNCALIBRATED_ERROR
    note = f"x{k:.2f}, as measured {like} ran against its prediction"
    origin = f"cost model x{k:.2f} from {len(ratios)} measured {like}"
    return Timing(prediction.us * k, prediction.us_per_token * k, spread, "predicted", note=note, origin=origin)


def memory_of(shape, candidate: Candidate, *, io_dtype: str = "bf16") -> dict[str, int]:
    """Bytes one sequence holds in one layer for a candidate, by part, from the cost model (with 'total')."""
    from replayssm_cli.model import cost

    c = candidate
    return cost.memory_per_seq(
        shape,
        c.variant,
        window=c.window if c.is_replay else None,
        state_dtype=c.state_dtype,
        read_dtype=c.read_dtype,
        io_dtype=io_dtype,
        draft=c.draft,
        rounding=c.rounding,
    )


@dataclass
class Assessment:
    """One candidate at one batch size: its time, error, memory, and the verdict with its reason."""

    candidate: Candidate
    timing: Timing | None
    error: float | None
    memory: dict[str, int] | None
    layers: int
    batch: int
    verdict: str = ""
    reason: str = ""
    rejected_for: str = ""
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    memory_budget: float | None = None

    @property
    def us_per_token(self) -> float | None:
        if self.timing is None or self.timing.status != "ok":
            return None
        return self.timing.us_per_token

    @property
    def mem_per_seq(self) -> int | None:
        """Bytes per sequence over all SSM layers."""
        return None if self.memory is None else self.memory["total"] * self.layers

    @property
    def seqs_fit(self) -> int | None:
        if self.mem_per_seq is None or not self.memory_budget:
            return None
        return int(self.memory_budget // self.mem_per_seq)

    def to_dict(self) -> dict[str, Any]:
        t = self.timing
        ok = t is not None and t.status == "ok"
        return {
            **self.candidate.to_dict(),
            "verdict": self.verdict,
            "rejected_for": self.rejected_for or None,
            "reason": self.reason,
            "us": t.us if ok else None,
            "us_per_token": self.us_per_token,
            "us_per_token_model": self.us_per_token * self.layers if ok else None,
            "spread": t.spread if ok else None,
            "source": t.source if t else None,
            "time_origin": t.label() if t else None,
            "time_note": t.note if t and t.note else None,
            "speedup": self.speedup,
            "speedup_lo": self.speedup_lo,
            "speedup_hi": self.speedup_hi,
            "error": self.error,
            "memory_per_layer": self.memory,
            "mem_per_seq": self.mem_per_seq,
            "seqs_fit": self.seqs_fit,
        }


@dataclass
class Decision:
    """The answer for one batch size and one mode (plain decode, or speculative verify of T drafts)."""

    batch: int
    draft: int
    accepted: float | None
    choice: Assessment | None
    baseline: Assessment | None
    assessments: list[Assessment] = field(default_factory=list)
    replay_pays: bool = False
    summary: str = ""

    @property
    def mode(self) -> str:
        return "decode" if not self.draft else f"verify T={self.draft} ({self.accepted:.3g} accepted)"

    @property
    def predicted(self) -> bool:
        """Whether the recommendation rests on a predicted time (its own, or its baseline's)."""
        return any(a is not None and a.timing is not None and not a.timing.measured for a in (self.choice, self.baseline))

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "mode": self.mode,
            "draft": self.draft,
            "accepted": self.accepted,
            "replay_pays": self.replay_pays,
            "predicted": self.predicted,
            "summary": self.summary,
            "recommended": self.choice.to_dict() if self.choice else None,
            "baseline": self.baseline.candidate.label() if self.baseline else None,
            "candidates": [a.to_dict() for a in self.assessments],
        }


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _assess(a: Assessment, error_budget: float, memory_budget: float | None) -> None:
    reasons: list[tuple[str, str]] = []
    t = a.timing
    if t is None:
        reasons.append(("unavailable", "no time: not measured (or skipped), and not predicted"))
    elif t.status != "ok":
        reasons.append(("failed", t.note or "failed its check against the reference"))
    if a.error is not None and a.error > error_budget:
        reasons.append(("error", f"{a.error:.1e} in the longest bucket, over the {error_budget:.0e} budget"))
    if a.memory is None:
        reasons.append(("unavailable", "its memory per sequence is unknown"))
    elif memory_budget is not None and a.batch * a.mem_per_seq > memory_budget:
        need = a.batch * a.mem_per_seq
        reasons.append(
            ("memory", f"{a.batch} x {fmt_bytes(a.mem_per_seq)} = {fmt_bytes(need)}, over the "
             f"{fmt_bytes(memory_budget)} budget (fits {a.seqs_fit} sequences)")
        )
    if reasons:
        a.verdict = "rejected"
        a.rejected_for = reasons[0][0]
        a.reason = "; ".join(r for _, r in reasons)


def decide(
    batch: int,
    group: Sequence[Candidate],
    *,
    timing: Callable[[Candidate, int], Timing | None],
    error: Callable[[Candidate], float | None],
    memory: Callable[[Candidate], dict[str, int] | None],
    layers: int,
    error_budget: float = DEFAULT_ERROR_BUDGET,
    memory_budget: float | None = None,
    baseline_dtype: str = "fp32",
) -> Decision:
    """The fastest candidate of one group (all plain decode, or all at one draft width) within both budgets.

    Rejects candidates without a time, whose check failed, over the error budget (longest-bucket error)
    or over the memory budget (bytes per sequence x layers x batch, in bytes). Among the rest, candidates
    within the fastest one's interval are a tie and the simplest of them is chosen (see _choose): measured
    before predicted, so a prediction wins only by more than its error; ReplaySSM (replay, split,
    spec-replay) only when its pessimistic time beats the best conventional candidate's optimistic time.
    Speedups are against the conventional candidate at `baseline_dtype` (else the fastest conventional),
    which is also the state dtype a tie prefers.
    """
    if not group:
        raise ValueError("no candidates to decide between")
    drafts = {c.draft for c in group}
    if len(drafts) != 1:
        raise ValueError(f"one decision covers one draft width, got {sorted(drafts)}")
    draft = drafts.pop()
    assessments = []
    for c in group:
        mem = memory(c)
        a = Assessment(c, timing(c, batch), error(c), mem, layers, batch, memory_budget=memory_budget)
        _assess(a, error_budget, memory_budget)
        assessments.append(a)

    timed = [a for a in assessments if a.us_per_token is not None]
    conventional = [a for a in timed if not a.candidate.is_replay]
    baseline = next((a for a in conventional if a.candidate.state_dtype == baseline_dtype and a.candidate.rounding == "nearest"), None)
    if baseline is None and conventional:
        baseline = min(conventional, key=lambda a: a.us_per_token)
    if baseline is not None:
        for a in timed:
            a.speedup = baseline.timing.us_per_token / a.timing.us_per_token
            a.speedup_lo = baseline.timing.lo / a.timing.hi
            a.speedup_hi = baseline.timing.hi / a.timing.lo

    alive = [a for a in assessments if not a.verdict]
    choice, tied, best_conv = _choose(alive, baseline_dtype)
    # The ReplaySSM candidate that stood against the choice: of the same kind (measured or predicted) as it.
    same = [a for a in alive if choice is not None and a.timing.measured == choice.timing.measured]
    best_rep = min((a for a in same if a.candidate.is_replay), key=_rank, default=None)
    pays = choice is not None and choice.candidate.is_replay and (best_conv is None or choice.timing.hi < best_conv.timing.lo)
    # ReplaySSM that does not pay is either a tie within the spread or slower beyond it.
    rep_slower = best_rep is not None and best_conv is not None and best_rep.timing.lo > best_conv.timing.hi

    for a in alive:
        if a is choice:
            a.verdict = "recommended"
            a.reason = _why_chosen(a, best_conv, best_rep, pays, rep_slower, tied)
            continue
        a.verdict = "rejected"
        if a is best_rep and not pays and best_conv is not None and not choice.candidate.is_replay:
            gain = best_conv.us_per_token / a.us_per_token
            need = (1 + a.timing.spread / 2) / (1 - best_conv.timing.spread / 2)
            a.rejected_for = "no-gain"
            if rep_slower:
                a.reason = f"{gain:.2f}x over {best_conv.candidate.label()}: slower beyond the spread"
            else:
                a.reason = (
                    f"{gain:.2f}x over {best_conv.candidate.label()}, within the spread "
                    f"(ReplaySSM needs over {need:.2f}x to count)"
                )
            continue
        if any(a is t for t in tied):
            a.rejected_for = "tie"
            a.reason = _why_tie(a, choice, baseline_dtype)
            continue
        if not a.timing.measured and choice.timing.measured and a.us_per_token < choice.us_per_token:
            a.rejected_for = "unconfirmed"
            a.reason = (f"predicted {a.us_per_token:.3g} us/token ±{a.timing.spread / 2:.0%}, not faster than measured "
                        f"{choice.candidate.label()} ({choice.us_per_token:.3g}) beyond its error")
            continue
        ref = best_rep if a.candidate.is_replay and best_rep is not None and not pays else choice
        a.rejected_for = "slower"
        a.reason = f"{a.us_per_token:.3g} vs {ref.us_per_token:.3g} us/token for {ref.candidate.label()}"

    accepted = group[0].accepted if draft else None
    d = Decision(batch, draft, accepted, choice, baseline, assessments, pays)
    d.summary = _summary(d, best_conv)
    return d


def _rank(a: Assessment) -> tuple[float, float]:
    """Fastest first; between equal times, the smaller error."""
    return (a.us_per_token, a.error if a.error is not None else math.inf)


def _simplicity(a: Assessment, own_dtype: str) -> tuple:
    """Between candidates within each other's spread: conventional before ReplaySSM, measured before predicted,
    the preset's own state dtype, no read copy, rounding to nearest, the shorter window; then the faster."""
    c = a.candidate
    return (c.is_replay, not a.timing.measured, c.state_dtype != own_dtype, c.read_dtype is not None, c.rounding != "nearest",
            c.window or 0, _rank(a))


def _pick(pool: list[Assessment], own_dtype: str) -> tuple[Assessment, list[Assessment], Assessment | None]:
    """(choice, the others it tied with, the conventional candidate it was held against) within one pool.

    The fastest candidate and every candidate whose interval reaches into its interval are a tie; of a tie,
    the simplest is chosen. A ReplaySSM pick that does not clear the pool's best conventional candidate's
    interval gives way to it.
    """
    best = min(pool, key=_rank)
    tied = [a for a in pool if a.timing.lo <= best.timing.hi and best.timing.lo <= a.timing.hi]
    choice = min(tied, key=lambda a: _simplicity(a, own_dtype))
    conv = min((a for a in pool if not a.candidate.is_replay), key=_rank, default=None)
    if choice.candidate.is_replay and conv is not None and not choice.timing.hi < conv.timing.lo:
        choice = conv
    return choice, [a for a in tied if a is not choice], conv


def _choose(alive: list[Assessment], own_dtype: str) -> tuple[Assessment | None, list[Assessment], Assessment | None]:
    """The recommended candidate, the others it tied with, and the conventional candidate it was held against.

    Measured candidates are decided among themselves first. A predicted candidate then wins only where even
    its pessimistic time (its prediction error) beats the measured choice's optimistic time; the predicted
    candidates that do are decided among themselves the same way. With nothing measured, the predictions
    are decided among themselves, each as wide as its error.
    """
    if not alive:
        return None, [], None
    measured = [a for a in alive if a.timing.measured]
    if not measured:
        return _pick(alive, own_dtype)
    choice, tied, conv = _pick(measured, own_dtype)
    challengers = [a for a in alive if not a.timing.measured and a.timing.hi < choice.timing.lo]
    if not challengers:
        return choice, tied, conv
    held = choice
    choice, tied, pconv = _pick(challengers, own_dtype)
    if pconv is None and choice.candidate.is_replay and held.candidate.is_replay:
        pconv = conv
    return choice, tied, pconv if pconv is not None else (held if not held.candidate.is_replay else conv)


def _why_tie(a: Assessment, choice: Assessment, own_dtype: str) -> str:
    c, k = a.candidate, choice.candidate
    base = f"{a.us_per_token:.3g} vs {choice.us_per_token:.3g} us/token, within the spread of {k.label()}: a tie"
    if a.timing.measured != choice.timing.measured:
        return f"{base}, and {k.label()} is measured" if choice.timing.measured else f"{base}; {k.label()} is simpler"
    if c.is_replay and not k.is_replay:
        return f"{base}, and conventional decode is simpler"
    if c.state_dtype != own_dtype and k.state_dtype == own_dtype:
        return f"{base}, and {k.label()} keeps the preset's {own_dtype} state"
    if (c.window or 0) > (k.window or 0):
        return f"{base}, and W{k.window} is the shorter window"
    return f"{base}; {k.label()} is simpler"


def _why_chosen(a: Assessment, best_conv: Assessment | None, best_rep: Assessment | None, pays: bool,
                rep_slower: bool, tied: list[Assessment]) -> str:
    if tied and pays:
        names = ", ".join(t.candidate.label() for t in tied[:2]) + (f" and {len(tied) - 2} more" if len(tied) > 2 else "")
        lead = f"{best_conv.us_per_token / a.us_per_token:.2f}x over {best_conv.candidate.label()}; " if best_conv else ""
        return f"{lead}ties with {names} within the spread, and is the simplest"
    if pays and best_conv is not None:
        return f"fastest within both budgets: {best_conv.us_per_token / a.us_per_token:.2f}x over {best_conv.candidate.label()}"
    if pays:
        return "fastest within both budgets; no conventional candidate is within them"
    if best_rep is None:
        return "fastest within both budgets; no ReplaySSM candidate is within them"
    if rep_slower:
        return "ReplaySSM does not pay here: conventional decode is faster"
    return "ReplaySSM does not pay here: conventional decode is as fast within the spread"


def _summary(d: Decision, best_conv: Assessment | None) -> str:
    c = d.choice
    if c is None:
        return "no candidate meets the error and memory budgets"
    where = f"batch {d.batch}" + ("" if not d.draft else f", {d.mode}")
    if d.replay_pays:
        base = d.baseline.candidate.label() if d.baseline else "conventional"
        return f"{where}: run {c.candidate.label()} ({c.speedup:.2f}x over {base})" if c.speedup else f"{where}: run {c.candidate.label()}"
    if c.candidate.is_replay:
        return f"{where}: run {c.candidate.label()} (no conventional candidate is within the budgets)"
    return f"{where}: ReplaySSM does not pay; run {c.candidate.label()}"


def tune(
    batches: Sequence[int],
    cands: Sequence[Candidate],
    *,
    timing: Callable[[Candidate, int], Timing | None],
    error: Callable[[Candidate], float | None],
    memory: Callable[[Candidate], dict[str, int] | None],
    layers: int,
    error_budget: float = DEFAULT_ERROR_BUDGET,
    memory_budget: float | None = None,
    baseline_dtype: str = "fp32",
) -> list[Decision]:
    """One Decision per batch size and mode (plain decode first, then each draft width)."""
    if not batches or any(b < 1 for b in batches):
        raise ValueError(f"batch sizes must be positive, got {list(batches)}")
    if error_budget <= 0:
        raise ValueError(f"the error budget must be positive, got {error_budget}")
    if memory_budget is not None and memory_budget <= 0:
        raise ValueError(f"the memory budget must be positive, got {memory_budget}")
    groups: dict[int, list[Candidate]] = {}
    for c in cands:
        groups.setdefault(c.draft, []).append(c)
    out = []
    for b in batches:
        for draft in sorted(groups):
            out.append(
                decide(
                    b,
                    groups[draft],
                    timing=timing,
                    error=error,
                    memory=memory,
                    layers=layers,
                    error_budget=error_budget,
                    memory_budget=memory_budget,
                    baseline_dtype=baseline_dtype,
                )
            )
    return out


# Before measuring, a guessed time counts as at least this wide (relative, ±): it comes from another run or a model
# (the same kernels on other H200s read within about 3% of the shipped reference).
REACH_ERROR = 0.05


def within_reach(guessed: dict[Candidate, Timing | None], *, always: Sequence[Candidate] = ()) -> list[Candidate]:
    """The candidates worth measuring at one batch: those whose guessed time could still be the best.

    A candidate is out of reach when even its optimistic guess (its error, at least REACH_ERROR) is slower than
    the pessimistic guess of the fastest candidate of its group (the same draft width). A candidate with no
    guess is measured; so are those in `always` (the speedups' baseline).
    """
    def lo(t: Timing) -> float:
        return t.us_per_token * (1 - max(t.spread / 2, REACH_ERROR))

    def hi(t: Timing) -> float:
        return t.us_per_token * (1 + max(t.spread / 2, REACH_ERROR))

    ok = {c: t for c, t in guessed.items() if t is not None and t.status == "ok"}
    best: dict[int, float] = {}
    for c, t in ok.items():
        best[c.draft] = min(best.get(c.draft, math.inf), hi(t))
    keep = [c for c in guessed if c not in ok or lo(ok[c]) <= best[c.draft] or c in always]
    # The best conventional candidate of each group is measured too: ReplaySSM must beat a measured one.
    for draft in best:
        conv = [c for c in ok if c.draft == draft and not c.is_replay]
        if conv:
            fastest = min(conv, key=lambda c: ok[c].us_per_token)
            if fastest not in keep:
                keep.append(fastest)
    return keep
