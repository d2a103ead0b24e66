"""Mamba-2 states stored stochastically rounded and as 8-bit rows with scales: decode, decode_multi, the ReplaySSM
cache (replay, its flushes, verify's fold, materialize) against their references."""

from __future__ import annotations

import importlib
import math

import pytest
import torch

from replayssm_kernels import mamba2
from replayssm_kernels import rounding as R

replay_mod = importlib.import_module("replayssm_kernels.mamba2.replay")

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
NAN = float("nan")
# mantissa bits of each stored format, and its smallest normal (below it the spacing is fixed)
MANTISSA = {torch.bfloat16: (7, 2.0**-126), torch.float16: (10, 2.0**-14), torch.float8_e4m3fn: (3, 2.0**-6)}
# The kernels' fp32 values differ from the reference's by a few fp32 roundings (sums in another order, exp), which
# moves a stored value to its other neighbour only where that difference straddles the rounding threshold: rare.
MOVED = 0.02


def quantum(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap between the neighbours of values v (fp32) in a 16-bit or fp8 format."""
    mant, tiny = MANTISSA[dtype]
    a = v.abs().clamp_min(tiny)
    return torch.exp2(torch.floor(torch.log2(a)) - mant)


def values(state: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    return R.dequantized_rows(state, scale) if scale is not None else state.float()


def assert_stored(got, want, got_scale=None, want_scale=None, *, what: str, exact: bool = True,
                  term_scale=None) -> None:
    """A stored state against the reference's: (with `exact`) equal to it but for a few elements, and everywhere
    within the two values' gaps of it: each store rounds its fp32 value to a neighbour, and the kernel's fp32 value
    and the reference's differ by a few fp32 roundings (sums in another order; the GPU's exp), so where they straddle
    a binade the two gaps differ and a value may land two of the smaller ones away. 8-bit rows' scales within those
    roundings (2^-16). Without `exact` (bf16 rounded to nearest in the CPU interpreter, which truncates, carried
    into later stores; a TF32 flush on the GPU, 2^-11 of the update) within four quanta of the largest value (8-bit
    rows: four of the largest row's gaps) and scales within 2^-9 of `term_scale`, the scales of the terms' magnitudes
    (`magnitudes`): a TF32 product's operands keep 10 of fp32's 23 mantissa bits, so each term is off by 2^-9 of
    itself at most, and the terms of a row may cancel."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    g, w = values(got, got_scale).cpu(), values(want, want_scale).cpu()
    assert not g.isnan().any(), f"{what}: NaN stored"
    if got_scale is not None:
        gs, ws = got_scale.cpu(), want_scale.cpu()
        bound = 2.0**-16 * ws.abs()
        if not exact:
            bound = bound + 2.0**-9 * (ws.abs() if term_scale is None else term_scale.cpu().abs())
        off = (gs - ws).abs() > bound
        assert not off.any(), f"{what}: {int(off.sum())} scales differ by up to {(gs - ws).abs().max():.3g}"
        if got.dtype == torch.int8:
            gaps = ws[..., None].expand(w.shape) + gs[..., None].expand(g.shape)
        else:
            gaps = ws[..., None] * quantum(want.float().cpu(), got.dtype) + gs[..., None] * quantum(
                got.float().cpu(), got.dtype)
    else:
        gaps = quantum(w, got.dtype) + quantum(g, got.dtype)
    # the fp32 difference itself: relative to the value, and to its row where the update cancels
    near = gaps * 1.0001 + w.abs() * 2.0**-16 + w.abs().amax(-1, keepdim=True) * 2.0**-20
    err = (g - w).abs()
    # without `exact`: four quanta of the largest value (8-bit: four of the largest row's gaps)
    coarse = quantum(w.abs().max(), got.dtype) if got_scale is None else gaps.max()
    bad = err > (near if exact else 4 * coarse)
    assert not bad.any(), f"{what}: {int(bad.sum())} values off by more than their gaps (worst {err.max():.3g})"
    if exact:
        bits = torch.int8 if got.element_size() == 1 else torch.int16
        moved = (got.cpu().view(bits) != want.cpu().view(bits)).float().mean().item()
        assert moved <= MOVED, f"{what}: {moved:.1%} of the stored values differ from the reference's"


def stored_state(nslots, H, P, N, dtype, device):
    """A random state pool in `dtype` and its row scales (None unless 8-bit)."""
    S = torch.randn(nslots, H, P, N) * torch.logspace(-2, 1, P)[:, None]
    if dtype in R.EIGHT_BIT:
        q, scale = R.quantized_rows_reference(S, None, dtype)
        return q.to(device), scale.to(device)
    return S.to(device, dtype), None


def clone(t):
    return None if t is None else t.clone()


def rounding(nslots, device, on: bool, seed: int = 5):
    if not on:
        return None
    r = R.StateRounding.create(nslots, seed=seed, device=device)
    r.step.copy_(torch.arange(nslots) * 3)
    return r


CASES = [(s, r) for s in ("bf16", "fp16", "fp8", "int8") for r in (False, True)]
CASE_IDS = [f"{s}-{'stochastic' if r else 'nearest'}" for s, r in CASES]


@pytest.mark.parametrize("state_dtype,random", CASES, ids=[f"B3-H4-P12-N20-G2-{i}" for i in CASE_IDS])
def test_decode_rounds_as_its_reference(device, assert_close, state_dtype, random):
    """B3-H4-P12-N20-G2 with a padding row: outputs, the stored state (and scales) and the step counts against the
    reference; slots in no row are untouched."""
    nslots, batch, H, P, N, G = 5, 3, 4, 12, 20, 2
    sd = DT[state_dtype]
    state, scale = stored_state(nslots, H, P, N, sd, device)
    inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.bfloat16, device=device)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    rnd = rounding(nslots, device, random)
    got, got_scale, got_rnd = state.clone(), clone(scale), None if rnd is None else rnd.clone()
    want, want_scale, want_rnd = state.clone(), clone(scale), None if rnd is None else rnd.clone()
    y = mamba2.decode(got, **inp, dt_softplus=True, slots=slots, state_scale=got_scale, rounding=got_rnd,
                      out=torch.full((batch, H, P), NAN, dtype=torch.bfloat16, device=device))
    y_want = mamba2.decode_ref(want, **inp, dt_softplus=True, slots=slots, state_scale=want_scale, rounding=want_rnd)
    assert_close(y, y_want, torch.bfloat16, what="y")
    assert y[1].isnan().all(), "a padding row's output was written"
    # the CPU interpreter truncates a bf16 cast where the GPU rounds to nearest: one quantum, not the same bits
    exact = random or sd != torch.bfloat16 or device == "cuda"
    assert_stored(got, want, got_scale, want_scale, what="state", exact=exact)
    for s in (1, 2, 4):
        assert torch.equal(got[s], state[s]), f"slot {s} is in no row but changed"
    if random:
        assert got_rnd.step.tolist() == want_rnd.step.tolist() == [1, 3, 6, 10, 12]


MULTI_CASES = [("bf16", True), ("fp16", True), ("int8", False), ("int8", True), ("fp8", True)]


@pytest.mark.parametrize("state_dtype,random", MULTI_CASES, ids=[
    f"B2-H2-P12-N10-G1-T3-{s}-{'stochastic' if r else 'nearest'}" for s, r in MULTI_CASES])
def test_decode_multi_rounds_each_snapshot(device, assert_close, state_dtype, random):
    """B2-H2-P12-N10-G1-T3: each snapshot is stored as decode stores a state (stochastically at its own step,
    count + t; 8-bit rows with their scales) and the next draft continues from it; the counts advance by T;
    accept_snapshot then copies a snapshot (and its scales) bit for bit."""
    nslots, batch, H, P, N, G, T = 3, 2, 2, 12, 10, 1, 3
    sd = DT[state_dtype]
    state, scale = stored_state(nslots, H, P, N, sd, device)
    inp = mamba2.random_inputs(batch, H, P, N, G, T=T, io_dtype=torch.bfloat16, device=device)
    slots = torch.tensor([2, 0], dtype=torch.int32, device=device)
    rnd = rounding(nslots, device, random)
    got_rnd, want_rnd = (None, None) if rnd is None else (rnd.clone(), rnd.clone())
    fill = 0 if sd in R.EIGHT_BIT else NAN
    snaps = torch.full((nslots, T, H, P, N), fill, dtype=torch.float32, device=device).to(sd)
    snap_scale = None if scale is None else torch.full((nslots, T, H, P), NAN, device=device)
    want_snaps, want_scale = snaps.clone(), clone(snap_scale)
    y = mamba2.decode_multi(state, snaps, **inp, dt_softplus=True, slots=slots, state_scale=scale,
                            snapshot_scale=snap_scale, rounding=got_rnd,
                            out=torch.full((batch, T, H, P), NAN, dtype=torch.bfloat16, device=device))
    y_want = mamba2.decode_multi_ref(state, want_snaps, **inp, dt_softplus=True, slots=slots, state_scale=scale,
                                     snapshot_scale=want_scale, rounding=want_rnd)
    coarse = torch.float8_e4m3fn if sd in R.EIGHT_BIT else sd
    assert_close(y, y_want, torch.bfloat16, coarse, what="y")
    for s in (0, 2):
        assert_stored(snaps[s], want_snaps[s], None if scale is None else snap_scale[s],
                      None if scale is None else want_scale[s], what=f"snapshots of slot {s}")
    if scale is None:
        assert snaps[1].isnan().all()
    else:
        assert snap_scale[1].isnan().all()
    if random:
        assert got_rnd.step.tolist() == want_rnd.step.tolist() == [3, 3, 9]
        nearest = snaps.clone()
        mamba2.decode_multi(state, nearest, **inp, dt_softplus=True, slots=slots, state_scale=scale,
                            snapshot_scale=clone(snap_scale))
        assert not torch.equal(nearest[0].view(torch.int8 if sd in R.EIGHT_BIT else torch.int16),
                               snaps[0].view(torch.int8 if sd in R.EIGHT_BIT else torch.int16)), \
            "stochastic snapshots equal the nearest ones"
    got, got_scale = state.clone(), clone(scale)
    n = torch.tensor([2, 3], dtype=torch.int32, device=device)
    mamba2.accept_snapshot(got, snaps, n, slots, state_scale=got_scale, snapshot_scale=snap_scale)
    want, want_state_scale = state.clone(), clone(scale)
    mamba2.accept_snapshot_ref(want, snaps, n, slots, state_scale=want_state_scale, snapshot_scale=snap_scale)
    bits = torch.int8 if sd in R.EIGHT_BIT else torch.int16
    assert torch.equal(got[2].view(bits), snaps[2, 1].view(bits)) and torch.equal(got.view(bits), want.view(bits))
    if scale is not None:
        assert torch.equal(got_scale[2], snap_scale[2, 1]) and torch.equal(got_scale[0], snap_scale[0, 2])
        assert torch.equal(got_scale, want_state_scale)


def test_decode_is_reproducible_and_per_slot(device):
    """The same seed and steps give the same bits; a slot's result does not depend on the rows beside it; the next
    step draws afresh."""
    nslots, H, P, N, G = 4, 2, 8, 16, 1
    state, _ = stored_state(nslots, H, P, N, torch.bfloat16, device)
    inp = mamba2.random_inputs(2, H, P, N, G, io_dtype=torch.bfloat16, device=device)
    slots = torch.tensor([1, 3], dtype=torch.int32, device=device)

    def run(rows, slots_, seed=5):
        st, rnd = state.clone(), rounding(nslots, device, True, seed)
        mamba2.decode(st, **{k: v[rows] if v.dim() > 1 else v for k, v in inp.items()}, dt_softplus=True,
                      slots=slots_, rounding=rnd)
        return st, rnd

    a, rnd_a = run(slice(None), slots)
    b, _ = run(slice(None), slots)
    assert torch.equal(a, b), "the same seed and steps gave different states"
    alone, _ = run(slice(1, 2), slots[1:])
    assert torch.equal(alone[3], a[3]), "a slot's rounding depends on its batch companions"
    other, _ = run(slice(None), slots, seed=6)
    assert not torch.equal(other[1], a[1]), "another seed gave the same rounding"
    again = a.clone()
    mamba2.decode(again, **inp, dt_softplus=True, slots=slots, rounding=rnd_a)
    twice = a.clone()
    mamba2.decode(twice, **inp, dt_softplus=True, slots=slots, rounding=rounding(nslots, device, True))
    assert not torch.equal(again, twice), "the next step drew the bits of the last"


def _drift(device, dtype, random: bool, steps: int = 64):
    """Two slots of ones (int8: rows of 0.75 to 1.5, the largest kept fixed) under decay 1 (A = 0) with increments
    Δ x B of 2^-10 (an eighth of a bf16 ulp at 1, a twelfth of an int8 row's quantum): the exact fp32 sum grows by
    steps · 2^-10 per element. Returns the stored state's values before and after `steps` steps."""
    slots, H, P, N, G = 2, 1, 16, 64, 1
    state, scale = torch.ones(slots, H, P, N, dtype=dtype, device=device), None
    B = torch.full((slots, G, N), 2.0**-2, device=device)
    if dtype in R.EIGHT_BIT:
        q, scale = R.quantized_rows_reference(torch.ones(slots, H, P, N) * torch.linspace(0.75, 1.5, N), None, dtype)
        state, scale = q.to(device), scale.to(device)
        # the row's largest value takes no increment, so its scale stays
        B[:, :, -1] = 0.0
    rnd = R.StateRounding.create(slots, seed=13, device=device) if random else None
    start = values(state, scale)
    inp = {
        "x": torch.full((slots, H, P), 2.0**-5, device=device),
        "dt": torch.full((slots, H), 2.0**-3, device=device),
        "A": torch.zeros(H, device=device),
        "B": B,
        "C": torch.ones(slots, G, N, device=device),
    }
    for _ in range(steps):
        mamba2.decode(state, **inp, state_scale=scale, rounding=rnd)
    return start, values(state, scale), B


@pytest.mark.parametrize("state_dtype", ["bf16", "int8"])
def test_decode_stochastic_rounding_does_not_drift(device, state_dtype):
    """Increments under half a quantum: rounded to nearest the state never moves (16 steps); rounded
    stochastically its mean over the slots' elements tracks the exact fp32 sum within 5 sigma over 64 steps."""
    sd, steps = DT[state_dtype], 64
    start, nearest, _ = _drift(device, sd, False, 16)
    assert torch.equal(nearest, start), "rounded to nearest, increments under half a quantum moved the state"
    start, stochastic, B = _drift(device, sd, True, steps)
    moving = (B[:, 0] > 0).cpu()
    gain = (stochastic - start).double().cpu()[:, 0][:, :, moving[0]]
    exact = steps * 2.0**-10
    # each store adds an independent, unbiased error of variance at most quantum^2 / 4 per element, and the next
    # step starts from it: an element's gain is the exact one plus a sum of `steps` such errors, and the mean over
    # n elements has sigma at most quantum / 2 · sqrt(steps / n)
    q = 2.0**-7 if sd == torch.bfloat16 else 1.5 / 127
    sigma = q / 2 * math.sqrt(steps / gain.numel())
    assert abs(gain.mean().item() - exact) <= 5 * sigma, (gain.mean().item(), exact, sigma)
    assert gain.std().item() <= q / 2 * math.sqrt(steps), "the elements spread by more than their rounding errors"


def test_decode_bad_rounding_and_scales(device):
    """Each bad combination is one ValueError naming what is wrong."""
    nslots, H, P, N, G = 3, 2, 4, 8, 1
    inp = mamba2.random_inputs(2, H, P, N, G, io_dtype=torch.float32, device=device)
    q8 = torch.zeros(nslots, H, P, N, dtype=torch.int8, device=device)
    scale = torch.zeros(nslots, H, P, device=device)
    bf = torch.zeros(nslots, H, P, N, dtype=torch.bfloat16, device=device)
    cases = [
        (dict(state=q8), "an int8 state needs state_scale"),
        (dict(state=bf, state_scale=scale), "state_scale applies only to an 8-bit"),
        (dict(state=q8, state_scale=scale[:, :1]), r"state_scale must have shape \(3, 2, 4\)"),
        (dict(state=q8, state_scale=scale.double()), "state_scale must be fp32"),
        (dict(state=q8, state_scale=torch.zeros(nslots, P, H, device=device).transpose(1, 2)),
         "state_scale must (have unit stride|be contiguous)"),
        (dict(state=torch.zeros(nslots, H, P, N, device=device),
              rounding=R.StateRounding.create(nslots, device=device)), "an fp32 state is stored exactly"),
        (dict(state=bf, rounding=R.StateRounding.create(nslots + 1, device=device)),
         "counts 4 slots but the state has 3"),
        (dict(state=bf, rounding="stochastic"), "rounding must be a StateRounding"),
    ]
    for kwargs, message in cases:
        state = kwargs.pop("state")
        before = state.clone()
        with pytest.raises(ValueError, match=message):
            mamba2.decode(state, **inp, **kwargs)
        assert torch.equal(state, before)
    snaps = torch.zeros(nslots, 2, H, P, N, dtype=torch.int8, device=device)
    inp2 = mamba2.random_inputs(2, H, P, N, G, T=2, io_dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="an int8 state needs snapshot_scale"):
        mamba2.decode_multi(q8, snaps, **inp2, state_scale=scale)
    with pytest.raises(ValueError, match=r"snapshot_scale must have shape \(3, 2, 2, 4\)"):
        mamba2.decode_multi(q8, snaps, **inp2, state_scale=scale, snapshot_scale=scale)
    with pytest.raises(ValueError, match="snapshot_scale applies only to an 8-bit"):
        mamba2.accept_snapshot(bf, snaps.to(torch.bfloat16), torch.ones(2, dtype=torch.int32, device=device),
                               snapshot_scale=torch.zeros(nslots, 2, H, P, device=device))


def test_fp8_state_is_refused_before_sm89(monkeypatch, device):
    """An fp8 state on a chip without e4m3 conversions is one line naming int8; an int8 state runs there."""
    from replayssm_kernels import families

    monkeypatch.setattr(families, "capability", lambda dev: 80)
    H, P, N = 2, 4, 8
    inp = mamba2.random_inputs(2, H, P, N, 1, io_dtype=torch.float32, device=device)
    scale = torch.ones(2, H, P, device=device)
    with pytest.raises(ValueError, match=r"fp8 states need sm_89 .*sm_80.*state_dtype='int8'"):
        mamba2.decode(torch.zeros(2, H, P, N, dtype=torch.float8_e4m3fn, device=device), **inp, state_scale=scale)
    q8 = torch.zeros(2, H, P, N, dtype=torch.int8, device=device)
    mamba2.decode(q8, **inp, state_scale=scale)
    assert q8.any()


# --- the ReplaySSM cache ------------------------------------------------------------------------------------------


def make_cache(shape, W, device, *, state, rounding_="nearest", read=None, max_draft=0, seed=5):
    nslots, H, P, N, G = shape
    cache = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype=state, read_dtype=read, io_dtype="bf16",
                                      max_draft=max_draft, rounding=rounding_, seed=seed, device=device)
    cache.load((torch.randn(nslots, H, P, N) * torch.logspace(-2, 1, P)[:, None]).to(device))
    if cache.rounding is not None:
        cache.rounding.step.copy_(torch.arange(nslots) * 3)
    return cache


def magnitudes(cache, inp, call):
    """The scales that `call` (a reference step on a cache and inputs) stores for its terms' magnitudes: the same step
    from |checkpoint|, |buffered x and B| and |x|, |B| (every decay and Δ is positive), so that each element is the
    sum of its terms' magnitudes. None unless the checkpoint has 8-bit rows."""
    if cache.checkpoint_scale is None:
        return None
    m = cache.clone()
    m.rounding = None
    if m.checkpoint.dtype == torch.float8_e4m3fn:
        m.checkpoint.view(torch.uint8).bitwise_and_(0x7F)
    else:
        m.checkpoint.abs_()
    for t in (m.x_buf, m.b_buf, m.b_draft):
        t.abs_()
    call(m, {**inp, "x": inp["x"].abs(), "B": inp["B"].abs()})
    return m.checkpoint_scale


def assert_caches(got, want, assert_close, *, exact: bool = True, term_scale=None) -> None:
    """Every committed tensor of two caches: the checkpoint (and scales) as `assert_stored`, the rest as the
    reference's, the rounding counts equal."""
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert not got.arrive.any() and not got.work[:2].any(), "the step's counters are not back to zero"
    assert_stored(got.checkpoint, want.checkpoint, got.checkpoint_scale, want.checkpoint_scale, what="checkpoint",
                  exact=exact, term_scale=term_scale)
    if got.read_copy is not None:
        deq = mamba2.reference.dequantize_ref
        assert_close(deq(got.read_copy, got.read_scale, torch.float32), deq(want.read_copy, want.read_scale,
                     torch.float32), got.read_dtype, got.state_dtype, what="read copy")
    if got.rounding is not None:
        assert torch.equal(got.rounding.step, want.rounding.step), "rounding counts differ"
    for s in range(got.checkpoint.shape[0]):
        f = int(got.fill[s, 0])
        assert torch.equal(got.x_buf[s, :, :f], want.x_buf[s, :, :f]), f"x buffer of slot {s}"
        assert torch.equal(got.b_buf[s, :, :f], want.b_buf[s, :, :f]), f"B buffer of slot {s}"
        assert_close(got.lam_buf[s, :, :f], want.lam_buf[s, :, :f], torch.float32, what=f"lam buffer of slot {s}")
    assert_close(mamba2.materialize(got), mamba2.materialize_ref(want), got.state_dtype
                 if got.state_dtype != torch.int8 else torch.float8_e4m3fn, what="materialized states")


def _replay_steps(got, steps, device, assert_close, config=None, exact=True):
    """`steps` replay steps of staggered rows, each against the reference from the kernel's own cache (a store the
    two rounded to different neighbours, which is allowed, is not carried into the next comparison): every output,
    then the cache."""
    nslots, H, P, N, G = got.shape
    slots = [3, 0, 4]
    for step in range(steps):
        want = got.clone()
        inp = mamba2.random_inputs(3, H, P, N, G, io_dtype=torch.bfloat16, device=device)
        # row r joins at step r: the rows flush on different steps
        rows = torch.tensor([s if step >= r else -1 for r, s in enumerate(slots)], dtype=torch.int32, device=device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows, config=config,
                          out=torch.full((3, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        coarse = torch.float8_e4m3fn if got.state_dtype in R.EIGHT_BIT else got.state_dtype
        assert_close(y, y_ref, torch.bfloat16, coarse, what=f"y at step {step}")
        assert_caches(got, want, assert_close, exact=exact)


REPLAY_CASES = [(s, r, None) for s, r in CASES] + [("bf16", True, "fp8"), ("fp16", True, "bf16")]


@pytest.mark.parametrize("state,random,read", REPLAY_CASES, ids=[
    f"B3-H2-P20-N12-G1-W2-{s}-{'stochastic' if r else 'nearest'}-{c or 'full'}" for s, r, c in REPLAY_CASES])
def test_replay_rounds_as_its_reference(device, assert_close, state, random, read):
    """Staggered rows through non-flush steps, flushes and the steps after them (W = 2): every output, then the
    checkpoint, its scales, buffers, rounding counts and materialized states against the reference."""
    got = make_cache((5, 2, 20, 12, 1), 2, device, state=state, rounding_="stochastic" if random else "nearest",
                     read=read)
    _replay_steps(got, 4, device, assert_close, exact=random or DT[state] != torch.bfloat16 or device == "cuda")
    if random:
        # from 3 · slot, one more per flush: slot 3 flushes at steps 1 and 3, slot 0 at step 2, slot 4 at step 3
        assert got.rounding.step.tolist() == [1, 3, 6, 11, 13]


def _variants():
    from replayssm_kernels.mamba2.replay import STEP_LAUNCH, StepConfig

    heads = StepConfig(rows=64, chunk=32, piece=32, stages=2, warps=2, maxnreg=None, heads=8)
    return [("small-early", STEP_LAUNCH["replay-bf16-small"]), ("heads-tail", STEP_LAUNCH["replay-bf16-large"]),
            ("heads-flush-launch", heads), ("one-head-groups-flush-launch", heads)]


@pytest.mark.parametrize("state", ["int8", "bf16"])
@pytest.mark.parametrize("variant", [v[0] for v in _variants()])
def test_replay_launch_variants_round_as_the_reference(device, assert_close, variant, state):
    """B3-H4-P16-N18-G1-W2, stochastic (N not a power of two: masked columns): a small grid's early
    one-warp programs, the heads launch with its flushes in its own programs, and with them in a launch of their
    own."""
    config = dict(_variants())[variant]
    # with one head per group the heads launch is lowered to the one-launch kernel's non-flush phase
    G = 4 if variant.startswith("one-head") else 1
    got = make_cache((5, 4, 16, 18, G), 2, device, state=state, rounding_="stochastic")
    # a flush in one TF32 product rounds some stores the other way on the GPU (the interpreter's product is fp32)
    _replay_steps(got, 3, device, assert_close, config=config, exact=config.precision != "tf32" or device == "cpu")
    # slot 3 flushed at step 1, slot 0 at step 2
    assert got.rounding.step.tolist() == [1, 3, 6, 10, 12]


VERIFY_CASES = [("bf16", True, None), ("fp8", False, None), ("int8", True, None), ("int8", True, "verify-bf16-small")]


@pytest.mark.parametrize("state,random,row", VERIFY_CASES, ids=[
    f"B2-H2-P16-N12-G1-W2-T2-{s}-{'stochastic' if r else 'nearest'}-{row or 'medium'}" for s, r, row in VERIFY_CASES])
def test_verify_accept_round_as_the_reference(device, assert_close, state, random, row):
    """verify + accept twice: the second verify folds a full buffer first (a checkpoint store); outputs, then the
    cache, against the reference (a small grid's row: B·C in the verify's own programs)."""
    config = None if row is None else importlib.import_module("replayssm_kernels.mamba2.verify").VERIFY_LAUNCH[row]
    got = make_cache((4, 2, 16, 12, 1), 2, device, state=state, rounding_="stochastic" if random else "nearest",
                     max_draft=2)
    want = got.clone()
    _, H, P, N, G = got.shape
    rows = torch.tensor([3, -1, 1], dtype=torch.int32, device=device)
    coarse = torch.float8_e4m3fn if got.state_dtype in R.EIGHT_BIT else got.state_dtype
    before = got.checkpoint.clone()
    for round_, accepted in enumerate(([2, 0, 1], [1, 0, 2])):
        inp = mamba2.random_inputs(3, H, P, N, G, T=2, io_dtype=torch.bfloat16, device=device)
        y = mamba2.verify(got, **inp, dt_softplus=True, slots=rows, config=config,
                          out=torch.full((3, 2, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.verify_ref(want, **inp, dt_softplus=True, slots=rows)
        assert y[1].isnan().all()
        assert_close(y, y_ref, torch.bfloat16, coarse, what=f"verify, round {round_}")
        n = torch.tensor(accepted, dtype=torch.int32, device=device)
        mamba2.accept(got, n, rows)
        mamba2.accept_ref(want, n, rows)
    assert not torch.equal(got.checkpoint[3], before[3]), "slot 3's full buffer was not folded"
    assert torch.equal(got.checkpoint[1], before[1]), "slot 1 never reached W but its checkpoint changed"
    assert_caches(got, want, assert_close)
    if random:
        assert got.rounding.step.tolist() == [0, 5, 6, 11]


def test_replay_is_reproducible_and_per_slot(device):
    """The same seed and counts give the same checkpoint bits; a slot's flush does not depend on the rows beside
    it; another seed rounds otherwise."""
    shape, W = (4, 2, 16, 12, 1), 2
    _, H, P, N, G = shape
    inputs = [mamba2.random_inputs(2, H, P, N, G, io_dtype=torch.bfloat16, device=device) for _ in range(W)]

    def run(rows, slots, seed=5):
        torch.manual_seed(1)
        cache = make_cache(shape, W, device, state="bf16", rounding_="stochastic", seed=seed)
        for inp in inputs:
            mamba2.replay(cache, **{k: v[rows] if v.dim() > 1 else v for k, v in inp.items()}, dt_softplus=True,
                          slots=torch.tensor(slots, dtype=torch.int32, device=device))
        return cache

    a, b = run(slice(None), [1, 3]), run(slice(None), [1, 3])
    assert torch.equal(a.checkpoint, b.checkpoint), "the same seed and counts gave different checkpoints"
    alone = run(slice(1, 2), [3])
    assert torch.equal(alone.checkpoint[3], a.checkpoint[3]), "a slot's rounding depends on its batch companions"
    assert not torch.equal(run(slice(None), [1, 3], seed=6).checkpoint[1], a.checkpoint[1])


def test_cache_slot_operations_keep_scales_and_counts(device):
    """load quantizes rows to nearest (materialize gives the state back within a quantum) and zeroes the counts;
    move carries checkpoint, scales and counts bit for bit and empties the source; reset zeroes them; clone is deep."""
    H, P, N = 2, 8, 12
    cache = mamba2.ReplayCache.create(4, H, P, N, 1, 3, state_dtype="int8", rounding="stochastic", seed=2,
                                      device=device)
    assert cache.checkpoint.dtype == torch.int8 and cache.checkpoint_scale.shape == (4, H, P)
    state = torch.randn(4, H, P, N, device=device)
    cache.rounding.step.fill_(7)
    cache.load(state)
    assert not cache.rounding.step.any(), "load left a slot's rounding count"
    back = mamba2.materialize(cache)
    assert bool(((back - state).abs() <= cache.checkpoint_scale[..., None] * 0.5001).all())
    copy = cache.clone()
    copy.rounding.step += 1
    copy.checkpoint_scale.zero_()
    assert not cache.rounding.step.any() and cache.checkpoint_scale.any(), "clone shares tensors"
    cache.rounding.step.copy_(torch.tensor([1, 2, 3, 4]))
    ck, scale = cache.checkpoint.clone(), cache.checkpoint_scale.clone()
    cache.move([0, 2], [3, 1])
    assert torch.equal(cache.checkpoint[3], ck[0]) and torch.equal(cache.checkpoint_scale[1], scale[2])
    assert cache.rounding.step.tolist() == [0, 3, 0, 1]
    assert not cache.checkpoint_scale[0].any() and not cache.checkpoint[2].any()
    cache.reset([3])
    assert cache.rounding.step.tolist() == [0, 3, 0, 0] and not cache.checkpoint_scale[3].any()


def test_cache_bad_precisions_are_one_line(device, monkeypatch):
    """A read copy over an 8-bit checkpoint, stochastic rounding of an fp32 one, an unknown rounding, a bad seed,
    and an fp8 checkpoint before sm_89: each one ValueError line."""
    from replayssm_kernels import families

    def create(**kw):
        return mamba2.ReplayCache.create(2, 2, 4, 8, 1, 2, device=device, **kw)

    cases = [
        (dict(state_dtype="int8", read_dtype="fp8"), "an int8 checkpoint takes no read copy"),
        (dict(state_dtype="fp8", read_dtype="bf16"), "an fp8 checkpoint takes no read copy"),
        (dict(state_dtype="fp32", rounding="stochastic"), "an fp32 checkpoint is stored exactly"),
        (dict(state_dtype="bf16", rounding="up"), "rounding must be 'nearest' or 'stochastic'"),
        (dict(state_dtype="bf16", rounding="stochastic", seed=-3), "seed must be an integer"),
        (dict(state_dtype="fp4"), "state_dtype must be fp32, bf16, fp16, fp8 or int8"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as exc:
            create(**kwargs)
        assert "\n" not in str(exc.value)
    cache = create(state_dtype="fp8")
    monkeypatch.setattr(families, "capability", lambda dev: 86)
    with pytest.raises(ValueError, match=r"fp8 states need sm_89 .*sm_86.*state_dtype='int8'"):
        create(state_dtype="fp8")
    inp = mamba2.random_inputs(2, 2, 4, 8, 1, io_dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="fp8 states need sm_89"):
        mamba2.replay(cache, **inp)
    assert not cache.fill.any()
    create(state_dtype="int8", rounding="stochastic")


GPU_CASES = [("bf16", True), ("fp16", True), ("int8", True), ("fp8", False)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16, 90], ids=["small", "medium", "large"])
@pytest.mark.parametrize("state,random", GPU_CASES, ids=[f"{s}-{'stochastic' if r else 'nearest'}"
                                                         for s, r in GPU_CASES])
def test_shipped_rows_round_as_the_reference_on_gpu(assert_close, batch, state, random):
    """H128-P64-N128-G8-W4 at batches that take each grid class's rows (the large one the heads launch with its
    flushes in its own programs): conventional decode, then 2W + 2 replay steps of staggered rows with padding,
    outputs pre-filled with NaN, then verify + accept; states, checkpoints, scales and counts as the references."""
    device = torch.device("cuda")
    H, P, N, G, W = 128, 64, 128, 8, 4
    nslots = batch + 3
    slots = torch.randperm(nslots, device=device)[:batch].to(torch.int32)
    sd = DT[state]
    st, scale = stored_state(nslots, H, P, N, sd, device)
    rnd = rounding(nslots, device, random)
    got = (st.clone(), clone(scale), None if rnd is None else rnd.clone())
    want = (st.clone(), clone(scale), None if rnd is None else rnd.clone())
    inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.bfloat16, device=device)
    y = mamba2.decode(got[0], **inp, dt_softplus=True, slots=slots, state_scale=got[1], rounding=got[2])
    y_ref = mamba2.decode_ref(want[0], **inp, dt_softplus=True, slots=slots, state_scale=want[1], rounding=want[2])
    assert_close(y, y_ref, torch.bfloat16, what="decode y")
    assert_stored(got[0], want[0], got[1], want[1], what="decode state")

    cache = make_cache((nslots, H, P, N, G), W, device, state=state, rounding_="stochastic" if random else "nearest",
                       max_draft=2)
    r = torch.arange(batch, device=device)
    coarse = torch.float8_e4m3fn if sd in R.EIGHT_BIT else sd
    # a flush in one TF32 product (the large grid's 2-byte and 1-byte rows) moves each term by up to 2^-9 of itself,
    # so that some stores round the other way: within the quanta and the terms' magnitudes, not the same bits
    exact = replay_mod.STEP_LAUNCH[replay_mod.select(cache, batch)].precision != "tf32"
    # each call from the kernel's own cache: a store the two rounded to different neighbours (allowed) is not
    # carried into the next comparison
    for step in range(2 * W + 2):
        ref = cache.clone()
        rows = torch.where((r % W <= step) & (r % 7 != 3), slots, -1)
        inp = mamba2.random_inputs(batch, H, P, N, G, io_dtype=torch.bfloat16, device=device)
        terms = None if exact else magnitudes(cache, inp, lambda m, i: mamba2.replay_ref(m, **i, dt_softplus=True,
                                                                                        slots=rows))
        y = mamba2.replay(cache, **inp, dt_softplus=True, slots=rows,
                          out=torch.full((batch, H, P), NAN, dtype=torch.bfloat16, device=device))
        y_ref = mamba2.replay_ref(ref, **inp, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, coarse, what=f"replay y at step {step}")
        assert_caches(cache, ref, assert_close, exact=exact, term_scale=terms)
    n = torch.full((batch,), 2, dtype=torch.int32, device=device)

    def verify_accept_ref(c, i):
        mamba2.verify_ref(c, **i, dt_softplus=True, slots=slots)
        mamba2.accept_ref(c, n, slots)

    for round_ in range(2):
        ref = cache.clone()
        inp = mamba2.random_inputs(batch, H, P, N, G, T=2, io_dtype=torch.bfloat16, device=device)
        terms = None if exact else magnitudes(cache, inp, verify_accept_ref)
        y = mamba2.verify(cache, **inp, dt_softplus=True, slots=slots)
        y_ref = mamba2.verify_ref(ref, **inp, dt_softplus=True, slots=slots)
        assert_close(y, y_ref, torch.bfloat16, coarse, what=f"verify y, round {round_}")
        mamba2.accept(cache, n, slots)
        mamba2.accept_ref(ref, n, slots)
        assert_caches(cache, ref, assert_close, exact=exact, term_scale=terms)


@pytest.mark.gpu
@pytest.mark.parametrize("state", ["bf16", "int8"])
def test_stochastic_replay_and_decode_in_cuda_graph(state):
    """Two windows of stochastically rounded replay steps, and decode steps, captured once (the rounding counts
    advance on the device) give the eager loop's bits."""
    device = "cuda"
    shape, W = (8, 8, 64, 128, 2), 4
    eager = make_cache(shape, W, device, state=state, rounding_="stochastic")
    graphed = eager.clone()
    rows = torch.tensor([7, 0, -1, 3], dtype=torch.int32, device=device)
    steps = [mamba2.random_inputs(4, 8, 64, 128, 2, device=device) for _ in range(2 * W)]
    ys_eager = [mamba2.replay(eager, **inp, dt_softplus=True, slots=rows) for inp in steps]
    st, scale = stored_state(8, 8, 64, 128, DT[state], device)
    st_eager, scale_eager, rnd_eager = st.clone(), clone(scale), rounding(8, device, True)
    for inp in steps:
        mamba2.decode(st_eager, **inp, dt_softplus=True, slots=rows, state_scale=scale_eager, rounding=rnd_eager)
    # warm the kernels up on copies, so that capture compiles nothing
    mamba2.replay(graphed.clone(), **steps[0], dt_softplus=True, slots=rows, check=False)
    st_graph, scale_graph, rnd_graph = st.clone(), clone(scale), rounding(8, device, True)
    mamba2.decode(st.clone(), **steps[0], dt_softplus=True, slots=rows, state_scale=clone(scale),
                  rounding=rounding(8, device, True), check=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [mamba2.replay(graphed, **inp, dt_softplus=True, slots=rows, check=False) for inp in steps]
        for inp in steps:
            mamba2.decode(st_graph, **inp, dt_softplus=True, slots=rows, state_scale=scale_graph, rounding=rnd_graph,
                          check=False)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(ys, ys_eager):
        assert torch.equal(a[[0, 1, 3]], b[[0, 1, 3]])
    assert torch.equal(graphed.checkpoint.view(torch.uint8), eager.checkpoint.view(torch.uint8))
    assert torch.equal(graphed.rounding.step, eager.rounding.step)
    assert torch.equal(st_graph.view(torch.uint8), st_eager.view(torch.uint8))
    assert torch.equal(rnd_graph.step, rnd_eager.step)
    if scale is not None:
        assert torch.equal(graphed.checkpoint_scale, eager.checkpoint_scale) and torch.equal(scale_graph, scale_eager)
