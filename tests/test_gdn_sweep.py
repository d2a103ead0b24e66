"""benchmarks/sweep_gdn.py without a GPU: arguments, plan, byte counts, refusal, and its check and step code."""

from __future__ import annotations

import pytest
import torch

import benchmark_scripts
import sweep_cost

sweep = benchmark_scripts.fixture("sweep_gdn")


def _run(*argv):
    return benchmark_scripts.run("sweep_gdn", *argv)


def test_sweep_help():
    done = _run("--help")
    assert done.returncode == 0
    assert "--quick" in done.stdout and "--launch" in done.stdout and "examples:" in done.stdout


def test_sweep_dry_run_plans_every_kernel_and_batch():
    done = _run("--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 10 * 4  # 10 kernels (split-bf16 whole, non-flush and flush, split-fp8 among them), 4 batches
    assert all("layers" in line and "MiB/layer-step" in line for line in lines)


def test_sweep_bad_launch_is_one_line():
    done = _run("--launch", "replay:chunk")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "field=integer" in done.stderr


def test_sweep_parse_launch(sweep):
    assert sweep.parse_launch("replay:chunk=64,warps=8") == ("replay", {"chunk": 64, "warps": 8})
    with pytest.raises(ValueError, match="KERNEL one of"):
        sweep.parse_launch("conv:chunk=4")
    plan = sweep.plan(["replay", "decode"], True, [("replay", {"num_warps": 4})])
    assert plan["replay"] == [{"num_warps": 4}] and plan["decode"] == sweep.QUICK_GRID["decode"]


def _cost_model_bytes(sweep, kernel: str, batch: int, state: str = "fp32", buffer: str | None = None) -> float:
    from replayssm_cli.model.shapes import GDNShape

    # GDN reads no parameters once per step: the rows add up.
    return sweep_cost.graph_bytes(sweep, GDNShape(**sweep.SHAPE), kernel, batch, 0, state_dtype=state,
                                  buffer_dtype=buffer)


@pytest.mark.parametrize("batch", [1, 3, 256])
def test_sweep_bytes_are_the_cost_models(sweep, monkeypatch, batch):
    """The bytes behind the GB/s column are the cost model's for every kernel's rows (fla's and the slot-less decode
    a conventional step's), and the inputs the sweep draws are the ones it counts (g in bf16, as the others)."""
    monkeypatch.setitem(sweep.common.STATE, "dtype", "fp32")
    monkeypatch.setitem(sweep.common.STATE, "buffer", None)
    for kernel in sweep.KERNELS + sweep.EXTRA_KERNELS:
        assert sweep.bytes_per_layer_step(kernel, batch) == pytest.approx(_cost_model_bytes(sweep, kernel, batch),
                                                                          abs=1), kernel
    inp = sweep.random_inputs(2, None, "cpu")
    assert {k: v.dtype for k, v in inp.items()} == dict.fromkeys(("q", "k", "v", "g", "beta"), torch.bfloat16)


def test_sweep_bytes_with_2_byte_buffers(sweep, monkeypatch):
    """--buffer-dtype bf16 at a bf16 state: the cost model's bytes, which are the fp32 buffers' less 2 bytes for
    every element of u and k a row moves."""
    (H, HV, K, V), W, batch = (sweep.SHAPE[d] for d in ("H", "HV", "K", "V")), sweep.WINDOW, 256
    monkeypatch.setitem(sweep.common.STATE, "dtype", "bf16")
    monkeypatch.setitem(sweep.common.STATE, "buffer", "fp32")
    wide = sweep.bytes_per_layer_step("replay", batch)
    monkeypatch.setitem(sweep.common.STATE, "buffer", "bf16")
    narrow = sweep.bytes_per_layer_step("replay", batch)
    assert narrow == pytest.approx(_cost_model_bytes(sweep, "replay", batch, "bf16", "bf16"), abs=1)
    # In W steps a row reads f entries and appends one at each nonflush fill f = 0..W-2 and reads W-1 at its flush:
    # W(W-1)/2 + W-1 entries, each u (HV, V) and k (H, K) in 2 bytes instead of 4.
    entries_per_step = (W * (W - 1) / 2 + W - 1) / W
    assert wide - narrow == pytest.approx(batch * entries_per_step * (HV * V + H * K) * 2, rel=1e-12)
    for kernel in ("decode", "split-fp8", "verify"):
        assert sweep.bytes_per_layer_step(kernel, batch) == pytest.approx(
            _cost_model_bytes(sweep, kernel, batch, "bf16", "bf16"), abs=1), kernel


def test_sweep_buffer_dtype_is_fp32_or_the_state_dtype():
    done = _run("--dry-run", "--buffer-dtype", "bf16")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and "--buffer-dtype must be fp32 or the state dtype" in done.stderr
    done = _run("--dry-run", "--state-dtype", "bf16", "--buffer-dtype", "fp32")
    assert done.returncode == 0 and len(done.stdout.strip().splitlines()) == 7 * 4
    # a bf16 copy is not narrower than a bf16 state: each split-bf16 kernel one line, not planned
    skipped = done.stderr.strip().splitlines()
    assert len(skipped) == 3 and all("skipping split-bf16" in line and "not narrower" in line for line in skipped)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_sweep_refuses_without_cuda():
    done = _run("--quick", "--kernel", "decode")
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""


@pytest.mark.parametrize("kernel", ["decode", "decode-direct", "split-bf16", "decode-multi", "verify"])
def test_sweep_check_and_step_at_a_tiny_shape(sweep, device, monkeypatch, kernel):
    """The per-config correctness check passes and a stack steps, with the sweep's own code, at a tiny shape."""
    monkeypatch.setattr(sweep, "SHAPE", {"H": 1, "HV": 2, "K": 16, "V": 8})
    monkeypatch.setattr(sweep, "WINDOW", 3)
    monkeypatch.setattr(sweep, "DRAFT", 2)
    monkeypatch.setattr(sweep, "ACCEPTED", 1)
    launch = {"rows": 8, "warps": 2} if kernel.startswith("decode") else {"chunk": 16, "warps": 2}
    assert sweep.check_config(kernel, launch, device) < 2e-2
    stack = sweep.Stack(kernel, 3, 2, launch, device)
    stack.rewind()
    before = [layer[0].clone() for layer in stack.layers] if kernel in ("decode", "decode-direct") else None
    stack.step()
    if kernel in ("split-bf16", "verify"):
        assert all(layer.fill.sum() > 0 for layer in stack.layers)
    if before is not None:
        assert all(not torch.equal(layer[0], old) for layer, old in zip(stack.layers, before)), "no state was stepped"


def test_sweep_checks_on_rows_of_the_timed_grid_class(sweep, device, monkeypatch):
    """The check runs the launch row the timed batch takes: as many rows as the batch up to 8, so on the H200 (132
    SMs, a grid small under 264 programs) the check's grid is small exactly when the timed one is; a split row's
    flush_ fields (which only its two-launch rows take) then pass the check at a large batch."""
    common = sweep.common
    assert common.check_rows(1) == [0] and common.check_rows(3) == [2, -1, 0]
    assert common.check_rows(512) == [2, -1, 0, 3, 4, 5, 6, 7]
    for batch in range(1, 600):
        assert (len(common.check_rows(batch)) * 64 < 264) == (batch * 64 < 264), batch
    # On a GPU the check's 8 rows need enough heads for a grid that is not small (8 x 64 programs; 8 x 2 would take
    # the one-launch small-grid row, which has no flush_ fields); on the CPU no grid is small.
    hv = 2 if device == "cpu" else 64
    monkeypatch.setattr(sweep, "SHAPE", {"H": 1, "HV": hv, "K": 16, "V": 8})
    monkeypatch.setattr(sweep, "WINDOW", 3)
    assert sweep.check_config("split-bf16", {"flush_flush_chunk": 16}, device, common.check_rows(256)) < 2e-2


@pytest.mark.parametrize("kernel,v_first", [("fla", 1), ("fla-inplace", 1), ("fla-inplace", 0)])
def test_sweep_fla_kernels_at_a_tiny_shape(sweep, device, monkeypatch, kernel, v_first):
    """fla's decode as the sweep runs it, out of place and written over its initial state, against our reference."""
    pytest.importorskip("fla.ops.gated_delta_rule.fused_recurrent", reason="fla-core is not installed")
    monkeypatch.setattr(sweep, "SHAPE", {"H": 1, "HV": 2, "K": 16, "V": 8})
    launch = {"V_FIRST": v_first}
    try:
        assert sweep.check_config(kernel, launch, device) < 2e-2
    except Exception as exc:
        if device == "cpu" and "0-dimensional arrays" in str(exc):
            pytest.skip("fla's kernel loops tl.range(0, T) over a runtime scalar, which Triton's interpreter cannot "
                        "turn into an int (it runs on CUDA)")
        raise
    stack = sweep.Stack(kernel, 3, 2, launch, device)
    before = [layer[0] for layer in stack.layers]
    copies = [state.clone() for state in before]
    stack.rewind()
    stack.step()
    for old, copy, layer in zip(before, copies, stack.layers):
        assert not torch.equal(layer[0], copy), "the step did not change the state"
        assert (layer[0] is old) == (kernel == "fla-inplace")


def test_sweep_skips_a_missing_outside_kernel(sweep, monkeypatch, capsys):
    """A kernel whose package is missing is one line and is left out; the others still run."""
    monkeypatch.setattr(sweep, "unavailable", lambda k: f"{k} needs a package" if k == "fla" else None)
    code = sweep.main(["--kernel", "fla", "--kernel", "decode", "--batch", "1", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.strip() == "sweep_gdn: skipping fla needs a package"
    assert out.strip().startswith("decode") and "fla" not in out


def test_sweep_configs_are_the_chosen_rows_with_the_fields_put_in(sweep):
    """Each timed setting is a field of the launch configuration the kernel picks at that batch."""
    from replayssm_kernels import gdn

    cache = gdn.ReplayCache.create(2, 1, 2, 8, 8, 4, state_dtype="fp32", read_dtype="bf16", io_dtype="bf16",
                                   max_draft=2, device="cpu")
    plain = gdn.ReplayCache.create(2, 1, 2, 8, 8, 4, state_dtype="fp32", io_dtype="bf16", max_draft=2, device="cpu")
    for kernel, settings in sweep.GRID.items():
        if kernel in sweep.FLA_KERNELS:
            continue
        target = torch.zeros(2, 2, 8, 8) if kernel.startswith("decode") else cache if "split" in kernel else plain
        for fields in settings:
            sweep.config_for(kernel, target, 2, fields)
    assert sweep.config_for("split-bf16", cache, 2, {"flush_rows": 64}).flush.rows == 64
    with pytest.raises(ValueError, match="ReplayConfig has no field 'CHUNK'"):
        sweep.config_for("replay", plain, 2, {"CHUNK": 16})
