"""Predicted kernel times calibrated by measurement: the cost model's bytes and FLOPs over a GPU's datasheet ceilings,
divided by an efficiency (the achieved share of those ceilings) fitted to the shipped measured profiles.

The efficiency of a kernel is kept per (op, variant, phase, state dtype, read dtype, draft) as a curve over its grid
size, x = (sequence, head) pairs per SM: measured points, between which the time is a fixed cost plus a bandwidth
term (`_interpolate`), the efficiency constant above the largest grid (bandwidth-bound). The curves ship as
profiles/calibration/<gpu>.json, written by `python benchmarks/calibrate.py`; the tuner calls `predict_step` for a
candidate's µs and its error.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from replayssm_cli.model import ops

KIND = "replayssm-calibration"
VERSION = 1
VARIANTS = ("conventional", "replay", "split", "spec-conventional", "spec-replay")
# Two grids within this relative distance are the same calibration point.
SAME_X = 0.01
# A prediction through another configuration's curve (another dtype, draft width or window) is not known better than
# this (relative, ±): no measurement says how far that configuration's efficiency is from the borrowed one.
BORROWED_ERROR = 0.10
_DIGITS = 6
# A stochastically rounded step is predicted from its configuration's curve rounded to nearest (no shipped
# measurement calibrates stochastic rounding's integer work), and its error is at least this: measured at batch 256 on
# H200s, stochastic rounding cost a ReplaySSM step +3% to +11% and a conventional step +19% to +44% over the same step
# rounded to nearest (benchmarks/notes/run-77.md, run-78.md).
STOCHASTIC_ERROR = 0.45


@dataclass(frozen=True)
class Prediction:
    """A predicted step time: us (µs per step per layer), error (the relative error expected of it, a fraction: the
    measured spread where the configuration was measured, the leave-one-out error of the curve between points, at
    least BORROWED_ERROR through another configuration's curve),
    method ('calibrated' or 'roofline'), calibrated_on (the GPU the efficiency was fitted on), basis (the curve used,
    when not the configuration's own) and efficiency (achieved share of the datasheet ceilings)."""

    us: float
    error: float | None
    method: str
    calibrated_on: str | None
    basis: str | None = None
    efficiency: float | None = None

    def x_prediction(self) -> dict[str, Any]:
        """The row field x_prediction of the results contract."""
        out = {"method": self.method, "calibrated_on": self.calibrated_on, "fit_error": self.error}
        if self.basis:
            out["basis"] = self.basis
        return out


def heads(shape: Any) -> int:
    """The heads a decode kernel's grid spans per sequence: H for Mamba-2, the value heads HV for GDN."""
    return ops.of(shape).state_heads(shape)


def grid_per_sm(shape: Any, batch: int, sm_count: int) -> float:
    """(sequence, head) pairs per SM: the grid-size axis of the efficiency curves."""
    return batch * heads(shape) / sm_count


def ideal_us(cost: Any, hbm_gbs: float, fp32_tflops: float) -> float:
    """Time at the datasheet ceilings, µs: the larger of all bytes at hbm_gbs and all FLOPs at fp32_tflops."""
    return max(cost.total_bytes / (hbm_gbs * 1e3), cost.flops / (fp32_tflops * 1e6))


def _key(op: str, variant: str, phase: str, state: str | None, read: str | None, draft: int) -> str:
    return f"{op} {variant} {phase} {state}" + (f"-{read}" if read else "") + (f" T{draft}" if draft else "")


def _row_cost(row: dict[str, Any], preset: Any) -> Any:
    from replayssm_cli.model import cost
    from replayssm_cli.measure.grid import nonflush_fill

    phase, window = row["phase"], row.get("window")
    fill = nonflush_fill(window) if phase == "nonflush" else (window - 1 if phase == "flush" else None)
    return cost.step_cost(
        preset.shape, row["variant"], phase, batch=row["batch"], window=window, fill=fill,
        state_dtype=row["state_dtype"], read_dtype=row.get("read_dtype"), io_dtype=row["io_dtype"],
        draft=row.get("draft") or 0, accepted=row.get("accepted"), has_z=getattr(preset, "has_z", True),
    )


def _interpolate(points: list[dict[str, Any]], x: float, skip: int | None = None) -> float:
    """The efficiency at grid x from a curve's points (sorted by x), leaving out point `skip`.

    Along a curve the time at the ceilings grows as x, so t = x / eff in units of that; t is taken linear in x between
    points (a fixed cost plus a bandwidth term) and beyond the smallest grid along the first segment (down to a
    constant efficiency where that line would cross zero); above the largest grid the efficiency stays the last.
    """
    pts = [p for i, p in enumerate(points) if i != skip]
    if len(pts) == 1 or x >= pts[-1]["x"]:
        return pts[0]["eff"] if len(pts) == 1 else pts[-1]["eff"]
    xs = [p["x"] for p in pts]
    i = min(max(bisect.bisect_left(xs, x), 1), len(pts) - 1)
    lo, hi = pts[i - 1], pts[i]
    t_lo, t_hi = lo["x"] / lo["eff"], hi["x"] / hi["eff"]
    t = t_lo + (t_hi - t_lo) * (x - lo["x"]) / (hi["x"] - lo["x"])
    if x < lo["x"]:
        t = max(t, t_lo * x / lo["x"])
    return x / t


def fit(profiles: Iterable[Any], gpu: Any) -> dict[str, Any]:
    """The calibration document fitted to measured profiles of one GPU (`gpu`: its GpuSpec, whose datasheet ceilings
    the efficiencies are shares of).

    `profiles` come newest first (results.reference_profiles). Every ok, measured kernel row of our variants counts,
    the cost model's bytes and FLOPs recomputed now. A configuration measured in several files is one point with the
    newest file's efficiency, as the merged reference keeps it; its error is the largest relative deviation of the
    files at the same commit (or half the largest sample spread, if larger), n their count. Each point also carries
    loo: the relative error of its time predicted from the other points of its curve.
    """
    from replayssm_cli.model import presets as presets_mod

    groups: dict[str, dict[str, Any]] = {}
    files = []
    for order, prof in enumerate(profiles):
        env = prof.environment or {}
        files.append({"file": prof.path.name if prof.path else None, "created": prof.created, "commit": env.get("commit")})
        for row in prof.rows:
            if (row.get("kind") != "kernel" or row.get("source") != "measured" or row.get("status") != "ok"
                    or row.get("variant") not in VARIANTS or not row.get("us")):
                continue
            preset = presets_mod.resolve(row["preset"], row.get("tp") or 1)
            eff = ideal_us(_row_cost(row, preset), gpu.hbm_gbs, gpu.fp32_tflops) / row["us"]
            key = _key(preset.kind, row["variant"], row["phase"], row["state_dtype"], row.get("read_dtype"), row.get("draft") or 0)
            x = grid_per_sm(preset.shape, row["batch"], gpu.sm_count)
            curve = groups.setdefault(key, {"key": key, "op": preset.kind, "variant": row["variant"], "phase": row["phase"],
                                            "state_dtype": row["state_dtype"], "read_dtype": row.get("read_dtype"),
                                            "draft": row.get("draft") or 0, "windows": [], "samples": []})
            if row.get("window") and row["window"] not in curve["windows"]:
                curve["windows"] = sorted([*curve["windows"], row["window"]])
            curve["samples"].append((x, order, env.get("commit"), eff, row.get("spread") or 0.0))
    curves = []
    for key in sorted(groups):
        curve = groups.pop(key)
        points: list[dict[str, Any]] = []
        for sample in sorted(curve.pop("samples")):
            if points and abs(sample[0] / points[-1]["x"] - 1) <= SAME_X:
                points[-1]["_s"].append(sample)
            else:
                points.append({"x": sample[0], "_s": [sample]})
        for p in points:
            samples = sorted(p.pop("_s"), key=lambda smp: smp[1])
            _, _, commit, eff, _ = samples[0]
            same = [smp for smp in samples if smp[2] == commit]
            p["eff"] = eff
            p["n"] = len(same)
            p["error"] = max(max(abs(smp[3] / eff - 1) for smp in same), max(smp[4] for smp in same) / 2)
        for i, p in enumerate(points):
            p["loo"] = (_interpolate(points, p["x"], skip=i) / p["eff"] - 1) if len(points) > 1 else None
        curves.append({**curve, "points": [{k: _round(v) for k, v in p.items()} for p in points]})
    loo = sorted(abs(p["loo"]) for c in curves for p in c["points"] if p["loo"] is not None)
    errors = [p["error"] for c in curves for p in c["points"]]
    return {
        "kind": KIND,
        "version": VERSION,
        "gpu": gpu.key,
        "gpu_name": gpu.name,
        "basis": {"hbm_gbs": gpu.hbm_gbs, "fp32_tflops": gpu.fp32_tflops, "sm_count": gpu.sm_count,
                  "what": "efficiency = time at these datasheet ceilings / measured time; x = (sequence, head) pairs per SM"},
        "files": files,
        "fit_error": {
            "points": len(errors),
            "max": _round(max(errors, default=0.0)),
            "loo_median": _round(loo[len(loo) // 2]) if loo else None,
            "loo_max": _round(loo[-1]) if loo else None,
            "what": "max: largest relative error of a calibrated point (deviation between files, or half the sample "
                    "spread); loo: relative error of each point's time predicted from the rest of its curve",
        },
        "curves": curves,
    }


def _round(v: Any) -> Any:
    return float(f"{v:.{_DIGITS}g}") if isinstance(v, float) else v


def calibration_path(gpu_key: str = "h200") -> Path:
    from importlib import resources

    return Path(str(resources.files("replayssm_profiles") / "calibration" / f"{gpu_key}.json"))


@functools.lru_cache(maxsize=4)
def load(gpu_key: str = "h200") -> dict[str, Any] | None:
    """The shipped calibration fitted on `gpu_key`, or None where none ships."""
    path = calibration_path(gpu_key)
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("kind") != KIND or doc.get("version") != VERSION:
        return None
    return doc


def _short_gpu(name: str | None) -> str | None:
    return name.removeprefix("NVIDIA ").strip() if name else name


def _curve(doc: dict[str, Any], op: str, variant: str, phase: str, state: str, read: str | None, draft: int):
    """The curve of this configuration, else the nearest one (fp16 as bf16, the nearest draft width, another state
    dtype's), with a basis line saying which; (None, None) when the variant and phase were never measured."""
    by_key = {c["key"]: c for c in doc["curves"]}
    same = {"fp16": "bf16"}
    exact = by_key.get(_key(op, variant, phase, state, read, draft))
    if exact is not None:
        return exact, None
    candidates = [c for c in doc["curves"] if c["op"] == op and c["variant"] == variant and c["phase"] == phase]
    if not candidates:
        return None, None

    def distance(c: dict[str, Any]) -> tuple:
        return (
            c["state_dtype"] not in (state, same.get(state)),
            c["state_dtype"] != "fp32",
            (c["read_dtype"] or "") not in (read or "", same.get(read or "", "")),
            abs((c["draft"] or 0) - draft),
        )

    best = min(candidates, key=distance)
    return best, f"efficiency of {best['key']}"


def predict_step(preset: Any, variant: str, *, rounding: str = "nearest", **kw: Any) -> Prediction:
    """`_predict_step` (its arguments in `kw`) for a step whose 16-bit or 8-bit state is stored with `rounding`:
    "nearest" as calibrated, "stochastic" from the same curve with an error of at least STOCHASTIC_ERROR and a basis
    saying so."""
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    pred = _predict_step(preset, variant, **kw)
    if rounding == "nearest" or pred.method != "calibrated":
        return pred
    return dataclasses.replace(
        pred, error=max(pred.error or 0.0, STOCHASTIC_ERROR),
        basis=", ".join(filter(None, [pred.basis, "rounding to nearest's efficiency (stochastic rounding's integer "
                                                  "work not calibrated)"])))


def _predict_step(
    preset: Any,
    variant: str,
    *,
    batch: int,
    phase: str = "avg",
    window: int | None = None,
    state_dtype: str = "fp32",
    read_dtype: str | None = None,
    io_dtype: str = "bf16",
    draft: int = 0,
    accepted: float | None = None,
    fill: float | None = None,
    gpu: str = "h200",
    calibrated_on: str = "h200",
) -> Prediction:
    """Predict one decode step of one SSM layer (µs) and its relative error, for a preset (a presets.Preset) on `gpu`
    (a GPU spec key), from the efficiencies fitted on `calibrated_on`'s measured profiles applied to `gpu`'s
    datasheet ceilings.

    The tuner's entry point for a candidate that no profile measured: `prediction.us` is µs per step per layer
    (divide by accepted + 1 for µs per token with drafts), `prediction.error` the relative error to expect (at least
    BORROWED_ERROR where `prediction.basis` says whose curve or which window it borrowed). A ReplaySSM window average
    at an unmeasured window is the window average of its flush and non-flush steps (`_window_average`). Where no
    calibration ships, or the variant and phase were never measured, it falls back to the roofline model
    (cost.predict_us over the ceilings, method 'roofline', error None).
    """
    from replayssm_cli.model import cost, gpus
    from replayssm_cli.measure.grid import nonflush_fill

    spec = gpus.load_gpu(gpu)
    if fill is None and phase in ("nonflush", "flush") and window:
        fill = nonflush_fill(window) if phase == "nonflush" else window - 1
    c = cost.step_cost(preset.shape, variant, phase, batch=batch, window=window, fill=fill, state_dtype=state_dtype,
                       read_dtype=read_dtype, io_dtype=io_dtype, draft=draft, accepted=accepted,
                       has_z=getattr(preset, "has_z", True))
    doc = load(calibrated_on)
    curve, basis = _curve(doc, preset.kind, variant, phase, state_dtype, read_dtype, draft) if doc else (None, None)
    if curve is None:
        us = cost.predict_us(c, gpus.ceilings_for(spec), cost.launches_per_step(variant, phase))
        return Prediction(us=us, error=None, method="roofline", calibrated_on=None)
    fitted = curve.get("windows") or []
    if window and fitted and window not in fitted:
        if phase == "avg" and variant in ("replay", "split"):
            composed = _window_average(preset, variant, window, fitted, batch=batch, state_dtype=state_dtype,
                                       read_dtype=read_dtype, io_dtype=io_dtype, draft=draft, gpu=gpu, calibrated_on=calibrated_on)
            if composed is not None:
                return composed
        basis = ", ".join(filter(None, [basis, f"fitted at W={'/'.join(map(str, fitted))}"]))
    x = grid_per_sm(preset.shape, batch, spec.sm_count)
    points = curve["points"]
    eff = _interpolate(points, x)
    return Prediction(
        us=ideal_us(c, spec.hbm_gbs, spec.fp32_tflops) / eff,
        error=max(_error_at(points, x), BORROWED_ERROR if basis else 0.0),
        method="calibrated",
        calibrated_on=_short_gpu(doc.get("gpu_name")) or calibrated_on,
        basis=basis,
        efficiency=eff,
    )


def _window_average(preset: Any, variant: str, window: int, fitted: list[int], **kw: Any) -> Prediction | None:
    """A ReplaySSM window average at a window no profile measured: (W-1) non-flush steps and one flush, each from its
    phase's curve at this window, scaled by how the measured average compared with that sum at the nearest fitted
    window (staggered flushes cost less than the aligned flush step the phase curve holds)."""
    near = min(fitted, key=lambda w: abs(w - window))

    def average(w: int) -> tuple[float, float, str | None] | None:
        flush = predict_step(preset, variant, phase="flush", window=w, **kw)
        nonflush = predict_step(preset, variant, phase="nonflush", window=w, **kw) if w > 1 else flush
        if flush.method != "calibrated" or nonflush.method != "calibrated":
            return None
        return ((w - 1) * nonflush.us + flush.us) / w, max(flush.error, nonflush.error), flush.basis or nonflush.basis

    here, there = average(window), average(near)
    if here is None or there is None:
        return None
    measured = predict_step(preset, variant, phase="avg", window=near, **kw)
    us = here[0] * measured.us / there[0]
    return Prediction(
        us=us, error=max(here[1], measured.error, BORROWED_ERROR), method="calibrated", calibrated_on=measured.calibrated_on,
        basis=", ".join(filter(None, [measured.basis, *(b for b in (here[2] or "").split(", ") if not b.startswith("fitted at W=")),
                                      f"W={window} as the window average of its flush and non-flush steps, scaled as measured at W={near}"])),
        efficiency=measured.efficiency,
    )


def _error_at(points: list[dict[str, Any]], x: float) -> float:
    """The relative error to expect at grid x: a measured point's own error there, else the leave-one-out errors of
    the points either side (the end point's beyond the curve)."""
    xs = [p["x"] for p in points]
    i = bisect.bisect_left(xs, x)
    near = [p for p in points[max(i - 1, 0): i + 1] if abs(x / p["x"] - 1) <= SAME_X]
    if near:
        return near[0]["error"]
    side = points[max(i - 1, 0): i + 1] or points[-1:]
    loo = [abs(p["loo"]) for p in side if p.get("loo") is not None]
    return _round(max(loo + [p["error"] for p in side]))


@functools.lru_cache(maxsize=4)
def reference_index(gpu_key: str = "h200") -> dict[tuple, dict[str, Any]]:
    """The shipped measurements of `gpu_key` by configuration (newest file first), each with its file's origin."""
    from replayssm_cli.report import results

    merged = results.load_reference(gpu_key)
    if merged is None:
        return {}
    return {reference_key(r): r for r in merged.rows if r.get("status") == "ok" and r.get("kind") == "kernel"}


def reference_key(row: dict[str, Any]) -> tuple:
    """A configuration's identity for matching a prediction with a measurement (acceptance to 1e-6)."""
    from replayssm_cli.measure.grid import config_key

    accepted = row.get("accepted")
    return config_key(row) + (round(accepted, 6) if accepted is not None else None,)


def write(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


