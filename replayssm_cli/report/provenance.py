"""Where a figure came from, in one short label: measured here, a shipped or saved file (GPU, date, commit), or predicted (how)."""

from __future__ import annotations

from typing import Any

MEASURED_HERE = "measured here"


def _origin_label(origin: dict[str, Any]) -> str:
    facts = ", ".join(str(v) for v in (origin.get("gpu"), origin.get("date"), origin.get("commit")) if v)
    name = origin.get("file") or "results file"
    return f"{name} ({facts})" if facts else name


def file_label(results: Any) -> str:
    """A loaded results file in one label: 'h200-spec.json (NVIDIA H200, 2026-11-30, 2adf3f9)'.

    A file that is a prediction says so, with its rows' largest fit error: 'p.json (predicted for NVIDIA B200,
    calibrated on H200, up to ±4%)'.
    """
    from replayssm_cli.report.results import origin_of

    origin = origin_of(results)
    rows = getattr(results, "rows", None) or []
    if rows and all(r.get("source") == "predicted" for r in rows):
        how = prediction_label(rows[0], error=False).removeprefix("predicted ").strip("()")
        errors = [e for r in rows if (e := (r.get("x_prediction") or {}).get("fit_error")) is not None]
        if errors and how.startswith("calibrated"):
            how += f", up to ±{percent(max(errors))}"
        target = f"for {origin['gpu']}, " if origin.get("gpu") else ""
        return f"{origin.get('file') or 'results'} (predicted {target}{how})"
    return _origin_label(origin)


def prediction_label(row: dict[str, Any], error: bool = True) -> str:
    """How a predicted row was predicted: 'predicted (calibrated on H200, ±4%)' (without the fit's error when `error`
    is false) or 'predicted (roofline, uncalibrated)'."""
    how = row.get("x_prediction") or {}
    if how.get("method") == "calibrated":
        err = how.get("fit_error") if error else None
        on = how.get("calibrated_on") or "measured profiles"
        return f"predicted (calibrated on {on}" + (f", ±{percent(err)}" if err is not None else "") + ")"
    return "predicted (roofline, uncalibrated)"


def percent(fraction: float) -> str:
    """A relative error as a whole percentage, '<1%' below one."""
    return f"{100 * fraction:.0f}%" if fraction >= 0.01 else "<1%"


def row_label(row: dict[str, Any], results: Any = None, error: bool = True) -> str:
    """One row's provenance.

    A predicted row says how (prediction_label; `error` false leaves out the fit's error). A measured row carrying x_origin (a row of a merged reference)
    names that file; one from a loaded `results` file names it (file_label's form); with neither, the row was
    measured in this process: 'measured here'.
    """
    if row.get("source") == "predicted":
        return prediction_label(row, error)
    if isinstance(row.get("x_origin"), dict):
        return _origin_label(row["x_origin"])
    if results is not None:
        from replayssm_cli.report.results import origin_of

        return _origin_label(origin_of(results))
    return MEASURED_HERE


def reference_label(reference: dict[str, Any]) -> str:
    """A predicted row's x_reference (the shipped measurement of its configuration) as 'file (GPU, date, commit)'."""
    return _origin_label(reference)
