"""benchmarks/precision_gpu.sh without a GPU (DRY_RUN=1: its profiles predicted, ncu and FlashInfer only said) and
benchmarks/precision_report.py's summary and targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import benchmark_scripts

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "precision_gpu.sh"
report = benchmark_scripts.fixture("precision_report")


def _run(out: Path, *parts: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DRY_RUN="1", OUT=str(out), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(SCRIPT), *parts], capture_output=True, text=True, env=env, timeout=120)


def test_a_dry_run_writes_each_part_and_the_summary(tmp_path):
    out = tmp_path / "precision"
    done = _run(out, "m2-256", "ncu", "fi-256")
    assert done.returncode == 0, done.stderr
    steps = (out / "steps.txt").read_text().splitlines()
    assert [s.split(":")[0] for s in steps] == ["m2-256", "ncu", "fi-256"] and all(": exit 0," in s for s in steps)
    rows = json.loads((out / "m2-256.json").read_text())["rows"]
    # every precision both ways at batch 256, fp32 exact: 9 of them, conventional and ReplaySSM
    assert len(rows) == 18 and {r["batch"] for r in rows} == {256} and {r["source"] for r in rows} == {"predicted"}
    assert {(r["state_dtype"], r["rounding"]) for r in rows} == {
        ("fp32", "nearest"), *((d, r) for d in ("bf16", "fp16", "int8", "fp8") for r in ("nearest", "stochastic"))}
    summary = (out / "summary.md").read_text()
    assert "m2-256.json (predicted for NVIDIA H200" in summary and "| 256 | int8 SR |" in summary
    assert "not run (DRY_RUN=1)" in (out / "ncu.log").read_text() and "not run" in (out / "fi-256.log").read_text()
    targets = json.loads((out / "summary.json").read_text())["targets"]
    eight = next(t for t in targets if "int8 checkpoint" in t["target"])
    assert eight["value"] is not None and eight["predicted"] and eight["from"] == "[1]"
    assert "m2-256: profile: 18/18 done" in done.stderr, "the parts' progress lines reach stderr"


def test_an_unknown_part_is_one_line_and_exit_2_before_anything_runs(tmp_path):
    done = _run(tmp_path / "p", "m2-256", "nosuch")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "unknown part nosuch" in done.stderr
    assert not (tmp_path / "p").exists()


def _row(**kw):
    base = {"kind": "kernel", "op": "mamba2", "phase": "avg", "status": "ok", "source": "measured", "batch": 256,
            "read_dtype": None, "rounding": "nearest", "x_from": "[1]"}
    return {**base, **kw}


def test_the_targets_rest_on_the_rows_they_name(report):
    rows = [
        _row(variant="replay", state_dtype="int8", speedup=1.82, us_per_token=80.0),
        _row(variant="replay", state_dtype="fp8", speedup=1.6, us_per_token=85.0),
        _row(variant="replay", state_dtype="int8", rounding="stochastic", speedup=1.8, us_per_token=81.0, x_vs_nearest=1.0125),
        _row(op="gdn", variant="conventional", state_dtype="bf16", rounding="stochastic", us_per_token=300.0, x_vs_nearest=1.041),
        _row(variant="baseline:flashinfer-checkpointing", state_dtype="int8", us_per_token=90.0, x_vs_ours=1.125, x_ours_us=80.0),
    ]
    checks = [{"ok": True, "preset": "p", "variant": "replay", "phase": "flush", "state_dtype": "int8", "rounding": "nearest",
               "model_bytes_read": 100, "model_bytes_written": 100, "diff_total_pct": -3.5, "x_from": "[2]"}]
    got = {t["target"]: t for t in report.targets(rows, checks)}
    int8 = got["Mamba-2 int8 checkpoint, ReplaySSM over conventional int8 at 256 >= 1.7x"]
    assert int8["value"] == 1.82 and int8["met"] and not int8["predicted"]
    assert got["Mamba-2 fp8 checkpoint, ReplaySSM over conventional fp8 at 256 >= 1.7x"]["met"] is False
    sr = got["stochastic rounding costs under 3% over rounding to nearest (worst step at 256)"]
    assert sr["value"] == 1.041 and sr["met"] is False and sr["what"] == "gdn conventional bf16 SR"
    fi = got["faster than FlashInfer's checkpointing_ssu at int8, batch 256"]
    assert fi["value"] == 1.125 and fi["met"]
    assert got["faster than FlashInfer's checkpointing_ssu at fp8, batch 256"]["met"] is None
    assert got["Nsight Compute's DRAM bytes within 5% of the model (worst step)"]["met"]
    text = report.render(rows, checks, ["[1] a.json (NVIDIA H200, 2026-12-02, abc1234)", "[2] ncu-8bit.json"])
    assert "| 256 | int8 SR |" in text and "| 256 | int8 | 80.0 | 90.0 | 1.12x |" in text and "-3.5%" in text
