"""`replayssm roofline`: ceilings, classification, the figure read back from its HTML, rendering in Chromium."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayssm_cli.report import roofline as rl
from replayssm_cli.report import roofline_figure as rl_fig
from replayssm_cli.main import app
from replayssm_cli.report.results import ResultsWriter, load

FIXTURES = Path(__file__).parent / "fixtures"
MEASURED = FIXTURES / "results_h200_measured.json"
AFTER = FIXTURES / "results_h200_after.json"
PREDICTED = FIXTURES / "results_h200_predicted.json"

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["roofline", *args])


def figure(html: Path) -> tuple[list[dict], dict]:
    """The data and layout plotly draws, read back from the arguments of the page's Plotly.newPlot call."""
    text = html.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    i = text.rindex("Plotly.newPlot(") + len("Plotly.newPlot(")
    values = []
    for _ in range(3):
        while text[i] in " \t\r\n,":
            i += 1
        value, i = decoder.raw_decode(text, i)
        values.append(value)
    return values[1], values[2]


def traces(data: list[dict], role: str) -> list[dict]:
    return [t for t in data if (t.get("meta") or {}).get("role") == role]


def annotations(layout: dict, name: str) -> list[dict]:
    return [a for a in layout.get("annotations", []) if a.get("name") == name]


def close(a: float, b: float) -> bool:
    # Rows store int byte and FLOP counts beside float ratios computed before rounding.
    return math.isclose(a, b, rel_tol=1e-6)


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code != 0
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in result.output
    return lines[0]


def write_results(path: Path, environment: dict, rows: list[dict]) -> Path:
    writer = ResultsWriter(path, environment, {})
    for row in rows:
        writer.add(row)
    writer.close(True)
    return path


def arrows(data: list[dict]) -> dict[str, dict]:
    return {t["meta"]["over"]: t for t in traces(data, "arrows")}


def test_roofline_html_holds_ceilings_points_and_arrows(tmp_path):
    out = tmp_path / "fig.html"
    result = run(str(MEASURED), "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "<script src=" not in text and "plotly.js v" in text and len(text) > 1_000_000
    data, layout = figure(out)

    ceilings = {t["meta"]["name"]: t["meta"] for t in traces(data, "ceiling")}
    assert set(ceilings) == {"HBM", "copy", "L2", "FP32", "TF32", "BF16"}
    assert (ceilings["copy"]["value"], ceilings["copy"]["source"]) == (4250.0, "measured")
    assert ceilings["HBM"]["source"] == "datasheet" and ceilings["HBM"]["value"] > ceilings["copy"]["value"]
    assert (ceilings["L2"]["value"], ceilings["FP32"]["value"], ceilings["BF16"]["value"]) == (9800.0, 65.6, 720.0)
    assert ceilings["TF32"]["source"] == "datasheet"
    labels = {t["name"] for t in traces(data, "ceiling")}
    assert "copy 4.25 TB/s (measured)" in labels and any(lab.endswith("(datasheet)") and lab.startswith("HBM") for lab in labels)
    ridge = traces(data, "ridge")[0]
    assert ridge["meta"]["ridges"]["FP32"] == pytest.approx(65.6e12 / 4250e9)
    assert ridge["x"] == pytest.approx([ridge["meta"]["ridges"][n] for n in ("FP32", "TF32", "BF16")])
    # Each roof is named once beside its line; the copy and HBM roofs, 12% apart, share one label.
    texts = [a["text"] for a in annotations(layout, "ceiling-label")]
    assert any("copy 4.25 TB/s" in t and "HBM 4.80 TB/s" in t for t in texts)
    assert sum("FP32 CUDA-core 65.6 TFLOP/s (measured), ridge 15.4 FLOP/B" in t for t in texts) == 1

    rows = load(MEASURED).rows
    ok = [r for r in rows if r["status"] == "ok" and r["phase"] == "avg" and r.get("us") is not None]
    points = traces(data, "points")
    assert {t["meta"]["variant"] for t in points} == {r["variant"] for r in ok}
    # Whole-window averages only unless --phase asks for more.
    assert sum(len(t["x"]) for t in points) == len(ok) and {ph for t in points for ph in t["meta"]["phase"]} == {"avg"}
    colours = {t["meta"]["variant"]: t["marker"]["color"] for t in points}
    assert len(set(colours.values())) == len(colours)
    for t in points:
        sizes = dict(zip(t["meta"]["batch"], t["marker"]["size"]))
        assert [sizes[b] for b in sorted(sizes)] == sorted(sizes.values())
        assert all(not s.endswith("-open") for s in t["marker"]["symbol"])
        for x, y, hover in zip(t["x"], t["y"], t["hovertext"]):
            match = [r for r in ok if r["variant"] == t["meta"]["variant"] and close(x, r["intensity"]) and close(y, r["flops_per_s"])]
            assert len(match) == 1
            lines = hover.split("<br>")
            assert len(lines) <= 9 and f"{match[0]['us']:,.2f} µs per step" in lines[1]
            assert "source: results_h200_measured.json (NVIDIA H200" in lines[-1]
            assert "x_case" not in hover and "us_p99" not in hover

    by_over = arrows(data)
    assert set(by_over) == {"conventional", "fp32-conventional", "snapshots"}
    replays = [r for r in ok if r["variant"] == "replay"]
    assert by_over["conventional"]["meta"]["count"] == len(replays) == 4
    assert sorted(by_over["conventional"]["meta"]["labels"]) == sorted(f"{r['speedup']:.2f}x" for r in replays)
    assert by_over["fp32-conventional"]["meta"]["labels"] == [f"{next(r for r in ok if r['variant'] == 'split')['speedup']:.2f}x"]
    spec = {r["variant"]: r for r in ok if r["variant"].startswith("spec")}
    over_snapshots = spec["spec-conventional"]["us_per_token"] / spec["spec-replay"]["us_per_token"]
    assert by_over["snapshots"]["meta"]["labels"] == [f"{over_snapshots:.2f}x"]
    for t in by_over.values():
        # One trace per kind of baseline: tail, head and a gap per arrow; the head is an arrow marker.
        assert len(t["x"]) == 3 * t["meta"]["count"] and t["marker"]["symbol"] == "arrow"
        assert t["marker"]["angleref"] == "previous" and t["marker"]["size"][1::3] == [t["marker"]["size"][1]] * t["meta"]["count"]
    assert not annotations(layout, "speedup-arrow")

    speedups = traces(data, "speedup")
    assert speedups and all(t["yaxis"] == "y2" and t["legend"] == "legend2" for t in speedups)
    rep = next(t for t in speedups if t["meta"]["variant"] == "replay")
    assert rep["x"] == [1, 16, 64, 256] and rep["y"] == pytest.approx([r["speedup"] for r in replays])
    assert not traces(data, "e2e") and not traces(data, "bandwidth")
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"
    assert layout["xaxis"]["title"]["text"].endswith("(modelled bytes)")
    assert all(label[-1] in "GTP" for label in layout["yaxis"]["ticktext"])


def test_roofline_classifies_points_and_flags_one_above_the_roof():
    results = load(MEASURED)
    roof = rl.roof_for(results)
    assert (roof.memory.name, roof.compute.name) == ("copy", "FP32")
    placement = rl.place([("m", results)], roof)
    by_key = {(p.variant, p.row["batch"], p.row["phase"]): p for p in placement.points}
    conv = by_key[("conventional", 256, "avg")]
    row = conv.row
    nbytes = row["bytes_read"] + row["bytes_written"]
    assert conv.bound == "memory"
    assert conv.roof_flops_per_s == pytest.approx(4250e9 * row["intensity"])
    assert conv.pct_of_roof == pytest.approx(100 * row["gbs"] / 4250)
    assert conv.us_left == pytest.approx(row["us"] - 1e6 * nbytes / 4250e9)
    above = [p for p in placement.points if p.above_roof]
    assert [(p.variant, p.row["phase"]) for p in above] == [("replay", "nonflush")]
    warnings = placement.warnings()
    assert len(warnings) == 1 and "8.2% above the copy 4.25 TB/s (measured) roof" in warnings[0] and "measurement error" in warnings[0]
    assert any("1 failed row" in n for n in placement.notes)

    compute_row = dict(row, variant="baseline:dense", flops=row["flops"] * 100, us=row["us"] * 5)
    dense = rl.place([("c", load_rows(results, [compute_row]))], roof).points[0]
    assert dense.intensity > roof.ridge() and dense.bound == "compute"
    assert dense.roof_flops_per_s == pytest.approx(65.6e12)
    assert dense.us_left == pytest.approx(dense.us - 1e6 * compute_row["flops"] / 65.6e12)


def load_rows(results, rows):
    return type(results)(path=None, environment=results.environment, spec={}, rows=rows)


def test_roofline_table_and_json(tmp_path):
    result = run(str(MEASURED), "--out", str(tmp_path / "f.html"), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["gpu"] == "NVIDIA H200" and doc["written"] == [str(tmp_path / "f.html")]
    assert len(doc["points"]) == 16
    flagged = [p for p in doc["points"] if p["above_roof"]]
    assert [(p["variant"], p["phase"]) for p in flagged] == [("replay", "nonflush")]
    assert flagged[0]["distance_to_roof_pct"] < 0 and flagged[0]["us_left"] < 0
    assert {p["bound"] for p in doc["points"]} == {"memory"}
    assert "warning:" in result.stderr and "measurement error" in result.stderr

    result = run(str(MEASURED), "--out", str(tmp_path / "f.html"))
    assert result.exit_code == 0
    assert "108.2 !" in result.stdout and "nonflush" in result.stdout and "µs left" in result.stdout


def test_roofline_plots_a_predicted_only_file_hollow(tmp_path):
    out = tmp_path / "p.html"
    result = run(str(PREDICTED), "--out", str(out))
    assert result.exit_code == 0, result.output
    data, layout = figure(out)
    points = traces(data, "points")
    assert points and all(s.endswith("-open") for t in points for s in t["marker"]["symbol"])
    assert all(all(t["meta"]["predicted"]) for t in points)
    names = {t["meta"]["name"] for t in traces(data, "ceiling")}
    assert "copy" not in names and "HBM" in names
    by_over = arrows(data)
    assert by_over["conventional"]["meta"]["count"] == 4
    assert all(label.endswith("x pred.") for label in by_over["conventional"]["meta"]["labels"])
    assert all(t["line"]["dash"] == "dash" for t in traces(data, "speedup"))
    hover = points[0]["hovertext"][0].split("<br>")
    assert hover[-1].startswith("source: predicted (")


def test_roofline_overlays_before_and_after(tmp_path):
    out = tmp_path / "ba.html"
    result = run(str(MEASURED), str(AFTER), "--out", str(out))
    assert result.exit_code == 0, result.output
    data, _ = figure(out)
    files = {t["meta"]["file"] for t in traces(data, "points")}
    assert files == {"results_h200_measured", "results_h200_after"}
    # The earlier file of a before/after overlay is drawn fainter, in the same colours and symbols.
    opacity = {t["meta"]["file"]: t["marker"]["opacity"] for t in traces(data, "points")}
    assert opacity["results_h200_measured"] < opacity["results_h200_after"]
    link = traces(data, "before-after")[0]
    assert link["meta"]["count"] == len(load(AFTER).rows)
    assert len(link["x"]) == 3 * link["meta"]["count"]
    assert "results_h200_measured" in result.stdout and "results_h200_after" in result.stdout


def test_roofline_draws_e2e_baselines_and_measured_bytes(tmp_path):
    base = load(MEASURED)
    e2e = [
        {"kind": "e2e", "op": "mamba2", "preset": "nemotron-3-super-120b-a12b", "variant": v, "phase": "avg", "batch": b,
         "source": "measured", "status": "ok", "us": 9000.0 + b, "x_share_ssm": ssm, "x_share_attn": 0.2,
         "x_share_mlp": 0.7 - ssm, "x_share_other": 0.1}
        for v, ssm in (("conventional", 0.4), ("replay", 0.25)) for b in (1, 256)
    ]
    baseline = dict(base.rows[0], variant="baseline:vllm")
    path = write_results(tmp_path / "crafted.json", base.environment, base.rows + [baseline] + e2e)
    plain = write_results(tmp_path / "plain.json", base.environment, load(AFTER).rows)
    out = tmp_path / "e.html"
    result = run(str(path), str(plain), "--bytes", "measured", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "plain has no measured DRAM bytes" in result.stderr
    data, layout = figure(out)

    bars = traces(data, "e2e")
    assert [t["meta"]["share"] for t in bars] == ["x_share_ssm", "x_share_attn", "x_share_mlp", "x_share_other"]
    assert all(t["type"] == "bar" and t["yaxis"] == "y3" for t in bars)
    # ITL bars: conventional and ReplaySSM side by side per batch, each bar's shares stacked to its step time.
    assert bars[0]["x"] == [["B1", "B1", "B256", "B256"], ["conventional", "ReplaySSM", "conventional", "ReplaySSM"]]
    itl = [(9000.0 + b) / 1000 for b in (1, 1, 256, 256)]
    assert bars[0]["y"] == pytest.approx([0.4 * itl[0], 0.25 * itl[1], 0.4 * itl[2], 0.25 * itl[3]])
    assert [sum(t["y"][i] for t in bars) for i in range(4)] == pytest.approx(itl)
    assert layout["barmode"] == "stack"
    assert {t["marker"]["color"] for t in bars}.isdisjoint({c for _, c in rl_fig.VARIANT_STYLE.values()})
    totals = traces(data, "e2e-totals")[0]["meta"]["text"]
    assert totals[1] == f"{itl[1]:.2f} ms<br>{itl[0] / itl[1]:.2f}x"
    colours = {t["meta"]["variant"]: t["marker"]["color"] for t in traces(data, "points") if t["meta"]["file"] == "crafted"}
    assert colours["baseline:vllm"] != colours["baseline:flashinfer"]
    assert colours["baseline:vllm"] not in {c for _, c in rl_fig.VARIANT_STYLE.values()}

    moved = traces(data, "bytes-difference")
    assert len(moved) == 1 and moved[0]["meta"]["count"] == 2
    rows = {r["variant"]: r for r in base.rows if r["batch"] == 64 and r["status"] == "ok" and "x_ncu_bytes_read" in r}
    conv = rows["conventional"]
    x = conv["x_ncu_flops"] / (conv["x_ncu_bytes_read"] + conv["x_ncu_bytes_written"])
    points = next(t for t in traces(data, "points") if t["meta"]["variant"] == "conventional" and t["meta"]["file"] == "crafted")
    at64 = points["meta"]["batch"].index(64)
    assert close(points["x"][at64], x) and not math.isclose(x, conv["intensity"], rel_tol=1e-3)
    assert any(close(px, conv["intensity"]) for px in moved[0]["x"] if px is not None)


def test_roofline_gpu_option_draws_that_gpus_datasheet(tmp_path):
    from replayssm_cli.model import gpus

    other = next(g for g in gpus.list_gpus() if g.key != "h200" and g.hbm_gbs != gpus.load_gpu("h200").hbm_gbs)
    out = tmp_path / "g.html"
    result = run(str(MEASURED), "--gpu", other.key, "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["gpu"] == other.name
    ceilings = {c["name"]: c for c in doc["roof"]["ceilings"]}
    assert "copy" not in ceilings and "L2" not in ceilings
    assert ceilings["HBM"]["value"] == other.hbm_gbs and ceilings["FP32"]["value"] == other.fp32_tflops
    assert "unknown GPU 'no-such-gpu'" in one_error_line(run(str(MEASURED), "--gpu", "no-such-gpu", "--out", str(out)))

    results = load(MEASURED)
    unknown = write_results(tmp_path / "unknown.json", {"gpu": {"name": "NVIDIA Prototype"}}, results.rows)
    line = one_error_line(run(str(unknown), "--out", str(out)))
    assert "no memory bandwidth ceiling for GPU 'NVIDIA Prototype'" in line and "--gpu" in line
    assert run(str(unknown), "--gpu", "h200", "--out", str(out)).exit_code == 0
    measured_only = dict(results.environment, gpu={"name": "NVIDIA Prototype"})
    measured_only = write_results(tmp_path / "measured_only.json", measured_only, results.rows)
    doc = json.loads(run(str(measured_only), "--out", str(out), "--json").stdout)
    assert [c["name"] for c in doc["roof"]["ceilings"]] == ["copy", "L2", "FP32", "BF16"]


@pytest.mark.parametrize("content", ["truncated", "garbage", "foreign", "bad-row"])
def test_roofline_rejects_a_corrupt_file_in_one_line(tmp_path, content):
    text = MEASURED.read_text()
    bad = tmp_path / "bad.json"
    if content == "truncated":
        bad.write_text(text[: len(text) // 2])
    elif content == "garbage":
        bad.write_bytes(b"\x00\x01 not json")
    elif content == "foreign":
        bad.write_text(json.dumps({"rows": []}))
    else:
        doc = json.loads(text)
        del doc["rows"][0]["variant"]
        bad.write_text(json.dumps(doc))
    line = one_error_line(run(str(bad), "--out", str(tmp_path / "x.html")))
    assert str(bad) in line
    assert not (tmp_path / "x.html").exists()


def test_roofline_refuses_bad_outputs_and_missing_files(tmp_path, monkeypatch):
    assert "unknown format" in one_error_line(run(str(MEASURED), "--out", str(tmp_path / "x.pdf")))
    assert "does not exist" in one_error_line(run(str(tmp_path / "missing.json")))
    (tmp_path / "file").write_text("")
    assert "cannot write" in one_error_line(run(str(MEASURED), "--out", str(tmp_path / "file" / "x.html")))
    results = load(MEASURED)
    failed = write_results(tmp_path / "failed.json", results.environment, [r for r in results.rows if r["status"] == "failed"])
    assert "no row with a time to plot in failed" in one_error_line(run(str(failed), "--out", str(tmp_path / "x.html")))
    monkeypatch.setattr(rl_fig, "find_chrome", lambda: None)
    line = one_error_line(run(str(MEASURED), "--out", str(tmp_path / "x.png")))
    if importlib.util.find_spec("kaleido") is None:
        # A machine without kaleido (the GPU machine here) is told that first.
        assert "need kaleido" in line and "pip install kaleido" in line
    else:
        assert "Chrome or Chromium" in line and "apt-get install chromium" in line
    assert not (tmp_path / "x.png").exists()


def test_roofline_default_input(tmp_path, monkeypatch):
    import replayssm_cli.report.results as results_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results_module, "reference_files", lambda: [])
    line = one_error_line(run())
    assert "./runs/" in line and "replayssm profile" in line

    shipped = [tmp_path / "h200-a.json", tmp_path / "h200-b.json"]
    for src, dst in zip((MEASURED, AFTER), shipped):
        shutil.copy(src, dst)
    monkeypatch.setattr(results_module, "reference_files", lambda: shipped)
    result = run("--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    # The newer file (AFTER) measured 8 of the older one's 17 configurations again: each is plotted once, with
    # its newer time (one of the 17 has no time to plot).
    assert len(doc["points"]) == 16 and {p["file"] for p in doc["points"]} == {"reference profile"}
    after = {(r["variant"], r["batch"], r["phase"]): r["us"] for r in json.loads(AFTER.read_text())["rows"]}
    plotted = {(p["variant"], p["batch"], p["phase"]): p["us"] for p in doc["points"]}
    assert all(plotted[k] == pytest.approx(us) for k, us in after.items())
    assert (tmp_path / "roofline.html").is_file()

    assert "plotting the shipped H200 reference profile (2 files: h200-a.json, h200-b.json)" in " ".join(result.stderr.split())
    assert {p["provenance"] for p in doc["points"]} >= {"h200-b.json (NVIDIA H200, 2026-11-22, abc123def456)"}

    runs = tmp_path / "runs"
    runs.mkdir()
    shutil.copy(PREDICTED, runs / "20261120-h200.json")
    result = run("--json")
    doc = json.loads(result.stdout)
    assert {p["file"] for p in doc["points"]} == {"20261120-h200"} and {p["source"] for p in doc["points"]} == {"predicted"}
    assert "plotting runs/20261120-h200.json: predicted, the newest results file in ./runs/ (none there is measured)" in (
        " ".join(result.stderr.split()))

    # A measured file older than the predicted one is plotted, the predicted one skipped in one line; a temporary
    # file a killed run left behind is never picked.
    shutil.copy(MEASURED, runs / "20261119-h200.json")
    os.utime(runs / "20261119-h200.json", (1, 1))
    (runs / ".tmp-abc.json").write_text('{"kind": "replayssm-res')
    result = run("--json")
    assert result.exit_code == 0, result.output
    assert {p["file"] for p in json.loads(result.stdout)["points"]} == {"20261119-h200"}
    lines = result.stderr.splitlines()
    assert sum("skipping 1 newer predicted file(s) in ./runs/ (20261120-h200.json)" in line for line in lines) == 1
    assert "plotting runs/20261119-h200.json (the newest measured results file in ./runs/)" in " ".join(result.stderr.split())
    result = run(str(runs / "20261120-h200.json"), "--json")
    assert result.stderr.splitlines()[0] == f"plotting {runs / '20261120-h200.json'}"


def test_roofline_imports_no_torch():
    code = (
        "import sys; from replayssm_cli.report import roofline as rl; from replayssm_cli.commands import roofline; "
        f"files = rl.load_files([{str(MEASURED)!r}]); p = rl.place(files, rl.roof_for(files[0][1])); "
        "from replayssm_cli.report import roofline_figure; roofline_figure.build_figure(p); "
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NO_CHROMIUM = "needs Debian's chromium (.ci/run installs it with apt-get; on a machine without apt-get this test skips)"
# Where a run keeps what it rendered, for a person to look at afterwards.
ARTIFACTS = Path(os.environ.get("REPLAYSSM_ARTIFACTS", Path(__file__).resolve().parent.parent / "artifacts"))
# Records every error the page raises, then (once the figure is drawn) writes what plotly drew into the DOM.
PROBE_HEAD = (
    "<script>window.__errors = [];"
    "addEventListener('error', e => __errors.push(String(e.message)));"
    "addEventListener('unhandledrejection', e => __errors.push(String(e.reason)));</script>"
)
PROBE_BODY = """<script>
setTimeout(function () {
  var gd = document.getElementById('replayssm-roofline'), out = {errors: window.__errors};
  if (gd && gd.data) {
    out.traces = gd.data.map(function (t) { var m = t.meta || {}; return {role: m.role, over: m.over, count: m.count,
      n: (t.x || []).length, labels: m.labels, text: m.role === 'arrow-labels' ? t.text : undefined}; });
    out.svg = Array.prototype.map.call(document.querySelectorAll('.main-svg text'), function (t) { return t.textContent; });
    out.markers = document.querySelectorAll('.scatterlayer .point').length;
    out.plot = [gd._fullLayout.xaxis._length, gd._fullLayout.yaxis._length];
    out.bars = document.querySelectorAll('.barlayer .point').length;
  }
  var pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}, 200);
</script>"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium with the flags this machine's closed network needs, in a fresh profile."""
    return subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--virtual-time-budget=3000", *args,
        ],
        capture_output=True, text=True, timeout=180, check=True,
    )


def probe(tmp_path: Path, page: Path) -> dict:
    """What the page drew and the errors it raised, read back from the DOM Chromium dumps."""
    import html as html_module

    probed = page.with_name(page.stem + "-probe.html")
    text = page.read_text(encoding="utf-8").replace("<head>", "<head>" + PROBE_HEAD, 1)
    probed.write_text(text.replace("</body>", PROBE_BODY + "</body>"), encoding="utf-8")
    dom = chromium(tmp_path, "--dump-dom", probed.as_uri()).stdout
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    return json.loads(html_module.unescape(dom[start : dom.index("</pre>", start)]))


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_roofline_page_renders_in_headless_chromium(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "reference.html"
    assert run("--out", str(page)).exit_code == 0
    data, layout = figure(page)
    seen = probe(tmp_path, page)
    assert seen["errors"] == []
    # The figure the browser holds is the one written: every trace, its arrows and labels, drawn.
    assert [t["role"] for t in seen["traces"]] == [(t.get("meta") or {}).get("role") for t in data]
    drawn = {t["over"]: t for t in seen["traces"] if t["role"] == "arrows"}
    assert {over: t["labels"] for over, t in drawn.items()} == {t["meta"]["over"]: t["meta"]["labels"] for t in traces(data, "arrows")}
    assert "0.82x" in drawn["snapshots"]["labels"] and "3.05x" in drawn["snapshots"]["labels"]
    shown = next(t for t in seen["traces"] if t["role"] == "arrow-labels")["text"]
    assert shown and all(label in seen["svg"] for label in shown)
    for words in ("copy 4.24 TB/s (measured)", "batch size", "ITL, ms per decode step", "1.0x: as fast as its baseline",
                  "arithmetic intensity, FLOP per byte (modelled bytes)", "variant (colour)", "share of the step"):
        assert any(words in t for t in seen["svg"]), words
    e2e_bars = sum(len(t["x"][0]) for t in traces(data, "e2e"))
    assert seen["markers"] >= sum(len(t["x"]) for t in traces(data, "points")) and seen["bars"] == e2e_bars > 0
    # The panel is the size the arrows were fitted to, so that they end at the markers' edges.
    margin = rl_fig.MARGIN
    assert seen["plot"] == [rl_fig.WIDTH - margin["l"] - margin["r"], rl_fig.PANEL_PX["roofline"]]
    # The probe itself catches an error a page raises.
    broken = tmp_path / "broken.html"
    broken.write_text("<html><head></head><body><script>setTimeout(function () { null.f(); }, 0);</script></body></html>")
    assert "null" in probe(tmp_path, broken)["errors"][0]

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "roofline-chromium.png"
    chromium(tmp_path, f"--window-size={layout['width']},{layout['height']}", f"--screenshot={shot}", page.as_uri())
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", png[16:24]) == (layout["width"], layout["height"])
    # A blank page compresses to a few kB; the drawn figure does not.
    assert len(png) > 100_000
    print(f"screenshot: {shot}")


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_roofline_png_goes_through_the_same_chromium(tmp_path, monkeypatch):
    monkeypatch.delenv("BROWSER_PATH", raising=False)
    assert Path(rl_fig.find_chrome()).resolve() == Path(CHROMIUM).resolve()
    out = tmp_path / "m.png"
    result = run(str(MEASURED), "--out", str(out))
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    width, height = struct.unpack(">II", data[16:24])
    layout = figure_layout(MEASURED, tmp_path)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and (width, height) == (2 * layout["width"], 2 * layout["height"])


def figure_layout(path: Path, tmp_path: Path) -> dict:
    page = tmp_path / "layout.html"
    assert run(str(path), "--out", str(page)).exit_code == 0
    return figure(page)[1]


@pytest.mark.skipif(rl_fig.find_chrome() is None, reason="PNG/SVG through kaleido needs a Chrome or Chromium")
def test_roofline_writes_svg_through_kaleido(tmp_path):
    out = tmp_path / "f.svg"
    result = run(str(PREDICTED), "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.lstrip().startswith("<svg") and "ReplaySSM" in text and "HBM 4.80 TB/s (datasheet)" in text


def reference_run(tmp_path, monkeypatch, *args):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ref.html"
    result = run("--out", str(out), "--json", *args)
    assert result.exit_code == 0, result.output
    return result, out


def test_roofline_shipped_reference_chart_structure(tmp_path, monkeypatch):
    from replayssm_cli.report.results import reference_profiles

    result, out = reference_run(tmp_path, monkeypatch)
    data, layout = figure(out)
    assert layout["meta"]["panels"] == ["roofline", "speedup", "e2e"]
    assert {"legend", "legend2", "legend3"} <= set(layout)
    titles = {t.get("legendgrouptitle", {}).get("text") for t in data} - {None}
    assert {"ceilings", "arrows: speedup over", "variant (colour)", "preset (symbol)", "batch size (marker size)",
            "share of the step"} <= titles
    keys = {t["name"] for t in traces(data, "key")}
    assert {"batch 1", "batch 256", "whole-window average", "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"} <= keys
    # Each preset its own symbol, each variant its own colour.
    symbols = {t["meta"]["preset"]: {s for s in t["marker"]["symbol"]} for t in traces(data, "points")}
    assert len({frozenset(s) for s in symbols.values()}) == len(symbols) == 2
    colours = {}
    for t in traces(data, "points"):
        colours.setdefault(t["meta"]["variant"], set()).add(t["marker"]["color"])
    assert all(len(c) == 1 for c in colours.values()) and len({next(iter(c)) for c in colours.values()}) == len(colours)

    newest: dict[tuple, dict] = {}
    for results in reference_profiles("h200"):
        for r in results.rows:
            key = tuple(r.get(k) for k in ("kind", "op", "preset", "variant", "phase", "batch", "window", "state_dtype",
                                           "read_dtype", "io_dtype", "draft", "accepted", "tp", "flush", "source"))
            newest.setdefault(key, r)
    rows = [r for r in newest.values() if r["kind"] == "kernel" and r["status"] == "ok" and r["phase"] == "avg"]
    snapshot = {(r["preset"], r["batch"], r["draft"], r["state_dtype"]): r for r in rows if r["variant"] == "spec-conventional"}
    spec = [r for r in rows if r["variant"] == "spec-replay"]
    by_over = arrows(data)
    meta = by_over["snapshots"]["meta"]
    assert meta["pairs"] == len(spec) > 0
    labelled = dict(zip(meta["points"], meta["labels"]))
    for r in spec:
        base = snapshot[(r["preset"], r["batch"], r["draft"], r["state_dtype"])]
        assert labelled[rl.describe(r)] == f"{base['us_per_token'] / r['us_per_token']:.2f}x"
    assert labelled["nemotron-3-super-120b-a12b spec-replay B1 W16 fp32 T2 avg"] == "0.82x"
    assert labelled["nemotron-3-super-120b-a12b spec-replay B256 W16 fp32 T4 avg"] == "3.05x"
    replays = [r for r in rows if r["variant"] in ("replay", "split")]
    assert by_over["conventional"]["meta"]["pairs"] + by_over["fp32-conventional"]["meta"]["pairs"] == len(replays)
    assert sum(t["meta"]["count"] for t in by_over.values()) <= sum(t["meta"]["pairs"] for t in by_over.values())
    speedups = json.loads(result.stdout)["speedups"]
    assert {s["speedup_over"] for s in speedups} == {"conventional", "fp32-conventional", "snapshots"}
    # The speedup panel draws every pair; its 1.0x line is marked.
    assert sum(len(t["x"]) for t in traces(data, "speedup")) == len(speedups)
    assert any(s.get("y0") == 1.0 and s.get("yref") == "y2" for s in layout["shapes"])
    one = next(a for a in layout["annotations"] if a.get("name") == "one-x")
    assert one["y"] == 0 and one["yref"] == "y2" and one["text"].startswith("1.0x")
    # Labels drawn are among the arrows' labels and never overlap one another.
    drawn = traces(data, "arrow-labels")[0]
    assert set(drawn["text"]) <= {lab for t in by_over.values() for lab in t["meta"]["labels"]} and drawn["text"]
    bars = traces(data, "e2e")
    e2e = [r for r in newest.values() if r["kind"] == "e2e" and r["status"] == "ok"]
    assert len(bars) == 4 and len(bars[0]["x"][0]) == len(e2e) > 0 and set(bars[0]["x"][1]) == {"conventional", "ReplaySSM"}
    # Where the data are: about two decades of each axis, not the whole roof's.
    assert layout["xaxis"]["range"][1] - layout["xaxis"]["range"][0] < 2.0
    whole = layout["updatemenus"][0]["buttons"][1]["args"][0]
    assert whole["xaxis.range"][1] > math.log10(183)
    from replayssm_cli.report.results import reference_files

    shipped = sorted(f.name for f in reference_files() if f.name.startswith("h200-"))
    assert f"plotting the shipped H200 reference profile ({len(shipped)} files: {', '.join(shipped)})" in result.stderr
    # Every trace and layout key is one plotly knows (the figure is built without per-element validation).
    import plotly.graph_objects as go

    go.Figure({"data": data, "layout": layout})


def crafted_pair(tmp_path, **changes) -> Path:
    base = load(MEASURED)
    rows = [dict(r) for r in base.rows if r["batch"] == 256 and r["phase"] == "avg" and r["variant"] in ("spec-conventional", "spec-replay")]
    for r in rows:
        r.update(changes.get(r["variant"], {}))
    return write_results(tmp_path / "pair.json", base.environment, rows)


def test_roofline_arrow_reads_speedup_over():
    from replayssm_cli.report import roofline_figure as figure_mod

    base = load(MEASURED)
    roof = rl.roof_for(base)

    def pairs(**changes):
        rows = [dict(r) for r in base.rows if r["batch"] == 256 and r["phase"] == "avg" and r["variant"].startswith("spec")]
        for r in rows:
            r.update(changes.get(r["variant"], {}))
        placement = rl.place([("pair", load_rows(base, rows))], roof)
        return placement.pairs, arrows(figure_mod.build_figure(placement)["data"])

    (pair,), drawn = pairs(**{"spec-replay": {"speedup": 2.5, "speedup_over": "snapshots", "speedup_lo": 2.4, "speedup_hi": 2.6,
                                             "speedup_vs_decode": 5.0}})
    assert drawn["snapshots"]["meta"]["labels"] == ["2.50x"]
    assert (pair.speedup, pair.lo, pair.hi, pair.over) == (2.5, 2.4, 2.6, "snapshots")
    # A row that says its speedup is over something with no arrow (null: a baseline row) gets none.
    assert pairs(**{"spec-replay": {"speedup": 2.5, "speedup_over": None}}) == ([], {})


def test_roofline_roof_check_has_a_tolerance(tmp_path):
    base = load(MEASURED)
    conv = next(r for r in base.rows if r["variant"] == "conventional" and r["batch"] == 256)
    roof = rl.roof_for(base)
    at_copy = (conv["bytes_read"] + conv["bytes_written"]) / roof.memory.per_s * 1e6

    def placed(us: float, spread: float | None, **extra):
        row = dict(conv, us=us, spread=spread, **extra)
        return rl.place([("t", load_rows(base, [row]))], roof).points[0]

    # 0.04% above the roof with a 2% spread (and the ceiling's 2%): at the roof, not an error.
    noisy = placed(at_copy / 1.0004, 0.02)
    assert noisy.pct_of_roof == pytest.approx(100.04) and noisy.at_roof and not noisy.above_roof
    assert noisy.tolerance == pytest.approx(0.01 + rl.DEFAULT_CEILING_SPREAD)
    # The same point with quartiles recorded takes its spread from them.
    assert placed(at_copy / 1.0004, 0.02, x_us_p25=at_copy / 1.0004 / 1.05).tolerance == pytest.approx(0.05 + 0.02)
    # 4% above with a 0.2% spread: beyond its tolerance, a counting error.
    tight = placed(at_copy / 1.04, 0.002)
    assert tight.above_roof and not tight.at_roof
    placement = rl.place([("t", load_rows(base, [dict(conv, us=at_copy / 1.0004, spread=0.02)]))], roof)
    assert placement.warnings() == []
    placement = rl.place([("t", load_rows(base, [dict(conv, us=at_copy / 1.04, spread=0.002)]))], roof)
    (line,) = placement.warnings()
    assert "4.0% above the copy 4.25 TB/s (measured) roof (beyond its ±2.1% tolerance)" in line
    # A ceiling's own recorded spread is used where the file has one.
    env = dict(base.environment, ceilings=dict(base.environment["ceilings"], spread={"copy_gbs": 0.05}))
    assert rl.roof_for(type(base)(path=None, environment=env, spec={}, rows=[])).memory.spread == 0.05
    path = write_results(tmp_path / "near.json", base.environment, [dict(conv, us=at_copy / 1.0004, spread=0.02)])
    result = run(str(path), "--out", str(tmp_path / "n.html"))
    assert result.exit_code == 0 and "warning" not in result.stderr and "100.0 ≈" in result.stdout


@pytest.mark.parametrize("case", ["row-not-object", "string-time", "negative-time", "gpu-string", "deep"])
def test_roofline_malformed_results_file_is_one_line(tmp_path, case):
    doc = json.loads(MEASURED.read_text())
    if case == "row-not-object":
        doc["rows"][1] = [1, 2]
    elif case == "string-time":
        doc["rows"][0]["us"] = "fast"
    elif case == "negative-time":
        doc["rows"][0]["us"] = -3.0
    elif case == "gpu-string":
        doc["environment"]["gpu"] = "NVIDIA H200"
    bad = tmp_path / "bad.json"
    text = json.dumps(doc) if case != "deep" else '{"kind": "replayssm-results", "rows": ' + "[" * 200_000 + "]" * 200_000 + "}"
    bad.write_text(text)
    result = run(str(bad), "--out", str(tmp_path / "x.html"))
    if case == "gpu-string":
        assert result.exit_code == 0, result.output
        return
    line = one_error_line(result)
    assert str(bad) in line and "Traceback" not in result.output
    assert not (tmp_path / "x.html").exists()


def test_roofline_plotlyjs_modes(tmp_path):
    for mode, script in (("cdn", 'src="https://cdn.plot.ly/plotly-'), ("directory", 'src="plotly.min.js"')):
        out = tmp_path / mode / "r.html"
        result = run(str(MEASURED), "--out", str(out), "--plotlyjs", mode)
        assert result.exit_code == 0, result.output
        text = out.read_text()
        assert script in text and len(text) < 1_000_000
        assert (out.parent / "plotly.min.js").is_file() == (mode == "directory")
    assert run(str(MEASURED), "--plotlyjs", "web").exit_code == 2


def test_roofline_phase_option_draws_flush_points_ringed(tmp_path):
    out = tmp_path / "ph.html"
    assert run(str(MEASURED), "--out", str(out), "--phase", "all").exit_code == 0
    data, _ = figure(out)
    phases = {ph for t in traces(data, "points") for ph in t["meta"]["phase"]}
    assert phases == {"avg", "nonflush", "flush"}
    replay = next(t for t in traces(data, "points") if t["meta"]["variant"] == "replay")
    widths = dict(zip(replay["meta"]["phase"], replay["marker"]["line"]["width"]))
    assert widths["flush"] > widths["nonflush"] > widths["avg"]
    assert {"flush step (black ring)", "non-flush step (grey ring)"} <= {t["name"] for t in traces(data, "key")}
    assert run(str(MEASURED), "--out", str(out), "--phase", "flush").exit_code == 0
    assert {ph for t in traces(figure(out)[0], "points") for ph in t["meta"]["phase"]} == {"flush"}


def scaled_rows(n: int) -> list[dict]:
    """n kernel rows: the fixture's conventional/ReplaySSM pairs over many batch sizes and presets."""
    base = [r for r in load(MEASURED).rows if r["variant"] in ("conventional", "replay") and r["phase"] == "avg" and r.get("us")]
    rows = []
    i = 0
    while len(rows) < n:
        for r in base:
            rows.append(dict(r, batch=r["batch"] + 1000 * i, preset=f"p{i % 3}", us=r["us"] * (1 + 0.001 * i)))
        i += 1
    return rows[:n]


def test_roofline_is_linear_in_rows_one_trace_per_arrow_kind(tmp_path):
    from replayssm_cli.report import roofline_figure as figure_mod

    base = load(MEASURED)
    counts = {}
    for n in (80, 1600):
        placement = rl.place([("s", load_rows(base, scaled_rows(n)))], rl.roof_for(base))
        fig = figure_mod.build_figure(placement)
        data, layout = fig["data"], fig["layout"]
        arrow_traces = traces(data, "arrows")
        assert len(arrow_traces) == 1 and arrow_traces[0]["meta"]["pairs"] == n // 2
        counts[n] = (len(layout["annotations"]), len([t for t in data if t["meta"]["role"] != "speedup"]))
        (labels,) = traces(data, "arrow-labels")
        # Labels only where they can be read: a few among few points, none where markers cover the panel.
        assert (0 < len(labels["text"]) < n // 2) if n == 80 else len(labels["text"]) < n // 20
    assert counts[80] == counts[1600]


def test_roofline_measured_bytes_draw_dram_and_l2_points_per_kernel(tmp_path):
    shipped = Path(__file__).parent.parent / "profiles" / "reference" / "ncu" / "h200-profile-ncu-nemotron-b64.json"
    out = tmp_path / "h.html"
    result = run(str(shipped), "--bytes", "measured", "--out", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = {r["variant"]: r for r in json.loads(shipped.read_text())["rows"]}
    by = {(p["variant"], p["level"]): p for p in doc["points"]}
    assert set(by) == {(v, level) for v in rows for level in ("DRAM", "L2")}
    for variant, r in rows.items():
        dram, l2 = by[(variant, "DRAM")], by[(variant, "L2")]
        assert dram["bytes"] == r["x_ncu_bytes_read"] + r["x_ncu_bytes_written"] and l2["bytes"] == r["x_ncu_l2_bytes"]
        # One kernel, one attained rate: the levels differ in intensity only, each under its own roof.
        assert dram["flops_per_s"] == l2["flops_per_s"] == pytest.approx(r["x_ncu_flops"] / (r["us"] * 1e-6))
        assert (dram["roof"], l2["roof"]) == ("copy", "L2")
        l2_gbs = next(c["value"] for c in doc["roof"]["ceilings"] if c["name"] == "L2")
        assert l2["pct_of_roof"] == pytest.approx(100 * l2["gbs"] / l2_gbs)
    data, layout = figure(out)
    assert traces(data, "levels")[0]["meta"]["count"] == 2
    l2_points = [t for t in traces(data, "points") if t["meta"]["level"] == "L2"]
    assert l2_points and all(s.endswith("-open-dot") for t in l2_points for s in t["marker"]["symbol"])
    assert layout["xaxis"]["title"]["text"].endswith("(measured bytes)")
    assert "L2 bytes (dotted ring)" in {t["name"] for t in traces(data, "key")}
    assert "L2, ncu" in run(str(shipped), "--bytes", "measured", "--out", str(out)).stdout


def test_roofline_arrows_run_from_marker_edge_to_marker_edge():
    from replayssm_cli.report import roofline_figure as figure_mod

    base = load(MEASURED)
    placement = rl.place([("m", base)], rl.roof_for(base))
    fig = figure_mod.build_figure(placement)
    layout = fig["layout"]
    frame = figure_mod.Frame(tuple(layout["xaxis"]["range"]), tuple(layout["yaxis"]["range"]),
                             figure_mod.WIDTH - figure_mod.MARGIN["l"] - figure_mod.MARGIN["r"], figure_mod.PANEL_PX["roofline"])
    by_label = {describe_pair(p): p for p in placement.pairs}
    checked = 0
    for t in traces(fig["data"], "arrows"):
        drawn = [p for p in placement.pairs if p.over == t["meta"]["over"]]
        for i, pair in enumerate(drawn):
            tail = frame.px(t["x"][3 * i], t["y"][3 * i])
            head = frame.px(t["x"][3 * i + 1], t["y"][3 * i + 1])
            base_c = frame.px(pair.base.intensity, pair.base.flops_per_s)
            point_c = frame.px(pair.point.intensity, pair.point.flops_per_s)
            assert math.dist(tail, base_c) == pytest.approx(figure_mod.marker_size(pair.base.row["batch"]) / 2 + 0.3 + 1)
            assert math.dist(head, point_c) == pytest.approx(figure_mod.marker_size(pair.point.row["batch"]) / 2 + 0.3 + 1)
            checked += 1
    assert checked == len(by_label) > 0


def describe_pair(pair) -> str:
    return rl.describe(pair.base.row) + " -> " + rl.describe(pair.point.row)


def test_roofline_pairs_a_stochastically_rounded_step_with_its_own_conventional_step():
    base = load(MEASURED)
    roof = rl.roof_for(base)
    avg = [dict(r) for r in base.rows if r["batch"] == 256 and r["phase"] == "avg" and r["variant"] in ("conventional", "replay")
           and r["state_dtype"] == "fp32" and not r.get("read_dtype")][:2]
    assert {r["variant"] for r in avg} == {"conventional", "replay"}
    rows = []
    for rounding, slower in (("nearest", 1.0), ("stochastic", 1.02)):
        for r in avg:
            over = "conventional" if r["variant"] == "replay" else None
            rows.append({**r, "state_dtype": "bf16", "rounding": rounding, "us": r["us"] * slower,
                         "us_per_token": r["us_per_token"] * slower, "speedup": None, "speedup_over": over})
    placement = rl.place([("sr", load_rows(base, rows))], roof)
    by = {p.point.row["rounding"]: p for p in placement.pairs}
    assert set(by) == {"nearest", "stochastic"}
    assert by["stochastic"].base.row["rounding"] == "stochastic" and by["nearest"].base.row["rounding"] == "nearest"
    assert "bf16/SR" not in rl.describe(by["stochastic"].point.row) and "bf16 SR" in rl.describe(by["stochastic"].point.row)
