"""calibration: the shipped efficiencies are the fit of the shipped measurements; predictions reproduce them, say how
sure they are and carry over to other GPUs as predicted (calibrated on H200)."""

from __future__ import annotations

import json
import pytest
import torch
from typer.testing import CliRunner

from replayssm_cli.model import calibration, gpus, presets
from replayssm_cli.report import provenance
from replayssm_cli.measure import grid
from replayssm_cli.measure import profile as prof
from replayssm_cli.main import app
from replayssm_cli.report.results import load, reference_profiles

SUPER, QWEN = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"
TOLERANCE = 0.05


def test_calibration_shipped_file_is_the_fit_of_the_shipped_reference():
    """profiles/calibration/h200.json is what `python benchmarks/calibrate.py` writes from profiles/reference/."""
    shipped = json.loads(calibration.calibration_path("h200").read_text())
    fitted = json.loads(json.dumps(calibration.fit(reference_profiles("h200"), gpus.load_gpu("h200"))))
    assert shipped == fitted
    assert shipped["fit_error"]["max"] < TOLERANCE and shipped["fit_error"]["loo_median"] < 0.1


def test_calibration_reproduces_every_shipped_speedup():
    """A no-GPU profile of each reference file's grid gives every speedup the shipped reference holds within 5%."""
    checked = prof.check_reference("h200")
    assert len(checked) > 100
    off = [c for c in checked if c["error"] is None or abs(c["error"]) > TOLERANCE]
    assert not off, off[:3]
    gdn_b1 = next(c for c in checked if c["op"] == "gdn" and c["variant"] == "replay" and c["batch"] == 1
                  and c["phase"] == "avg" and c["state_dtype"] == "fp32")
    assert gdn_b1["predicted"] < 1.0 and gdn_b1["measured"] == pytest.approx(gdn_b1["predicted"], rel=TOLERANCE)
    assert {c["speedup_over"] for c in checked} == {"conventional", "fp32-conventional", "snapshots"}


def _point(preset, variant, batch, **kw):
    return grid.Point(preset=preset.name, source_name=preset.name, op=preset.kind, variant=variant, batch=batch,
                      window=kw.pop("window", None if "conventional" in variant else 16), state_dtype=kw.pop("state_dtype", "fp32"),
                      read_dtype=kw.pop("read_dtype", None), io_dtype="bf16", **kw)


def test_calibration_prediction_names_its_basis_and_error():
    qwen = presets.resolve(QWEN)
    measured = calibration.predict_step(qwen, "replay", batch=256, window=16)
    between = calibration.predict_step(qwen, "replay", batch=100, window=16)
    assert measured.method == between.method == "calibrated" and measured.calibrated_on == "H200"
    assert measured.error < between.error, "a measured grid is surer than one between measurements"
    assert measured.basis is None
    fp16 = calibration.predict_step(qwen, "replay", batch=256, window=16, state_dtype="fp16")
    assert fp16.basis == "efficiency of gdn replay avg bf16", "fp16 state takes the bf16 state's curve, and says so"
    assert calibration.predict_step(qwen, "replay", batch=256, window=16, gpu="b200").us < measured.us


def test_stochastic_rounding_is_predicted_with_the_error_its_cost_allows():
    """No shipped measurement calibrates stochastic rounding: a stochastically rounded step takes its curve rounded to
    nearest, says so, and claims no less than STOCHASTIC_ERROR (its measured cost reaches +44%); a bad rounding is
    refused."""
    sup = presets.resolve(SUPER)
    for variant, window in (("replay", 16), ("conventional", None)):
        nearest = calibration.predict_step(sup, variant, batch=256, window=window, state_dtype="bf16")
        sr = calibration.predict_step(sup, variant, batch=256, window=window, state_dtype="bf16", rounding="stochastic")
        assert sr.us == nearest.us and nearest.error < 0.05
        assert sr.error >= calibration.STOCHASTIC_ERROR >= 0.44
        assert "stochastic rounding's integer work not calibrated" in sr.basis
        assert sr.x_prediction()["fit_error"] == sr.error
    with pytest.raises(ValueError, match="rounding must be 'nearest' or 'stochastic', got 'up'"):
        calibration.predict_step(sup, "replay", batch=256, window=16, rounding="up")


def test_calibration_other_gpu_rows_say_calibrated_on_h200():
    qwen = presets.resolve(QWEN)
    rows = prof.predicted_rows(_point(qwen, "replay", 64), qwen, None, None, gpu="b200")
    assert all(provenance.row_label(r).startswith("predicted (calibrated on H200") for r in rows)
    assert all("x_reference" not in r for r in rows)


def test_calibration_reference_beside_the_prediction():
    qwen = presets.resolve(QWEN)
    rows = prof.predicted_rows(_point(qwen, "replay", 256), qwen, None, None, gpu="h200",
                               reference=calibration.reference_index("h200"))
    avg = rows[0]
    ref = avg["x_reference"]
    assert ref["file"].startswith("h200-") and ref["gpu"] == "NVIDIA H200" and ref["commit"] and ref["date"]
    assert avg["us"] == pytest.approx(ref["us"], rel=TOLERANCE)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_calibration_profile_table_shows_measured_beside_predicted(tmp_path, no_cuda):
    res = CliRunner().invoke(app, ["profile", "--preset", QWEN, "--batch", "1", "--no-phases", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    rows = load(tmp_path / "p.json").rows
    replay = next(r for r in rows if r["variant"] == "replay")
    assert replay["x_prediction"]["method"] == "calibrated" and replay["speedup"] < 1.0
    text = " ".join(res.stdout.split())
    assert "figures: predicted (calibrated on H200)" in text
    assert f"[1] {provenance.reference_label(replay['x_reference'])}" in text
    assert f"{replay['x_reference']['speedup']:.2f}x" in text


def test_calibration_unmeasured_window_is_a_window_average_and_says_so():
    """Only W = 16 was measured: W = 32 is its flush and non-flush steps averaged over the window, scaled as the
    measured W = 16 average compares with its own; such a prediction is no surer than BORROWED_ERROR."""
    sup = presets.resolve(SUPER)
    at16 = calibration.predict_step(sup, "replay", batch=256, window=16)
    at32 = calibration.predict_step(sup, "replay", batch=256, window=32)
    assert at16.basis is None and at32.basis.startswith("W=32 as the window average")
    assert at32.error >= calibration.BORROWED_ERROR > at16.error
    flush = calibration.predict_step(sup, "replay", batch=256, window=32, phase="flush")
    nonflush = calibration.predict_step(sup, "replay", batch=256, window=32, phase="nonflush")
    flush16 = calibration.predict_step(sup, "replay", batch=256, window=16, phase="flush")
    nonflush16 = calibration.predict_step(sup, "replay", batch=256, window=16, phase="nonflush")
    scale = at16.us / ((15 * nonflush16.us + flush16.us) / 16)
    assert at32.us == pytest.approx(scale * (31 * nonflush.us + flush.us) / 32)
    spec = calibration.predict_step(sup, "spec-replay", batch=64, window=32, draft=4, accepted=2.0)
    assert spec.basis == "fitted at W=16" and spec.error >= calibration.BORROWED_ERROR
