"""`replayssm check`: kernels against their references on this device; a broken kernel is reported failing."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import replayssm_kernels.mamba2 as mamba2
from replayssm_cli.measure import bench, check
from replayssm_cli.main import app

TINY = (("conventional", "fp32", None, "bf16", 0), ("replay", "bf16", None, "bf16", 0))


@pytest.fixture
def tiny_grid(monkeypatch):
    monkeypatch.setattr(check, "GRID", TINY)


def test_check_cases_cover_every_kernel():
    specs = check.cases()
    for op in ("mamba2", "gdn"):
        variants = {s["variant"] for s in specs if s["shape"]["op"] == op}
        assert variants == set(check.KERNEL_OF), f"{op}: every kernel is checked"
    assert {s["read_dtype"] for s in specs} == {None, "bf16", "fp8"}
    assert all(s["window"] and s["window"] < s["batch"] + 2 for s in specs if s["variant"] in ("replay", "split"))
    assert [s["shape"]["op"] for s in check.cases("gdn")] == ["gdn"] * len(check.GRID)


def test_check_cases_round_every_stored_low_precision_state_when_asked():
    assert {s["rounding"] for s in check.cases()} == {"nearest"}
    specs = check.cases("mamba2", "stochastic")
    assert {(s["state_dtype"], s["rounding"]) for s in specs} == {("fp32", "nearest"), *((d, r) for d in ("bf16", "fp16", "int8", "fp8")
                                                                                       for r in ("nearest", "stochastic"))}
    assert len(specs) == len(check.GRID) + sum(1 for case in check.GRID if case[1] != "fp32")
    assert check.label(next(s for s in specs if s["rounding"] == "stochastic")).endswith("bf16 SR io bf16")


def test_check_compile_with_stochastic_rounding_is_one_line():
    res = CliRunner().invoke(app, ["check", "--compile", "--stochastic-rounding"])
    assert res.exit_code == 2 and "drop one of them" in res.stderr


def test_check_cli_passes(device, tiny_grid):
    res = CliRunner().invoke(app, ["check", "--op", "mamba2", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["kernel"] for r in rows] == ["decode", "replay"]
    assert all(r["ok"] and 0 < r["max_err"] <= r["tolerance"] for r in rows), rows


def test_check_cli_reports_broken_kernel(device, tiny_grid, monkeypatch):
    real = mamba2.decode

    def off_by_a_bit(*args, **kwargs):
        return real(*args, **kwargs) * 1.05

    monkeypatch.setattr(mamba2, "decode", off_by_a_bit)
    res = CliRunner().invoke(app, ["check", "--op", "mamba2"])
    assert res.exit_code == 1
    assert "FAIL" in res.stdout and "pass" in res.stdout, "the broken decode fails, replay still passes"
    assert "1 of 2 kernel checks failed" in res.stderr


def test_check_reports_raising_kernel(device, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(mamba2, "replay", boom)
    spec = {**check.cases("mamba2")[3], "variant": "replay"}
    [row] = check.run_checks([spec], device, progress=False)
    assert not row["ok"] and row["error"] == "RuntimeError: kernel launch failed"


def test_check_without_a_device_says_how(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    res = CliRunner().invoke(app, ["check"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "TRITON_INTERPRET=1" in lines[0]


def test_profile_run_point_does_not_time_a_failing_kernel(device, monkeypatch):
    real = mamba2.replay
    monkeypatch.setattr(mamba2, "replay", lambda *a, **k: real(*a, **k) + 1.0)
    monkeypatch.setattr(bench, "time_graph", lambda *a, **k: pytest.fail("a failing kernel must not be timed"))
    spec = {**check.cases("mamba2")[3], "ssm_layers": 2}
    point = SimpleNamespace(case_spec=lambda seed=0: dict(spec), variant="replay", window=spec["window"], phases=True)
    [m] = bench.run_point(point, {"device": str(device)})
    assert not m["ok"] and m["check_max_err"] > m["tolerance"] and "over the tolerance" in m["error"]


def test_profile_run_point_reports_a_raising_kernel(device, monkeypatch):
    def boom(*args, **kwargs):
        raise ValueError("x must be contiguous")

    monkeypatch.setattr(mamba2, "replay", boom)
    spec = {**check.cases("mamba2")[3], "ssm_layers": 2}
    point = SimpleNamespace(case_spec=lambda seed=0: dict(spec), variant="replay", window=spec["window"], phases=True)
    [m] = bench.run_point(point, {"device": str(device)})
    assert not m["ok"] and m["error"] == "ValueError: x must be contiguous" and m["check_max_err"] is None
