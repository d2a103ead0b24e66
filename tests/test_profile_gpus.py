"""`replayssm profile --gpus`: the grid split over two faked GPUs, rows merged into one file, each naming its GPU, every
ratio within one GPU; the option's refusals."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import typer
from typer.testing import CliRunner

from replayssm_cli.commands import profile as command
from replayssm_cli.errors import UserError
from replayssm_cli.measure import profile_gpus as pg
from replayssm_cli.measure.grid import ProfileSpec
from replayssm_cli.report.results import load

# Per faked GPU (its CUDA_VISIBLE_DEVICES entry), µs of each variant's step: the speedups differ by GPU, so a ratio
# across GPUs would show.
US = {"5": {"conventional": 10.0, "replay": 5.0}, "7": {"conventional": 30.0, "replay": 10.0}}


def fake_setup(gpu, spec):
    device = os.environ["CUDA_VISIBLE_DEVICES"]
    # Both workers start before either takes work, so that both take some.
    barrier = Path(os.environ["FAKE_BARRIER"])
    (barrier / device).touch()
    deadline = time.monotonic() + 20
    while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    return {"environment": {"mode": "measured", "gpu": {"name": f"Fake GPU {device}", "uuid": f"GPU-fake-{device}"}},
            "ceilings": None, "free_bytes": None, "gpu_key": "fake", "gpu_name": f"Fake GPU {device}", "context": {}}


def fake_runner(point, context):
    device = os.environ["CUDA_VISIBLE_DEVICES"]
    # A point takes a while, as on a GPU, so a worker leaving the barrier a poll later still finds groups left.
    time.sleep(0.05)
    us = US[device][point.variant]
    return [{"phase": "avg", "ok": True, "samples_us": [us] * 5, "layers": 1, "note": f"ran on {device}"}]


def test_grid_split_over_two_gpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    (tmp_path / "barrier").mkdir()
    monkeypatch.setenv("FAKE_BARRIER", str(tmp_path / "barrier"))
    spec = ProfileSpec(presets=("nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"), batches=(1, 16, 64), phases=False, repeats=3)
    out = tmp_path / "p.json"
    run = pg.run_profile_gpus(spec, 2, out=out, progress=True, setup=fake_setup, runner=fake_runner, start_method="fork")
    got = load(out)
    assert got.complete and not run.interrupted and len(got.rows) == 2 * 3 * 2
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5,7", "the parent's devices are left as they were"
    seen = set()
    for row in got.rows:
        device = row["x_note"].split()[-1]
        assert row["x_gpu_uuid"] == f"GPU-fake-{device}" and row["x_gpu_index"] == ["5", "7"].index(device)
        seen.add(device)
        if row["variant"] == "replay":
            assert row["speedup"] == pytest.approx(US[device]["conventional"] / US[device]["replay"]), "a ratio within one GPU"
    assert seen == {"5", "7"}, "both GPUs took work"
    by_group = {}
    for row in got.rows:
        by_group.setdefault((row["preset"], row["batch"]), set()).add(row["x_gpu_index"])
    assert all(len(g) == 1 for g in by_group.values()), "a preset and batch stay on one GPU"
    assert [g["uuid"] for g in got.environment["x_gpus"]] == ["GPU-fake-5", "GPU-fake-7"]
    assert run.gpu_name.startswith("2 x ")
    assert "profile: 12/12 done on 2 GPUs" in capsys.readouterr().err, "a plain progress line where stderr is no terminal"


def test_groups_keep_each_ratio_on_one_gpu():
    from replayssm_cli.measure.grid import plan
    from replayssm_cli.model import presets

    spec = ProfileSpec(presets=("nemotron-3-super-120b-a12b",), batches=(1, 256), read_dtypes=("bf16",), state_dtypes=("fp32", "bf16"))
    resolved = [presets.resolve(p) for p in spec.presets]
    points = plan(spec, resolved, [], [])
    found = pg.groups(points)
    assert sorted(len(g) for g in found) == [len(points) // 2] * 2
    for g in found:
        assert len({(p.preset, p.batch) for p in g}) == 1
        variants = {(p.variant, p.state_dtype) for p in g}
        assert ("conventional", "fp32") in variants and ("split", "fp32") in variants


@pytest.mark.parametrize("value, visible, words", [("3", 2, "2 are visible"), ("0", 4, "not a number"), ("x", 4, "not a number"),
                                                   ("all", 0, "0 GPUs visible")])
def test_gpu_count_refusals(value, visible, words):
    with pytest.raises(UserError, match=words):
        pg.gpu_count(value, visible)


def test_gpu_count():
    assert pg.gpu_count("all", 8) == 8 and pg.gpu_count("2", 8) == 2 and pg.gpu_count(None, 0) == 1


app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """Stand-in root so that `profile` is a subcommand."""


app.command("profile")(command.profile)


def test_more_gpus_than_visible_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = CliRunner().invoke(app, ["profile", "--gpus", "4"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "4 GPUs" in lines[0] and "2 are visible" in lines[0], result.output


def test_gpus_without_cuda_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(app, ["profile", "--gpus", "2"])
    assert result.exit_code == 2 and "--gpus" in result.output and len(result.output.strip().splitlines()) == 1, result.output
