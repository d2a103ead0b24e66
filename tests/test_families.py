"""Feature refusals and launch rows per GPU family, on the CPU with the device's compute capability faked."""

from __future__ import annotations

import importlib

import pytest
import torch
from triton.runtime.errors import OutOfResources

import replayssm_kernels.gdn as gdn
import replayssm_kernels.mamba2 as mamba2
from replayssm_kernels import families

CPU = torch.device("cpu")


@pytest.fixture
def chip(monkeypatch):
    """Make the kernels see a GPU of compute capability `arch` (major * 10 + minor) behind CPU tensors."""

    def set_arch(arch: int) -> None:
        monkeypatch.setattr(families, "capability", lambda device: arch)

    return set_arch


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_family_of_every_generation_and_none_older():
    assert [families.family_of(a).name for a in (80, 86, 89, 90, 100, 120)] == [
        "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"]
    assert families.family_of(87).name == "sm_80" and families.family_of(103).name == "sm_100"
    assert [f.name for f in families.FAMILIES if f.tuned] == ["sm_90"]
    assert families.family_of(80).shared_per_block == 163 * 1024
    assert families.family_of(120).shared_per_block == 99 * 1024
    with pytest.raises(ValueError, match="sm_75 is not a GPU generation these kernels support"):
        families.family_of(75)


@pytest.mark.parametrize("op", ["mamba2", "gdn"])
@pytest.mark.parametrize("arch", [80, 86])
def test_fp8_read_copy_is_refused_before_sm89(chip, op, arch):
    chip(arch)
    with pytest.raises(ValueError) as exc:
        if op == "mamba2":
            mamba2.ReplayCache.create(2, 4, 8, 8, 2, 4, read_dtype="fp8", device="cpu")
        else:
            gdn.ReplayCache.create(2, 2, 4, 8, 8, 4, state_dtype="fp32", read_dtype="fp8", io_dtype="bf16", device="cpu")
    line = _one_line(exc)
    assert "fp8 read copies need sm_89" in line and f"sm_{arch}" in line and "--read-dtype bf16" in line


@pytest.mark.parametrize("op", ["mamba2", "gdn"])
def test_fp8_cache_on_a_chip_without_fp8_is_refused_by_the_kernel(chip, op):
    chip(89)
    if op == "mamba2":
        cache = mamba2.ReplayCache.create(2, 4, 8, 8, 2, 4, read_dtype="fp8", device="cpu")
        inputs = mamba2.random_inputs(2, 4, 8, 8, 2, io_dtype=torch.bfloat16)
    else:
        cache = gdn.ReplayCache.create(2, 2, 4, 8, 8, 4, state_dtype="fp32", read_dtype="fp8", io_dtype="bf16", device="cpu")
        inputs = gdn.random_inputs(2, 2, 4, 8, 8, io_dtype=torch.bfloat16)
    before = cache.fill.clone()
    chip(80)
    with pytest.raises(ValueError, match="fp8 read copies need sm_89.*sm_80.*--read-dtype bf16"):
        (mamba2 if op == "mamba2" else gdn).replay(cache, **inputs)
    assert torch.equal(cache.fill, before), "nothing ran"


def test_pdl_rows_carry_over_without_pdl_and_an_asked_pdl_is_refused(chip):
    chip(90)
    assert families.pdl(True, False, CPU) and not families.pdl(False, True, CPU)
    for arch in (80, 86, 89):
        chip(arch)
        assert not families.pdl(True, False, CPU), "the sm_90 row carried over without PDL"
        with pytest.raises(ValueError) as exc:
            families.pdl(True, True, CPU)
        line = _one_line(exc)
        assert "programmatic dependent launch" in line and "sm_90" in line and f"sm_{arch}" in line
        assert "without it" in line
    # the CPU (Triton's interpreter) has no family: nothing to overlap
    chip(None)
    assert not families.pdl(True, True, CPU)


def test_gdn_replay_refuses_an_asked_pdl_before_sm90(chip):
    chip(86)
    cache = gdn.ReplayCache.create(2, 2, 4, 8, 8, 4, state_dtype="fp32", read_dtype="bf16", io_dtype="bf16", device="cpu")
    before = cache.fill.clone()
    row = importlib.import_module("replayssm_kernels.gdn.replay").REPLAY_LAUNCH["replay-split"]
    with pytest.raises(ValueError, match="pdl .*needs sm_90 or newer; this GPU is sm_86"):
        gdn.replay(cache, **gdn.random_inputs(2, 2, 4, 8, 8, io_dtype=torch.bfloat16), config=row)
    assert torch.equal(cache.fill, before), "nothing ran"


def test_out_of_shared_memory_is_one_line_naming_the_need_and_the_chip(chip, monkeypatch):
    chip(86)

    @families.refuse_out_of_resources
    def replay():
        raise OutOfResources(147456, 101376, "shared memory")

    with pytest.raises(families.UnsupportedOnChip) as exc:
        replay()
    line = _one_line(exc)
    assert line.startswith("replay: the launch row needs shared memory 147456, over the 101376 of sm_86")
    assert "fewer STAGES" in line and "replayssm check --compile" in line


def test_every_public_kernel_function_refuses_out_of_resources_in_one_line():
    for module in (mamba2, gdn):
        for name in ("decode", "decode_multi", "accept_snapshot", "replay", "materialize", "verify", "accept"):
            assert getattr(module, name).__wrapped__, f"{module.__name__}.{name}"


def test_check_refuses_fp8_before_sm89_without_failing(device, monkeypatch):
    from replayssm_cli.measure import check

    monkeypatch.setattr(families, "capability", lambda device: 86)
    spec = next(s for s in check.cases("mamba2") if s["read_dtype"] == "fp8")
    (row,) = check.run_checks([spec], device, progress=False)
    assert row["ok"] is None and row["error"] is None and "fp8 read copies need sm_89" in row["refused"]


def test_profile_refuses_fp8_on_a_chip_without_it_in_one_line(monkeypatch):
    from typer.testing import CliRunner

    from replayssm_cli.main import app

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(families, "capability", lambda device: 80)
    res = CliRunner().invoke(app, ["profile", "--preset", "nemotron-3-super-120b-a12b", "--batch", "1",
                                   "--read-dtype", "fp8"])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert "\n" not in line and "fp8 read copies need sm_89" in line and "sm_80 (NVIDIA A100-SXM4-80GB)" in line
    assert "--read-dtype bf16" in line
