"""Split precision: the read copy's rounding reaches the outputs of non-flush steps and never the checkpoint."""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import mamba2

STEPS = 2000
READ = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
# One unit in the last place, relative, of each read dtype, and its smallest subnormal.
UNIT = {torch.bfloat16: (2.0**-7, 0.0), torch.float16: (2.0**-10, 2.0**-24), torch.float8_e4m3fn: (2.0**-3, 2.0**-9)}


def _slow_decay_inputs(H, P, N, G, device="cpu"):
    """One step with A·Δ = -0.002: a bf16 state cannot represent such a small decay, so its error piles up."""
    inp = mamba2.random_inputs(1, H, P, N, G, io_dtype=torch.float32, device=device, optional=False)
    inp["A"] = torch.full((H,), -1.0, device=device)
    inp["dt"] = torch.full((1, H), 0.002, device=device)
    return inp


def assert_copy_rounds_the_checkpoint(cache, device) -> None:
    """The read copy is the fp32 checkpoint rounded to the read dtype: within one unit everywhere, and
    identical but for rare ties under the GPU's approximate division (the CPU interpreter truncates bf16
    casts, so there bf16 copies are only held to the unit)."""
    want, scale = mamba2.quantize_ref(cache.checkpoint, cache.read_dtype)
    got, want = cache.read_copy.float(), want.float()
    if scale is not None:
        torch.testing.assert_close(cache.read_scale, scale, rtol=1e-6, atol=0)
    rel, tiny = UNIT[cache.read_dtype]
    assert ((got - want).abs() <= rel * want.abs() + tiny).all(), "the read copy is off by more than one unit"
    if not (device == "cpu" and cache.read_dtype == torch.bfloat16):
        same = (got == want).double().mean().item()
        assert same >= 0.99, f"only {same:.1%} of the read copy rounds to nearest"


def _rel_err(y, y_exact) -> float:
    return ((y.double() - y_exact).abs().max() / y_exact.abs().max()).item()


def test_split_precision_error_stays_bounded_over_2000_steps():
    """References, 2000 steps, W = 8: a bf16 read copy over an fp32 checkpoint keeps its error at the bf16
    level with no growth, and leaves the checkpoint bit-identical to an fp32-only cache's, while a bf16
    conventional state's error keeps growing."""
    H, P, N, G, W = 2, 8, 8, 1, 8
    start = torch.randn(1, H, P, N)
    split = mamba2.ReplayCache.create(1, H, P, N, G, W, read_dtype="bf16", io_dtype="fp32", device="cpu")
    full = mamba2.ReplayCache.create(1, H, P, N, G, W, io_dtype="fp32", device="cpu")
    split.load(start)
    full.load(start)
    conv = start.to(torch.bfloat16)
    exact = start.double()
    err_split, err_conv = [], []
    for step in range(STEPS):
        inp = _slow_decay_inputs(H, P, N, G)
        y_split = mamba2.replay_ref(split, **inp)
        mamba2.replay_ref(full, **inp)
        y_conv = mamba2.decode_ref(conv, **inp)
        y_exact = mamba2.decode_ref(exact, **{k: v.double() for k, v in inp.items()})
        err_split.append(_rel_err(y_split, y_exact))
        err_conv.append(_rel_err(y_conv, y_exact))
    assert torch.equal(split.checkpoint, full.checkpoint), "read-copy rounding reached the checkpoint"
    quarter = STEPS // 4
    first_split, last_split = max(err_split[:quarter]), max(err_split[-quarter:])
    first_conv, last_conv = sum(err_conv[:quarter]) / quarter, sum(err_conv[-quarter:]) / quarter
    assert last_split < 4 * 2.0**-8, f"split-precision error {last_split:.3g} is above the bf16 level"
    assert last_split < 2 * first_split, f"split-precision error grew from {first_split:.3g} to {last_split:.3g}"
    assert last_conv > 4 * first_conv, f"bf16 conventional error {first_conv:.3g} -> {last_conv:.3g} did not grow"
    assert last_conv > 10 * last_split


@pytest.mark.parametrize("read", list(READ), ids=[f"B2-H2-P12-N10-G1-W4-fp32-{r}-bf16" for r in READ])
def test_split_kernel_checkpoint_matches_full_precision(device, assert_close, read):
    """Kernels, 4 windows of staggered rows, then verify rounds that fold: the split cache's checkpoint and
    materialized state equal an fp32-only cache's to fp32 rounding, its read copy is its checkpoint rounded,
    and its outputs differ from the fp32-only cache's only by the read dtype."""
    nslots, H, P, N, G, W = 3, 2, 12, 10, 1, 4
    start = torch.randn(nslots, H, P, N, device=device)
    split = mamba2.ReplayCache.create(nslots, H, P, N, G, W, read_dtype=read, max_draft=3, device=device)
    full = mamba2.ReplayCache.create(nslots, H, P, N, G, W, max_draft=3, device=device)
    split.load(start)
    full.load(start)
    for step in range(4 * W):
        inp = mamba2.random_inputs(2, H, P, N, G, device=device)
        rows = torch.tensor([2, 0 if step >= 1 else -1], dtype=torch.int32, device=device)
        y_split = mamba2.replay(split, **inp, dt_softplus=True, slots=rows)
        y_full = mamba2.replay(full, **inp, dt_softplus=True, slots=rows)
        live = rows >= 0
        assert_close(y_split[live], y_full[live], torch.bfloat16, READ[read], what=f"y at step {step}")
    assert_copy_rounds_the_checkpoint(split, device)
    rows = torch.tensor([2, 0], dtype=torch.int32, device=device)
    for round_ in range(3):
        inp = mamba2.random_inputs(2, H, P, N, G, T=3, device=device)
        y_split = mamba2.verify(split, **inp, dt_softplus=True, slots=rows)
        y_full = mamba2.verify(full, **inp, dt_softplus=True, slots=rows)
        assert_close(y_split, y_full, torch.bfloat16, READ[read], what=f"verify y, round {round_}")
        n = torch.tensor([3, 2], dtype=torch.int32, device=device)
        mamba2.accept(split, n, rows)
        mamba2.accept(full, n, rows)
    assert_copy_rounds_the_checkpoint(split, device)
    assert_close(split.checkpoint, full.checkpoint, torch.float32, what="checkpoint")
    assert_close(mamba2.materialize(split), mamba2.materialize(full), torch.float32, what="materialized state")


@pytest.mark.gpu
def test_split_kernel_2000_steps_on_gpu(assert_close):
    """The kernel over 2000 steps on the GPU: error bounded and flat, checkpoint equal to an fp32-only run."""
    device = "cuda"
    H, P, N, G, W = 8, 64, 128, 2, 16
    start = torch.randn(1, H, P, N, device=device)
    split = mamba2.ReplayCache.create(1, H, P, N, G, W, read_dtype="bf16", io_dtype="fp32", device=device)
    full = mamba2.ReplayCache.create(1, H, P, N, G, W, io_dtype="fp32", device=device)
    split.load(start)
    full.load(start)
    exact = start.double()
    errs = []
    for _ in range(STEPS):
        inp = _slow_decay_inputs(H, P, N, G, device)
        y = mamba2.replay(split, **inp, check=False)
        mamba2.replay(full, **inp, check=False)
        errs.append(_rel_err(y, mamba2.decode_ref(exact, **{k: v.double() for k, v in inp.items()})))
    quarter = STEPS // 4
    assert max(errs[-quarter:]) < 4 * 2.0**-8
    assert max(errs[-quarter:]) < 2 * max(errs[:quarter])
    assert_close(split.checkpoint, full.checkpoint, torch.float32, what="checkpoint after 2000 steps")
    assert_copy_rounds_the_checkpoint(split, device)
