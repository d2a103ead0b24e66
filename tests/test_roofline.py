"""`replayssm roofline`: ceilings, classification, the figure read back from its HTML, rendering in Chromium."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from replayssm_cli import roofline as rl
from replayssm_cli.main import app
from replayssm_cli.results import ResultsWriter, load

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

    rows = load(MEASURED).rows
    ok = [r for r in rows if r["status"] == "ok"]
    points = traces(data, "points")
    assert {t["meta"]["variant"] for t in points} == {r["variant"] for r in ok}
    assert sum(len(t["x"]) for t in points) == len(ok)
    colours = [t["marker"]["color"] for t in points]
    assert len(set(colours)) == len(colours)
    for t in points:
        row_of = {(r["variant"], r["batch"], r["phase"]): r for r in ok if r["variant"] == t["meta"]["variant"]}
        sizes = dict(zip(t["meta"]["batch"], t["marker"]["size"]))
        assert [sizes[b] for b in sorted(sizes)] == sorted(sizes.values())
        assert all(not s.endswith("-open") for s in t["marker"]["symbol"])
        for x, y, hover in zip(t["x"], t["y"], t["hovertext"]):
            match = [r for r in row_of.values() if close(x, r["intensity"]) and close(y, r["flops_per_s"])]
            assert len(match) == 1
            for key, value in match[0].items():
                if value is not None:
                    assert f"{key}: " in hover

    arrows, arrow_labels = annotations(layout, "speedup-arrow"), annotations(layout, "speedup-label")
    replays = [r for r in ok if r["variant"] in ("replay", "spec-replay") and r["phase"] == "avg"]
    assert len(arrows) == len(arrow_labels) == len(replays) == 5
    assert sorted(a["text"] for a in arrow_labels) == sorted(f"{r['speedup']:.2f}x" for r in replays)
    for r in replays:
        head = [a for a in arrows if close(a["x"], math.log10(r["intensity"])) and close(a["y"], math.log10(r["flops_per_s"]))]
        base = next(c for c in ok if c["variant"] == r["variant"].replace("replay", "conventional") and c["batch"] == r["batch"])
        assert len(head) == 1 and close(head[0]["ax"], math.log10(base["intensity"]))

    bandwidth = traces(data, "bandwidth")
    assert bandwidth and all(t["yaxis"] == "y2" for t in bandwidth)
    conv = next(t for t in bandwidth if t["meta"]["variant"] == "conventional")
    assert conv["x"] == [1, 16, 64, 256]
    assert conv["y"] == pytest.approx([100 * r["gbs"] / 4250 for r in ok if r["variant"] == "conventional"])
    assert not traces(data, "e2e")
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"


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
    labels = annotations(layout, "speedup-label")
    assert len(labels) == 4 and all(a["text"].endswith("x pred.") for a in labels)
    assert all(t["line"]["dash"] == "dash" for t in traces(data, "bandwidth"))


def test_roofline_overlays_before_and_after(tmp_path):
    out = tmp_path / "ba.html"
    result = run(str(MEASURED), str(AFTER), "--out", str(out))
    assert result.exit_code == 0, result.output
    data, _ = figure(out)
    files = {t["meta"]["file"] for t in traces(data, "points")}
    assert files == {"results_h200_measured", "results_h200_after"}
    symbols = {t["meta"]["file"]: t["marker"]["symbol"][0] for t in traces(data, "points")}
    assert symbols["results_h200_measured"] != symbols["results_h200_after"]
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
    assert bars[0]["y"] == pytest.approx([40.0, 40.0, 25.0, 25.0])
    assert [sum(t["y"][i] for t in bars) for i in range(4)] == pytest.approx([100.0] * 4)
    assert layout["barmode"] == "stack"
    colours = {t["meta"]["variant"]: t["marker"]["color"] for t in traces(data, "points") if t["meta"]["file"] == "crafted"}
    assert colours["baseline:vllm"] != colours["baseline:flashinfer"]
    assert colours["baseline:vllm"] not in {c for _, c in rl.VARIANT_STYLE.values()}

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
    from replayssm_cli import gpus

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
    monkeypatch.setattr(rl, "find_chrome", lambda: None)
    line = one_error_line(run(str(MEASURED), "--out", str(tmp_path / "x.png")))
    if importlib.util.find_spec("kaleido") is None:
        # A machine without kaleido (the GPU machine here) is told that first.
        assert "need kaleido" in line and "pip install kaleido" in line
    else:
        assert "Chrome or Chromium" in line and "apt-get install chromium" in line
    assert not (tmp_path / "x.png").exists()


def test_roofline_default_input(tmp_path, monkeypatch):
    import replayssm_cli.results as results_module

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

    (tmp_path / "runs").mkdir()
    shutil.copy(PREDICTED, tmp_path / "runs" / "20261120-h200.json")
    doc = json.loads(run("--json").stdout)
    assert {p["file"] for p in doc["points"]} == {"20261120-h200"} and {p["source"] for p in doc["points"]} == {"predicted"}


def test_roofline_imports_no_torch():
    code = (
        "import sys; from replayssm_cli import roofline as rl; from replayssm_cli.commands import roofline; "
        f"files = rl.load_files([{str(MEASURED)!r}]); p = rl.place(files, rl.roof_for(files[0][1])); rl.build_figure(p); "
        "bad = [m for m in ('torch', 'triton') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def png_pixels(data: bytes) -> list[tuple[int, int, int]]:
    """Decode an 8-bit RGB or RGBA, non-interlaced PNG into its (r, g, b) pixels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    pixels, prev = [], bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.extend(tuple(line[i : i + 3]) for i in range(0, stride, bpp))
        prev = line
    return pixels


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package for a headless render")
def test_roofline_page_renders_in_headless_chromium(tmp_path):
    out = tmp_path / "r.html"
    assert run(str(MEASURED), "--out", str(out)).exit_code == 0
    shot = tmp_path / "r.png"
    subprocess.run(
        [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars", "--window-size=900,700", "--force-device-scale-factor=0.5",
            "--virtual-time-budget=5000", f"--screenshot={shot}", out.as_uri(),
        ],
        check=True, capture_output=True, timeout=120,
    )
    pixels = png_pixels(shot.read_bytes())
    white = sum(1 for p in pixels if p == (255, 255, 255))
    assert len(set(pixels)) > 50 and white < 0.97 * len(pixels)
    # The ReplaySSM points (#F58518, drawn at 0.9 opacity over white) are on the page, not only axes and text.
    orange = sum(1 for r, g, b in pixels if abs(r - 246) < 16 and abs(g - 145) < 20 and abs(b - 47) < 28)
    assert orange > 20


@pytest.mark.skipif(rl.find_chrome() is None, reason="PNG/SVG through kaleido needs a Chrome or Chromium")
def test_roofline_writes_svg_through_kaleido(tmp_path):
    out = tmp_path / "f.svg"
    result = run(str(PREDICTED), "--out", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.lstrip().startswith("<svg") and "ReplaySSM" in text and "HBM 4.80 TB/s (datasheet)" in text
