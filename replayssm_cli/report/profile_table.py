"""The profile's table: one line per results row, its columns dropped in order to fit the terminal."""

from __future__ import annotations
import math
from typing import Any

from replayssm_cli.model.dtypes import precision_label
from replayssm_cli.report.columns import columns_to_drop, left_out


NOISY_SPREAD = 0.10


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

    from replayssm_cli.report.provenance import reference_label, row_label

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
    pieces = {"speedup": lambda t: t.split(SEGMENT), "from": str.split}
    dropped, needed = columns_to_drop(names, cells, width, DROP_ORDER, pieces) if width else ([], {})
    if references and "measured" not in dropped:
        lines.append("measured: µs per token and speedup of the same configuration in the shipped reference, " + "; ".join(
            f"[{i}] {label}" for i, label in enumerate(references, 1)))
    if dropped:
        lines.append(left_out(dropped))
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
        "state→read": precision_label(r["state_dtype"], r.get("read_dtype"), r.get("rounding")),
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


def _reference_cell(r: dict[str, Any], references: list[str]) -> str:
    """A predicted row's shipped measurement: µs per token, speedup and which file ([n] in the caption)."""
    from replayssm_cli.report.provenance import reference_label

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
        from replayssm_cli.report.provenance import percent

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
    if r.get("speedup_vs_fp32") is not None:
        cell += f" [dim]· {r['speedup_vs_fp32']:.2f}x vs fp32[/]"
    if r.get("x_vs_ours") is not None:
        cell += f" [dim]· ours {r['x_vs_ours']:.2f}x[/]"
    return cell


def _flush_cell(r: dict[str, Any]) -> str:
    if r.get("x_flush_cost_us") is None:
        return "–"
    return f"{_num(r['x_flush_cost_us'])} µs / {100 * (r.get('x_flush_share') or 0):.0f}%"
