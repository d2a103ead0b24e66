"""How states are stored (replayssm_kernels.rounding): rounding to nearest and stochastically, 8-bit rows."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from replayssm_kernels import rounding as R

TL = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float8_e4m3fn: tl.float8e4nv, torch.int8: tl.int8}


@triton.jit
def _store_kernel(x, y, steps, seed, i_s, i_h, E, DTYPE: tl.constexpr, RANDOM: tl.constexpr, BE: tl.constexpr):
    o_e = tl.program_id(0) * BE + tl.arange(0, BE)
    m_e = o_e < E
    b_r = R.store_bits(R.store_key(seed, steps, i_s, i_h, RANDOM), o_e, RANDOM)
    tl.store(y + o_e, R.stored(tl.load(x + o_e, mask=m_e), b_r, DTYPE, RANDOM), mask=m_e)


@triton.jit
def _rows_kernel(x, q, scale, steps, seed, C, DTYPE: tl.constexpr, RANDOM: tl.constexpr, BC: tl.constexpr):
    i_r = tl.program_id(0)
    o_c = tl.arange(0, BC)
    m_c = o_c < C
    b_s = tl.load(x + i_r * C + o_c[None, :], mask=m_c[None, :], other=0.0)
    b_r = R.store_bits(R.store_key(seed, steps, 0, i_r, RANDOM), o_c[None, :], RANDOM)
    b_q, b_scale = R.quantized_rows(b_s, b_r, DTYPE, RANDOM)
    tl.store(q + i_r * C + o_c[None, :], b_q, mask=m_c[None, :])
    tl.store(scale + i_r + tl.arange(0, 1), b_scale)


@triton.jit
def _row_bits_kernel(by_element, by_row, seed, steps, N, C0: tl.constexpr, R_: tl.constexpr, BN: tl.constexpr):
    o_r, o_n = tl.arange(0, R_), tl.arange(0, BN)
    step = tl.load(steps + 1)
    o_out = o_r[:, None] * BN + o_n[None, :]
    b_k = R.slot_key(seed, step, 1, 2)
    tl.store(by_element + o_out, R.paired_bits(b_k, o_r[:, None] * N + C0 + o_n[None, :]).to(tl.int64))
    tl.store(by_row + o_out, R.row_bits(b_k, o_r, N, C0, BN).to(tl.int64))


@triton.jit
def _hash_kernel(keys, bits, seed, steps, E, BE: tl.constexpr, PAIRED: tl.constexpr):
    i_s = tl.program_id(0)
    o_e = tl.arange(0, BE)
    step = tl.load(steps + i_s)
    b_k = R.slot_key(seed, step, i_s, 3)
    tl.store(keys + i_s + o_e * 0, b_k.to(tl.int64), mask=o_e == 0)
    if PAIRED:
        b_r = R.paired_bits(b_k, o_e)
    else:
        b_r = R.element_bits(b_k, o_e)
    tl.store(bits + i_s * E + o_e, b_r.to(tl.int64), mask=o_e < E)


def _lowbias32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 over int64 tensors holding uint32 values."""
    m = 0xFFFFFFFF
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & m
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & m
    return x ^ (x >> 16)


def _store(x, dtype, rounding=None, slot=0, head=0):
    y = torch.full(x.shape, float("nan"), dtype=dtype, device=x.device)
    seed, steps, random = R.rounding_args(rounding, x)
    BE = 1024
    _store_kernel[(triton.cdiv(x.numel(), BE),)](x, y, steps, seed, slot, head, x.numel(), DTYPE=TL[dtype],
                                                 RANDOM=random, BE=BE)
    return y


def _rows(x, dtype, rounding=None):
    rows, C = x.shape
    q = torch.zeros(rows, C, dtype=dtype, device=x.device)
    scale = torch.full((rows,), float("nan"), device=x.device)
    seed, steps, random = R.rounding_args(rounding, x)
    _rows_kernel[(rows,)](x, q, scale, steps, seed, C, DTYPE=TL[dtype], RANDOM=random, BC=triton.next_power_of_2(C))
    return q, scale


def _values(n, device):
    """Normal and subnormal magnitudes of both signs, zeros, infinities and NaN."""
    x = torch.randn(n) * torch.logspace(-30, 30, n).clamp_max(6e4)
    x[:6] = torch.tensor([float("inf"), float("nan"), -float("inf"), 0.0, -0.0, -1e-30])
    return x.to(device)


def _same_bits(a, b):
    a, b = a.float().cpu(), b.float().cpu()
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_nearest_is_the_cast(device, dtype):
    """Rounding to nearest gives torch's cast bit for bit: subnormals, signed zeros, inf and NaN included."""
    x = _values(3000, device)
    assert _same_bits(_store(x, dtype), x.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_matches_its_reference(device, dtype):
    """The kernel's stochastic rounding equals the reference's for the same Philox bits."""
    x = _values(3000, device)
    rnd = R.StateRounding.create(4, seed=7, device=device)
    rnd.step[2] = 5
    got = _store(x, dtype, rnd, slot=2, head=3)
    bits = R.draw_bits(rnd, torch.tensor([2]), 4, x.numel(), paired=False)[0, 3]
    assert _same_bits(got, R.rounded_reference(x, bits, dtype).to(dtype))
    lo = x.to(dtype, copy=True).float()
    assert not _same_bits(got, lo), "stochastic rounding gave the nearest value everywhere"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_stochastic_is_unbiased_with_the_expected_variance(device, dtype):
    """Over 4096 draws, each value's rounding error has mean 0 and variance (x - lo)(hi - x), within 5 sigma, and
    every result is one of the value's two neighbours."""
    draws, n = 4096, 16
    lo = torch.linspace(0.75, 1.8, n)
    lo = R.rounded_reference(lo, None, dtype)
    gap = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float8_e4m3fn: 2.0**-3}[dtype]
    gap = gap * torch.where(lo >= 1, 1.0, 0.5)
    frac = torch.rand(n) * 0.9 + 0.05
    x = (lo + frac * gap).to(device)
    # each draw of a value is one more element of the stream
    rnd = R.StateRounding.create(1, seed=11, device=device)
    stored = _store(x.repeat(draws), dtype, rnd).float().cpu().view(draws, n)
    assert bool(((stored == lo) | (stored == lo + gap)).all()), "a result is not a neighbour of its value"
    err = stored - x.cpu()[None, :]
    var = (frac * (1 - frac) * gap * gap)
    sigma_mean = (var / draws).sqrt()
    assert bool((err.mean(0).abs() <= 5 * sigma_mean).all()), f"biased: {err.mean(0) / sigma_mean}"
    # the sample variance of a two-point variable: its standard error is about var * sqrt(2 / draws) or less
    assert bool(((err.var(0) - var).abs() <= 5 * var * math.sqrt(2 / draws) + 1e-12).all())


def test_steps_draw_afresh(device):
    """A slot's next store draws new bits: over 64 steps of one value a quarter of the way up its gap, about a
    quarter of the stores round up, and their mean is the value within 5 sigma (rounded to nearest, every one
    rounds down)."""
    x = torch.full((256,), 1.0 + 2.0**-9, device=device)
    rnd = R.StateRounding.create(1, seed=3, device=device)
    total = torch.zeros(256, dtype=torch.float64)
    for _ in range(64):
        total += _store(x, torch.bfloat16, rnd).double().cpu()
        rnd.advance(None, 1)
    sigma = math.sqrt(0.25 * 0.75 / (64 * 256)) * 2.0**-7
    assert abs(total.mean().item() / 64 - (1.0 + 2.0**-9)) <= 5 * sigma
    assert bool((_store(x, torch.bfloat16) == 1.0).all())


def test_streams_are_per_slot_head_and_step(device):
    """Bits depend on (seed, slot, head, step) and nothing else: a slot's draw is the same whichever rows it shares a
    launch with, and advance counts only the launch's slots (padding rows skipped)."""
    rnd = R.StateRounding.create(6, seed=5, device=device)
    a = R.draw_bits(rnd, torch.tensor([4, 1]), 2, 64, paired=True)
    b = R.draw_bits(rnd, torch.tensor([1]), 2, 64, paired=True)
    assert torch.equal(a[1], b[0])
    assert not torch.equal(a[0, 0], a[0, 1]) and not torch.equal(a[0], a[1])
    rnd.advance(torch.tensor([4, -1, 1], dtype=torch.int32, device=device), 3)
    assert rnd.step.tolist() == [0, 1, 0, 0, 1, 0]
    assert not torch.equal(R.draw_bits(rnd, torch.tensor([1]), 2, 64, paired=True), b)
    other = R.StateRounding(6, rnd.step.clone())
    assert not torch.equal(R.draw_bits(other, torch.tensor([1]), 2, 64, paired=True),
                           R.draw_bits(rnd, torch.tensor([1]), 2, 64, paired=True))
    rnd.reset(torch.tensor([1], device=device))
    assert torch.equal(R.draw_bits(rnd, torch.tensor([1]), 2, 64, paired=True), b)


@pytest.mark.parametrize("N,C0,BN", [(16, 0, 16), (24, 0, 32), (64, 0, 64), (128, 64, 64)],
                         ids=["N16", "N24-BN32", "N64", "N128-columns64"])
def test_row_bits_are_the_elements_bits(device, N, C0, BN):
    """row_bits (one hash per pair of neighbours) gives each element of columns C0 .. of a row the bits paired_bits and
    draw_bits give it, 16 bits each."""
    rnd = R.StateRounding.create(3, seed=9, device=device)
    rnd.step[1] = 4
    by_element = torch.zeros(8, BN, dtype=torch.int64, device=device)
    by_row = torch.zeros_like(by_element)
    _row_bits_kernel[(1,)](by_element, by_row, rnd.seed, rnd.step, N, C0=C0, R_=8, BN=BN)
    drawn = R.draw_bits(rnd, torch.tensor([1]), 3, 8 * N, paired=True)[0, 2].view(8, N)[:, C0:].cpu()
    width = min(BN, N - C0)
    assert torch.equal(by_element[:, :width].cpu(), drawn[:, :width])
    assert torch.equal(by_row[:, :width].cpu(), drawn[:, :width])
    assert int(drawn.max()) < 2**16 and int(drawn.min()) >= 0


@pytest.mark.parametrize("paired", [True, False], ids=["paired", "element"])
def test_bits_are_the_hash_of_place_and_key(device, paired):
    """Paired: elements 2i and 2i + 1 take the low and the high half of lowbias32(i + the store's key); by element:
    element e the top half of lowbias32(e + key). The key is one Philox draw per (slot, head, step): keys differ
    between slots and steps, and the bits of 3 x 4096 places look uniform (each 16th of the range within 5 sigma of
    its share) and neighbours uncorrelated, within a pair and across."""
    nslots, E = 3, 4096
    rnd = R.StateRounding.create(nslots, seed=11, device=device)
    rnd.step.copy_(torch.tensor([0, 0, 7]))
    keys = torch.zeros(nslots, dtype=torch.int64, device=device)
    bits = torch.zeros(nslots, E, dtype=torch.int64, device=device)
    _hash_kernel[(nslots,)](keys, bits, rnd.seed, rnd.step, E, BE=E, PAIRED=paired)
    keys, bits = keys.cpu(), bits.cpu()
    assert len(set(keys.tolist())) == nslots
    e = torch.arange(E)[None, :]
    if paired:
        want = (_lowbias32(((e >> 1) + keys[:, None]) & 0xFFFFFFFF) >> (16 * (e & 1))) & 0xFFFF
    else:
        want = _lowbias32((e + keys[:, None]) & 0xFFFFFFFF) >> 16
    assert torch.equal(bits, want)
    assert torch.equal(bits, R.draw_bits(rnd, torch.arange(nslots), 4, E, paired=paired)[:, 3].cpu())
    counts = torch.bincount((bits >> 12).flatten(), minlength=16).float()
    n = bits.numel() / 16
    assert bool(((counts - n).abs() <= 5 * math.sqrt(n)).all()), counts
    u = bits.float() / 2**16 - 0.5
    for a, b in ((u[:, 0::2], u[:, 1::2]), (u[:, 1:-1:2], u[:, 2::2])):
        r = (a * b).mean() / u.var()
        assert abs(float(r)) < 5 / math.sqrt(a.numel())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.int8])
@pytest.mark.parametrize("random", [False, True], ids=["nearest", "stochastic"])
def test_rows_match_their_reference(device, dtype, random):
    """8-bit rows and scales equal the reference's; dequantized, each value is within one quantum (half of one
    rounded to nearest); a row of zeros stays zero with a zero scale."""
    rows, C = 12, 40
    x = torch.randn(rows, C) * torch.logspace(-6, 3, rows)[:, None]
    x[3] = 0.0
    x = x.to(device)
    rnd = R.StateRounding.create(1, seed=9, device=device) if random else None
    q, scale = _rows(x, dtype, rnd)
    bits = R.draw_bits(rnd, torch.tensor([0]), rows, C, paired=False)[0] if random else None
    want_q, want_scale = R.quantized_rows_reference(x, bits, dtype)
    assert torch.equal(scale.cpu(), want_scale.cpu())
    assert torch.equal(q.cpu().view(torch.int8), want_q.cpu().view(torch.int8))
    back = R.dequantized_rows(q, scale).cpu()
    if dtype == torch.int8:
        quantum = scale.cpu()[:, None].expand(rows, C)
    else:
        quantum = scale.cpu()[:, None] * R.rounded_reference(x.cpu() / scale.cpu()[:, None].clamp_min(1e-38), None,
                                                             dtype).abs().clamp_min(2.0**-6) * 2.0**-3
    err = (back - x.cpu()).abs()
    assert bool((err <= (1.0 if random else 0.5) * quantum * 1.0001 + 1e-30).all())
    assert scale[3].item() == 0.0 and bool((q[3].float() == 0).all())


def test_fp8_nearest_is_the_cast(device):
    """fp8 rows rounded to nearest are torch's e4m3 cast of the scaled row."""
    x = torch.randn(8, 32, device=device) * 3
    q, _ = _rows(x, torch.float8_e4m3fn)
    want = (x * (448.0 / x.abs().amax(-1))[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.int8), want.view(torch.int8))


def test_bad_rounding_is_one_line():
    with pytest.raises(ValueError, match="seed must be an integer"):
        R.StateRounding.create(2, seed=-1, device="cpu")
    rnd = R.StateRounding.create(2, device="cpu")
    with pytest.raises(ValueError, match="fp32 state is stored exactly"):
        R.check_rounding(rnd, torch.float32, 2, torch.device("cpu"), 64)
    with pytest.raises(ValueError, match="counts 2 slots but the state has 3"):
        R.check_rounding(rnd, torch.bfloat16, 3, torch.device("cpu"), 64)
    with pytest.raises(ValueError, match="must be a StateRounding"):
        R.check_rounding(7, torch.bfloat16, 2, torch.device("cpu"), 64)
    with pytest.raises(ValueError, match="even number of elements"):
        R.check_rounding(rnd, torch.bfloat16, 2, torch.device("cpu"), 17)
