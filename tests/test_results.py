"""The results file: round trip, schema checks, a truncated file, an interrupted run's file."""

from __future__ import annotations

import json

import pytest

from replayssm_cli import results
from replayssm_cli.errors import UserError
from replayssm_cli.results import ROW_FIELDS, SCHEMA_VERSION, ResultsWriter, load

ENV = {"gpu": {"name": "NVIDIA H200", "driver": "570.86"}, "torch": "2.11.0", "triton": "3.6.0", "commit": "abc123"}
SPEC = {"presets": ["nemotron-3-super-120b-a12b"], "batches": [1, 256], "windows": [16]}


def row(batch: int = 256, variant: str = "conventional", **extra) -> dict:
    r = {k: None for k in ROW_FIELDS}
    r.update(kind="kernel", op="mamba2", preset="nemotron-3-super-120b-a12b", variant=variant, phase="avg", batch=batch,
             window=None if variant == "conventional" else 16, state_dtype="fp32", io_dtype="bf16", draft=0, tp=1,
             layers=1, flush="staggered", source="measured", status="ok", us=568.0 + batch / 7, x_samples_us=[568.0, 569.5])
    r.update(extra)
    return r


def test_results_round_trip(tmp_path):
    path = tmp_path / "runs" / "a.json"
    w = ResultsWriter(path, ENV, SPEC)
    rows = [row(1), row(256), row(256, "replay", speedup=1.8, x_flush_share=0.04)]
    for r in rows:
        w.add(r)
    w.skip("nemotron replay B512", "out of memory at batch 512")
    closed = w.close()
    got = load(path)
    assert got.complete and closed.complete
    assert got.schema_version == SCHEMA_VERSION
    assert got.environment == ENV and got.spec == SPEC
    assert got.rows == rows
    assert got.skipped == [{"what": "nemotron replay B512", "why": "out of memory at batch 512"}]
    assert got.frame().shape == (3, len(rows[2]))
    assert [p.name for p in path.parent.iterdir()] == ["a.json"], "no temporary file is left behind"


def test_results_nan_becomes_null(tmp_path):
    w = ResultsWriter(tmp_path / "a.json", ENV, SPEC)
    w.add(row(spread=float("nan")))
    w.close()
    assert json.loads((tmp_path / "a.json").read_text())["rows"][0]["spread"] is None


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"status": None}, "lacks status"),
        ({"source": None}, "lacks source"),
        ({"speed": 2.0}, "unknown fields speed"),
    ],
    ids=["no-status", "no-source", "unknown-field"],
)
def test_results_writer_rejects_bad_rows(tmp_path, bad, message):
    w = ResultsWriter(tmp_path / "a.json", ENV, SPEC)
    with pytest.raises(ValueError, match=message):
        w.add(row(**bad))
    assert load(tmp_path / "a.json").rows == []


def _doc(**changes) -> dict:
    doc = {"kind": results.KIND, "schema_version": SCHEMA_VERSION, "created": "", "complete": True,
           "environment": ENV, "spec": SPEC, "rows": [row()], "skipped": []}
    doc.update(changes)
    return doc


@pytest.mark.parametrize(
    "doc, message",
    [
        (_doc(schema_version=SCHEMA_VERSION + 1), "schema_version"),
        (_doc(kind="something-else"), "not a replayssm results file"),
        ([1, 2, 3], "not a replayssm results file"),
        (_doc(rows={"a": 1}), "lacks its rows"),
        (_doc(rows=[{**row(), "batch": None}]), "row 0 is malformed"),
        (_doc(rows=[{**row(), "gpu_clock": 1}]), "row 0 is malformed"),
    ],
    ids=["newer-schema", "foreign-kind", "not-a-dict", "rows-not-a-list", "row-missing-batch", "row-unknown-field"],
)
def test_results_load_checks_schema(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=message):
        load(path)


def test_results_load_missing_file(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load(tmp_path / "nope.json")


def test_results_truncated_file_is_one_clear_error(tmp_path):
    path = tmp_path / "a.json"
    w = ResultsWriter(path, ENV, SPEC)
    w.add(row())
    w.close()
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(UserError, match="corrupt or truncated") as exc:
        load(path)
    assert "\n" not in exc.value.line()


def test_results_interrupted_run_loads_with_finished_rows(tmp_path):
    path = tmp_path / "a.json"
    w = ResultsWriter(path, ENV, SPEC)
    w.add(row(1))
    # The process dies here (no close): what is on disk is a whole file marked incomplete.
    got = load(path)
    assert not got.complete and got.rows == [row(1)]
    w.add(row(16))
    w.skip("replay B64", "not run: interrupted")
    w.close(complete=False)
    got = load(path)
    assert not got.complete
    assert [r["batch"] for r in got.rows] == [1, 16]
    assert got.skipped[0]["why"] == "not run: interrupted"


def test_results_newest(tmp_path):
    import os

    assert results.newest(tmp_path / "none") is None
    for i, name in enumerate(["b.json", "a.json"]):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, (1_000_000 + i, 1_000_000 + i))
    assert results.newest(tmp_path).name == "a.json"


def test_load_reference_reads_the_newest_run_first(tmp_path, monkeypatch):
    """The shipped profiles of one GPU merged, the newest file's rows first and a configuration measured twice kept
    from the newest; another GPU's files left out."""
    for name, rows in (("h200-a.json", [row(256, us=600.0), row(1, us=5.0)]), ("h200-b.json", [row(256, us=550.0)]),
                       ("b200-x.json", [row(64, us=1.0)])):
        w = ResultsWriter(tmp_path / name, ENV, SPEC)
        for r in rows:
            w.add(r)
        w.close()
    # the creation times the files record: h200-a a day before h200-b (name order is not age order)
    for name, created in (("h200-a.json", "2026-11-28T10:00:00+00:00"), ("h200-b.json", "2026-11-29T10:00:00+00:00")):
        doc = json.loads((tmp_path / name).read_text())
        doc["created"] = created
        (tmp_path / name).write_text(json.dumps(doc))
    monkeypatch.setattr(results, "reference_files", lambda: sorted(tmp_path.glob("*.json")))
    merged = results.load_reference("h200")
    assert [(r["batch"], r["us"]) for r in merged.rows] == [(256, 550.0), (1, 5.0)]
    assert merged.created == "2026-11-29T10:00:00+00:00"
    assert results.load_reference("h100") is None
    monkeypatch.setattr(results, "reference_files", lambda: [])
    assert results.load_reference("h200") is None
