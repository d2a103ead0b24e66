"""The roofline figure: the roofline panel, speedup against batch, the whole-model step, and writing them out."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

from replayssm_cli.errors import UserError
from replayssm_cli.report.provenance import row_label
from replayssm_cli.model.dtypes import precision_label
from replayssm_cli.report.results import rounding_of
from replayssm_cli.report.roofline import OVER_WORDS, Pair, Placement, Point, Roof, _positive, before_after_pairs, describe

IMAGE_SUFFIXES = (".png", ".svg")
PLOTLYJS_MODES = ("inline", "cdn", "directory")

VARIANT_STYLE: dict[str, tuple[str, str]] = {
    "conventional": ("conventional", "#4C78A8"),
    "replay": ("ReplaySSM", "#F58518"),
    "split": ("split precision", "#54A24B"),
    "spec-conventional": ("speculative, snapshots", "#B279A2"),
    "spec-replay": ("speculative, ReplaySSM", "#E45756"),
}
OTHER_COLOURS = ("#72B7B2", "#9D755D", "#EECA3B", "#FF9DA6", "#79706E", "#17BECF", "#BCBD22", "#8C564B")
PRESET_SYMBOLS = ("circle", "diamond", "square", "triangle-up", "pentagon", "star", "hexagon", "cross")
# The whole-model panel's own palette: no colour there means a variant.
E2E_SHARES = (
    ("x_share_ssm", "SSM layers", "#3F3F3F"),
    ("x_share_attn", "attention", "#8E8E8E"),
    ("x_share_mlp", "MLP / MoE", "#C9B99A"),
    ("x_share_other", "other", "#E6E0D4"),
)
OVER_COLOURS = {"conventional": "#F58518", "fp32-conventional": "#54A24B", "snapshots": "#E45756"}
PHASE_OUTLINE = {"avg": ("#FFFFFF", 0.6), "nonflush": ("#555555", 1.2), "flush": ("#000000", 2.4)}

# Fixed geometry, so that arrows can end at marker edges and labels can be kept apart in pixels.
WIDTH = 1400
MARGIN = {"l": 90, "r": 380, "t": 110, "b": 80}
PANEL_PX = {"roofline": 600, "speedup": 360, "e2e": 340}
GAP_PX = 100
HEAD_PX = 5.0
LABEL_CELL = 12


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


def _variant_order(variant: str) -> int:
    order = list(VARIANT_STYLE)
    return order.index(variant) if variant in order else len(order)


def marker_size(batch: Any) -> float:
    """Marker diameter in px: grows with log2 of the batch size."""
    b = _positive(batch) or 1.0
    return 6.0 + 1.7 * math.log2(max(b, 1.0))


def _radius(point: Point) -> float:
    return marker_size(point.row.get("batch")) / 2 + PHASE_OUTLINE.get(str(point.row.get("phase")), ("", 1.0))[1] / 2


def si(value: float, unit: str = "") -> str:
    """A number with an SI prefix: 500G, 1T, 20T, 1.5P as tick labels; with a unit, '926 MB', '8.12 TFLOP/s'."""
    space = " " if unit else ""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{space}{prefix}{unit}"
    return f"{value:.3g}{space}{unit}"


def _ticks(lo: float, hi: float, fmt: Callable[[float], str]) -> tuple[list[float], list[str]]:
    """1-2-5 ticks between two log10 bounds, labelled in one format."""
    vals = []
    for decade in range(math.floor(lo) - 1, math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**decade
            if lo - 1e-9 <= math.log10(v) <= hi + 1e-9:
                vals.append(v)
    return vals, [fmt(v) for v in vals]


def _intensity_label(v: float) -> str:
    return f"{v:g}" if v < 1000 else si(v)


class Frame:
    """Pixel geometry of the roofline panel: log10 ranges and pixels per decade on each axis."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], width_px: float, height_px: float):
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        self.sx = width_px / (self.x1 - self.x0)
        self.sy = height_px / (self.y1 - self.y0)
        self.width, self.height = width_px, height_px

    def px(self, x: float, y: float) -> tuple[float, float]:
        """Pixels from the panel's lower left corner of a point given in data units."""
        return (math.log10(x) - self.x0) * self.sx, (math.log10(y) - self.y0) * self.sy

    def data(self, px: float, py: float) -> tuple[float, float]:
        return 10 ** (self.x0 + px / self.sx), 10 ** (self.y0 + py / self.sy)

    @property
    def slope_deg(self) -> float:
        """The on-screen angle of a memory roof (slope 1 in log-log), degrees above horizontal."""
        return math.degrees(math.atan2(self.sy, self.sx))


class Occupancy:
    """Which pixels of the panel are taken (by markers or labels), on a coarse grid: a label goes only where it is free."""

    def __init__(self, frame: Frame):
        self.frame = frame
        self.cells: set[tuple[int, int]] = set()

    def _cells(self, x0: float, y0: float, x1: float, y1: float):
        for i in range(int(x0 // LABEL_CELL), int(x1 // LABEL_CELL) + 1):
            for j in range(int(y0 // LABEL_CELL), int(y1 // LABEL_CELL) + 1):
                yield i, j

    def inside(self, x0: float, y0: float, x1: float, y1: float) -> bool:
        return x0 >= 0 and y0 >= 0 and x1 <= self.frame.width and y1 <= self.frame.height

    def free(self, x0: float, y0: float, x1: float, y1: float) -> bool:
        return self.inside(x0, y0, x1, y1) and not any(c in self.cells for c in self._cells(x0, y0, x1, y1))

    def take(self, x0: float, y0: float, x1: float, y1: float) -> None:
        self.cells.update(self._cells(x0, y0, x1, y1))


class Chart:
    """A figure under construction: plotly's subplot layout, and the traces as plain dicts.

    Traces skip plotly's per-element validation (seconds at 10,000 points); the tests validate the whole figure.
    """

    def __init__(self, fig):
        self.fig = fig
        self.traces: list[dict[str, Any]] = []

    def add(self, kind: str, row: int, **props: Any) -> None:
        title = props.pop("legendgrouptitle_text", None)
        if title:
            props["legendgrouptitle"] = {"text": title}
        axis = "" if row == 1 else str(row)
        trace = {"type": kind, "xaxis": f"x{axis}", "yaxis": f"y{axis}"}
        trace.update((k, v) for k, v in props.items() if v is not None)
        self.traces.append(trace)

    def to_dict(self) -> dict[str, Any]:
        doc = self.fig.to_plotly_json()
        return {"data": self.traces, "layout": doc["layout"]}


def build_figure(placement: Placement, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The plotly figure as a dict (data, layout): the roofline (ceilings, ridges, points, speedup arrows), speedup
    against batch, e2e ITL bars."""
    from plotly.subplots import make_subplots

    report = progress or (lambda stage: None)
    roof = placement.roof
    shown = placement.shown()
    pairs = placement.pairs
    panels = ["roofline"] + (["speedup"] if pairs else []) + (["e2e"] if placement.e2e else [])
    titles = {
        "roofline": f"Roofline of the {roof.gpu}: every kernel at its {placement.bytes_source} bytes "
        f"({_phase_words(placement.phases)}); arrows: speedup over its baseline",
        "speedup": "Speedup over each kernel's baseline against batch size (bands: quartile range)",
        "e2e": "Whole-model decode step: inter-token latency, shares stacked",
    }
    inner = sum(PANEL_PX[p] for p in panels) + GAP_PX * (len(panels) - 1)
    height = inner + MARGIN["t"] + MARGIN["b"]
    fig = make_subplots(
        rows=len(panels), cols=1, subplot_titles=[titles[p] for p in panels],
        row_heights=[PANEL_PX[p] / inner for p in panels], vertical_spacing=GAP_PX / inner,
    )
    domain = fig.layout.yaxis.domain
    data_view, whole_view = _views(placement, shown)
    frame = Frame(data_view[0], data_view[1], WIDTH - MARGIN["l"] - MARGIN["r"], (domain[1] - domain[0]) * inner)
    others: dict[str, str] = {}
    presets = _preset_symbols(placement)
    chart = Chart(fig)
    report("drawing the ceilings")
    _ceilings(chart, roof, frame, whole_view)
    report(f"drawing {len(shown):,} points")
    occupancy = Occupancy(frame)
    _points(chart, placement, shown, others, presets, occupancy)
    report(f"drawing {len(pairs):,} speedup arrows")
    _arrows(chart, placement, pairs, frame, occupancy)
    _legend_keys(chart, placement, shown, others, presets)
    if "speedup" in panels:
        _speedup_panel(chart, placement, pairs, others, presets, panels.index("speedup") + 1)
    if "e2e" in panels:
        _e2e_panel(chart, placement, panels.index("e2e") + 1)

    x_ticks = _ticks(*whole_view[0], _intensity_label)
    y_ticks = _ticks(*whole_view[1], si)
    fig.update_xaxes(
        type="log", range=list(data_view[0]), tickvals=x_ticks[0], ticktext=x_ticks[1], row=1, col=1,
        title_text=f"arithmetic intensity, FLOP per byte ({placement.bytes_source} bytes)",
    )
    fig.update_yaxes(type="log", range=list(data_view[1]), tickvals=y_ticks[0], ticktext=y_ticks[1], row=1, col=1,
                     title_text="attained FLOP/s")
    names = [label for label, _ in placement.files]
    legends = {
        "legend": {"x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top", "groupclick": "togglegroup",
                   "tracegroupgap": 6, "itemsizing": "trace", "font": {"size": 11}},
    }
    for i, panel in enumerate(panels[1:], start=2):
        top = fig.layout[f"yaxis{i}"].domain[1]
        legends[f"legend{i}"] = {"x": 1.02, "xanchor": "left", "y": top, "yanchor": "top", "font": {"size": 11},
                                 "tracegroupgap": 4, "groupclick": "toggleitem"}
    fig.update_layout(
        title={"text": f"ReplaySSM roofline · {roof.gpu} · {', '.join(names)}", "x": 0.01},
        template="plotly_white",
        width=WIDTH,
        height=height,
        margin=MARGIN,
        hovermode="closest",
        hoverlabel={"align": "left", "font": {"size": 11}},
        barmode="stack",
        updatemenus=[{
            # Above-left of the memory roof no kernel can sit: the buttons go there.
            "type": "buttons", "direction": "right", "x": 0.005, "xanchor": "left",
            "y": fig.layout.yaxis.domain[1] - 0.005, "yanchor": "top", "showactive": True, "font": {"size": 11},
            "buttons": [
                {"label": "where the data are", "method": "relayout",
                 "args": [{"xaxis.range": list(data_view[0]), "yaxis.range": list(data_view[1])}]},
                {"label": "whole roof", "method": "relayout",
                 "args": [{"xaxis.range": list(whole_view[0]), "yaxis.range": list(whole_view[1])}]},
            ],
        }],
        meta={"gpu": roof.gpu, "roof": roof.to_dict(), "files": names, "panels": panels,
              "bytes": placement.bytes_source, "phases": list(placement.phases)},
        **legends,
    )
    return chart.to_dict()


def _phase_words(phases: Sequence[str]) -> str:
    if tuple(phases) == ("avg",):
        return "whole-window averages"
    return "phases: " + ", ".join({"avg": "average", "nonflush": "non-flush", "flush": "flush"}.get(p, p) for p in phases)


def _preset_symbols(placement: Placement) -> dict[str, str]:
    presets = dict.fromkeys(str(p.row.get("preset")) for p in placement.points)
    return {name: PRESET_SYMBOLS[i % len(PRESET_SYMBOLS)] for i, name in enumerate(presets)}


def _views(placement: Placement, shown: Sequence[Point]):
    """log10 ranges where the data are (every shown point and the roof above it), and of the whole roof."""
    roof = placement.roof
    xs = [p.intensity for p in shown] + [p.modelled_intensity for p in shown if p.modelled_intensity]
    ys = [p.flops_per_s for p in shown] + [p.roof_flops_per_s for p in shown]
    ys += [p.modelled_flops_per_s for p in shown if p.modelled_flops_per_s]
    if not xs:
        xs, ys = [roof.ridge()], [roof.compute.per_s]

    def span(values: list[float], pad: float, least: float) -> tuple[float, float]:
        lo, hi = math.log10(min(values)) - pad, math.log10(max(values)) + pad
        if hi - lo < least:
            mid = (hi + lo) / 2
            lo, hi = mid - least / 2, mid + least / 2
        return lo, hi

    data = (span(xs, 0.2, 1.2), span(ys, 0.15, 1.0))
    computes = [c for c in roof.ceilings if c.kind == "compute"]
    ridges = [roof.ridge(c) for c in computes]
    whole_x = (min(data[0][0], math.log10(min(ridges)) - 1.5), max(data[0][1], math.log10(max(ridges)) + 0.6))
    whole_y = (data[1][0], max(data[1][1], math.log10(max(c.per_s for c in computes)) + 0.3))
    return data, (whole_x, whole_y)


def _ceilings(chart: "Chart", roof: Roof, frame: Frame, whole) -> None:
    (wx0, wx1), _ = whole
    memories = sorted((c for c in roof.ceilings if c.kind == "memory"), key=lambda c: c.value)
    computes = sorted((c for c in roof.ceilings if c.kind == "compute"), key=lambda c: c.value)
    top = computes[-1].per_s

    def style(c, dash: str) -> dict:
        main = c is roof.memory or c is roof.compute
        return {"color": "#333" if main else "#888", "width": 2 if main else 1.3, "dash": dash}

    def meta(c) -> dict:
        return {"role": "ceiling", "kind": c.kind, "name": c.name, "value": c.value, "source": c.source, "spread": c.spread}

    dashes = {"HBM": "dash", "copy": "solid", "L2": "dot", "FP32": "solid", "TF32": "dashdot", "BF16": "longdash"}
    for c in memories:
        x_end = min(10**wx1, top / c.per_s)
        xs = [10**wx0, x_end]
        chart.add("scatter", 1,
            x=xs, y=[c.per_s * x for x in xs], mode="lines", line=style(c, dashes.get(c.name, "solid")),
            name=c.label, legendgroup="ceilings", legendgrouptitle_text="ceilings", hovertemplate=c.label + "<extra></extra>",
            meta=meta(c),
        )
    for c in computes:
        text = f"{c.label}, ridge {roof.ridge(c):.3g} FLOP/B"
        chart.add("scatter", 1,
            x=[roof.ridge(c), 10**wx1], y=[c.per_s, c.per_s], mode="lines", line=style(c, dashes.get(c.name, "solid")),
            name=c.label, legendgroup="ceilings", hovertemplate=text + "<extra></extra>", meta=meta(c),
        )
    ridges = {c.name: roof.ridge(c) for c in computes}
    chart.add("scatter", 1,
        x=list(ridges.values()), y=[c.per_s for c in computes], mode="markers+text",
        marker={"symbol": "x-thin-open", "size": 11, "color": "#222", "line": {"width": 2}},
        text=[f"{r:.3g} FLOP/B" for r in ridges.values()], textposition="bottom right", textfont={"size": 10, "color": "#555"},
        hovertext=[f"ridge of {name}: {r:.3g} FLOP/B on the {roof.memory.label} roof" for name, r in ridges.items()],
        hoverinfo="text", name=f"ridge points ({roof.memory.name} roof)", legendgroup="ceilings",
        meta={"role": "ridge", "memory": roof.memory.name, "ridges": ridges},
    )
    _ceiling_labels(chart, roof, memories, computes, frame, wx1)


def _ceiling_labels(chart: "Chart", roof: Roof, memories, computes, frame: Frame, wx1: float) -> None:
    """Each roof named beside its line, never on it: bandwidths above their diagonal (close ones share one label),
    rates above their line at the right (the lower of two close rates below its line)."""
    groups: list[list] = []
    for c in sorted(memories, key=lambda c: -c.value):
        if groups and groups[-1][-1].value / c.value < 1.35:
            groups[-1].append(c)
        else:
            groups.append([c])
    theta = math.radians(frame.slope_deg)
    for n, group in enumerate(groups):
        log_c = math.log10(group[0].per_s)
        # The part of the diagonal inside the panel, in log10 x.
        a, b = max(frame.x0, frame.y0 - log_c), min(frame.x1, frame.y1 - log_c)
        if b - a < 0.15:
            continue
        lx = a + (b - a) * (0.22 + 0.5 * (n % 2))
        lines = [c.label + {"HBM": " - -", "L2": " ···"}.get(c.name, "") for c in group]
        offset = 7 + 7 * len(lines)
        chart.fig.add_annotation(
            x=lx, y=lx + log_c, xref="x", yref="y", text="<br>".join(lines), showarrow=False,
            textangle=-frame.slope_deg, xshift=-offset * math.sin(theta), yshift=offset * math.cos(theta),
            font={"size": 11, "color": "#333"}, name="ceiling-label", align="center",
        )
    for i, c in enumerate(computes):
        below = i + 1 < len(computes) and computes[i + 1].value < 2 * c.value
        chart.fig.add_annotation(
            x=wx1 - 0.02, y=math.log10(c.per_s), xref="x", yref="y", xanchor="right", yanchor="top" if below else "bottom",
            yshift=-3 if below else 3, text=f"{c.label}, ridge {roof.ridge(c):.3g} FLOP/B", showarrow=False,
            font={"size": 11, "color": "#333"}, name="ceiling-label",
        )


def hover_text(point: Point, pair: Pair | None, roof: Roof) -> str:
    """About eight lines: the configuration, time with its interval, speedup and over what, bytes, intensity,
    share of the roof and where the figure comes from."""
    r = point.row
    per_token = _positive(r.get("us_per_token"))
    quart = [_positive(r.get("x_us_p25")), _positive(r.get("x_us_p75"))]
    interval = f" (p25–p75 {quart[0]:,.2f}–{quart[1]:,.2f})" if all(quart) else (
        f" (±{50 * r['spread']:.1f}%)" if _positive(r.get("spread")) else "")
    time = f"time: {point.us:,.2f} µs per step{interval}"
    if per_token and _positive(r.get("tokens_per_step")) and r["tokens_per_step"] != 1:
        time += f", {per_token:,.2f} µs per token"
    lines = [f"<b>{describe(r)}</b>" + (f" · {r['io_dtype']} io" if r.get("io_dtype") else ""), time]
    if pair is not None:
        lines.append(f"speedup: {pair.speedup:.2f}x{pair.interval()} over {OVER_WORDS[pair.over]}")
    elif _positive(r.get("speedup")) and r.get("speedup_over") in OVER_WORDS:
        lines.append(f"speedup: {r['speedup']:.2f}x over {OVER_WORDS[r['speedup_over']]} (its row)")
    elif r.get("variant") in ("conventional", "spec-conventional"):
        lines.append("speedup: the baseline of its ReplaySSM counterpart")
    lines.append(f"bytes ({point.bytes_source}{', ' + point.level if point.level != 'DRAM' else ''}): "
                 f"{si(point.bytes, 'B')}, {point.gbs:,.0f} GB/s   FLOPs: {si(point.flops, 'FLOP')}")
    if point.modelled_bytes is not None:
        lines[-1] += f" (modelled {si(point.modelled_bytes, 'B')}, {100 * (point.bytes / point.modelled_bytes - 1):+.1f}%)"
    lines.append(f"intensity: {point.intensity:.3g} FLOP/B   attained: {si(point.flops_per_s, 'FLOP/s')}")
    roof_name = (roof.find(point.roof_name) or roof.memory).label
    flag = " above the roof beyond tolerance: a counting error" if point.above_roof else (" (at the roof within noise)" if point.at_roof else "")
    lines.append(f"{point.pct_of_roof:.1f}% of the {roof_name} roof ±{100 * point.tolerance:.1f}% ({point.bound}-bound){flag}")
    lines.append(f"{point.us_left:,.2f} µs left to the roof")
    lines.append(f"source: {point.provenance}")
    return "<br>".join(lines)


def _points(chart: "Chart", placement: Placement, shown: Sequence[Point], others, presets, occupancy: Occupancy) -> None:
    by_point = {id(p.point): p for p in placement.pairs}
    groups: dict[tuple, list[Point]] = {}
    for p in shown:
        groups.setdefault((p.file_index, _variant_order(p.variant), p.variant, str(p.row.get("preset")), p.level), []).append(p)
    several = len(placement.files) > 1
    frame = occupancy.frame
    for (index, _, variant, preset, level), group in sorted(groups.items(), key=lambda kv: kv[0][:2]):
        label, colour = variant_style(variant, others)
        file_label = placement.files[index][0]
        outline = [PHASE_OUTLINE.get(str(p.row.get("phase")), PHASE_OUTLINE["avg"]) for p in group]
        symbol = presets[preset] + ("-open-dot" if level == "L2" else "")
        chart.add("scatter", 1,
            x=[p.intensity for p in group],
            y=[p.flops_per_s for p in group],
            mode="markers",
            name=f"{label} · {preset}" + (f" · {file_label}" if several else ""),
            legendgroup=f"variant:{variant}",
            showlegend=False,
            marker={
                "color": colour,
                "size": [marker_size(p.row.get("batch")) for p in group],
                "symbol": [symbol + ("-open" if p.predicted and level == "DRAM" else "") for p in group],
                "line": {"color": [colour if p.predicted else o[0] for p, o in zip(group, outline)],
                         "width": [2 if p.predicted else o[1] for p, o in zip(group, outline)]},
                # Earlier files of a before/after overlay are drawn fainter.
                "opacity": 0.5 if several and index < len(placement.files) - 1 else 0.9,
            },
            hovertext=[hover_text(p, by_point.get(id(p)), placement.roof) for p in group],
            hoverinfo="text",
            meta={
                "role": "points", "variant": variant, "preset": preset, "file": file_label, "level": level,
                "predicted": [p.predicted for p in group],
                "batch": [p.row.get("batch") for p in group],
                "phase": [p.row.get("phase") for p in group],
            },
        )
        for p in group:
            cx, cy = frame.px(p.intensity, p.flops_per_s)
            r = _radius(p)
            occupancy.take(cx - r, cy - r, cx + r, cy + r)

    moved = [p for p in shown if p.modelled_intensity is not None]
    hover = [f"{describe(p.row)}: modelled {p.modelled_bytes:,.0f} B, measured {p.bytes:,.0f} B "
             f"({100 * (p.bytes / p.modelled_bytes - 1):+.1f}%)" for p in moved]
    _links(chart, [((p.modelled_intensity, p.modelled_flops_per_s), p) for p in moved], "bytes-difference",
           "modelled → measured DRAM bytes", {"color": "#999", "width": 1, "dash": "dot"}, hover)
    l2 = [p for p in shown if p.level == "L2"]
    dram = {(p.file_index, p.config()[:-1]): p for p in shown if p.level == "DRAM"} if l2 else {}
    levels = [(dram[key], p) for p in l2 if (key := (p.file_index, p.config()[:-1])) in dram]
    _links(chart, levels, "levels", "one kernel: DRAM ● → L2 ◉ bytes", {"color": "#bbb", "width": 1})
    _links(chart, before_after_pairs(shown) if several else [], "before-after", "before → after (same configuration)",
           {"color": "#777", "width": 1, "dash": "dot"})


def _links(chart: "Chart", links: Sequence[tuple], role: str, name: str, line: dict, hover: list[str] | None = None) -> None:
    """One trace of plain segments, each from a point (or an (x, y) pair) to a point; nothing when there are none."""
    if not links:
        return
    xs, ys = [], []
    for a, b in links:
        (ax, ay) = a if isinstance(a, tuple) else (a.intensity, a.flops_per_s)
        xs += [ax, b.intensity, None]
        ys += [ay, b.flops_per_s, None]
    chart.add("scatter", 1, x=xs, y=ys, mode="lines", name=name, legendgroup="keys", line=line,
              hovertext=[h for h in hover for _ in range(3)] if hover else None, hoverinfo="text" if hover else "skip",
              meta={"role": role, "count": len(links)})


def _arrows(chart: "Chart", placement: Placement, pairs: Sequence[Pair], frame: Frame, occupancy: Occupancy) -> None:
    """One trace of arrows per kind of baseline, each from the edge of the baseline's marker to the edge of the
    kernel's; labels where they can be read (not over a marker or another label), the rest in the hover."""
    shown = {id(p) for p in placement.shown()}
    by_over: dict[str, list[Pair]] = {}
    for pair in pairs:
        if id(pair.base) in shown and id(pair.point) in shown:
            by_over.setdefault(pair.over, []).append(pair)
    label_x, label_y, label_text, label_colour, label_hover = [], [], [], [], []
    # The widest gains are labelled first; a label that finds no free place is left to the hover.
    ordered = sorted((p for ps in by_over.values() for p in ps), key=lambda p: -abs(math.log(p.speedup)))
    segments: dict[int, tuple] = {}
    for pair in ordered:
        (bx, by), (rx, ry) = frame.px(pair.base.intensity, pair.base.flops_per_s), frame.px(pair.point.intensity, pair.point.flops_per_s)
        dx, dy = rx - bx, ry - by
        d = math.hypot(dx, dy)
        rb, rr = _radius(pair.base) + 1, _radius(pair.point) + 1
        if d <= rb + rr + HEAD_PX:
            segments[id(pair)] = None
            continue
        ux, uy = dx / d, dy / d
        tail, head = (bx + ux * rb, by + uy * rb), (rx - ux * rr, ry - uy * rr)
        segments[id(pair)] = (tail, head)
        text = pair.label
        w, h = 6.2 * len(text) + 6, 14
        mx, my = (tail[0] + head[0]) / 2, (tail[1] + head[1]) / 2
        # Candidate centres: either side of the shaft's middle, then beyond its head.
        for cx, cy in ((mx - uy * 11 + w / 2 * (1 if -uy >= 0 else -1), my + ux * 11),
                       (mx + uy * 11 - w / 2 * (1 if -uy >= 0 else -1), my - ux * 11),
                       (head[0] + ux * (w / 2 + 4), head[1] + uy * 12)):
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            if occupancy.free(*box):
                occupancy.take(*box)
                x, y = frame.data(cx, cy)
                label_x.append(x)
                label_y.append(y)
                label_text.append(text)
                label_colour.append(OVER_COLOURS.get(pair.over, "#333"))
                label_hover.append(_arrow_hover(pair))
                break
    for over, group in by_over.items():
        xs, ys, sizes, hover = [], [], [], []
        drawn = 0
        for pair in group:
            seg = segments.get(id(pair))
            if seg is None:
                continue
            drawn += 1
            (tx, ty), (hx, hy) = frame.data(*seg[0]), frame.data(*seg[1])
            xs += [tx, hx, None]
            ys += [ty, hy, None]
            sizes += [0, 2 * HEAD_PX + 2, 0]
            hover += [_arrow_hover(pair)] * 2 + [""]
        chart.add("scatter", 1,
            x=xs, y=ys, mode="lines+markers", name=f"speedup over {OVER_WORDS[over]}", legendgroup="arrows",
            legendgrouptitle_text="arrows: speedup over",
            line={"color": OVER_COLOURS.get(over, "#333"), "width": 1.4},
            marker={"symbol": "arrow", "angleref": "previous", "size": sizes, "color": OVER_COLOURS.get(over, "#333")},
            hovertext=hover, hoverinfo="text",
            meta={"role": "arrows", "over": over, "count": drawn, "pairs": len(group),
                  "speedups": [round(p.speedup, 4) for p in group],
                  "labels": [p.label for p in group],
                  "points": [describe(p.point.row) for p in group]},
        )
    chart.add("scatter", 1,
        x=label_x, y=label_y, mode="text", text=label_text, textfont={"size": 10, "color": label_colour},
        hovertext=label_hover, hoverinfo="text", showlegend=False, meta={"role": "arrow-labels", "text": label_text},
    )


def _arrow_hover(pair: Pair) -> str:
    return (f"<b>{pair.label}{pair.interval()}</b> over {OVER_WORDS[pair.over]}<br>"
            f"{describe(pair.base.row)} → {describe(pair.point.row)}<br>source: {pair.point.provenance}")


def _legend_keys(chart: "Chart", placement: Placement, shown: Sequence[Point], others, presets) -> None:
    """Legend entries that are keys, not data: variant colours, preset symbols, batch sizes, phases, predicted."""
    def key(name: str, group: str, title: str | None, marker: dict) -> None:
        chart.add("scatter", 1,
            x=[None], y=[None], mode="markers", name=name, legendgroup=group, legendgrouptitle_text=title,
            marker=marker, hoverinfo="skip", meta={"role": "key", "group": group.split(":")[0]},
        )

    variants = sorted({p.variant for p in shown}, key=_variant_order)
    for i, v in enumerate(variants):
        label, colour = variant_style(v, others)
        key(label, f"variant:{v}", "variant (colour)" if i == 0 else None, {"color": colour, "size": 10, "symbol": "square"})
    for i, (preset, symbol) in enumerate(p for p in presets.items() if any(q.row.get("preset") == p[0] for q in shown)):
        key(preset, "preset", "preset (symbol)" if i == 0 else None, {"color": "#777", "size": 10, "symbol": symbol})
    batches = sorted({int(b) for p in shown if (b := _positive(p.row.get("batch")))})
    if len(batches) > 6:
        step = (len(batches) - 1) / 5
        batches = sorted({batches[round(i * step)] for i in range(6)})
    for i, b in enumerate(batches):
        key(f"batch {b}", "batch", "batch size (marker size)" if i == 0 else None,
            {"color": "#bbb", "size": marker_size(b), "symbol": "circle", "line": {"color": "#fff", "width": 0.6}})
    phases = [ph for ph in ("avg", "nonflush", "flush") if any(p.row.get("phase") == ph for p in shown)]
    words = {"avg": "whole-window average", "nonflush": "non-flush step (grey ring)", "flush": "flush step (black ring)"}
    for i, ph in enumerate(phases):
        colour, width = PHASE_OUTLINE[ph]
        key(words[ph], "phase", "phase" if i == 0 else None,
            {"color": "#bbb", "size": 12, "symbol": "circle", "line": {"color": colour, "width": width}})
    if any(p.predicted for p in shown):
        key("predicted (hollow)", "phase", None, {"color": "#777", "size": 12, "symbol": "circle-open", "line": {"width": 2}})
    if any(p.level == "L2" for p in shown):
        key("L2 bytes (dotted ring)", "phase", None, {"color": "#777", "size": 12, "symbol": "circle-open-dot"})


def _speedup_panel(chart: "Chart", placement: Placement, pairs: Sequence[Pair], others, presets, row: int) -> None:
    series: dict[tuple, list[Pair]] = {}
    for pair in pairs:
        r = pair.point.row
        key = (pair.point.file_index, str(r.get("preset")), _variant_order(pair.point.variant), pair.point.variant) + tuple(
            str(r.get(k)) for k in ("window", "state_dtype", "read_dtype", "io_dtype", "draft", "tp", "flush")) + (
            rounding_of(r), pair.over)
        series.setdefault(key, []).append(pair)
    several = len(placement.files) > 1
    legend = f"legend{row}"
    seen_presets: set[str] = set()
    values = []
    for key in sorted(series):
        group = sorted((p for p in series[key] if _positive(p.point.row.get("batch"))), key=lambda p: p.point.row["batch"])
        if not group:
            continue
        first = group[0].point
        label, colour = variant_style(first.variant, others)
        r = first.row
        name = " ".join([label] + [x for x in (
            f"W{r['window']}" if r.get("window") else "",
            precision_label(r["state_dtype"], r.get("read_dtype"), r.get("rounding")) if r.get("state_dtype") else "",
            f"T{r['draft']}" if r.get("draft") else "") if x])
        name += f" · {first.file}" if several else ""
        preset = str(r.get("preset"))
        xs = [p.point.row["batch"] for p in group]
        ys = [p.speedup for p in group]
        values += ys
        dash = "dash" if not all(p.measured for p in group) else "solid"
        bounded = [p for p in group if p.lo is not None and p.hi is not None]
        if len(bounded) == len(group) and len(group) > 1:
            chart.add("scatter", row,
                x=xs + xs[::-1], y=[p.hi for p in group] + [p.lo for p in group][::-1], fill="toself", mode="lines",
                line={"width": 0}, fillcolor=_rgba(colour, 0.18), hoverinfo="skip", showlegend=False,
                legend=legend, legendgroup=f"{legend}:{key}", meta={"role": "speedup-band"},
            )
        chart.add("scatter", row,
            x=xs, y=ys, mode="lines+markers", name=name, legend=legend, legendgroup=f"{legend}:{key}",
            legendgrouptitle_text=preset if preset not in seen_presets else None,
            line={"color": colour, "width": 1.8, "dash": dash},
            marker={"color": colour, "size": 8, "symbol": presets.get(preset, "circle")},
            hovertext=[f"<b>{describe(p.point.row)}</b><br>{p.label}{p.interval()} over {OVER_WORDS[p.over]}<br>"
                       f"source: {p.point.provenance}" for p in group],
            hoverinfo="text",
            meta={"role": "speedup", "variant": first.variant, "preset": preset, "over": group[0].over,
                  "file": first.file, "batch": xs},
        )
        seen_presets.add(preset)
    chart.fig.add_hline(y=1.0, line={"color": "#333", "width": 1.5}, row=row, col=1, exclude_empty_subplots=False)
    # Annotations on a log axis take log10 coordinates: 0 is 1.0x.
    chart.fig.add_annotation(x=1, xref=f"x{row} domain", y=0, yref=f"y{row}", xanchor="right", yanchor="top",
                             text="1.0x: as fast as its baseline", showarrow=False, font={"size": 11}, name="one-x")
    lo, hi = min(values + [1.0]), max(values + [1.0])
    ticks = [t for t in (0.25, 0.5, 0.75, 1, 1.25, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if lo / 1.3 <= t <= hi * 1.3]
    batches = sorted({int(b) for p in pairs if (b := _positive(p.point.row.get("batch")))})
    chart.fig.update_xaxes(type="log", title_text="batch size", tickvals=batches or None, row=row, col=1)
    chart.fig.update_yaxes(type="log", title_text="speedup over its baseline", tickvals=ticks, ticktext=[f"{t:g}x" for t in ticks],
                     range=[math.log10(lo / 1.15), math.log10(hi * 1.15)], row=row, col=1)


def _rgba(hex_colour: str, alpha: float) -> str:
    h = hex_colour.lstrip("#")
    return f"rgba({int(h[0:2], 16)},{int(h[2:4], 16)},{int(h[4:6], 16)},{alpha})"


def _e2e_panel(chart: "Chart", placement: Placement, row: int) -> None:
    """Inter-token latency per batch size: conventional and ReplaySSM side by side, their time shares stacked inside."""
    rows = [(i, r) for i, r in placement.e2e if r.get("status", "ok") == "ok" and _positive(r.get("us"))]
    several_presets = len({r.get("preset") for _, r in rows}) > 1
    several_files = len({i for i, _ in rows}) > 1
    rows.sort(key=lambda ir: (ir[0], str(ir[1].get("preset")), _positive(ir[1].get("batch")) or 0, _variant_order(str(ir[1].get("variant")))))
    outer, inner, totals, hover = [], [], [], []
    base_ms: dict[tuple, float] = {}
    for index, r in rows:
        group = f"B{r.get('batch')}"
        if several_presets:
            group = f"{short_preset(str(r.get('preset')))} {group}"
        if several_files:
            group += f" · {placement.files[index][0]}"
        outer.append(group)
        inner.append(variant_style(str(r.get("variant")))[0])
        ms = float(r["us"]) / 1000
        key = (index, r.get("preset"), r.get("batch"))
        if r.get("variant") == "conventional":
            base_ms[key] = ms
        totals.append(ms)
    for (index, r), ms in zip(rows, totals):
        key = (index, r.get("preset"), r.get("batch"))
        speed = base_ms.get(key, ms) / ms if r.get("variant") != "conventional" and key in base_ms else None
        p25, p75 = _positive(r.get("x_us_p25")), _positive(r.get("x_us_p75"))
        interval = f" (p25–p75 {p25 / 1000:.3f}–{p75 / 1000:.3f})" if p25 and p75 else ""
        lines = [f"<b>{describe(r)}</b>", f"ITL: {ms:.3f} ms{interval}"]
        if speed is not None:
            lines.append(f"{speed:.2f}x over conventional at batch {r.get('batch')}")
        if _positive(r.get("x_tokens_per_s")):
            lines.append(f"{float(r['x_tokens_per_s']):,.0f} tokens/s")
        shares = [f"{what} {100 * _share(r, k):.0f}%" for k, what, _ in E2E_SHARES if _share(r, k) is not None]
        lines.append("shares: " + ", ".join(shares))
        lines.append(f"source: {row_label(r, placement.files[index][1])}")
        hover.append("<br>".join(lines))
    x = [outer, inner]
    for key, what, colour in E2E_SHARES:
        shares = [_share(r, key) for _, r in rows]
        chart.add("bar", row,
            x=x, y=[None if s is None else s * ms for s, ms in zip(shares, totals)], name=what,
            marker={"color": colour, "line": {"color": "#fff", "width": 0.5}}, legend=f"legend{row}",
            legendgroup=f"e2e:{key}", legendgrouptitle_text="share of the step" if key == E2E_SHARES[0][0] else None,
            hovertext=hover, hoverinfo="text", meta={"role": "e2e", "share": key},
        )
    labels = []
    for (index, r), ms in zip(rows, totals):
        key = (index, r.get("preset"), r.get("batch"))
        speed = base_ms[key] / ms if r.get("variant") != "conventional" and key in base_ms else None
        labels.append(f"{ms:.2f} ms" + (f"<br>{speed:.2f}x" if speed is not None else ""))
    chart.add("scatter", row,
        x=x, y=totals, mode="text", text=labels, textposition="top center", textfont={"size": 10, "color": "#333"},
        hoverinfo="skip", showlegend=False, meta={"role": "e2e-totals", "text": labels},
    )
    chart.fig.update_yaxes(title_text="ITL, ms per decode step", range=[0, max(totals or [1]) * 1.25], row=row, col=1)
    chart.fig.update_xaxes(automargin=True, row=row, col=1)


def short_preset(name: str) -> str:
    """A preset's name up to its size token: nemotron-3-super-120b-a12b -> nemotron-3-super, qwen3.5-122b-a10b -> qwen3.5."""
    words = name.split("-")
    for i, word in enumerate(words):
        if i and word[:-1].replace(".", "").isdigit() and word[-1:].lower() == "b":
            return "-".join(words[:i])
    return name


def _share(row: dict[str, Any], key: str) -> float | None:
    """A time share as a fraction; rows may hold fractions or percentages (shares summing past 1.0 are percentages)."""
    value = row.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    total = sum(float(row.get(k) or 0) for k, _, _ in E2E_SHARES if isinstance(row.get(k), (int, float)))
    return float(value) / (100.0 if total > 1.0 + 1e-6 else 1.0)


def find_chrome() -> str | None:
    """A Chrome or Chromium kaleido can drive, found on this machine; never downloads one."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except (ImportError, AttributeError, TypeError, RuntimeError, OSError):
        found = None
    return str(found) if found else None


def check_outputs(paths: Sequence[Path]) -> None:
    """Refuse, before any work, an output of unknown format or in no writable folder, or an image without Chrome."""
    for path in paths:
        if str(path) in ("", ".", "-"):
            raise UserError(f"--out {str(path)!r} is not a file name", "pass e.g. --out roofline.html")
        if path.suffix.lower() not in (".html", ".htm") + IMAGE_SUFFIXES:
            raise UserError(f"--out {path}: unknown format {path.suffix or '(no suffix)'!r}", "use .html, .png or .svg")
        if path.is_dir():
            raise UserError(f"--out {path} is a directory", "pass a file name such as roofline.html")
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


def write_figure(fig, path: Path, plotlyjs: str = "inline") -> Path:
    """Write the figure: HTML (plotly.js inlined so it works offline; or from the CDN; or from a plotly.min.js beside
    the file, written there), or PNG/SVG through kaleido and the Chrome it finds."""
    if plotlyjs not in PLOTLYJS_MODES:
        raise ValueError(f"plotlyjs must be one of {', '.join(PLOTLYJS_MODES)}, not {plotlyjs!r}")
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(fig, path, plotlyjs)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", "pass another --out") from None
    return path


def _write(fig: dict[str, Any], path: Path, plotlyjs: str) -> None:
    import plotly.io as pio

    suffix = path.suffix.lower()
    if suffix in IMAGE_SUFFIXES:
        from kaleido.errors import JavascriptError, KaleidoError

        chrome = find_chrome()
        if chrome and not os.environ.get("BROWSER_PATH"):
            # kaleido drives the Chromium found here, the same one the HTML is tested in.
            os.environ["BROWSER_PATH"] = chrome
        size = {"width": int(fig["layout"].get("width") or WIDTH), "height": int(fig["layout"].get("height") or 1200)}
        # A loaded machine can call kaleido's page before its scripts are in ("kaleido_scopes is not defined"): once more.
        for attempt in (1, 2):
            try:
                pio.write_image(fig, str(path), format=suffix[1:], scale=2 if suffix == ".png" else 1, validate=False, **size)
                return
            except (RuntimeError, KaleidoError, JavascriptError) as exc:
                reason = " ".join(str(exc).split())[:200]
                if attempt == 2 or "is not defined" not in reason:
                    raise UserError(f"kaleido could not render {path}: {reason}", "write --out FILE.html instead") from None
    include: Any = {"inline": True, "cdn": "cdn", "directory": "directory"}[plotlyjs]
    html = pio.to_html(
        fig, validate=False, include_plotlyjs=include, full_html=True, include_mathjax=False, div_id="replayssm-roofline",
        config={"displaylogo": False, "scrollZoom": True, "toImageButtonOptions": {"filename": path.stem}},
    )
    title = ((fig["layout"].get("title") or {}).get("text") or "ReplaySSM roofline").replace("<", "&lt;")
    html = html.replace("<head>", f"<head>\n    <title>{title}</title>", 1)
    path.write_text(html, encoding="utf-8")
    if plotlyjs == "directory":
        bundle = path.parent / "plotly.min.js"
        if not bundle.exists():
            from plotly.offline import get_plotlyjs

            bundle.write_text(get_plotlyjs(), encoding="utf-8")
