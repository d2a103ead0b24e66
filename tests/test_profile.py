"""`replayssm profile`: the predicted profile without a GPU, the measured path through a stand-in runner, interruptions, bad options."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from replayssm_cli.measure import bench
from replayssm_cli.model.gpus import load_gpu
from replayssm_cli.measure import grid
from replayssm_cli.measure import timing
from replayssm_cli.report import profile_table
from replayssm_cli.measure import profile as prof
from replayssm_cli.model import presets
from replayssm_cli.main import app
from replayssm_cli.report.results import load, schema_errors

SUPER, QWEN = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"
FIXTURES = Path(__file__).parent / "fixtures"
CEILINGS = SimpleNamespace(copy_gbs=4250.0, read_gbs=4130.0, fp32_tflops=65.6, bf16_tflops=700.0, tf32_tflops=None,
                           l2_gbs=None, source="measured", measured_at=None, driver="570", gpu_name="NVIDIA H200")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def invoke(*args: str):
    return CliRunner().invoke(app, ["profile", *args])


def test_predicted_batch_past_the_gpus_memory_is_skipped_with_what_fits(tmp_path, no_cuda):
    """Where a measured run would be out of memory, a predicted one says so instead of predicting a time."""
    out = tmp_path / "p.json"
    res = invoke("--preset", SUPER, "--batch", "64,500000", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["batch"] for r in rows} == {64}
    got = load(out)
    assert [s["what"] for s in got.skipped] == [f"{SUPER} conventional B500000 fp32", f"{SUPER} replay B500000 W16 fp32"]
    per_seq = {r["variant"]: r["mem_per_seq"] for r in rows if r["phase"] == "avg"}
    memory = int(load_gpu("h200").memory_gib * 2**30)
    for s in got.skipped:
        variant = s["what"].split()[1]
        assert s["why"].startswith("does not fit on the h200"), s["why"]
        assert f"at most {memory // per_seq[variant]:,} sequences" in s["why"], s["why"]
        assert f"all 40 SSM layers hold {memory // (per_seq[variant] * 40):,}" in s["why"]


def test_profile_predicted_without_gpu(tmp_path, no_cuda):
    out = tmp_path / "p.json"
    res = invoke("--preset", SUPER, "--preset", QWEN, "--batch", "1,256", "--draft", "2", "--read-dtype", "bf16", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert "no CUDA GPU" in res.stderr.splitlines()[0]
    rows = json.loads(res.stdout)
    assert all(r.pop("x_provenance").startswith("predicted (calibrated on H200, ±") for r in rows)
    got = load(out)
    assert got.complete and got.rows == rows
    assert schema_errors(json.loads(out.read_text())) == [], "a predicted profile conforms to the shipped schema"
    assert got.environment["gpu"]["key"] == "h200" and got.spec["mode"] == "predicted"
    assert {r["source"] for r in rows} == {"predicted"} and {r["preset"] for r in rows} == {SUPER, QWEN}
    # Per preset and batch: conventional, replay x3 phases, split x3, spec-conventional, spec-replay.
    assert len(rows) == 2 * 2 * 9
    for r in rows:
        assert r["us"] > 0 and r["gbs"] > 0 and r["mem_per_seq"] > 0 and r["seqs_fit"] > 0
        assert (r["speedup"] is None) == (r["variant"] in ("conventional", "spec-conventional"))
    big = {(r["preset"], r["variant"], r["phase"]): r for r in rows if r["batch"] == 256}
    assert big[SUPER, "replay", "avg"]["speedup"] > 1.3, "ReplaySSM moves fewer bytes: predicted faster at batch 256"
    assert big[SUPER, "split", "avg"]["speedup"] > big[SUPER, "replay", "avg"]["speedup"]
    assert big[SUPER, "replay", "avg"]["x_flush_cost_us"] > 0 and 0 < big[SUPER, "replay", "avg"]["x_flush_share"] < 1
    spec, snap = big[SUPER, "spec-replay", "avg"], big[SUPER, "spec-conventional", "avg"]
    assert spec["speedup_over"] == "snapshots" and spec["speedup"] == pytest.approx(snap["us_per_token"] / spec["us_per_token"])
    assert spec["speedup_vs_decode"] == pytest.approx(big[SUPER, "conventional", "avg"]["us_per_token"] / spec["us_per_token"])
    assert snap["speedup"] is None and snap["speedup_over"] is None and snap["speedup_vs_decode"] > 0
    assert big[SUPER, "split", "avg"]["speedup_over"] == "fp32-conventional"
    assert big[SUPER, "replay", "avg"]["speedup_over"] == "conventional" and big[SUPER, "conventional", "avg"]["speedup_over"] is None
    layers = presets.resolve(SUPER, 1).ssm_layers
    assert all(r["mem_per_seq_model"] == r["mem_per_seq"] * layers for r in rows if r["preset"] == SUPER)
    assert big[SUPER, "spec-replay", "avg"]["accepted"] == pytest.approx(0.8 + 0.8**2)


def test_profile_predicted_defaults_table(tmp_path, no_cuda, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = invoke("--gpu", "b200")
    assert res.exit_code == 0, res.output
    files = list((tmp_path / "runs").glob("*-b200.json"))
    assert len(files) == 1
    got = load(files[0])
    assert {r["batch"] for r in got.rows} == {1, 16, 64, 256}
    assert {r["preset"] for r in got.rows} == {SUPER, QWEN}
    assert "predicted" in res.stdout and SUPER in res.stdout and re.search(r"\d\.\d\dx", res.stdout)


def test_profile_require_gpu_is_one_line(no_cuda, tmp_path):
    res = invoke("--require-gpu", "--out", str(tmp_path / "x.json"))
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "--require-gpu" in res.stderr
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--preset", "no-such-model"], "no-such-model"),
        (["--window", "0"], "--window 0"),
        (["--window", "65"], "--window 65"),
        (["--batch=-5"], "--batch -5"),
        (["--batch", "0,16"], "--batch 0"),
        (["--batch", "many"], "--batch 'many'"),
        (["--state-dtype", "fp4"], "--state-dtype 'fp4'"),
        (["--state-dtype", "fp32", "--stochastic-rounding"], "an fp32 state is stored exactly"),
        (["--read-dtype", "int4"], "--read-dtype 'int4'"),
        (["--io-dtype", "fp64"], "--io-dtype 'fp64'"),
        (["--draft", "9"], "--draft 9"),
        (["--draft", "2,4", "--accept-dist", "1,1,1"], "--accept-dist"),
        (["--accept-rate", "1.5"], "--accept-rate"),
        (["--tp", "3"], "tp"),
    ],
    ids=["unknown-preset", "window-0", "window-65", "negative-batch", "zero-batch", "batch-word", "state-fp4", "stochastic-fp32",
         "read-int4", "io-fp64", "draft-9", "dist-two-drafts", "rate-1.5", "tp-3"],
)
def test_profile_bad_options_exit_with_one_line(tmp_path, no_cuda, args, words):
    res = invoke(*args, "--out", str(tmp_path / "x.json"))
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert words in lines[0] and "Traceback" not in res.output
    assert not (tmp_path / "x.json").exists()


def fake_runner(fail: set[str] = frozenset(), oom_batch: int | None = None, interrupt_at: int | None = None, noisy: str | None = None):
    """A stand-in for bench.run_point: per-step samples from a made-up timing model, no GPU."""
    calls = []

    def run(point, context):
        calls.append(point.label())
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        if point.batch == oom_batch:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        if point.variant in fail:
            return [{"phase": "avg", "ok": False, "layers": 3, "check_max_err": 0.4, "tolerance": 2e-3, "error": "max relative error"}]
        base = 2.0 + point.batch * 2.2
        factor = {"conventional": 1.0, "replay": 0.6, "split": 0.4, "spec-conventional": 1.6, "spec-replay": 0.9}[point.variant]
        rng = random.Random(point.batch)
        spread = 0.3 if point.variant == noisy else 0.01

        def samples(us):
            return [us * (1 + spread * (rng.random() - 0.5)) for _ in range(20)]

        common = {"ok": True, "layers": 3, "check_max_err": 1e-4, "tolerance": 2e-3}
        out = [{"phase": "avg", "samples_us": samples(base * factor), "steps": 32, "repeats": 20,
                "accepted": 1.5 if point.draft else None, **common}]
        for phase in grid.point_phases(point)[1:]:
            us = base * (0.5 if phase == "nonflush" else 1.05)
            out.append({"phase": phase, "samples_us": samples(us), "steps": 1, "repeats": 20, **common})
        return out

    run.calls = calls
    return run


@pytest.fixture
def measured(monkeypatch):
    """Run the measured path of the command with a stand-in runner (set with .runner = ...)."""

    def setup(gpu, spec):
        return {"environment": {"gpu": {"name": "NVIDIA H200", "driver": "570"}, "mode": "measured"}, "ceilings": CEILINGS,
                "free_bytes": 100 * 2**30, "gpu_key": "h200", "gpu_name": "NVIDIA H200", "context": {}}

    monkeypatch.setattr(prof, "detect_mode", lambda require_gpu: "measured")
    monkeypatch.setattr(prof, "measured_setup", setup)

    def use(runner):
        monkeypatch.setattr(bench, "run_point", runner)
        return runner

    return use


def test_profile_measured_rows(tmp_path, measured):
    measured(fake_runner(noisy="split"))
    out = tmp_path / "m.json"
    res = invoke("--preset", SUPER, "--batch", "1,64", "--read-dtype", "bf16", "--draft", "3", "--out", str(out))
    assert res.exit_code == 0, res.output
    got = load(out)
    assert got.complete and {r["source"] for r in got.rows} == {"measured"}
    assert schema_errors(json.loads(out.read_text())) == [], "a measured profile conforms to the shipped schema"
    by = {(r["variant"], r["phase"], r["batch"]): r for r in got.rows}
    conv, rep = by["conventional", "avg", 64], by["replay", "avg", 64]
    assert conv["us"] == pytest.approx(statistics_median(conv["x_samples_us"]), rel=1e-3)
    assert conv["us_p50"] <= conv["us_p95"] <= conv["us_p99"]
    assert rep["speedup"] == pytest.approx(conv["us_per_token"] / rep["us_per_token"])
    assert rep["speedup_lo"] <= rep["speedup"] <= rep["speedup_hi"]
    assert rep["gbs"] == pytest.approx((rep["bytes_read"] + rep["bytes_written"]) / rep["us"] / 1e3)
    assert rep["pct_copy_bw"] == pytest.approx(100 * rep["gbs"] / CEILINGS.copy_gbs)
    flush, nonflush = by["replay", "flush", 64], by["replay", "nonflush", 64]
    assert rep["x_flush_cost_us"] == pytest.approx(flush["us"] - nonflush["us"])
    assert rep["x_flush_share"] == pytest.approx(rep["x_flush_cost_us"] / 16 / rep["us"])
    assert nonflush["flush"] == "aligned" and nonflush["x_fill"] == 7 and flush["x_fill"] == 15
    spec = by["spec-replay", "avg", 64]
    accepted = 0.8 + 0.8**2 + 0.8**3
    assert spec["accepted"] == pytest.approx(accepted) and spec["x_accepted_drawn"] == 1.5
    assert spec["us_per_token"] == pytest.approx(spec["us"] / (accepted + 1))
    assert "not timed" in by["spec-conventional", "avg", 64]["x_note"]
    assert spec["speedup"] == pytest.approx(by["spec-conventional", "avg", 64]["us_per_token"] / spec["us_per_token"])
    assert spec["speedup_over"] == "snapshots" and spec["speedup_vs_decode"] > spec["speedup"]
    assert by["split", "avg", 64]["spread"] > profile_table.NOISY_SPREAD
    assert "noisy" in res.stdout


def statistics_median(values):
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def test_profile_interrupted_keeps_finished_rows(tmp_path, measured):
    runner = measured(fake_runner(interrupt_at=3))
    out = tmp_path / "i.json"
    res = invoke("--preset", SUPER, "--batch", "1,16", "--out", str(out))
    assert res.exit_code == 130
    got = load(out)
    assert not got.complete
    assert [(r["variant"], r["phase"], r["batch"]) for r in got.rows] == [
        ("conventional", "avg", 1), ("replay", "avg", 1), ("replay", "nonflush", 1), ("replay", "flush", 1),
    ]
    assert [s["what"] for s in got.skipped] == runner.calls[2:] + [f"{SUPER} replay B16 W16 fp32"]
    assert all(s["why"] == "not run: interrupted" for s in got.skipped)
    assert "interrupted" in res.stderr


def test_profile_out_of_memory_is_skipped(tmp_path, measured):
    measured(fake_runner(oom_batch=256))
    out = tmp_path / "o.json"
    res = invoke("--preset", SUPER, "--batch", "1,256,16", "--out", str(out))
    assert res.exit_code == 0, res.output
    got = load(out)
    assert got.complete and {r["batch"] for r in got.rows} == {1, 16}
    assert {s["why"] for s in got.skipped} == {"out of memory at batch 256"} and len(got.skipped) == 2
    stderr = " ".join(res.stderr.split())
    assert "out of memory at batch 256" in stderr and "largest batch that fit" in stderr
    assert f"{SUPER} replay: 16" in stderr


def test_profile_failed_check_is_not_timed(tmp_path, measured):
    measured(fake_runner(fail={"replay"}))
    out = tmp_path / "f.json"
    res = invoke("--preset", SUPER, "--batch", "16", "--read-dtype", "bf16", "--out", str(out), "--json")
    assert res.exit_code == 1
    rows = json.loads(res.stdout)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 1 and failed[0]["variant"] == "replay" and failed[0]["phase"] == "avg"
    assert failed[0]["us"] is None and failed[0]["speedup"] is None and failed[0]["check_max_err"] == 0.4
    assert any(r["variant"] == "split" and r["status"] == "ok" and r["speedup"] for r in rows)
    assert "failed its check" in " ".join(res.stderr.split())
    assert load(out).complete


def test_run_grid_predicted_library(tmp_path):
    from replayssm_cli.report.results import ResultsWriter

    spec = grid.ProfileSpec(presets=(QWEN,), batches=(64,), windows=(8, 32), state_dtypes=("bf16",), phases=False)
    spec.validate()
    pre = presets.resolve(QWEN)
    points = grid.plan(spec, [pre])
    assert [p.variant for p in points] == ["conventional", "replay", "replay"]
    writer = ResultsWriter(tmp_path / "r.json", {}, spec.to_dict())
    run = prof.run_grid(points, {pre.name: pre}, writer, mode="predicted", ceilings=CEILINGS, free_bytes=2**36, progress=False)
    assert run.results.complete and [r["window"] for r in run.results.rows] == [None, 8, 32]
    assert all(r["state_dtype"] == "bf16" and r["op"] == "gdn" for r in run.results.rows)


def test_accept_probs_and_stats():
    probs = grid.accept_probs(4, 0.9)
    assert sum(probs) == pytest.approx(1.0) and grid.mean_accepted(probs) == pytest.approx(0.9 + 0.81 + 0.729 + 0.6561)
    assert grid.accept_probs(2, dist=(1, 1, 2)) == [0.25, 0.25, 0.5]
    stats = timing.sample_stats([float(v) for v in range(1, 102)])
    assert stats["us"] == 51 and stats["us_p95"] == 96 and stats["us_p99"] == 100
    assert stats["spread"] == pytest.approx((76 - 26) / 51)
    assert math.isnan(timing.percentile([], 50))


@pytest.mark.parametrize("op, shape", [("mamba2", {"H": 2, "P": 12, "N": 8, "G": 1}), ("gdn", {"H": 1, "HV": 2, "K": 12, "V": 10})],
                         ids=["mamba2-H2-P12-N8-G1", "gdn-H1-HV2-K12-V10"])
def test_make_case_staggers_fills_and_checks(device, op, shape):
    case = bench.make_case({"shape": {"op": op, **shape}, "variant": "replay", "batch": 5, "window": 3, "state_dtype": "fp32",
                            "io_dtype": "bf16", "layers": 2, "ssm_layers": 4, "seed": 1}, device)
    try:
        assert case.layers == 2
        for layer in case._layers:
            fills = layer.cache.fill[layer.slots.long()][:, 0].tolist()
            assert fills == [r % 3 for r in range(5)], "row r starts at fill r mod W"
        assert case.check() <= case.tolerance()
        case.step()
        layer = case._layers[1]
        assert layer.cache.fill[layer.slots.long()][:, 0].tolist() == [1, 2, 0, 1, 2]
    finally:
        case.close()


def test_profile_split_needs_a_narrower_read_copy(tmp_path, no_cuda):
    out = tmp_path / "s.json"
    res = invoke("--preset", QWEN, "--batch", "16", "--state-dtype", "fp32,bf16", "--read-dtype", "bf16", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {(r["state_dtype"], r["read_dtype"]) for r in rows if r["variant"] == "split"} == {("fp32", "bf16")}
    assert load(out).skipped == [{"what": f"{QWEN} split bf16-bf16", "why": "the read copy (bf16) is not narrower than the checkpoint (bf16): a read copy is bf16 or fp16 over fp32, fp8 over 16 bits"}]
    assert "not narrower" in " ".join(res.stderr.split())
    res = invoke("--preset", QWEN, "--state-dtype", "bf16", "--read-dtype", "fp16", "--out", str(out))
    assert res.exit_code == 0
    res = invoke("--preset", QWEN, "--state-dtype", "fp16", "--read-dtype", "bf16", "--draft", "2", "--accept-rate", "0", "--out", str(out))
    assert res.exit_code == 2 and "accepts no draft" in res.stderr


def test_run_profile_library_predicts_on_request(tmp_path):
    spec = grid.ProfileSpec(presets=(QWEN,), batches=(16,), windows=(8,), drafts=(2,))
    run = prof.run_profile(spec, out=tmp_path / "r.json", predict=True, gpu="h100-sxm", progress=False)
    assert run.mode == "predicted" and not run.interrupted and run.results.complete
    assert run.results.environment["gpu"]["key"] == "h100-sxm"
    assert run.layers_of == {QWEN: presets.resolve(QWEN).ssm_layers}
    assert [r["variant"] for r in load(tmp_path / "r.json").rows] == [
        "conventional", "replay", "replay", "replay", "spec-conventional", "spec-replay"]


def test_profile_of_a_preset_file_ends_with_its_verdict(tmp_path, no_cuda):
    """A preset given as a model's config.json: the rows and the verdict name the preset the file defines (the verdict
    looked it up by that name among the shipped presets, and the run ended in 'unknown preset', exit 2)."""
    config = presets.resolve(str(FIXTURES / "configs" / "nemotron_h_super.json"))
    res = invoke("--preset-file", str(FIXTURES / "configs" / "nemotron_h_super.json"), "--batch", "256", "--no-phases",
                 "--out", str(tmp_path / "f.json"))
    assert res.exit_code == 0, res.output
    assert {r["preset"] for r in load(tmp_path / "f.json").rows} == {config.name}
    assert f"replayssm profile: {config.name} on NVIDIA H200: does ReplaySSM pay?" in res.stdout
    assert "`replayssm tune` on the same preset file" in " ".join(res.stdout.split())


def test_profile_skips_stochastic_rounding_of_odd_mamba2_rows(tmp_path, no_cuda):
    """A Mamba-2 preset of odd N: its stochastically rounded rows are skipped with why (the stores pair a row's
    neighbours), its rows rounded to nearest still run."""
    config = json.loads((FIXTURES / "configs" / "nemotron_h_super.json").read_text())
    config["ssm_state_size"] = 127
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = invoke("--preset-file", str(tmp_path / "config.json"), "--batch", "64", "--state-dtype", "bf16",
                 "--stochastic-rounding", "--no-phases", "--out", str(tmp_path / "o.json"))
    assert res.exit_code == 0, res.output
    assert {r["rounding"] for r in load(tmp_path / "o.json").rows} == {"nearest"}
    assert "bf16 stochastic rounding: stochastic rounding pairs a state row's neighbours: the rows of N = 127" in \
        " ".join(res.stderr.split())


def test_profile_table_shows_speculative_speedup_over_snapshots_first(tmp_path, no_cuda):
    res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", "256", "--draft", "4", "--no-phases",
                                   "--out", str(tmp_path / "s.json")], terminal_width=240)
    assert res.exit_code == 0, res.output
    row = next(r for r in load(tmp_path / "s.json").rows if r["variant"] == "spec-replay")
    line = next(line for line in res.stdout.splitlines() if "spec-replay" in line)
    over, decode = f"{row['speedup']:.2f}x", f"{row['speedup_vs_decode']:.2f}x vs decode"
    assert over in line and decode in line and line.index(over) < line.index(decode)
    assert "vs snapshots" in line
    assert "figures: predicted" in res.stdout


@pytest.mark.parametrize("width", [80, 100, 120])
def test_profile_table_fits_the_terminal(tmp_path, no_cuda, width):
    """At 80-120 columns: preset, variant, B, W and speedup stay and no number is cut; secondary columns go, named."""
    from rich.console import Console

    res = invoke("--preset", SUPER, "--preset", QWEN, "--batch", "1,256", "--draft", "4", "--read-dtype", "bf16",
                 "--out", str(tmp_path / "w.json"))
    assert res.exit_code == 0, res.output
    rows = load(tmp_path / "w.json").rows
    table = profile_table.render_table(rows, title="t", width=width)
    console = Console(width=width, record=True, color_system=None)
    with console.capture() as cap:
        console.print(table)
    text = cap.get()
    assert max(len(line) for line in text.splitlines()) <= width
    headers = [c.header for c in table.columns]
    assert set(profile_table.KEPT_COLUMNS) <= set(headers)
    flat = " ".join(text.split())
    for r in rows:
        assert r["preset"] in text
        if r.get("speedup") is not None:
            assert f"{r['speedup']:.2f}x" in flat
        if r.get("speedup_vs_decode") is not None:
            assert f"{r['speedup_vs_decode']:.2f}x vs decode" in flat
    wide = profile_table.render_table(rows, title="t")
    every = [c.header for c in wide.columns]
    dropped = [c for c in profile_table.DROP_ORDER if c in every and c not in headers]
    assert dropped and dropped == [c for c in profile_table.DROP_ORDER if c in every][:len(dropped)], "secondary columns go in order"
    assert f"left out for the terminal's width: {', '.join(dropped)} (--wide shows every column)" in flat
    assert "left out" not in str(wide.caption)


def test_profile_wide_option_shows_every_column(tmp_path, no_cuda):
    res = invoke("--preset", SUPER, "--batch", "1", "--wide", "--out", str(tmp_path / "w.json"))
    assert res.exit_code == 0, res.output
    assert "TFLOP/s" in res.stdout and "left out" not in res.stdout


def test_profile_progress_in_a_log_is_plain_lines(tmp_path, no_cuda):
    res = invoke("--preset", SUPER, "--batch", "1,16", "--out", str(tmp_path / "p.json"))
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("profile: ")]
    assert lines and lines[-1].startswith("profile: 4/4 done, ") and "\x1b" not in res.stderr


def test_profile_table_memory_is_per_model_or_blank():
    """MiB/seq is over the preset's SSM layers: mem_per_seq_model, else mem_per_seq times the layers given, never
    one layer's figure among whole-model ones."""
    base = {"kind": "kernel", "op": "mamba2", "preset": SUPER, "variant": "conventional", "phase": "avg", "batch": 1,
            "window": None, "state_dtype": "fp32", "source": "measured", "status": "failed", "mem_per_seq": 2**20}
    rows = [{**base, "mem_per_seq_model": 40 * 2**20}, base]
    cells = [c["MiB/seq"] for c in (profile_table._row_cells(r, "", False, [], None) for r in rows)]
    assert cells == ["40", "–"]
    assert profile_table._row_cells(base, "", False, [], {SUPER: 40})["MiB/seq"] == "40"


def test_profile_stochastic_rounding_and_eight_bit_rows(tmp_path, measured):
    runner = measured(fake_runner())
    out = tmp_path / "sr.json"
    res = invoke("--preset", SUPER, "--batch", "64", "--state-dtype", "fp32,bf16,int8", "--stochastic-rounding",
                 "--no-phases", "--out", str(out))
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert schema_errors(doc) == []
    by = {(r["variant"], r["state_dtype"], r["rounding"]): r for r in load(out).rows}
    # fp32 stays exact (the fp32 baseline); each 16-bit and 8-bit state rounds both ways
    assert sorted(by) == sorted((v, d, r) for v in ("conventional", "replay") for d, r in (
        ("fp32", "nearest"), ("bf16", "nearest"), ("bf16", "stochastic"), ("int8", "nearest"), ("int8", "stochastic")))
    assert f"{SUPER} replay B64 W16 int8-SR" in runner.calls and f"{SUPER} replay B64 W16 int8" in runner.calls
    rep, conv, fp32 = by["replay", "int8", "stochastic"], by["conventional", "int8", "stochastic"], by["conventional", "fp32", "nearest"]
    # the cost of stochastic rounding: over the same configuration rounded to nearest, in the same file
    assert rep["x_vs_nearest"] == pytest.approx(rep["us_per_token"] / by["replay", "int8", "nearest"]["us_per_token"])
    assert by["replay", "int8", "nearest"].get("x_vs_nearest") is None
    # over the conventional step at the same precision and rounding, and over fp32 conventional beside it
    assert rep["speedup_over"] == "conventional"
    assert rep["speedup"] == pytest.approx(conv["us_per_token"] / rep["us_per_token"])
    assert rep["speedup_vs_fp32"] == pytest.approx(fp32["us_per_token"] / rep["us_per_token"])
    assert conv["speedup"] is None and conv["speedup_vs_fp32"] == pytest.approx(fp32["us_per_token"] / conv["us_per_token"])
    assert by["replay", "fp32", "nearest"]["speedup_vs_fp32"] is None
    # the cost model's 8-bit bytes (scales with the rows) and the random draws as integer ops
    shape = presets.resolve(SUPER).shape
    # per sequence a Philox draw (100 integer operations) per head, a hash (10) per pair of stored elements and 1 per
    # element
    assert conv["int_ops"] == 64 * (shape.H * 100 + shape.state_elems // 2 * 10 + shape.state_elems) and by["conventional", "int8", "nearest"]["int_ops"] == 0
    assert conv["x_mem_state"] == shape.state_elems + shape.state_rows * 4
    assert "int8 SR" in " ".join(res.stdout.split())


def test_rows_written_before_rounding_pair_as_nearest():
    from replayssm_cli.measure.grid import config_key
    from replayssm_cli.report.results import rounding_of

    old = {"kind": "kernel", "variant": "replay", "state_dtype": "bf16"}
    assert rounding_of(old) == "nearest"
    assert config_key(old) == config_key({**old, "rounding": "nearest"}) != config_key({**old, "rounding": "stochastic"})


SMALL = {"mamba2": {"op": "mamba2", "H": 2, "P": 12, "N": 8, "G": 1}, "gdn": {"op": "gdn", "H": 1, "HV": 2, "K": 12, "V": 10}}


@pytest.mark.parametrize("op, state, rounding", [("mamba2", "int8", "nearest"), ("mamba2", "fp8", "nearest"),
                                                 ("mamba2", "bf16", "stochastic"), ("mamba2", "int8", "stochastic"),
                                                 ("gdn", "fp8", "nearest"), ("gdn", "int8", "stochastic")],
                         ids=["mamba2-int8", "mamba2-fp8", "mamba2-bf16-SR", "mamba2-int8-SR", "gdn-fp8", "gdn-int8-SR"])
def test_make_case_checks_a_conventional_step_at_the_new_precisions(device, op, state, rounding):
    """The instrumented loop hands the kernel and its reference the same row scales and rounding streams."""
    case = bench.make_case({"shape": SMALL[op], "variant": "conventional", "batch": 3,
                            "state_dtype": state, "rounding": rounding, "io_dtype": "bf16", "layers": 1, "seed": 2}, device)
    try:
        layer = case._layers[0]
        assert layer.state.dtype == {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}[state]
        assert (layer.state_scale is not None) == (state in ("int8", "fp8")) and (layer.rounding is not None) == (rounding == "stochastic")
        assert case.check() <= case.tolerance()
        if layer.rounding is not None:
            assert layer.rounding.step.tolist() == [2, 2, 2], "the check's two steps advanced every slot's store count"
    finally:
        case.close()


@pytest.mark.parametrize("op, state, rounding", [("mamba2", "int8", "nearest"), ("mamba2", "fp8", "stochastic"),
                                                 ("mamba2", "bf16", "stochastic"), ("gdn", "int8", "nearest"),
                                                 ("gdn", "fp16", "stochastic")],
                         ids=["mamba2-int8", "mamba2-fp8-SR", "mamba2-bf16-SR", "gdn-int8", "gdn-fp16-SR"])
def test_make_case_checks_a_replay_cache_at_the_new_precisions(device, op, state, rounding):
    """A ReplaySSM case loads its 8-bit checkpoints from full states and checks a whole window (every row flushes)."""
    case = bench.make_case({"shape": SMALL[op], "variant": "replay", "batch": 3,
                            "window": 3, "state_dtype": state, "rounding": rounding, "io_dtype": "bf16", "layers": 1,
                            "seed": 3}, device)
    try:
        cache = case._layers[0].cache
        assert (cache.checkpoint_scale is not None) == (state in ("int8", "fp8")) and (cache.rounding is not None) == (rounding == "stochastic")
        assert case.check() <= case.tolerance()
    finally:
        case.close()


def test_profile_leaves_out_snapshots_of_an_eight_bit_state(tmp_path, no_cuda):
    out = tmp_path / "d.json"
    res = invoke("--preset", SUPER, "--batch", "16", "--state-dtype", "int8", "--draft", "2", "--no-phases", "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert {r["variant"] for r in rows} == {"conventional", "replay", "spec-replay"}
    assert load(out).skipped == [{"what": f"{SUPER} spec-conventional T2 int8", "why": "decode_multi writes fp32 or 16-bit snapshots, not 8-bit rows"}]


@pytest.mark.parametrize("variant, extra", [("conventional", {}), ("replay", {"window": 3}),
                                            ("spec-replay", {"window": 3, "draft": 2})],
                         ids=["conventional", "replay", "spec-replay"])
def test_a_large_batch_is_checked_on_rows_spread_over_it(device, monkeypatch, variant, extra):
    """Past CHECK_ROWS rows the references run on CHECK_ROWS rows from first to last (so over the staggered fills)
    while the kernels run them all: the check passes, and a kernel wrong on one checked row fails it."""
    monkeypatch.setattr(bench, "CHECK_ROWS", 4)
    spec = {"shape": SMALL["mamba2"], "variant": variant, "batch": 10, "state_dtype": "fp32", "io_dtype": "bf16",
            "layers": 1, "seed": 4, **extra}
    case = bench.make_case(spec, device)
    try:
        rows = case.check_rows(case._layers[0])
        assert rows.tolist() == [0, 3, 6, 9]
        assert case.check() <= case.tolerance()
        K = bench.kernels("mamba2")
        entry = {"conventional": "decode", "replay": "replay", "spec-replay": "verify"}[variant]
        real = getattr(K, entry)

        def wrong(*args, **kwargs):
            y = real(*args, **kwargs)
            y[6] += 1.0
            return y

        monkeypatch.setattr(K, entry, wrong)
        assert case.check() > case.tolerance()
    finally:
        case.close()
