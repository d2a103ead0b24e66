"""`replayssm show`: a results file's table again, filtered like profile's, as JSON and as CSV."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from typer.testing import CliRunner

from replayssm_cli.main import app

SPEC = Path(__file__).parent.parent / "profiles" / "reference" / "h200-spec.json"
MEASURED = Path(__file__).parent / "fixtures" / "results_h200_measured.json"
SUPER = "nemotron-3-super-120b-a12b"

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["show", *args])


def test_show_filters_rows_and_prints_json():
    result = run(str(SPEC), "--preset", SUPER, "--batch", "1,256", "--variant", "spec-replay", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["preset"], r["variant"]) for r in rows} == {(SUPER, "spec-replay")} and {r["batch"] for r in rows} == {1, 256}
    doc = json.loads(SPEC.read_text())
    assert len(rows) == sum(1 for r in doc["rows"] if r["preset"] == SUPER and r["variant"] == "spec-replay" and r["batch"] in (1, 256))
    # The speedup shown is over snapshots, as the schema names it.
    assert {r["speedup_over"] for r in rows} == {"snapshots"}


def test_show_table_names_the_file_and_its_figures():
    result = run(str(SPEC), "--preset", SUPER, "--batch", "256", "--variant", "spec-replay")
    assert result.exit_code == 0, result.output
    assert "h200-spec.json (NVIDIA H200, 2026-11-30, 2adf3f9)" in result.stdout
    assert "vs snapshots" in result.stdout and "measured here" not in result.stdout


def test_show_writes_csv_for_spreadsheets(tmp_path):
    out = tmp_path / "rows.csv"
    result = run(str(MEASURED), "--variant", "replay", "--csv", str(out))
    assert result.exit_code == 0, result.output
    with out.open() as fh:
        table = list(csv.DictReader(fh))
    expected = [r for r in json.loads(MEASURED.read_text())["rows"] if r["variant"] == "replay"]
    assert len(table) == len(expected) and list(table[0])[:3] == ["preset", "op", "variant"]
    assert [t["us"] for t in table] == ["" if r.get("us") is None else str(r["us"]) for r in expected]
    assert f"wrote {len(expected)} rows to {out}" in result.stderr.splitlines()


def test_show_bad_filter_and_file_are_one_line(tmp_path):
    for args, words in (((str(SPEC), "--batch", "3"), "no row of"), ((str(SPEC), "--variant", "nope"), "it holds"),
                        ((str(tmp_path / "missing.json"),), "missing.json")):
        result = run(*args)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output
    assert run(str(SPEC), "--csv", "").exit_code == 2
