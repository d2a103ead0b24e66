"""Two results files side by side: per-row speedup, "within noise" where the spreads overlap, a geometric mean."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from replayssm_cli.report import provenance
from replayssm_cli.errors import UserError
from replayssm_cli.measure.grid import CONFIG_KEYS, config_key
from replayssm_cli.model.dtypes import precision_label

# Environment facts that must match for two files' times to be comparable (software versions and the GPU).
ENV_KEYS = ("replayssm", "torch", "triton", "cuda")
GPU_KEYS = ("name", "driver")


@dataclass
class Comparison:
    """Matched rows with B's speedup over A, the rows only one side has, and the geometric mean over whole-window rows."""

    rows: list[dict[str, Any]]
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)
    geomean: float | None = None
    geomean_rows: int = 0
    differences: list[str] = field(default_factory=list)
    label_a: str = ""
    label_b: str = ""


def environment_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two environments among the GPU and the software versions, as 'key: A vs B' lines."""
    diffs = []
    ga, gb = a.get("gpu") or {}, b.get("gpu") or {}
    for key in GPU_KEYS:
        if ga.get(key) != gb.get(key):
            diffs.append(f"gpu {key}: {ga.get(key)} vs {gb.get(key)}")
    for key in ENV_KEYS:
        if a.get(key) != b.get(key):
            diffs.append(f"{key}: {a.get(key)} vs {b.get(key)}")
    return diffs


def row_key(row: dict[str, Any]) -> tuple:
    return config_key(row)


def _interval(row: dict[str, Any]) -> tuple[float, float]:
    """The row's per-token interquartile range (the median alone for a predicted row)."""
    tok = row.get("tokens_per_step") or 1.0
    if row.get("x_us_p25") is not None and row.get("x_us_p75") is not None:
        return row["x_us_p25"] / tok, row["x_us_p75"] / tok
    med = row["us_per_token"]
    half = (row.get("spread") or 0.0) * med / 2
    return med - half, med + half


def compare_results(a: Any, b: Any, *, force: bool = False) -> Comparison:
    """Compare results B against A (speedup = A's µs per token over B's); refuses different GPUs or software unless force."""
    diffs = environment_differences(a.environment, b.environment)
    if diffs and not force:
        raise UserError(
            f"the two files come from different environments ({'; '.join(diffs)})",
            "pass --force to compare them anyway",
        )
    b_rows = {row_key(r): r for r in b.rows}
    matched, only_a = [], []
    seen = set()
    for ra in a.rows:
        key = row_key(ra)
        rb = b_rows.get(key)
        if rb is None:
            only_a.append(ra)
            continue
        seen.add(key)
        matched.append(_pair(ra, rb, a, b))
    only_b = [r for r in b.rows if row_key(r) not in seen]
    speedups = [m["speedup"] for m in matched if m["speedup"] and m["phase"] == "avg"]
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups)) if speedups else None
    return Comparison(rows=matched, only_a=only_a, only_b=only_b, geomean=geo, geomean_rows=len(speedups), differences=diffs,
                      label_a=provenance.file_label(a), label_b=provenance.file_label(b))


def _pair(ra: dict[str, Any], rb: dict[str, Any], a: Any = None, b: Any = None) -> dict[str, Any]:
    out = {k: ra.get(k) for k in CONFIG_KEYS}
    out.update(status_a=ra["status"], status_b=rb["status"], source_a=ra["source"], source_b=rb["source"])
    out.update(provenance_a=provenance.row_label(ra, a), provenance_b=provenance.row_label(rb, b))
    out.update(us_a=ra.get("us_per_token"), us_b=rb.get("us_per_token"), speedup=None, within_noise=None, verdict="")
    failed = [side for side, r in (("A", ra), ("B", rb)) if r["status"] != "ok"]
    if failed:
        out["verdict"] = "failed in " + " and ".join(failed)
        return out
    if not ra.get("us_per_token") or not rb.get("us_per_token"):
        out["verdict"] = "no time"
        return out
    out["speedup"] = ra["us_per_token"] / rb["us_per_token"]
    lo_a, hi_a = _interval(ra)
    lo_b, hi_b = _interval(rb)
    out["within_noise"] = lo_a <= hi_b and lo_b <= hi_a
    if out["within_noise"]:
        out["verdict"] = "within noise"
    else:
        out["verdict"] = "faster" if out["speedup"] > 1 else "slower"
    return out


def render(comp: Comparison, *, name_a: str, name_b: str):
    """The rich table of a comparison."""
    from rich.table import Table

    caption = [f"A = {name_a}: {comp.label_a or 'results'}", f"B = {name_b}: {comp.label_b or 'results'}",
               "speedup: A's µs per token over B's; within noise: the interquartile ranges overlap"]
    if comp.geomean is not None:
        caption.append(f"geometric mean over {comp.geomean_rows} whole-window rows: {comp.geomean:.3f}x")
    if comp.only_a or comp.only_b:
        caption.append(f"unmatched rows: {len(comp.only_a)} only in A, {len(comp.only_b)} only in B")
    if comp.differences:
        caption.append("environments differ (--force): " + "; ".join(comp.differences))
    table = Table(title="replayssm compare", caption="\n".join(caption), caption_justify="left", header_style="bold")
    for name in ("preset", "variant", "phase", "B", "W", "state→read", "T", "µs/tok A", "µs/tok B", "speedup", ""):
        table.add_column(name, justify="left" if name in ("preset", "variant", "phase", "state→read", "") else "right", no_wrap=name in ("", "speedup"))
    for r in comp.rows:
        dtypes = precision_label(r["state_dtype"], r.get("read_dtype"), r.get("rounding"))
        speed = f"{r['speedup']:.3f}x" if r["speedup"] else "–"
        style = {"faster": "green", "slower": "red", "within noise": "dim"}.get(r["verdict"], "yellow")
        table.add_row(
            r["preset"], r["variant"], r["phase"], str(r["batch"]), str(r["window"] or "–"), dtypes, str(r.get("draft") or "–"),
            _us(r["us_a"]), _us(r["us_b"]), speed, f"[{style}]{r['verdict']}[/]",
        )
    return table


def _us(v: Any) -> str:
    return "–" if v is None else f"{v:.4g}"
