"""Energy per step from NVML's total-energy counter, on the CPU with NVML and the clock faked."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from replayssm_cli.measure import energy
from replayssm_cli.model import presets as presets_mod
from replayssm_cli.measure import grid
from replayssm_cli.measure import profile as prof
from replayssm_cli.main import app

IDLE_W, BUSY_W = 80.0, 450.0
# NVML's counter advances at its update interval, not continuously.
UPDATE_S = 0.02
REPLAY_S = 0.0123


class FakeNvml:
    """pynvml's names for the energy counter, over a fake clock: the GPU draws BUSY_W while a replay runs, IDLE_W else."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    def __init__(self, fail: type | None = None):
        self.t = 0.0
        self.joules = 0.0
        self.watts = IDLE_W
        self.fail = fail

    def advance(self, seconds: float, watts: float) -> None:
        self.t += seconds
        self.joules += seconds * watts
        self.watts = watts

    def clock(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds, IDLE_W)

    def replay(self) -> None:
        self.advance(REPLAY_S, BUSY_W)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        if self.fail is not None:
            raise self.fail("Not Supported")
        # The joules at the last update, in mJ (the draw since then is the latest advance's).
        last = math.floor(self.t / UPDATE_S) * UPDATE_S
        return int((self.joules - (self.t - last) * self.watts) * 1e3)


def start(nv: FakeNvml, said: list[str] | None = None):
    return energy.Session.start(nvml=nv, clock=nv.clock, sleep=nv.sleep, say=(said.append if said is not None else None))


def test_session_subtracts_the_idle_draw_measured_before_the_run():
    nv = FakeNvml()
    s = start(nv)
    assert s.idle_w == pytest.approx(IDLE_W, rel=0.05) and s.idle_s == pytest.approx(energy.IDLE_SECONDS)
    m = s.measure(nv.replay, sync=lambda: None, steps_per_replay=64)
    # Long enough for the counter: at least MIN_SECONDS per loop, so its update step is a few percent at most.
    assert m["loop_s"] >= energy.MIN_SECONDS and m["replays"] == math.ceil(energy.MIN_SECONDS / REPLAY_S)
    want = (BUSY_W - IDLE_W) * REPLAY_S / 64
    assert m["j_per_step"] == pytest.approx(want, rel=0.05)
    assert len(m["samples_j_per_step"]) == energy.REPEATS and m["spread"] is not None and m["spread"] < 0.1
    assert m["draw_w"] == pytest.approx(BUSY_W, rel=0.05) and m["counter"] == energy.COUNTER


@pytest.mark.parametrize("error, words", [("NVMLError_NotSupported", "no nvmlDeviceGetTotalEnergyConsumption counter"),
                                          ("NVMLError_NoPermission", "no permission")], ids=["old-gpu", "no-permission"])
def test_missing_counter_is_one_line_and_no_session(error, words):
    nv = FakeNvml()
    nv.fail = getattr(FakeNvml, error)
    said: list[str] = []
    assert start(nv, said) is None
    assert len(said) == 1 and words in said[0] and "goes on" in said[0]


def test_layer_and_model_fields():
    m = {"j_per_step": 0.002, "spread": 0.01}
    layer = energy.layer_fields(m, model_layers=40, tokens_per_step=256)
    assert layer["j_per_layer_step"] == 0.002 and layer["j_per_model_step"] == pytest.approx(0.08)
    assert layer["tokens_per_j"] == pytest.approx(256 / 0.08) and "SSM layers only" in layer["scope"]
    whole = energy.model_fields({"j_per_step": 4.0}, tokens_per_step=64)
    assert whole["j_per_model_step"] == 4.0 and whole["tokens_per_j"] == 16


def test_graph_meter_measures_the_handed_graph(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    nv = FakeNvml()
    meter = energy.GraphMeter.of(start(nv), steps_per_replay=32 * 4)
    assert energy.GraphMeter.of(None, 8) is None
    assert meter.fields(tokens_per_step=1) is None
    meter(nv.replay)
    got = meter.fields(model_layers=40, tokens_per_step=64)
    assert got["j_per_layer_step"] == pytest.approx((BUSY_W - IDLE_W) * REPLAY_S / 128, rel=0.05)
    assert got["j_per_model_step"] == pytest.approx(got["j_per_layer_step"] * 40)


def test_profile_row_carries_the_measured_energy():
    preset = presets_mod.resolve("nemotron-3-super-120b-a12b")
    point = grid.plan(grid.ProfileSpec(presets=(preset.name,), batches=(64,), phases=False), [preset])[0]
    x = energy.layer_fields({"j_per_step": 0.003, "spread": 0.02}, model_layers=preset.ssm_layers, tokens_per_step=64)
    m = {"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-4, "tolerance": 2e-3, "samples_us": [140.0] * 10,
         "steps": 32, "repeats": 10, "energy": x}
    row = prof.measured_rows(point, preset, [m], None, None)[0]
    assert row["x_energy"]["tokens_per_j"] == pytest.approx(64 / (0.003 * preset.ssm_layers))


def test_profile_energy_is_off_by_default_and_needs_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert grid.ProfileSpec(presets=("x",)).energy is False
    res = CliRunner().invoke(app, ["profile", "--preset", "nemotron-3-super-120b-a12b", "--batch", "64", "--energy",
                                   "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    assert "--energy needs a CUDA GPU" in " ".join(res.stderr.split())
