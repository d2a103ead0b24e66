"""The roofline: a GPU's ceilings, every results row placed and classified under them, and the plotly figure."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from replayssm_cli.errors import UserError
from replayssm_cli.results import ROW_FIELDS, Results

BYTES_SOURCES = ("modelled", "measured")
IMAGE_SUFFIXES = (".png", ".svg")

VARIANT_STYLE: dict[str, tuple[str, str]] = {
    "conventional": ("conventional", "#4C78A8"),
    "replay": ("ReplaySSM", "#F58518"),
    "split": ("split precision", "#54A24B"),
    "spec-conventional": ("speculative, snapshots", "#B279A2"),
    "spec-replay": ("speculative, ReplaySSM", "#E45756"),
}
OTHER_COLOURS = ("#72B7B2", "#9D755D", "#EECA3B", "#FF9DA6", "#79706E", "#17BECF", "#BCBD22", "#8C564B")
FILE_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "pentagon", "star")
E2E_SHARES = (
    ("x_share_ssm", "SSM layers", "#F58518"),
    ("x_share_attn", "attention", "#4C78A8"),
    ("x_share_mlp", "MLP / MoE", "#54A24B"),
    ("x_share_other", "other", "#BAB0AC"),
)
# (what a speedup arrow starts from, what it points to): a kernel and its ReplaySSM counterpart.
ARROW_PAIRS = (("conventional", "replay"), ("spec-conventional", "spec-replay"))
PAIR_KEYS = ("op", "preset", "batch", "state_dtype", "io_dtype", "tp", "draft")
CONFIG_KEYS = (
    "op", "preset", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "io_dtype", "draft", "tp", "flush",
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
    """One roof: a bandwidth in GB/s (kind 'memory') or a rate in TFLOP/s (kind 'compute')."""

    kind: str
    name: str
    value: float
    source: str

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

    def ridge(self, compute: Ceiling | None = None) -> float:
        """Arithmetic intensity (FLOP/byte) where the classifying memory roof meets a compute roof."""
        return (compute or self.compute).per_s / self.memory.per_s

    def attainable(self, intensity: float) -> float:
        """FLOP/s the roof allows at an arithmetic intensity."""
        return min(self.memory.per_s * intensity, self.compute.per_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "memory_roof": self.memory.name,
            "compute_roof": self.compute.name,
            "ceilings": [
                {"kind": c.kind, "name": c.name, "value": c.value, "unit": "GB/s" if c.kind == "memory" else "TFLOP/s",
                 "source": c.source, "label": c.label}
                for c in self.ceilings
            ],
            "ridges": {c.name: self.ridge(c) for c in self.ceilings if c.kind == "compute"},
        }


@dataclass
class Point:
    """One kernel row placed on the roofline and classified."""

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
        return self.pct_of_roof > 100.0

    def config(self) -> tuple:
        return tuple(self.row.get(k) for k in CONFIG_KEYS)

    def to_dict(self) -> dict[str, Any]:
        r = self.row
        return {
            "file": self.file,
            "op": r.get("op"),
            "preset": r.get("preset"),
            "variant": r.get("variant"),
            "batch": r.get("batch"),
            "phase": r.get("phase"),
            "window": r.get("window"),
            "state_dtype": r.get("state_dtype"),
            "read_dtype": r.get("read_dtype"),
            "io_dtype": r.get("io_dtype"),
            "draft": r.get("draft"),
            "source": r.get("source"),
            "us": self.us,
            "bytes": self.bytes,
            "bytes_source": self.bytes_source,
            "flops": self.flops,
            "intensity": self.intensity,
            "flops_per_s": self.flops_per_s,
            "gbs": self.gbs,
            "roof_flops_per_s": self.roof_flops_per_s,
            "bound": self.bound,
            "pct_of_roof": self.pct_of_roof,
            "distance_to_roof_pct": 100.0 - self.pct_of_roof,
            "us_left": self.us_left,
            "above_roof": self.above_roof,
        }


@dataclass
class Placement:
    """Everything the figure and the table draw from: the roof, the files, the placed points, the e2e rows."""

    roof: Roof
    files: list[tuple[str, Results]]
    points: list[Point]
    e2e: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def warnings(self) -> list[str]:
        """One line per point above a roof: such a point is a measurement error, never a win."""
        lines = []
        hbm = self.roof.find("HBM")
        for p in self.points:
            if not p.above_roof:
                continue
            hit = self.roof.memory if p.bound == "memory" else self.roof.compute
            also = ""
            if hbm is not None and hit is not hbm and p.flops_per_s > min(hbm.per_s * p.intensity, self.roof.compute.per_s):
                also = ", above the datasheet HBM roof as well"
            lines.append(
                f"{p.file}: {describe(p.row)} sits {p.pct_of_roof - 100:.1f}% above the {hit.label} roof{also}: "
                "a measurement error (cache-resident data, wrong byte or FLOP count, wrong units), not a win"
            )
        return lines


def variant_style(variant: str, others: dict[str, str] | None = None) -> tuple[str, str]:
    """Legend label and colour of a variant; 'baseline:<name>' and unknown variants get their own colour."""
    if variant in VARIANT_STYLE:
        return VARIANT_STYLE[variant]
    label = f"baseline: {variant.split(':', 1)[1]}" if variant.startswith("baseline:") else variant
    if others is None:
        return label, OTHER_COLOURS[0]
    if variant not in others:
        others[variant] = OTHER_COLOURS[len(others) % len(OTHER_COLOURS)]
    return label, others[variant]


def describe(row: dict[str, Any], batch: bool = True) -> str:
    """A short name for a row: preset, variant, batch, window, dtypes, phase."""
    parts = [str(row.get("preset")), str(row.get("variant"))] + ([f"B{row.get('batch')}"] if batch else [])
    if row.get("window"):
        parts.append(f"W{row['window']}")
    dtypes = "/".join(str(row[k]) for k in ("state_dtype", "read_dtype") if row.get(k))
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
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _origin_spec(results: Results, name: str | None):
    """The spec of the GPU a results file came from: by the key the profiler recorded, else by the GPU's name."""
    from replayssm_cli import gpus

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


def roof_for(results: Results, gpu: str | None = None) -> Roof:
    """The ceilings for the GPU a results file came from (or `gpu`): the file's recorded ceilings first, then the spec.

    The datasheet HBM bandwidth and a measured copy bandwidth are kept apart and labelled as which;
    FP32 CUDA-core, TF32 and BF16 tensor rates; an L2 ceiling only where one was measured. Raises
    UserError when neither the file nor a GPU spec gives a bandwidth and an FP32 rate.
    """
    from replayssm_cli import gpus

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
        ceilings.append(Ceiling("memory", "copy", copy, "measured"))
    l2 = _positive(recorded.get("l2_gbs"))
    if l2 is not None:
        ceilings.append(Ceiling("memory", "L2", l2, "measured"))
    for key, short in (("fp32_tflops", "FP32"), ("tf32_tflops", "TF32"), ("bf16_tflops", "BF16")):
        value, source = _positive(recorded.get(key)), "measured" if measured else "datasheet"
        if value is None and spec is not None:
            value, source = _positive(getattr(spec, key, None)), "datasheet"
        if value is not None:
            ceilings.append(Ceiling("compute", short, value, source))

    roof = Roof(gpu=name or "unknown GPU", ceilings=tuple(ceilings))
    where = f"GPU {name!r}" if name else "a results file that names no GPU"
    hint = "pass --gpu KEY (`replayssm gpu --gpu list` shows the keys)"
    if roof.find("copy") is None and roof.find("HBM") is None:
        raise UserError(f"no memory bandwidth ceiling for {where}: the file records none and no GPU spec matches", hint)
    if roof.find("FP32") is None:
        raise UserError(f"no FP32 rate for {where}: the file records none and no GPU spec matches", hint)
    return roof


def _time_bytes_flops(row: dict[str, Any], bytes_source: str) -> tuple[float | None, float | None, float | None, bool]:
    """A row's µs, bytes and FLOPs per step, and whether the bytes are Nsight Compute's."""
    us = _positive(row.get("us"))
    modelled = None
    if row.get("bytes_read") is not None or row.get("bytes_written") is not None:
        modelled = _positive((row.get("bytes_read") or 0) + (row.get("bytes_written") or 0))
    flops = _positive(row.get("flops"))
    if us is not None and modelled is None and flops is not None and _positive(row.get("intensity")):
        modelled = flops / float(row["intensity"])
    if flops is None and us is not None and _positive(row.get("flops_per_s")):
        flops = float(row["flops_per_s"]) * us * 1e-6
    has_ncu = row.get("x_ncu_bytes_read") is not None or row.get("x_ncu_bytes_written") is not None
    if bytes_source == "measured" and has_ncu:
        measured = _positive((row.get("x_ncu_bytes_read") or 0) + (row.get("x_ncu_bytes_written") or 0))
        return us, measured, _positive(row.get("x_ncu_flops")) or flops, True
    return us, modelled, flops, False


def place(files: Sequence[tuple[str, Results]], roof: Roof, bytes_source: str = "modelled") -> Placement:
    """Place every kernel row with a time on the roof and classify it; e2e rows are kept for their own panel.

    `bytes_source` 'measured' places points by Nsight Compute's DRAM bytes (x_ncu_bytes_read,
    x_ncu_bytes_written, x_ncu_flops) and keeps the modelled position for the difference; a file without
    them is said so in a note and placed by its modelled bytes.
    """
    if bytes_source not in BYTES_SOURCES:
        raise ValueError(f"bytes_source must be one of {', '.join(BYTES_SOURCES)}, not {bytes_source!r}")
    placement = Placement(roof=roof, files=list(files), points=[])
    mem, comp = roof.memory.per_s, roof.compute.per_s
    for index, (label, results) in enumerate(files):
        failed = untimed = 0
        any_measured = False
        for row in results.rows:
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
            intensity = flops / nbytes
            attained = flops / (us * 1e-6)
            roof_at = roof.attainable(intensity)
            point = Point(
                row=row,
                file=label,
                file_index=index,
                us=us,
                bytes=nbytes,
                flops=flops,
                intensity=intensity,
                flops_per_s=attained,
                bytes_source="measured" if is_measured else "modelled",
                roof_flops_per_s=roof_at,
                bound="memory" if intensity < comp / mem else "compute",
                pct_of_roof=100.0 * attained / roof_at,
                us_left=us - 1e6 * max(nbytes / mem, flops / comp),
            )
            if is_measured:
                _, modelled, mflops, _ = _time_bytes_flops(row, "modelled")
                if modelled is not None and mflops is not None:
                    point.modelled_bytes = modelled
                    point.modelled_intensity = mflops / modelled
                    point.modelled_flops_per_s = mflops / (us * 1e-6)
            placement.points.append(point)
        if failed:
            placement.notes.append(f"{label}: {failed} failed row(s) carry no time and are not plotted")
        if untimed:
            placement.notes.append(f"{label}: {untimed} row(s) without a time, bytes or FLOPs are not plotted")
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


def file_labels(paths: Sequence[Path]) -> list[str]:
    """Short, distinct names for results files (their stems, with the folder where stems repeat)."""
    stems = [p.stem for p in paths]
    labels = [f"{p.parent.name}/{p.stem}" if stems.count(p.stem) > 1 else p.stem for p in paths]
    return [f"{lab} ({i + 1})" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.4g}"
        return f"{value:,.4g}"
    return str(value)


def hover_text(point: Point, roof: Roof) -> str:
    """Every field of the row, after the placement: µs, GB/s, share of the roof, bytes, FLOPs and the rest."""
    pct_bw = 100 * point.gbs * 1e9 / roof.memory.per_s
    lines = [
        f"<b>{describe(point.row)}</b> ({point.file})",
        f"µs: {point.us:,.2f}   GB/s: {point.gbs:,.0f}   % of {roof.memory.name} ceiling: {pct_bw:.1f}",
        f"intensity: {point.intensity:.3g} FLOP/B   attained: {point.flops_per_s / 1e12:.3g} TFLOP/s",
        f"roof here: {point.roof_flops_per_s / 1e12:.3g} TFLOP/s ({point.bound}-bound), "
        f"{point.pct_of_roof:.1f}% of roof, {point.us_left:,.2f} µs left",
        f"bytes ({point.bytes_source}): {point.bytes:,.0f}   FLOPs: {point.flops:,.0f}",
    ]
    if point.modelled_bytes is not None:
        diff = 100.0 * (point.bytes - point.modelled_bytes) / point.modelled_bytes
        lines.append(f"modelled bytes: {point.modelled_bytes:,.0f} (measured {diff:+.1f}%)")
    return "<br>".join(lines + _row_fields(point.row))


def _row_fields(row: dict[str, Any]) -> list[str]:
    keys = [k for k in ROW_FIELDS if k in row] + sorted(k for k in row if k not in ROW_FIELDS)
    return [f"{k}: {_fmt(row[k])}" for k in keys if row[k] is not None]


def _marker_size(batch: Any) -> float:
    b = _positive(batch) or 1.0
    return 7.0 + 2.5 * math.log2(b)


def _symbol(file_index: int, predicted: bool) -> str:
    base = FILE_SYMBOLS[file_index % len(FILE_SYMBOLS)]
    return f"{base}-open" if predicted else base


def speedup_pairs(points: Sequence[Point]) -> list[tuple[Point, Point, float, bool]]:
    """(conventional point, ReplaySSM counterpart, speedup, measured) for every pair in the same file."""
    pairs = []
    for base_variant, replay_variant in ARROW_PAIRS:
        bases = [p for p in points if p.variant == base_variant]
        for r in points:
            if r.variant != replay_variant or r.row.get("phase") != "avg":
                continue
            for b in bases:
                if b.file_index != r.file_index or any(b.row.get(k) != r.row.get(k) for k in PAIR_KEYS):
                    continue
                speed = _positive(r.row.get("speedup"))
                if speed is None:
                    bu = _positive(b.row.get("us_per_token")) or b.us
                    ru = _positive(r.row.get("us_per_token")) or r.us
                    speed = bu / ru
                pairs.append((b, r, speed, not (b.predicted or r.predicted)))
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


def build_figure(placement: Placement):
    """The plotly figure: the roofline (ceilings, points, speedup arrows), % of the ceiling against batch, e2e shares."""
    from plotly.subplots import make_subplots

    roof = placement.roof
    titles = [f"Roofline, {roof.gpu}", f"Achieved bandwidth as % of the {roof.memory.label} ceiling"]
    heights = [0.62, 0.38]
    if placement.e2e:
        titles.append("Whole-model decode step: share of time")
        heights = [0.5, 0.25, 0.25]
    fig = make_subplots(rows=len(titles), cols=1, subplot_titles=titles, row_heights=heights, vertical_spacing=0.09)
    x_range, y_range = _roofline_ranges(placement)
    _ceilings(fig, roof, x_range)
    others: dict[str, str] = {}
    _points(fig, placement, others)
    _arrows(fig, placement)
    _bandwidth_panel(fig, placement, others)
    if placement.e2e:
        _e2e_panel(fig, placement)

    log_x, log_y = [math.log10(v) for v in x_range], [math.log10(v) for v in y_range]
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP/byte)", range=log_x, row=1, col=1)
    fig.update_yaxes(type="log", title_text="attained FLOP/s", exponentformat="SI", range=log_y, row=1, col=1)
    batches = sorted({int(p.row["batch"]) for p in placement.points if _positive(p.row.get("batch"))})
    fig.update_xaxes(type="log", title_text="batch size", tickvals=batches or None, row=2, col=1)
    fig.update_yaxes(title_text=f"% of {roof.memory.name} bandwidth", rangemode="tozero", row=2, col=1)
    names = [label for label, _ in placement.files]
    fig.update_layout(
        title={"text": f"ReplaySSM roofline · {roof.gpu} · {', '.join(names)}", "x": 0.01},
        template="plotly_white",
        height=1500 if placement.e2e else 1150,
        hovermode="closest",
        legend={"groupclick": "toggleitem", "tracegroupgap": 4, "itemsizing": "constant", "traceorder": "grouped"},
        barmode="stack",
        meta={"gpu": roof.gpu, "roof": roof.to_dict(), "files": names},
    )
    return fig


def _roofline_ranges(placement: Placement) -> tuple[tuple[float, float], tuple[float, float]]:
    """Axis ranges that hold every point, every ridge and the top compute roof."""
    roof, points = placement.roof, placement.points
    computes = [c for c in roof.ceilings if c.kind == "compute"]
    xs = [p.intensity for p in points] + [p.modelled_intensity for p in points if p.modelled_intensity]
    xs += [roof.ridge(c) for c in computes]
    ys = [p.flops_per_s for p in points] + [p.modelled_flops_per_s for p in points if p.modelled_flops_per_s]
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    y_lo = min(ys + [roof.memory.per_s * x_lo]) / 4
    return (x_lo, x_hi), (y_lo, max(c.per_s for c in computes) * 3)


def _ceilings(fig, roof: Roof, x_range: tuple[float, float]) -> None:
    import plotly.graph_objects as go

    x_lo, x_hi = x_range
    memories = [c for c in roof.ceilings if c.kind == "memory"]
    computes = [c for c in roof.ceilings if c.kind == "compute"]
    top = max(c.per_s for c in computes)
    text_font = {"size": 11, "color": "#444"}

    def line(c: Ceiling, dash: str) -> dict:
        main = c is roof.memory or c is roof.compute
        return {"color": "#333" if main else "#888", "width": 2 if main else 1.4, "dash": dash}

    def meta(c: Ceiling) -> dict:
        return {"role": "ceiling", "kind": c.kind, "name": c.name, "value": c.value, "source": c.source}

    dashes = {"HBM": "dash", "copy": "solid", "L2": "dot"}
    # Labels sit at staggered places along the diagonals so that close bandwidths don't print over each other.
    for i, c in enumerate(sorted(memories, key=lambda c: c.value)):
        x_end = min(x_hi, top / c.per_s)
        x_mid = x_lo * (x_end / x_lo) ** (0.55 + 0.14 * i)
        fig.add_trace(
            go.Scatter(
                x=[x_lo, x_mid, x_end],
                y=[c.per_s * x_lo, c.per_s * x_mid, c.per_s * x_end],
                mode="lines+text",
                text=["", c.label, ""],
                textposition="top left",
                textfont=text_font,
                line=line(c, dashes.get(c.name, "solid")),
                name=c.label,
                legendgroup="ceilings",
                legendgrouptitle_text="ceilings",
                hovertemplate=c.label + "<extra></extra>",
                meta=meta(c),
            ),
            row=1, col=1,
        )
    dashes = {"FP32": "solid", "TF32": "dashdot", "BF16": "longdash"}
    by_rate = sorted(computes, key=lambda c: c.value)
    for i, c in enumerate(by_rate):
        text = f"{c.label}, ridge {roof.ridge(c):.3g} FLOP/B"
        # Close rates (TF32 and BF16) put their labels on opposite sides of their lines.
        below = i + 1 < len(by_rate) and by_rate[i + 1].value < 2 * c.value
        fig.add_trace(
            go.Scatter(
                x=[roof.ridge(c), x_hi],
                y=[c.per_s, c.per_s],
                mode="lines+text",
                text=["", text],
                textposition="bottom left" if below else "top left",
                textfont=text_font,
                line=line(c, dashes.get(c.name, "solid")),
                name=c.label,
                legendgroup="ceilings",
                hovertemplate=text + "<extra></extra>",
                meta=meta(c),
            ),
            row=1, col=1,
        )
    ridges = {c.name: roof.ridge(c) for c in computes}
    fig.add_trace(
        go.Scatter(
            x=list(ridges.values()),
            y=[c.per_s for c in computes],
            mode="markers",
            marker={"symbol": "x-thin-open", "size": 12, "color": "#222", "line": {"width": 2}},
            text=[f"ridge {name}: {r:.3g} FLOP/B on the {roof.memory.label} roof" for name, r in ridges.items()],
            name=f"ridge points ({roof.memory.name} roof)",
            legendgroup="ceilings",
            hovertemplate="%{text}<extra></extra>",
            meta={"role": "ridge", "memory": roof.memory.name, "ridges": ridges},
        ),
        row=1, col=1,
    )


def _points(fig, placement: Placement, others: dict[str, str]) -> None:
    import plotly.graph_objects as go

    groups: dict[tuple[int, str], list[Point]] = {}
    for p in placement.points:
        groups.setdefault((p.file_index, p.variant), []).append(p)
    several = len(placement.files) > 1
    for (index, variant), group in sorted(groups.items(), key=lambda kv: (kv[0][0], _variant_order(kv[0][1]))):
        label, colour = variant_style(variant, others)
        file_label = placement.files[index][0]
        fig.add_trace(
            go.Scatter(
                x=[p.intensity for p in group],
                y=[p.flops_per_s for p in group],
                mode="markers",
                name=f"{label} · {file_label}" if several else label,
                legendgroup=f"{index}:{variant}",
                marker={
                    "color": colour,
                    "size": [_marker_size(p.row.get("batch")) for p in group],
                    "symbol": [_symbol(index, p.predicted) for p in group],
                    "line": {"color": colour, "width": [2 if p.predicted else 0.8 for p in group]},
                    # Earlier files of a before/after overlay are drawn fainter.
                    "opacity": 0.55 if several and index < len(placement.files) - 1 else 0.9,
                },
                hovertext=[hover_text(p, placement.roof) for p in group],
                hoverinfo="text",
                meta={
                    "role": "points",
                    "variant": variant,
                    "file": file_label,
                    "predicted": [p.predicted for p in group],
                    "batch": [p.row.get("batch") for p in group],
                    "rows": [describe(p.row) for p in group],
                },
            ),
            row=1, col=1,
        )

    moved = [p for p in placement.points if p.modelled_intensity is not None]
    if moved:
        xs, ys, hover = [], [], []
        for p in moved:
            xs += [p.modelled_intensity, p.intensity, None]
            ys += [p.modelled_flops_per_s, p.flops_per_s, None]
            diff = 100.0 * (p.bytes - p.modelled_bytes) / p.modelled_bytes
            text = f"{describe(p.row)}: modelled {p.modelled_bytes:,.0f} B, measured {p.bytes:,.0f} B ({diff:+.1f}%)"
            hover += [text] * 3
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines", name="modelled → measured bytes",
                line={"color": "#999", "width": 1, "dash": "dot"},
                hovertext=hover, hoverinfo="text", meta={"role": "bytes-difference", "count": len(moved)},
            ),
            row=1, col=1,
        )

    links = before_after_pairs(placement.points) if several else []
    if links:
        xs, ys = [], []
        for b, a in links:
            xs += [b.intensity, a.intensity, None]
            ys += [b.flops_per_s, a.flops_per_s, None]
        fig.add_trace(
            go.Scatter(
                x=xs, y=ys, mode="lines", name="before → after (same configuration)",
                line={"color": "#777", "width": 1, "dash": "dot"},
                hoverinfo="skip", meta={"role": "before-after", "count": len(links)},
            ),
            row=1, col=1,
        )


def _arrows(fig, placement: Placement) -> None:
    for base, rep, speed, measured in speedup_pairs(placement.points):
        text = f"{speed:.2f}x" if measured else f"{speed:.2f}x pred."
        info = f"{describe(base.row)} → {describe(rep.row)}: {text}"
        colour = variant_style(rep.variant)[1]
        # Annotations on log axes take log10 coordinates.
        head = (math.log10(rep.intensity), math.log10(rep.flops_per_s))
        tail = (math.log10(base.intensity), math.log10(base.flops_per_s))
        fig.add_annotation(
            x=head[0], y=head[1], ax=tail[0], ay=tail[1], xref="x", yref="y", axref="x", ayref="y",
            text="", showarrow=True, arrowhead=2, arrowsize=1.1, arrowwidth=1.4, arrowcolor=colour,
            standoff=4, startstandoff=4, name="speedup-arrow", hovertext=info,
        )
        fig.add_annotation(
            x=(head[0] + tail[0]) / 2, y=(head[1] + tail[1]) / 2, xref="x", yref="y",
            text=text, showarrow=False, xanchor="left", xshift=6, font={"size": 10, "color": colour},
            bgcolor="rgba(255,255,255,0.7)", name="speedup-label", hovertext=info,
        )


def _variant_order(variant: str) -> int:
    order = list(VARIANT_STYLE)
    return order.index(variant) if variant in order else len(order)


def _bandwidth_panel(fig, placement: Placement, others: dict[str, str]) -> None:
    import plotly.graph_objects as go

    roof = placement.roof
    series: dict[tuple, list[Point]] = {}
    # Whole-window averages only: the flush and non-flush phases alone are on the roofline.
    for p in (p for p in placement.points if p.row.get("phase", "avg") == "avg"):
        key = (p.file_index,) + tuple(p.row.get(k) for k in CONFIG_KEYS if k != "batch")
        series.setdefault(key, []).append(p)
    several = len(placement.files) > 1
    for group in series.values():
        group = sorted((p for p in group if _positive(p.row.get("batch"))), key=lambda p: p.row["batch"])
        if not group:
            continue
        first = group[0]
        colour = variant_style(first.variant, others)[1]
        name = describe(first.row, batch=False) + (f" · {first.file}" if several else "")
        dash = "dash" if all(p.predicted for p in group) else "solid"
        fig.add_trace(
            go.Scatter(
                x=[p.row["batch"] for p in group],
                y=[100.0 * p.gbs * 1e9 / roof.memory.per_s for p in group],
                mode="lines+markers",
                name=name,
                legendgroup=f"{first.file_index}:{first.variant}",
                showlegend=False,
                line={"color": colour, "width": 1.6, "dash": dash},
                marker={"color": colour, "size": 7, "symbol": [_symbol(first.file_index, p.predicted) for p in group]},
                hovertemplate=name + "<br>batch %{x}: %{y:.1f}% of " + roof.memory.name + "<extra></extra>",
                meta={"role": "bandwidth", "variant": first.variant, "file": first.file},
            ),
            row=2, col=1,
        )
    fig.add_hline(
        y=100, line={"color": "#333", "width": 1.5}, row=2, col=1,
        annotation_text=roof.memory.label, annotation_position="top left", name="ceiling-100",
    )


def _e2e_panel(fig, placement: Placement) -> None:
    import plotly.graph_objects as go

    several = len(placement.files) > 1
    rows = sorted(
        placement.e2e,
        key=lambda ir: (ir[0], str(ir[1].get("preset")), str(ir[1].get("variant")), ir[1].get("batch") or 0),
    )
    presets = {row.get("preset") for _, row in rows}
    cats, hover = [], []
    for index, row in rows:
        label = f"{variant_style(str(row.get('variant')))[0]} · B{row.get('batch')}"
        if len(presets) > 1:
            label = f"{row.get('preset')} · {label}"
        cats.append(label + (f" · {placement.files[index][0]}" if several else ""))
        hover.append("<br>".join([f"<b>{describe(row)}</b> ({placement.files[index][0]})"] + _row_fields(row)))
    # Shares may be recorded as fractions or as percentages: a row whose shares sum to at most 1 holds fractions.
    scales = [100.0 if sum(float(row.get(k) or 0) for k, _, _ in E2E_SHARES) <= 1.0 + 1e-6 else 1.0 for _, row in rows]
    for key, what, colour in E2E_SHARES:
        values = [None if row.get(key) is None else scale * float(row[key]) for (_, row), scale in zip(rows, scales)]
        fig.add_trace(
            go.Bar(
                x=cats, y=values, name=what, marker={"color": colour},
                legendgroup="e2e", legendgrouptitle_text="model step",
                hovertext=hover, hoverinfo="text", meta={"role": "e2e", "share": key},
            ),
            row=3, col=1,
        )
    fig.update_yaxes(title_text="% of step time", range=[0, 100], row=3, col=1)


def find_chrome() -> str | None:
    """A Chrome or Chromium kaleido can drive, found on this machine; never downloads one."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except (ImportError, AttributeError, TypeError, RuntimeError, OSError):
        found = None
    if found:
        return str(found)
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def check_outputs(paths: Sequence[Path]) -> None:
    """Refuse, before any work, an output of unknown format or in no writable folder, or an image without Chrome."""
    for path in paths:
        if path.suffix.lower() not in (".html", ".htm") + IMAGE_SUFFIXES:
            raise UserError(f"--out {path}: unknown format {path.suffix or '(no suffix)'!r}", "use .html, .png or .svg")
        folder = Path(path).absolute().parent
        while not folder.exists():
            folder = folder.parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            raise UserError(f"cannot write {path}: {folder} is not a writable folder", "pass another --out")
    if not any(p.suffix.lower() in IMAGE_SUFFIXES for p in paths):
        return
    try:
        import kaleido  # noqa: F401
    except ImportError:
        raise UserError(
            "PNG and SVG need kaleido, which is not installed", "pip install kaleido, or write --out FILE.html"
        ) from None
    if find_chrome() is None:
        raise UserError(
            "PNG and SVG need a Chrome or Chromium for kaleido and none is installed",
            "install one (Debian/Ubuntu: `apt-get install chromium`; or `plotly_get_chrome`), or write --out FILE.html",
        )


def write_figure(fig, path: Path) -> Path:
    """Write the figure: one self-contained HTML file (plotly.js inlined, works offline), or PNG/SVG through kaleido."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(fig, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", "pass another --out") from None
    return path


def _write(fig, path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        from kaleido.errors import JavascriptError, KaleidoError

        height = int(fig.layout.height or 1150)
        try:
            fig.write_image(str(path), format=suffix[1:], width=1400, height=height, scale=2 if suffix == ".png" else 1)
        except (RuntimeError, KaleidoError, JavascriptError) as exc:
            reason = " ".join(str(exc).split())[:200]
            raise UserError(f"kaleido could not render {path}: {reason}", "write --out FILE.html instead") from None
        return
    html = fig.to_html(
        include_plotlyjs=True, full_html=True, include_mathjax=False, div_id="replayssm-roofline",
        config={"displaylogo": False, "scrollZoom": True, "toImageButtonOptions": {"filename": path.stem}},
    )
    title = (fig.layout.title.text or "ReplaySSM roofline").replace("<", "&lt;")
    html = html.replace("<head>", f"<head>\n    <title>{title}</title>", 1)
    path.write_text(html, encoding="utf-8")


def load_files(paths: Sequence[Path]) -> list[tuple[str, Results]]:
    """Load results files with short labels; a missing, corrupt or truncated file is a UserError."""
    from replayssm_cli.results import load

    paths = [Path(p) for p in paths]
    return list(zip(file_labels(paths), (load(p) for p in paths)))


def load_default() -> list[tuple[str, Results]]:
    """The newest results file under ./runs/, else the shipped H200 reference profile (its files plotted as one)."""
    from replayssm_cli.results import load_reference, newest

    path = newest("runs")
    if path is not None:
        return load_files([path])
    merged = load_reference("h200")
    if merged is None:
        raise UserError(
            "no results file given, none under ./runs/ and no shipped reference profile",
            "run `replayssm profile` first, or pass a results file",
        )
    return [("reference profile", merged)]
