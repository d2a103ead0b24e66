"""The roofline: a GPU's ceilings, every results row placed and classified under them, and the speedup pairs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from replayssm_cli.errors import UserError
from replayssm_cli.measure.grid import config_key
from replayssm_cli.model.dtypes import precision_label
from replayssm_cli.report.provenance import row_label
from replayssm_cli.report.results import Results, rounding_of

BYTES_SOURCES = ("modelled", "measured")
PHASES = ("avg", "nonflush", "flush")
# A ceiling's run-to-run spread where the file records none: DESIGN's re-measurement bound for the ceilings' kernels.
DEFAULT_CEILING_SPREAD = 0.02

# (what a row's speedup is over) -> the variant of the row it is over, and whether that row's state is fp32.
BASELINE_OF = {
    "conventional": ("conventional", False),
    "snapshots": ("spec-conventional", False),
    "fp32-conventional": ("conventional", True),
}
# The baseline a variant's speedup is over when its row does not say (files before `speedup_over`).
DEFAULT_OVER = {"replay": "conventional", "split": "fp32-conventional", "spec-replay": "snapshots"}
OVER_WORDS = {
    "conventional": "conventional (same state precision)",
    "snapshots": "the snapshot-writing verify",
    "fp32-conventional": "fp32 conventional",
}
PAIR_KEYS = ("op", "preset", "batch", "io_dtype", "tp", "flush", "source")
CONFIG_KEYS = (
    "op", "preset", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "io_dtype", "draft", "tp", "flush",
    "rounding",
)

CEILING_NAMES = {
    "HBM": "HBM",
    "copy": "copy",
    "L2": "L2",
    "FP32": "FP32 CUDA-core",
    "TF32": "TF32 tensor",
    "BF16": "BF16 tensor",
}


@dataclass(frozen=True)
class Ceiling:
    """One roof: a bandwidth in GB/s (kind 'memory') or a rate in TFLOP/s (kind 'compute'), with its run-to-run spread."""

    kind: str
    name: str
    value: float
    source: str
    spread: float = DEFAULT_CEILING_SPREAD

    @property
    def per_s(self) -> float:
        return self.value * (1e9 if self.kind == "memory" else 1e12)

    @property
    def label(self) -> str:
        what = CEILING_NAMES.get(self.name, self.name)
        if self.kind == "memory":
            return f"{what} {self.value / 1000:.2f} TB/s ({self.source})"
        return f"{what} {self.value:.3g} TFLOP/s ({self.source})"


@dataclass(frozen=True)
class Roof:
    """The ceilings of one GPU; points are classified against `memory` (measured copy where known) and FP32."""

    gpu: str
    ceilings: tuple[Ceiling, ...]

    def find(self, name: str) -> Ceiling | None:
        return next((c for c in self.ceilings if c.name == name), None)

    @property
    def memory(self) -> Ceiling:
        return self.find("copy") or self.find("HBM")  # type: ignore[return-value]

    @property
    def compute(self) -> Ceiling:
        return self.find("FP32")  # type: ignore[return-value]

    def ridge(self, compute: Ceiling | None = None, memory: Ceiling | None = None) -> float:
        """Arithmetic intensity (FLOP/byte) where a memory roof (the classifying one by default) meets a compute roof."""
        return (compute or self.compute).per_s / (memory or self.memory).per_s

    def attainable(self, intensity: float, memory: Ceiling | None = None) -> float:
        """FLOP/s the roof allows at an arithmetic intensity."""
        return min((memory or self.memory).per_s * intensity, self.compute.per_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "memory_roof": self.memory.name,
            "compute_roof": self.compute.name,
            "ceilings": [
                {"kind": c.kind, "name": c.name, "value": c.value, "unit": "GB/s" if c.kind == "memory" else "TFLOP/s",
                 "source": c.source, "spread": c.spread, "label": c.label}
                for c in self.ceilings
            ],
            "ridges": {c.name: self.ridge(c) for c in self.ceilings if c.kind == "compute"},
        }


@dataclass
class Point:
    """One kernel row placed on the roofline and classified; `level` is the memory level its bytes were counted at."""

    row: dict[str, Any]
    file: str
    file_index: int
    us: float
    bytes: float
    flops: float
    intensity: float
    flops_per_s: float
    bytes_source: str
    roof_flops_per_s: float
    bound: str
    pct_of_roof: float
    us_left: float
    tolerance: float = 0.0
    provenance: str = ""
    level: str = "DRAM"
    roof_name: str = ""
    modelled_bytes: float | None = None
    modelled_intensity: float | None = None
    modelled_flops_per_s: float | None = None

    @property
    def variant(self) -> str:
        return str(self.row["variant"])

    @property
    def predicted(self) -> bool:
        return self.row.get("source") == "predicted"

    @property
    def gbs(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e9

    @property
    def above_roof(self) -> bool:
        """Above the roof by more than the measurement's and the ceiling's spreads allow: a counting error."""
        return self.pct_of_roof > 100.0 * (1.0 + self.tolerance)

    @property
    def at_roof(self) -> bool:
        """Above 100% of the roof but inside the tolerance: at the roof, within noise."""
        return 100.0 < self.pct_of_roof <= 100.0 * (1.0 + self.tolerance)

    def config(self) -> tuple:
        return config_key(self.row, CONFIG_KEYS) + (self.level,)

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "file": self.file,
            "provenance": self.provenance,
            "op": r.get("op"),
            "preset": r.get("preset"),
            "variant": r.get("variant"),
            "batch": r.get("batch"),
            "phase": r.get("phase"),
            "window": r.get("window"),
            "state_dtype": r.get("state_dtype"),
            "read_dtype": r.get("read_dtype"),
            "io_dtype": r.get("io_dtype"),
            "rounding": rounding_of(r),
            "draft": r.get("draft"),
            "source": r.get("source"),
            "level": self.level,
            "us": self.us,
            "bytes": self.bytes,
            "bytes_source": self.bytes_source,
            "flops": self.flops,
            "intensity": self.intensity,
            "flops_per_s": self.flops_per_s,
            "gbs": self.gbs,
            "roof": self.roof_name,
            "roof_flops_per_s": self.roof_flops_per_s,
            "bound": self.bound,
            "pct_of_roof": self.pct_of_roof,
            "tolerance_pct": 100.0 * self.tolerance,
            "distance_to_roof_pct": 100.0 - self.pct_of_roof,
            "us_left": self.us_left,
            "above_roof": self.above_roof,
        }


@dataclass
class Pair:
    """A kernel and the baseline its speedup is over: the arrow of the figure and a point of the speedup panel."""

    base: Point
    point: Point
    speedup: float
    lo: float | None
    hi: float | None
    over: str

    @property
    def measured(self) -> bool:
        return not (self.base.predicted or self.point.predicted)

    @property
    def label(self) -> str:
        return f"{self.speedup:.2f}x" if self.measured else f"{self.speedup:.2f}x pred."

    def interval(self) -> str:
        if self.lo is None or self.hi is None or f"{self.lo:.2f}" == f"{self.hi:.2f}":
            return ""
        return f" ({self.lo:.2f}–{self.hi:.2f})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "point": describe(self.point.row), "base": describe(self.base.row), "file": self.point.file,
            "speedup": self.speedup, "speedup_lo": self.lo, "speedup_hi": self.hi, "speedup_over": self.over,
            "measured": self.measured,
        }


@dataclass
class Placement:
    """Everything the figure and the table draw from: the roof, the files, the placed points, the e2e rows."""

    roof: Roof
    files: list[tuple[str, Results]]
    points: list[Point]
    bytes_source: str = "modelled"
    phases: tuple[str, ...] = ("avg",)
    e2e: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _pairs: list[Pair] | None = None

    @property
    def pairs(self) -> list[Pair]:
        if self._pairs is None:
            self._pairs = speedup_pairs(self.points)
        return self._pairs

    def shown(self) -> list[Point]:
        """The points of the phases asked for (the whole-window average unless told otherwise)."""
        return [p for p in self.points if p.row.get("phase", "avg") in self.phases]

    def warnings(self) -> list[str]:
        """One line per point above its roof by more than its tolerance: a counting error, never a win."""
        lines = []
        hbm = self.roof.find("HBM")
        for p in self.points:
            if not p.above_roof:
                continue
            hit = self.roof.find(p.roof_name) if p.bound == "memory" else self.roof.compute
            also = ""
            if (p.level == "DRAM" and hbm is not None and hit is not hbm
                    and p.flops_per_s > self.roof.attainable(p.intensity, hbm) * (1 + p.tolerance)):
                also = ", above the datasheet HBM roof as well"
            lines.append(
                f"{p.file}: {describe(p.row)}{'' if p.level == 'DRAM' else ' (' + p.level + ' bytes)'} sits "
                f"{p.pct_of_roof - 100:.1f}% above the {hit.label} roof (beyond its ±{100 * p.tolerance:.1f}% tolerance){also}: "
                "a measurement error (cache-resident data, wrong byte or FLOP count, wrong units), not a win"
            )
        return lines


def describe(row: dict[str, Any], batch: bool = True) -> str:
    """A short name for a row: preset, variant, batch, window, dtypes, phase."""
    parts = [str(row.get("preset")), str(row.get("variant"))] + ([f"B{row.get('batch')}"] if batch else [])
    if row.get("window"):
        parts.append(f"W{row['window']}")
    dtypes = precision_label(row["state_dtype"], row.get("read_dtype"), row.get("rounding"), arrow="/") if row.get("state_dtype") else ""
    if dtypes:
        parts.append(dtypes)
    if row.get("draft"):
        parts.append(f"T{row['draft']}")
    parts.append(str(row.get("phase")))
    return " ".join(parts)


def results_gpu_name(results: Results) -> str | None:
    """The GPU a results file came from, wherever the environment records it."""
    env = results.environment
    gpu = env.get("gpu")
    if isinstance(gpu, dict) and gpu.get("name"):
        return str(gpu["name"])
    if isinstance(gpu, str) and gpu:
        return gpu
    for key in ("gpu_name", "device_name"):
        if env.get(key):
            return str(env[key])
    ceilings = env.get("ceilings")
    if isinstance(ceilings, dict) and ceilings.get("gpu_name"):
        return str(ceilings["gpu_name"])
    spec_gpu = results.spec.get("gpu") if isinstance(results.spec, dict) else None
    return str(spec_gpu) if spec_gpu else None


def _positive(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _origin_spec(results: Results, name: str | None):
    """The spec of the GPU a results file came from: by the key the profiler recorded, else by the GPU's name."""
    from replayssm_cli.model import gpus

    gpu = results.environment.get("gpu")
    key = gpu.get("key") if isinstance(gpu, dict) else None
    for wanted in (key, name):
        if not wanted:
            continue
        try:
            return gpus.load_gpu(str(wanted))
        except UserError:
            continue
    return None


def _ceiling_spread(recorded: dict[str, Any], key: str) -> float:
    """A measured ceiling's recorded run-to-run spread (`<key>_spread` or `spread: {key: ...}`), else the default."""
    spreads = recorded.get("spread")
    value = spreads.get(key) if isinstance(spreads, dict) else recorded.get(f"{key}_spread")
    v = _positive(value)
    return v if v is not None and v < 1 else DEFAULT_CEILING_SPREAD


def roof_for(results: Results, gpu: str | None = None) -> Roof:
    """The ceilings for the GPU a results file came from (or `gpu`): the file's recorded ceilings first, then the spec.

    The datasheet HBM bandwidth and a measured copy bandwidth are kept apart and labelled as which;
    FP32 CUDA-core, TF32 and BF16 tensor rates; an L2 ceiling only where one was measured. Raises
    UserError when neither the file nor a GPU spec gives a bandwidth and an FP32 rate.
    """
    from replayssm_cli.model import gpus

    name = results_gpu_name(results)
    recorded = results.environment.get("ceilings")
    recorded = recorded if isinstance(recorded, dict) else {}
    origin = _origin_spec(results, name)
    if gpu:
        spec = gpus.load_gpu(gpu)
        if origin is None or origin.key != spec.key:
            recorded = {}
        name = spec.name
    else:
        spec = origin
        if spec is not None and not name:
            name = spec.name
    measured = str(recorded.get("source", "")).lower().startswith("measured")

    ceilings: list[Ceiling] = []
    hbm = _positive(getattr(spec, "hbm_gbs", None)) if spec is not None else None
    if hbm is None and not measured:
        hbm = _positive(recorded.get("copy_gbs"))
    if hbm is not None:
        ceilings.append(Ceiling("memory", "HBM", hbm, "datasheet"))
    copy = _positive(recorded.get("copy_gbs")) if measured else None
    if copy is not None:
        ceilings.append(Ceiling("memory", "copy", copy, "measured", _ceiling_spread(recorded, "copy_gbs")))
    l2 = _positive(recorded.get("l2_gbs"))
    if l2 is not None:
        ceilings.append(Ceiling("memory", "L2", l2, "measured", _ceiling_spread(recorded, "l2_gbs")))
    for key, short in (("fp32_tflops", "FP32"), ("tf32_tflops", "TF32"), ("bf16_tflops", "BF16")):
        value, source = _positive(recorded.get(key)), "measured" if measured else "datasheet"
        spread = _ceiling_spread(recorded, key)
        if value is None and spec is not None:
            value, source, spread = _positive(getattr(spec, key, None)), "datasheet", DEFAULT_CEILING_SPREAD
        if value is not None:
            ceilings.append(Ceiling("compute", short, value, source, spread))

    roof = Roof(gpu=name or "unknown GPU", ceilings=tuple(ceilings))
    where = f"GPU {name!r}" if name else "a results file that names no GPU"
    hint = "pass --gpu KEY (`replayssm gpu --gpu list` shows the keys)"
    if roof.find("copy") is None and roof.find("HBM") is None:
        raise UserError(f"no memory bandwidth ceiling for {where}: the file records none and no GPU spec matches", hint)
    if roof.find("FP32") is None:
        raise UserError(f"no FP32 rate for {where}: the file records none and no GPU spec matches", hint)
    return roof


def _sum_positive(row: dict[str, Any], *keys: str) -> float | None:
    values = [row.get(k) for k in keys]
    if all(v is None for v in values):
        return None
    try:
        return _positive(sum(float(v) for v in values if v is not None))
    except (TypeError, ValueError):
        return None


def _time_bytes_flops(row: dict[str, Any], bytes_source: str) -> tuple[float | None, float | None, float | None, bool]:
    """A row's µs, bytes and FLOPs per step, and whether the bytes are Nsight Compute's DRAM bytes."""
    us = _positive(row.get("us"))
    modelled = _sum_positive(row, "bytes_read", "bytes_written")
    flops = _positive(row.get("flops"))
    if us is not None and modelled is None and flops is not None and _positive(row.get("intensity")):
        modelled = flops / float(row["intensity"])
    if flops is None and us is not None and _positive(row.get("flops_per_s")):
        flops = float(row["flops_per_s"]) * us * 1e-6
    if bytes_source == "measured":
        measured = _sum_positive(row, "x_ncu_bytes_read", "x_ncu_bytes_written")
        if measured is not None:
            return us, measured, _positive(row.get("x_ncu_flops")) or flops, True
    return us, modelled, flops, False


def time_spread(row: dict[str, Any]) -> float:
    """How much faster than its median a row's fast quartile ran, as a fraction (0 where the row keeps no samples)."""
    us, p25 = _positive(row.get("us")), _positive(row.get("x_us_p25"))
    if us is not None and p25 is not None:
        return max(0.0, us / p25 - 1.0)
    spread = _positive(row.get("spread"))
    return spread / 2 if spread is not None and spread < 2 else 0.0


def place(
    files: Sequence[tuple[str, Results]],
    roof: Roof,
    bytes_source: str = "modelled",
    phases: Sequence[str] = ("avg",),
) -> Placement:
    """Place every kernel row with a time on the roof and classify it; e2e rows are kept for their own panel.

    `bytes_source` 'measured' places points by Nsight Compute's DRAM bytes (x_ncu_bytes_read,
    x_ncu_bytes_written, x_ncu_flops) and keeps the modelled position for the difference, and adds an
    L2 point per kernel where the row holds Nsight Compute's L2 bytes (x_ncu_l2_bytes): the
    hierarchical roofline. A file without them is said so in a note and placed by its modelled bytes.
    Every row is placed whatever `phases` holds; `phases` says which the figure shows.
    """
    if bytes_source not in BYTES_SOURCES:
        raise ValueError(f"bytes_source must be one of {', '.join(BYTES_SOURCES)}, not {bytes_source!r}")
    placement = Placement(roof=roof, files=list(files), points=[], bytes_source=bytes_source, phases=tuple(phases))
    l2 = roof.find("L2")
    for index, (label, results) in enumerate(files):
        failed = untimed = 0
        any_measured = False
        file_source = row_label({"source": "measured"}, results)
        for row in results.rows:
            if not isinstance(row, dict):
                untimed += 1
                continue
            if row.get("kind", "kernel") == "e2e":
                placement.e2e.append((index, row))
                continue
            if row.get("status") != "ok":
                failed += 1
                continue
            us, nbytes, flops, is_measured = _time_bytes_flops(row, bytes_source)
            if us is None or nbytes is None or flops is None:
                untimed += 1
                continue
            any_measured |= is_measured
            source = row_label(row, results) if "x_origin" in row or row.get("source") == "predicted" else file_source
            point = _point(row, label, index, us, nbytes, flops, roof, roof.memory, source, "measured" if is_measured else "modelled")
            if is_measured:
                _, modelled, mflops, _ = _time_bytes_flops(row, "modelled")
                if modelled is not None and mflops is not None:
                    point.modelled_bytes = modelled
                    point.modelled_intensity = mflops / modelled
                    point.modelled_flops_per_s = mflops / (us * 1e-6)
                l2_bytes = _positive(row.get("x_ncu_l2_bytes"))
                if l2_bytes is not None and l2 is not None:
                    placement.points.append(_point(row, label, index, us, l2_bytes, flops, roof, l2, source, "measured", "L2"))
            placement.points.append(point)
        if failed:
            placement.notes.append(f"{label}: {failed} failed row(s) carry no time and are not plotted")
        if untimed:
            placement.notes.append(f"{label}: {untimed} row(s) without a usable time, bytes or FLOPs are not plotted")
        if bytes_source == "measured" and not any_measured:
            placement.notes.append(
                f"{label} has no measured DRAM bytes (x_ncu_bytes_read/written): its points use the modelled bytes"
            )
        if not results.complete:
            placement.notes.append(f"{label} is incomplete (the run was interrupted): plotting the rows it has")
    if not placement.points and not placement.e2e:
        names = ", ".join(label for label, _ in files)
        raise UserError(f"no row with a time to plot in {names}", "profile again, or pass another results file")
    return placement


def _point(row, label, index, us, nbytes, flops, roof: Roof, memory: Ceiling, source: str, bytes_source: str,
           level: str = "DRAM") -> Point:
    intensity = flops / nbytes
    attained = flops / (us * 1e-6)
    roof_at = roof.attainable(intensity, memory)
    bound = "memory" if intensity < roof.ridge(memory=memory) else "compute"
    ceiling = memory if bound == "memory" else roof.compute
    return Point(
        row=row,
        file=label,
        file_index=index,
        us=us,
        bytes=nbytes,
        flops=flops,
        intensity=intensity,
        flops_per_s=attained,
        bytes_source=bytes_source,
        roof_flops_per_s=roof_at,
        bound=bound,
        pct_of_roof=100.0 * attained / roof_at,
        us_left=us - 1e6 * max(nbytes / memory.per_s, flops / roof.compute.per_s),
        tolerance=time_spread(row) + ceiling.spread,
        provenance=source,
        level=level,
        roof_name=ceiling.name,
    )


def _quartiles(row: dict[str, Any]) -> tuple[float, float] | None:
    """A row's per-token p25 and p75, from its samples' quartiles or its spread."""
    us = _positive(row.get("us"))
    per_token = _positive(row.get("us_per_token")) or us
    if us is None or per_token is None:
        return None
    scale = per_token / us
    p25, p75 = _positive(row.get("x_us_p25")), _positive(row.get("x_us_p75"))
    if p25 is not None and p75 is not None:
        return p25 * scale, p75 * scale
    spread = _positive(row.get("spread"))
    if spread is not None and spread < 2:
        return per_token * (1 - spread / 2), per_token * (1 + spread / 2)
    return None


def pair_speedup(base: dict[str, Any], row: dict[str, Any], over: str) -> tuple[float, float | None, float | None]:
    """A row's speedup over its baseline row, per token, with the pessimistic and optimistic bounds from the quartiles:
    the row's own `speedup` where its `speedup_over` names this baseline, else computed from the pair."""
    if row.get("speedup_over") == over and _positive(row.get("speedup")) is not None:
        return float(row["speedup"]), _positive(row.get("speedup_lo")), _positive(row.get("speedup_hi"))
    b_tok = _positive(base.get("us_per_token")) or float(base["us"])
    r_tok = _positive(row.get("us_per_token")) or float(row["us"])
    bq, rq = _quartiles(base), _quartiles(row)
    if bq is None or rq is None:
        return b_tok / r_tok, None, None
    return b_tok / r_tok, bq[0] / rq[1], bq[1] / rq[0]


def speedup_pairs(points: Sequence[Point]) -> list[Pair]:
    """Every whole-window-average DRAM point paired with the baseline its speedup is over, in the same file.

    The baseline is the one the row's `speedup_over` names ("conventional": the conventional step at the same
    state precision; "snapshots": the snapshot-writing verify at the same draft width; "fp32-conventional":
    the fp32 conventional step), or for rows without that field the one their variant's speedup is over. Outside
    kernels (baseline:<name>) are references, not ours: they get no arrow.
    """
    index: dict[tuple, Point] = {}
    for p in points:
        if p.level == "DRAM" and p.row.get("phase", "avg") == "avg" and p.variant in ("conventional", "spec-conventional"):
            key = (p.file_index, p.variant, p.row.get("state_dtype"), p.row.get("draft") or 0, rounding_of(p.row))
            index.setdefault(key + tuple(p.row.get(k) for k in PAIR_KEYS), p)
    pairs = []
    for p in points:
        if p.level != "DRAM" or p.row.get("phase", "avg") != "avg" or p.variant.startswith("baseline:"):
            continue
        over = p.row.get("speedup_over") if "speedup_over" in p.row else DEFAULT_OVER.get(p.variant)
        if over not in BASELINE_OF or p.variant in ("conventional", "spec-conventional") and over == "conventional":
            continue
        variant, fp32 = BASELINE_OF[over]
        draft = (p.row.get("draft") or 0) if variant == "spec-conventional" else 0
        key = (p.file_index, variant, "fp32" if fp32 else p.row.get("state_dtype"), draft,
               "nearest" if fp32 else rounding_of(p.row))
        base = index.get(key + tuple(p.row.get(k) for k in PAIR_KEYS))
        if base is None or base is p:
            continue
        speed, lo, hi = pair_speedup(base.row, p.row, over)
        pairs.append(Pair(base=base, point=p, speedup=speed, lo=lo, hi=hi, over=over))
    return pairs


def before_after_pairs(points: Sequence[Point]) -> list[tuple[Point, Point]]:
    """The same configuration in consecutive files (before, after)."""
    by_file: dict[int, dict[tuple, Point]] = {}
    for p in points:
        by_file.setdefault(p.file_index, {})[p.config()] = p
    pairs = []
    indices = sorted(by_file)
    for before, after in zip(indices, indices[1:]):
        for key, p in by_file[after].items():
            if key in by_file[before]:
                pairs.append((by_file[before][key], p))
    return pairs


def file_labels(paths: Sequence[Path]) -> list[str]:
    """Short, distinct names for results files (their stems, with the folder where stems repeat)."""
    stems = [p.stem for p in paths]
    labels = [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    return [f"{lab} ({i + 1})" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def load_files(paths: Sequence[Path]) -> list[tuple[str, Results]]:
    """Load results files with short labels; a missing, corrupt or truncated file is a UserError."""
    from replayssm_cli.report.results import load

    paths = [Path(p) for p in paths]
    loaded = []
    for path in paths:
        try:
            results = load(path)
        except RecursionError:
            raise UserError(f"results file {path} nests too deeply to be a results file", "pass a file written by `replayssm profile`") from None
        except (AttributeError, TypeError) as exc:
            raise UserError(f"results file {path} is malformed ({exc})", "pass a file written by `replayssm profile`") from None
        check_rows(results, path)
        loaded.append(results)
    return list(zip(file_labels(paths), loaded))


NUMERIC_FIELDS = ("us", "us_per_token", "bytes_read", "bytes_written", "flops", "intensity", "flops_per_s", "speedup",
                  "speedup_lo", "speedup_hi", "spread", "x_us_p25", "x_us_p75", "tokens_per_step")


def check_rows(results: Results, path: Path | str) -> None:
    """Refuse a results file whose rows are not objects or whose figures are not numbers (strings, negatives)."""
    for i, row in enumerate(results.rows):
        if not isinstance(row, dict):
            raise UserError(f"{path}: row {i} is a {type(row).__name__}, not an object", "pass a file written by `replayssm profile`")
        for key in NUMERIC_FIELDS:
            value = row.get(key)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                raise UserError(
                    f"{path}: row {i} field {key!r} is {value!r}, not a non-negative number",
                    "pass a file written by `replayssm profile`",
                )


@dataclass
class Chosen:
    """The files `roofline` plots with no argument, and one line saying which and why."""

    files: list[tuple[str, Results]]
    why: str
    skipped: list[str] = field(default_factory=list)


def _is_predicted(results: Results) -> bool:
    rows = [r for r in results.rows if isinstance(r, dict)]
    return bool(rows) and all(r.get("source") == "predicted" for r in rows)


def load_default(directory: str | Path = "runs") -> Chosen:
    """The newest measured results file under ./runs/ (the newest predicted one where none is measured), else the
    shipped H200 reference profile, its files merged (a configuration measured in several kept from the newest)."""
    from replayssm_cli.report.results import load_reference, reference_files

    folder = Path(directory)
    # Temporary files of a run in progress (or killed) start with a dot and are never plotted.
    found = [f for f in folder.glob("*.json") if not f.name.startswith(".") and f.is_file()] if folder.is_dir() else []
    found.sort(key=lambda f: f.stat().st_mtime, reverse=True)
    if found:
        loaded = [(f, _try_load(f)) for f in found]
        readable = [(f, r) for f, r in loaded if r is not None]
        if not readable:
            return Chosen(load_files([found[0]]), "")
        measured = [(f, r) for f, r in readable if not _is_predicted(r)]
        if measured:
            path, results = measured[0]
            newer = [f.name for f, r in readable if _is_predicted(r) and f.stat().st_mtime > path.stat().st_mtime]
            why = f"plotting {path} (the newest measured results file in ./{folder.name}/)"
            return Chosen([(file_labels([path])[0], results)], why, newer)
        path, results = readable[0]
        why = f"plotting {path}: predicted, the newest results file in ./{folder.name}/ (none there is measured)"
        return Chosen([(file_labels([path])[0], results)], why)
    merged = load_reference("h200")
    if merged is None:
        raise UserError(
            "no results file given, none under ./runs/ and no shipped reference profile",
            "run `replayssm profile` first, or pass a results file",
        )
    names = sorted(f.name for f in reference_files() if f.name.startswith("h200-"))
    why = f"plotting the shipped H200 reference profile ({len(names)} files: {', '.join(names)}); no results file in ./{folder.name}/"
    return Chosen([("reference profile", merged)], why)


def _try_load(path: Path) -> Results | None:
    try:
        return load_files([path])[0][1]
    except UserError:
        return None


def progress_lines(total: int, threshold: int = 2000) -> Callable[[str], None]:
    """A stage reporter for long work: plain lines on stderr once the rows pass `threshold`, silent below it."""
    from replayssm_cli.console import note

    if total < threshold:
        return lambda stage: None
    return lambda stage: note(f"roofline: {stage} ({total:,} rows)")
