"""The results file: round trip, schema checks, a truncated file, an interrupted run's file."""

from __future__ import annotations

import json

import pytest

from replayssm_cli.report import results
from replayssm_cli.errors import UserError
from replayssm_cli.report.results import ROW_FIELDS, SCHEMA_VERSION, ResultsWriter, load

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
        (_doc(rows=[row(), [1, 2]]), "row 1 is malformed .a results row is an object, not list"),
        (_doc(rows=[{**row(), "us": "fast"}]), "row 0 is malformed .results row's us is 'fast': must be number or null"),
        (_doc(rows=[{**row(), "us": -3.0}]), "us is -3.0: must be above 0"),
        (_doc(rows=[{**row(), "batch": True}]), "batch is True: must be integer"),
        (_doc(rows=[{**row(), "speedup_over": "decode"}]), "speedup_over is 'decode': must be one of conventional"),
        (_doc(skipped="none"), "skipped a list of objects"),
    ],
    ids=["newer-schema", "foreign-kind", "not-a-dict", "rows-not-a-list", "row-missing-batch", "row-unknown-field",
         "row-not-object", "string-time", "negative-time", "bool-batch", "unknown-baseline", "skipped-not-a-list"],
)
def test_results_load_checks_schema(tmp_path, doc, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=message):
        load(path)


def test_results_load_refuses_a_deep_file_in_one_line(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text('{"kind": "replayssm-results", "rows": ' + "[" * 200_000 + "]" * 200_000 + "}")
    with pytest.raises(UserError, match="nests deeper") as exc:
        load(path)
    assert "\n" not in exc.value.line()


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


def test_results_schema_file_is_the_one_the_code_writes():
    """profiles/schema/results.schema.json is json_schema() (regenerate with `python -m replayssm_cli.report.results --schema`)."""
    shipped = json.loads(results.schema_path().read_text())
    assert shipped == results.json_schema()
    assert shipped["properties"]["schema_version"] == {"const": SCHEMA_VERSION}
    documented = shipped["$defs"]["row"]["properties"]
    assert set(ROW_FIELDS) <= set(documented) and all(documented[k]["description"] for k in ROW_FIELDS)


def _shipped_files():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "profiles"
    # results documents only: the compile check's spill baseline lives beside them
    return sorted(p for p in [*root.glob("reference/*.json"), *root.glob("partial/*.json")]
                  if json.loads(p.read_text()).get("kind") == "replayssm-results")


@pytest.mark.parametrize("path", _shipped_files(), ids=lambda p: p.name)
def test_results_shipped_file_matches_schema(path):
    """Every shipped results file, upgraded from its version on load, conforms to the shipped JSON Schema."""
    doc = json.loads(path.read_text())
    assert doc["schema_version"] in results.READABLE_VERSIONS
    upgraded = results.upgrade(doc)
    assert results.schema_errors(upgraded) == []
    assert load(path).rows == upgraded["rows"]


@pytest.mark.parametrize(
    "change, where",
    [
        ({"batch": "256"}, "rows/0/batch"),
        ({"us": -1.0}, "rows/0/us"),
        ({"speedup_over": "decode"}, "rows/0/speedup_over"),
        ({"variant": "fast"}, "rows/0/variant"),
        ({"gpu_clock": 1}, "rows/0"),
    ],
    ids=["batch-string", "negative-time", "unknown-baseline", "unknown-variant", "unknown-field"],
)
def test_results_schema_rejects_wrong_types(change, where):
    doc = _doc(rows=[{**row(), "speedup_over": None, "speedup_vs_decode": None, "mem_per_seq_model": None, **change}])
    errors = results.schema_errors(doc)
    assert errors and errors[0].startswith(where)


def test_results_version_1_upgraded_on_load(tmp_path):
    """A version-1 file: a speculative row's `speedup` was over plain decode, x_spec_speedup over snapshots."""
    conv = row(64, us=100.0, us_model_step=4000.0, mem_per_seq=1000)
    for key in ("speedup_over", "speedup_vs_decode", "mem_per_seq_model"):
        conv.pop(key)
    snap = {**conv, "variant": "spec-conventional", "draft": 4, "speedup": 1.5, "speedup_lo": 1.4, "speedup_hi": 1.6}
    spec = {**conv, "variant": "spec-replay", "window": 16, "draft": 4, "speedup": 4.5, "speedup_lo": 4.4,
            "speedup_hi": 4.6, "x_spec_speedup": 3.0, "x_spec_speedup_lo": 2.9, "x_spec_speedup_hi": 3.1}
    split = {**conv, "variant": "split", "window": 16, "read_dtype": "bf16", "speedup": 2.5}
    doc = _doc(schema_version=1, rows=[conv, snap, spec, split])
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    got = load(path)
    assert got.schema_version == SCHEMA_VERSION
    c, s, r, p = got.rows
    assert c["speedup"] is None and c["speedup_over"] is None and c["mem_per_seq_model"] == 40 * 1000
    assert s["speedup"] is None and s["speedup_over"] is None and s["speedup_vs_decode"] == 1.5
    assert (r["speedup"], r["speedup_lo"], r["speedup_hi"], r["speedup_over"], r["speedup_vs_decode"]) == (3.0, 2.9, 3.1, "snapshots", 4.5)
    assert "x_spec_speedup" not in r
    assert p["speedup"] == 2.5 and p["speedup_over"] == "fp32-conventional"
    assert results.schema_errors(results.upgrade(doc)) == []


def test_results_writer_names_the_baseline_of_a_speedup(tmp_path):
    w = ResultsWriter(tmp_path / "a.json", ENV, SPEC)
    r = row(variant="replay", speedup=1.8)
    r.pop("speedup_over")
    w.add(r)
    assert load(tmp_path / "a.json").rows[0]["speedup_over"] == "conventional"
