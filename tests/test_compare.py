"""`replayssm compare` on crafted results files: per-row speedup, within noise, geometric mean, mismatched environments."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from replayssm_cli.report.compare import compare_results
from replayssm_cli.errors import UserError
from replayssm_cli.main import app
from replayssm_cli.report.results import ResultsWriter, load

ENV = {"replayssm": "0.1.0", "torch": "2.11.0", "triton": "3.6.0", "cuda": "12.8", "commit": "aaa",
       "gpu": {"name": "NVIDIA H200", "driver": "570.86"}}


def row(variant: str, batch: int, us: float, spread: float = 0.02, phase: str = "avg", **extra) -> dict:
    """A measured row whose interquartile range is us ± spread·us/2."""
    half = spread * us / 2
    r = dict(kind="kernel", op="mamba2", preset="nemotron-3-super-120b-a12b", variant=variant, phase=phase, batch=batch,
             window=None if variant == "conventional" else 16, state_dtype="fp32", read_dtype=None, io_dtype="bf16",
             draft=0, tp=1, flush="staggered", source="measured", status="ok", us=us, us_per_token=us, tokens_per_step=1.0,
             spread=spread, x_us_p25=us - half, x_us_p75=us + half)
    r.update(extra)
    return r


def write(path, rows, env=ENV):
    w = ResultsWriter(path, env, {})
    for r in rows:
        w.add(r)
    w.close()
    return path


@pytest.fixture
def files(tmp_path):
    a = write(tmp_path / "a.json", [
        row("conventional", 256, 568.0),
        row("replay", 256, 434.0),
        row("replay", 256, 266.0, phase="nonflush"),
        row("conventional", 1, 4.00, spread=0.10),
        row("replay", 64, 150.0),
    ])
    b = write(tmp_path / "b.json", [
        row("conventional", 256, 568.0 * 1.001),
        row("replay", 256, 310.0),
        row("replay", 256, 250.0, phase="nonflush"),
        row("conventional", 1, 4.10, spread=0.10),
        row("replay", 16, 50.0),
    ])
    return a, b


def test_compare_results_speedup_noise_geomean(files):
    comp = compare_results(load(files[0]), load(files[1]))
    by = {(r["variant"], r["batch"], r["phase"]): r for r in comp.rows}
    assert set(by) == {("conventional", 256, "avg"), ("replay", 256, "avg"), ("replay", 256, "nonflush"), ("conventional", 1, "avg")}
    assert by["replay", 256, "avg"]["speedup"] == pytest.approx(434.0 / 310.0)
    assert by["replay", 256, "avg"]["verdict"] == "faster" and not by["replay", 256, "avg"]["within_noise"]
    # 0.1% apart with 2% spreads, and 2.5% apart with 10% spreads: the ranges overlap.
    assert by["conventional", 256, "avg"]["within_noise"] and by["conventional", 256, "avg"]["verdict"] == "within noise"
    assert by["conventional", 1, "avg"]["within_noise"]
    assert by["conventional", 1, "avg"]["speedup"] == pytest.approx(4.0 / 4.1)
    expected = math.exp((math.log(1 / 1.001) + math.log(434 / 310) + math.log(4.0 / 4.1)) / 3)
    assert comp.geomean == pytest.approx(expected), "geometric mean over the whole-window rows only"
    assert comp.geomean_rows == 3
    assert [r["batch"] for r in comp.only_a] == [64] and [r["batch"] for r in comp.only_b] == [16]


def test_compare_results_slower_and_failed(tmp_path):
    a = write(tmp_path / "a.json", [row("replay", 256, 300.0), row("split", 256, 200.0, read_dtype="bf16")])
    failed = row("split", 256, 0.0, read_dtype="bf16", status="failed")
    for k in ("us", "us_per_token", "spread", "x_us_p25", "x_us_p75"):
        failed[k] = None
    b = write(tmp_path / "b.json", [row("replay", 256, 360.0), failed])
    comp = compare_results(load(a), load(b))
    verdicts = {r["variant"]: (r["verdict"], r["speedup"]) for r in comp.rows}
    assert verdicts["replay"] == ("slower", pytest.approx(300 / 360))
    assert verdicts["split"] == ("failed in B", None)
    assert comp.geomean == pytest.approx(300 / 360)


@pytest.mark.parametrize(
    "change, what",
    [({"gpu": {"name": "NVIDIA H100 80GB HBM3", "driver": "570.86"}}, "gpu name"), ({"torch": "2.10.0"}, "torch")],
    ids=["other-gpu", "other-torch"],
)
def test_compare_refuses_other_environment_without_force(tmp_path, change, what):
    a = write(tmp_path / "a.json", [row("replay", 256, 300.0)])
    b = write(tmp_path / "b.json", [row("replay", 256, 280.0)], env={**ENV, **change})
    with pytest.raises(UserError, match=what):
        compare_results(load(a), load(b))
    comp = compare_results(load(a), load(b), force=True)
    assert comp.rows[0]["speedup"] == pytest.approx(300 / 280)
    assert comp.differences and what in comp.differences[0]


def test_compare_cli_table_and_json(files):
    runner = CliRunner()
    res = runner.invoke(app, ["compare", str(files[0]), str(files[1])])
    assert res.exit_code == 0, res.output
    assert "within noise" in res.stdout and "geometric mean" in res.stdout
    res = runner.invoke(app, ["compare", str(files[0]), str(files[1]), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    assert len(doc["rows"]) == 4 and doc["geomean"] == pytest.approx(compare_results(load(files[0]), load(files[1])).geomean)


def test_compare_cli_refuses_with_one_line(tmp_path):
    a = write(tmp_path / "a.json", [row("replay", 256, 300.0)])
    b = write(tmp_path / "b.json", [row("replay", 256, 280.0)], env={**ENV, "gpu": {"name": "NVIDIA B200", "driver": "575"}})
    res = CliRunner().invoke(app, ["compare", str(a), str(b)])
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and "NVIDIA B200" in lines[0]
    res = CliRunner().invoke(app, ["compare", str(a), str(b), "--force"])
    assert res.exit_code == 0 and "environments differ" in res.stdout


def test_compare_cli_truncated_file(tmp_path, files):
    cut = tmp_path / "cut.json"
    cut.write_text(files[0].read_text()[:200])
    res = CliRunner().invoke(app, ["compare", str(cut), str(files[1])])
    assert res.exit_code != 0 and len(res.stderr.strip().splitlines()) == 1 and "truncated" in res.stderr


def test_compare_names_where_each_side_came_from(files):
    res = CliRunner().invoke(app, ["compare", str(files[0]), str(files[1]), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    created = load(files[0]).created[:10]
    assert got["label_a"] == f"a.json (NVIDIA H200, {created}, aaa)"
    assert {(r["provenance_a"], r["provenance_b"]) for r in got["rows"]} == {(got["label_a"], got["label_b"])}
    table = CliRunner().invoke(app, ["compare", str(files[0]), str(files[1])])
    assert got["label_a"] in " ".join(table.stdout.split())
