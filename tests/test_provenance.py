"""provenance: one short label per row and per file, for measured-here, shipped and predicted figures."""

from __future__ import annotations

from pathlib import Path

from replayssm_cli.report import provenance, results
from replayssm_cli.report.results import Results

ENV = {"gpu": {"name": "NVIDIA H200"}, "commit": "2adf3f9"}


def _file(name: str, rows: list[dict]) -> Results:
    return Results(path=Path("profiles/reference") / name, environment=ENV, spec={}, rows=rows,
                   created="2026-11-30T22:46:58+00:00")


def test_provenance_row_labels():
    measured = {"source": "measured"}
    calibrated = {"source": "predicted", "x_prediction": {"method": "calibrated", "calibrated_on": "H200", "fit_error": 0.04}}
    roofline = {"source": "predicted", "x_prediction": {"method": "roofline", "calibrated_on": None, "fit_error": None}}
    assert provenance.row_label(measured) == "measured here"
    assert provenance.row_label(measured, _file("h200-spec.json", [measured])) == "h200-spec.json (NVIDIA H200, 2026-11-30, 2adf3f9)"
    assert provenance.row_label(calibrated) == "predicted (calibrated on H200, ±4%)"
    assert provenance.row_label(roofline) == "predicted (roofline, uncalibrated)"
    # a predicted row stays predicted whatever file holds it
    assert provenance.row_label(calibrated, _file("p.json", [calibrated])).startswith("predicted (calibrated")


def test_provenance_file_labels():
    calibrated = {"source": "predicted", "x_prediction": {"method": "calibrated", "calibrated_on": "H200", "fit_error": 0.04}}
    assert provenance.file_label(_file("h200-spec.json", [{"source": "measured"}])) == "h200-spec.json (NVIDIA H200, 2026-11-30, 2adf3f9)"
    wider = {**calibrated, "x_prediction": {**calibrated["x_prediction"], "fit_error": 0.3}}
    assert provenance.file_label(_file("p.json", [calibrated, wider])) == "p.json (predicted for NVIDIA H200, calibrated on H200, up to ±30%)"


def test_provenance_of_a_merged_reference_names_each_row_file():
    merged = results.load_reference("h200")
    labels = {provenance.row_label(r, merged) for r in merged.rows}
    assert all(label.startswith("h200-") and "NVIDIA H200" in label for label in labels)
    assert len(labels) > 1, "the shipped reference is several files: rows name theirs"
