"""benchmarks/sweep_mamba2.py without a GPU: arguments, the plan, the byte counts, and a clean refusal."""

from __future__ import annotations

import pytest

import benchmark_scripts
import sweep_cost

sweep = benchmark_scripts.fixture("sweep_mamba2")


def _run(*argv):
    return benchmark_scripts.run("sweep_mamba2", *argv)


def test_sweep_help():
    done = _run("--help")
    assert done.returncode == 0
    assert "--quick" in done.stdout and "--launch" in done.stdout and "examples:" in done.stdout


def test_sweep_dry_run_plans_every_kernel_and_batch():
    done = _run("--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 10 * 4  # the 10 kernels (split-bf16 whole, non-flush and flush, split-fp8 among them), 4 batches
    assert all("layers" in line and "MiB/layer-step" in line for line in lines)


def test_sweep_bad_launch_is_one_line():
    done = _run("--launch", "replay:warps")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "field=integer" in done.stderr


def test_sweep_parse_launch(sweep):
    assert sweep.parse_launch("replay:warps=1,maxnreg=none,precision=tf32x3") == (
        "replay", {"warps": 1, "maxnreg": None, "precision": "tf32x3"})
    with pytest.raises(ValueError, match="KERNEL one of"):
        sweep.parse_launch("conv:rows=4")
    plan = sweep.plan(["replay", "decode"], True, [("replay", {"warps": 4})])
    assert plan["replay"] == [{"warps": 4}] and plan["decode"] == sweep.QUICK_GRID["decode"]


def test_sweep_configs_are_the_chosen_rows_with_the_fields_put_in(sweep):
    """Each timed setting is a field of the launch configuration the kernel picks at that batch."""
    import importlib

    import torch

    from replayssm_kernels import mamba2

    mr = importlib.import_module("replayssm_kernels.mamba2.replay")
    cache = mamba2.ReplayCache.create(2, 4, 8, 8, 2, 4, device="cpu")
    assert sweep.config_for("replay", cache, 2, {"chunk": 16}) == mr.STEP_LAUNCH["replay-fp32"].__class__(
        **{**mr.STEP_LAUNCH["replay-fp32"].__dict__, "chunk": 16})
    for kernel, settings in sweep.GRID.items():
        target = torch.zeros(2, 4, 8, 8) if kernel.startswith("decode") else cache
        for fields in settings:
            sweep.config_for(kernel, target, 2, fields)
    with pytest.raises(ValueError, match="StepConfig has no field 'CHUNK'"):
        sweep.config_for("replay", cache, 2, {"CHUNK": 16})


@pytest.mark.parametrize("batch", [1, 3, 256])
def test_sweep_bytes_are_the_cost_models(sweep, monkeypatch, batch):
    """The bytes behind the GB/s column are the cost model's for every kernel's rows, and the inputs the sweep
    draws are the ones it counts (dt in bf16, as the others)."""
    from replayssm_cli.model.shapes import Mamba2Shape

    monkeypatch.setitem(sweep.common.STATE, "dtype", "fp32")
    # A, D and dt_bias, fp32 per head, read once per step and not once per row
    params = 3 * sweep.SHAPE["H"] * 4
    for kernel in sweep.KERNELS:
        want = sweep_cost.graph_bytes(sweep, Mamba2Shape(**sweep.SHAPE), kernel, batch, params, state_dtype="fp32")
        assert sweep.bytes_per_layer_step(kernel, batch) == pytest.approx(want, abs=1), kernel
    import torch

    inp = sweep.random_inputs(2, None, "cpu")
    assert {k: v.dtype for k, v in inp.items() if k in ("x", "dt", "B", "C", "z")} == dict.fromkeys(
        ("x", "dt", "B", "C", "z"), torch.bfloat16)


def test_sweep_fills_and_layers(sweep, monkeypatch):
    """The harness both sweeps share: each row's fills step by step, and enough layers to overflow the L2."""
    monkeypatch.setitem(sweep.common.STATE, "dtype", "fp32")
    S = 128 * 64 * 128 * 4
    assert 2 * S < sweep.bytes_per_layer_step("decode", 1) < 2.02 * S
    assert sweep.fill_trajectory("replay", 14, 4) == [14, 15, 0, 1]
    assert sweep.fill_trajectory("verify", 15, 3) == [15, 18, 3]
    assert sweep.layer_count("decode", 1, 60 * 2**20) == 61 and sweep.layer_count("decode", 256, 60 * 2**20) == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_sweep_refuses_without_cuda():
    done = _run("--quick", "--kernel", "decode")
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""


def test_sweep_check_and_step_on_a_small_shape(sweep, device, monkeypatch):
    """The script's reference check and its layer stack, on a small layer (the timing itself needs CUDA)."""
    monkeypatch.setattr(sweep, "SHAPE", {"H": 2, "P": 8, "N": 8, "G": 1})
    monkeypatch.setattr(sweep, "WINDOW", 4)
    for kernel in sweep.KERNELS:
        assert sweep.check_config(kernel, {}, device) < 2e-2, kernel
        stack = sweep.Stack(kernel, 3, 2, {}, device)
        stack.rewind()
        stack.step()
        if kernel in ("replay", "split-bf16"):
            assert sorted(stack.layers[0].fill[:, 0].tolist()) == [1, 2, 3]


def test_sweep_ratios_and_table(sweep):
    """Ratios take each kernel's best time over its baseline's best; a failed check is shown, never timed."""
    import io

    R = sweep.Result
    results = [
        R("decode", 256, {"rows": 16}, 1, 16, 2e9, True, 1e-3, us_per_layer_step=600.0, gbps=3333.0),
        R("decode", 256, {"rows": 32}, 1, 16, 2e9, True, 1e-3, us_per_layer_step=500.0, gbps=4000.0),
        R("replay", 256, {"num_warps": 8}, 1, 16, 1e9, True, 1e-3, us_per_layer_step=250.0, gbps=4000.0),
        R("replay", 256, {"num_warps": 4}, 1, 16, 1e9, False, 0.5),
    ]
    sweep.add_ratios(results)
    assert results[2].ratio == pytest.approx(2.0) and results[1].ratio == pytest.approx(1.0)
    assert results[3].ratio is None
    out = io.StringIO()
    sweep.print_table(results, out)
    text = out.getvalue()
    assert "2.00x" in text and "FAILED (0.5)" in text and "num_warps=8" in text


def test_sweep_row_slots(sweep, monkeypatch):
    """--slots: rows in a random permutation of the slots by default (as a server's), row i in slot i with identity."""
    import torch

    monkeypatch.setitem(sweep.common.STATE, "slots", "identity")
    assert sweep.common.row_slots(5, "cpu").tolist() == [0, 1, 2, 3, 4]
    monkeypatch.setitem(sweep.common.STATE, "slots", "random")
    got = sweep.common.row_slots(64, "cpu")
    assert got.dtype == torch.int32 and sorted(got.tolist()) == list(range(64)) and got.tolist() != list(range(64))
    done = _run("--slots", "sideways", "--dry-run")
    assert done.returncode == 2 and "--slots" in done.stderr


def test_sweep_stops_at_a_fault_and_keeps_the_rows_before_it(sweep, monkeypatch, tmp_path, capsys):
    """A fault (a CUDA error leaves the context unusable) ends the sweep: the rows timed before it are printed and
    written, the config that faulted is named with how many were not run, and the exit code is 1."""
    import json
    from types import SimpleNamespace

    import torch

    timed = []

    def fake_time(op, kernel, batch, settings, *rest):
        if len(timed) == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")
        timed.append(kernel)
        return sweep.Result(kernel, batch, settings, 1, 16, 2e9, True, 1e-3, us_per_layer_step=500.0, gbps=4000.0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name="fake", L2_cache_size=0))
    monkeypatch.setattr(sweep.common, "time_config", fake_time)
    out = tmp_path / "sweep.json"
    code = sweep.main(["--kernel", "decode", "--kernel", "replay", "--batch", "16", "--launch", "decode:",
                       "--launch", "replay:chunk=16", "--launch", "replay:chunk=32", "--out", str(out)])
    err = capsys.readouterr()
    assert code == 1
    assert "stopped at replay batch 16 {'chunk': 16}: RuntimeError: CUDA error: an illegal memory access" in err.err
    assert "1 configs after it not run" in err.err and "more" not in err.err
    assert "decode" in err.out
    saved = json.loads(out.read_text())
    assert [r["kernel"] for r in saved["results"]] == ["decode"] and "replay batch 16" in saved["stopped_at"]
