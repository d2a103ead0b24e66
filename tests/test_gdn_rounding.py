"""Gated DeltaNet states stored with stochastic rounding and as 8-bit rows with scales, against the references."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
from replayssm_kernels import families, gdn
from replayssm_kernels import rounding as R
from replayssm_kernels.gdn.cache import dequantize_read
from replayssm_kernels.gdn.common import state_value
from test_gdn_decode import one_thread, rows  # noqa: F401 (one_thread: an autouse fixture)

gdn_replay = importlib.import_module("replayssm_kernels.gdn.replay")
gdn_verify = importlib.import_module("replayssm_kernels.gdn.verify")
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}
NAN = float("nan")
# (state dtype, rounding): every 16-bit state stochastically, both 8-bit ones both ways
STORES = [("bf16", "stochastic"), ("fp16", "stochastic"), ("fp8", "nearest"), ("fp8", "stochastic"),
          ("int8", "nearest"), ("int8", "stochastic")]
STORE_IDS = [f"{s}-{r}" for s, r in STORES]
# The share of stored elements whose code must equal the reference's where both draw the same bits: the two round
# fp32 values that differ in their last bits, so a value on a rounding boundary may land on the other side.
SAME_CODES = 0.97
# The relative error of the fp32 values a store rounds, kernel against reference (sums in another order; on the GPU
# approximate exponentials): it moves an 8-bit row's scale, and every value of the row with it.
FP32_PATH = 2.0**-12


def quantum(values: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None) -> torch.Tensor:
    """The gap between neighbouring values of `dtype` at each of `values` (fp32; an 8-bit state's dequantized values,
    with their row scales)."""
    values = values.float().cpu()
    if dtype == torch.int8:
        return scale.float().cpu()[..., None].expand_as(values)
    if dtype == torch.float8_e4m3fn:
        unit = values.abs() / scale.float().cpu().clamp_min(1e-38)[..., None]
        return scale.float().cpu()[..., None] * 2.0 ** (torch.log2(unit.clamp_min(2.0**-6)).floor() - 3)
    bits, tiny = {torch.bfloat16: (8, 0.0), torch.float16: (11, 2.0**-14)}[dtype]
    return 2.0 ** (torch.log2(values.abs().clamp_min(max(tiny, 1e-30))).floor() - bits + 1)


def assert_stored(got, want, dtype, got_scale=None, want_scale=None, what="state"):
    """A stored state against the reference's: scales equal within the fp32 path's error, each value within the two
    values' gaps of the reference's (each store rounds to a neighbour of its own fp32 value, and where the two fp32
    values straddle a binade the gaps differ) plus the fp32 path's error (relative to the value, and to its row where
    the update cancels), and nearly every code the same (the same bits give the same code unless the fp32 values
    before rounding straddle a boundary)."""
    if got_scale is not None:
        torch.testing.assert_close(got_scale.cpu(), want_scale.cpu(), rtol=FP32_PATH, atol=1e-30,
                                   msg=f"{what} scales")
    a, b = state_value(got, got_scale).cpu(), state_value(want, want_scale).cpu()
    assert not a.isnan().any(), f"{what}: NaN stored"
    gap = quantum(b, dtype, want_scale) + quantum(a, dtype, got_scale)
    err = (a - b).abs()
    bound = gap * 1.0001 + FP32_PATH * b.abs() + b.abs().amax(-1, keepdim=True) * 2.0**-16 + 1e-30
    assert bool((err <= bound).all()), f"{what}: {(err / gap).max():.3g} quanta off"
    same = (got.view(torch.uint8 if got.element_size() == 1 else torch.int16)
            == want.view(torch.uint8 if got.element_size() == 1 else torch.int16)).float().mean().item()
    assert same >= SAME_CODES, f"{what}: only {same:.1%} of the codes equal the reference's"


def new_state(shape, dtype, device):
    """A random state pool of `dtype` and its scales (None unless 8-bit), as a store gives them."""
    S = torch.randn(shape, device=device) * 0.5
    if dtype in R.EIGHT_BIT:
        return R.quantized_rows_reference(S, None, dtype)
    return S.to(dtype), None


def clone(t):
    return None if t is None else t.clone()


# K = 22 for the stochastic fp16 and int8 cases, 24 for the rest: row widths with masked columns in their blocks
DECODE_K = {("fp16", "stochastic"): 22, ("int8", "stochastic"): 22}


@pytest.mark.parametrize("state,rnd", STORES,
                         ids=[f"B3-H2-HV6-K{DECODE_K.get(c, 24)}-V20-{i}" for c, i in zip(STORES, STORE_IDS)])
def test_decode_matches_reference(device, assert_close, state, rnd):
    """Two steps with a padding row and permuted slots, each from the same stored state on both sides: outputs, the
    stored state and its scales, and the rounding's store counts (advanced for the rows' slots only)."""
    B, H, HV, V = 3, 2, 6, 20
    K = DECODE_K.get((state, rnd), 24)
    dtype = DT[state]
    got, got_scale = new_state((5, HV, V, K), dtype, device)
    rounding = R.StateRounding.create(5, seed=17, device=device) if rnd == "stochastic" else None
    slots = rows([4, -1, 1], device)
    for step in range(2):
        want, want_scale, want_rounding = got.clone(), clone(got_scale), rounding and rounding.clone()
        before = got.clone()
        inp = gdn.random_inputs(B, H, HV, K, V, io_dtype=torch.bfloat16, device=device)
        out = torch.full((B, HV, V), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.decode(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, state_scale=got_scale,
                       rounding=rounding)
        y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots, state_scale=want_scale,
                               rounding=want_rounding)
        assert_close(y[[0, 2]], y_ref[[0, 2]], torch.bfloat16, torch.float32, what=f"o at step {step}")
        assert out[1].isnan().all(), "a padding row's output was written"
        live = [4, 1]
        assert_stored(got[live], want[live], dtype, None if got_scale is None else got_scale[live],
                      None if want_scale is None else want_scale[live], what=f"state after step {step}")
        assert torch.equal(got[[0, 2, 3]].view(torch.uint8), before[[0, 2, 3]].view(torch.uint8))
        if rounding is not None:
            assert rounding.step.tolist() == [0, step + 1, 0, 0, step + 1]
            assert torch.equal(rounding.step, want_rounding.step)


def test_decode_multi_matches_reference_and_steps(device, assert_close):
    """Stochastically rounded snapshots against the reference; draft t equals decode t steps on with the same
    rounding, and the store counts advance by T."""
    B, H, HV, K, V, T = 2, 2, 4, 12, 20, 3
    start = (torch.randn(3, HV, V, K, device=device) * 0.5).to(torch.bfloat16)
    got, want, stepped = start.clone(), start.clone(), start.clone()
    snaps = torch.full((3, T, HV, V, K), NAN, device=device).to(torch.bfloat16)
    snaps_ref = snaps.clone()
    rounding = R.StateRounding.create(3, seed=4, device=device)
    rounding.step[2] = 9
    r_ref, r_step = rounding.clone(), rounding.clone()
    slots = rows([2, 0], device)
    inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.float32, device=device)
    out = torch.full((B, T, HV, V), NAN, device=device)
    y = gdn.decode_multi(got, snaps, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, rounding=rounding)
    y_ref = gdn.decode_multi_ref(want, snaps_ref, **inp, use_qk_l2norm_in_kernel=True, slots=slots, rounding=r_ref)
    assert torch.equal(got, start), "decode_multi changed the state"
    assert_close(y, y_ref, torch.float32, torch.bfloat16, what="o")
    assert_stored(snaps[[2, 0]], snaps_ref[[2, 0]], torch.bfloat16, what="snapshots")
    assert rounding.step.tolist() == [T, 0, 9 + T] and torch.equal(rounding.step, r_ref.step)
    for t in range(T):
        one = {name: x[:, t] for name, x in inp.items()}
        gdn.decode(stepped, **one, use_qk_l2norm_in_kernel=True, slots=slots, rounding=r_step)
        assert_stored(snaps[[2, 0], t], stepped[[2, 0]], torch.bfloat16, what=f"draft {t} against {t + 1} steps")


def make_cache(shape, W, device, state, rnd, *, max_draft=0, seed=3):
    """A loaded cache of `state` ("bf16/fp8": a bf16 checkpoint with an fp8 read copy)."""
    nslots, H, HV, K, V = shape
    state, _, read = state.partition("/")
    cache = gdn.ReplayCache.create(nslots, H, HV, K, V, W, state_dtype=state, read_dtype=read or None, io_dtype="bf16",
                                   max_draft=max_draft, rounding=rnd, seed=seed, device=device)
    cache.load(torch.randn(nslots, HV, V, K, device=device) * 0.5)
    return cache


def assert_caches(got, want, assert_close, what, buffers=(torch.float32,)):
    """The checkpoint as `assert_stored`, the buffers within the tolerance of `buffers` (a verify's products on the
    GPU take its tile in the state's dtype: those of its state then), the read copy and the store counts."""
    assert torch.equal(got.fill, want.fill), f"{what}: fill counters differ"
    assert_stored(got.checkpoint, want.checkpoint, got.state_dtype, got.checkpoint_scale, want.checkpoint_scale,
                  what=f"{what}: checkpoint")
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta", "buf_t"):
        if getattr(got, name) is not None:
            assert_close(getattr(got, name), getattr(want, name), *buffers, what=f"{what}: {name}")
    if got.read_copy is not None:
        assert_close(dequantize_read(got.read_copy, got.read_scale), dequantize_read(want.read_copy, want.read_scale),
                     got.read_dtype, what=f"{what}: read copy")
    if got.rounding is not None:
        assert torch.equal(got.rounding.step, want.rounding.step), f"{what}: store counts differ"


_FLUSHES = gdn_replay.FlushConfig(rows=256, flush_chunk=32, stages=2, warps=4, maxnreg=None, round_cap=None,
                                  precision="ieee", correction=None)
# the selected rows (an 8-bit checkpoint's flushes in a launch of their own), and each store path besides: flushes in
# the step's own launch, in a flush launch for a 16-bit checkpoint, and a small grid's one-warp programs
REPLAY_CASES = [(s, r, None) for s, r in STORES] + [
    ("int8", "stochastic", gdn_replay.REPLAY_LAUNCH["replay"]),
    ("bf16", "stochastic", dataclasses.replace(gdn_replay.REPLAY_LAUNCH["replay"], flush=_FLUSHES)),
    ("bf16", "stochastic", gdn_replay.REPLAY_LAUNCH["replay-small"]),
    ("fp8", "stochastic", gdn_replay.REPLAY_LAUNCH["replay-fp8-small"]),
    ("bf16/fp8", "stochastic", None),
]
# K = 18 for the stochastic fp16 and int8 cases (masked columns in the block), 16 for the rest
REPLAY_K = {("fp16", "stochastic"): 18, ("int8", "stochastic"): 18}
REPLAY_IDS = [f"N4-H2-HV4-K{REPLAY_K.get((s, r), 16) if c is None else 16}-V20-W3-{s.replace('/', '-copy-')}-{r}"
              + ("" if c is None else "-flush-launch" if c.flush else "-small" if c.early else "-one-launch")
              for s, r, c in REPLAY_CASES]


@pytest.mark.parametrize("state,rnd,config", REPLAY_CASES, ids=REPLAY_IDS)
def test_replay_matches_reference(device, assert_close, state, rnd, config):
    """Five steps with staggered rows, so that each flushes (a padding row, permuted slots), each step from the same
    cache on both sides: outputs (NaN-filled before), the stored checkpoint and scales, the buffers, the fills and
    the store counts; then materialize against its reference."""
    K = REPLAY_K.get((state, rnd), 16) if config is None else 16
    got = make_cache((4, 2, 4, K, 20), 3, device, state, rnd)
    for step in range(5):
        want = got.clone()
        slots = rows([s if step >= r else -1 for r, s in enumerate([3, 0, 2])], device)
        inp = gdn.random_inputs(3, 2, 4, K, 20, io_dtype=torch.bfloat16, device=device)
        out = torch.full((3, 4, 20), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, config=config)
        y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        live = (slots >= 0).nonzero().flatten()
        assert_close(y[live], y_ref[live], torch.bfloat16, torch.float32, what=f"o at step {step}")
        assert y[(slots < 0).nonzero().flatten()].isnan().all(), "a padding row's output was written"
        assert_caches(got, want, assert_close, f"step {step}")
        assert not got.work[:2].any(), "the flush list's counters not back to zero"
    assert_close(gdn.materialize(got), gdn.materialize_ref(got), torch.float32, what="materialize")


VERIFY_CASES = [("bf16", "stochastic", None), ("fp16", "stochastic", "verify-small"), ("fp8", "nearest", None),
                ("fp8", "stochastic", "verify-small"), ("int8", "nearest", "verify-small"),
                ("int8", "stochastic", None), ("bf16/fp8", "stochastic", None)]


@pytest.mark.parametrize("state,rnd,row", VERIFY_CASES,
                         ids=[f"N3-H2-HV4-K16-V20-W3-T2-{s.replace('/', '-copy-')}-{r}-{row or 'selected'}"
                              for s, r, row in VERIFY_CASES])
def test_verify_accept_matches_reference(device, assert_close, state, rnd, row):
    """replay, verify (T = 2), accept 2 (the fill passes W), verify again (it folds first, storing the checkpoint),
    accept 1: each call from the same cache on both sides, against the references."""
    config = None if row is None else gdn_verify.VERIFY_LAUNCH[row]
    got = make_cache((3, 2, 4, 16, 20), 3, device, state, rnd, max_draft=2)
    slots = rows([2, -1, 0], device)
    calls = ["replay", "verify", "accept", "verify", "accept"]
    for i, call in enumerate(calls):
        want = got.clone()
        if call == "accept":
            n = rows([2, 0, 2] if i == 2 else [1, 0, 0], device)
            gdn.accept(got, n, slots)
            gdn.accept_ref(want, n, slots)
        else:
            T = None if call == "replay" else 2
            inp = gdn.random_inputs(3, 2, 4, 16, 20, T=T, io_dtype=torch.bfloat16, device=device)
            out = torch.full(inp["v"].shape, NAN, dtype=torch.bfloat16, device=device)
            run, ref = (gdn.replay, gdn.replay_ref) if call == "replay" else (gdn.verify, gdn.verify_ref)
            kw = {} if call == "replay" else {"config": config}
            y = run(got, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, **kw)
            y_ref = ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
            assert_close(y[[0, 2]], y_ref[[0, 2]], torch.bfloat16, torch.float32, what=f"o of {call} {i}")
            assert y[1].isnan().all(), "a padding row's output was written"
        assert_caches(got, want, assert_close, f"{call} {i}")
    assert got.fill[2].tolist() == [1] * 4 and got.fill[0].tolist() == [0] * 4


def test_stochastic_rounding_does_not_drift(device):
    """decode with decay 1 and increments of at most a quarter of a bf16 ulp per step: rounded to nearest the state
    never moves (after a step that leaves it as it was, every later step is the same), while stochastically its
    mean over the elements tracks the exact (fp64) recurrence within 5 sigma over 64 steps."""
    B, H, HV, K, V, steps = 1, 1, 1, 64, 16, 64
    a, beta, d = 2.0**-6, 0.5, 2.0**-10
    # k = a (1, ..., 1): with every element at 1 each step adds u a = d (a quarter of the ulp 2^-8 below 2, less as
    # the row grows)
    k = torch.full((B, H, K), a, device=device)
    v = torch.full((B, HV, V), d / a / beta + a * K, device=device)
    g = torch.zeros(B, HV, device=device)
    b = torch.full((B, HV), beta, device=device)
    exact = torch.ones(B, HV, V, K, dtype=torch.float64)
    nearest = torch.ones(B, HV, V, K, dtype=torch.bfloat16, device=device)
    random = nearest.clone()
    rounding = R.StateRounding.create(B, seed=21, device=device)
    for step in range(steps):
        # u = beta (v - S k), S k = a times the row's sum
        exact = exact + (beta * (v.double().cpu() - a * exact.sum(-1)))[..., None] * a
        if step < 4:
            gdn.decode(nearest, k, k, v, g, b, scale=1.0)
        gdn.decode(random, k, k, v, g, b, scale=1.0, rounding=rounding)
    assert bool((nearest == 1.0).all()), "rounded to nearest, an increment under half an ulp moved the state"
    assert (exact - 1.0).min().item() > 0.03, "the exact recurrence should have moved by tens of quarter-ulps"
    err = random.double().cpu() - exact
    # each store's error has variance at most ulp^2 / 4 (ulp 2^-7 in [1, 2)); the elements' errors are independent
    sigma = math.sqrt(steps * 2.0**-14 / 4)
    assert abs(err.mean().item()) <= 5 * sigma / math.sqrt(err.numel()), f"drifted: mean error {err.mean():.3g}"
    assert err.abs().max().item() <= 6 * sigma


def test_decode_rounding_is_reproducible_and_per_slot(device):
    """The same seed and store counts give the same state bit for bit; another seed another; a slot's rounding does
    not depend on which rows share its launch."""
    B, H, HV, K, V = 2, 1, 2, 16, 8
    start = (torch.randn(4, HV, V, K, device=device) * 0.5).to(torch.bfloat16)
    inp = gdn.random_inputs(B, H, HV, K, V, io_dtype=torch.float32, device=device)

    def run(seed, slots):
        state = start.clone()
        gdn.decode(state, **inp, use_qk_l2norm_in_kernel=True, slots=rows(slots, device),
                   rounding=R.StateRounding.create(4, seed=seed, device=device))
        return state

    both = run(7, [3, 1])
    assert torch.equal(both, run(7, [3, 1]))
    assert not torch.equal(both[3], run(8, [3, 1])[3])
    alone = run(7, [-1, 1])
    assert torch.equal(alone[1], both[1]), "slot 1's rounding depends on its batch companion"
    assert not torch.equal(both[1], start[1]) and torch.equal(both[0], start[0])


def test_cache_rounding_is_reproducible_and_per_slot(device):
    """Two caches of the same seed give the same checkpoints after a flush; a slot's flush is the same whether or not
    another row shares its steps."""
    shape = (3, 2, 2, 16, 8)
    torch.manual_seed(5)
    states = torch.randn(3, 2, 8, 16, device=device)
    inputs = [gdn.random_inputs(2, 2, 2, 16, 8, io_dtype=torch.bfloat16, device=device) for _ in range(2)]

    def run(slots):
        cache = gdn.ReplayCache.create(*shape, 2, state_dtype="int8", io_dtype="bf16", rounding="stochastic",
                                       seed=11, device=device)
        cache.load(states)
        for inp in inputs:
            gdn.replay(cache, **inp, use_qk_l2norm_in_kernel=True, slots=rows(slots, device))
        return cache

    a, b, alone = run([2, 0]), run([2, 0]), run([2, -1])
    assert torch.equal(a.checkpoint, b.checkpoint) and torch.equal(a.checkpoint_scale, b.checkpoint_scale)
    assert torch.equal(a.checkpoint[2], alone.checkpoint[2]), "slot 2's flush depends on its batch companion"
    assert not torch.equal(a.checkpoint[0], alone.checkpoint[0])


@pytest.mark.parametrize("state", ["fp8", "int8"])
def test_cache_slot_operations_carry_scales_and_counts(device, state):
    """load stores 8-bit rows within a quantum of the states; move carries checkpoints, scales and store counts bit
    for bit and empties the source; reset zeroes them; clone is independent."""
    shape = (4, 2, 4, 16, 20)
    cache = gdn.ReplayCache.create(*shape, 3, state_dtype=state, io_dtype="bf16", rounding="stochastic", seed=2,
                                   device=device)
    assert cache.checkpoint.dtype == DT[state] and cache.checkpoint_scale.shape == (4, 4, 20)
    full = torch.randn(4, 4, 20, 16, device=device)
    cache.load(full)
    back = gdn.materialize(cache)
    assert bool(((back - full).abs().cpu() <= quantum(back, DT[state], cache.checkpoint_scale) + 1e-6).all())
    assert cache.rounding.step.tolist() == [1] * 4
    gdn.replay(cache, **gdn.random_inputs(2, 2, 4, 16, 20, io_dtype=torch.bfloat16, device=device),
               use_qk_l2norm_in_kernel=True, slots=rows([1, 3], device))
    # a step that does not flush stores nothing and leaves the counts; counts of their own for `move` to carry
    assert cache.rounding.step.tolist() == [1] * 4
    cache.rounding.step.copy_(torch.tensor([1, 2, 1, 2]))
    before = cache.clone()
    cache.move(rows([1], device), rows([0], device))
    assert torch.equal(cache.checkpoint[0].view(torch.uint8), before.checkpoint[1].view(torch.uint8))
    assert torch.equal(cache.checkpoint_scale[0], before.checkpoint_scale[1])
    assert cache.rounding.step.tolist() == [2, 0, 1, 2] and before.rounding.step.tolist() == [1, 2, 1, 2]
    assert not cache.checkpoint_scale[1].any() and not cache.checkpoint[1].float().any()
    cache.reset(rows([3], device))
    assert cache.rounding.step[3] == 0 and not cache.checkpoint_scale[3].any()
    assert torch.equal(gdn.materialize(cache, rows([3], device)), torch.zeros(1, 4, 20, 16, device=device))


def _decode_args(device, dtype=torch.bfloat16):
    state = torch.zeros(3, 4, 8, 16, device=device, dtype=dtype)
    return state, gdn.random_inputs(2, 2, 4, 16, 8, io_dtype=torch.float32, device=device)


BAD_DECODE = {
    "scale-missing": (torch.int8, {}, "int8 state needs state_scale"),
    "scale-extra": (torch.bfloat16, {"state_scale": torch.ones(3, 4, 8)}, "applies only to an 8-bit"),
    "scale-shape": (torch.int8, {"state_scale": torch.ones(3, 4, 16)}, r"state_scale must have shape \(3, 4, 8\)"),
    "scale-dtype": (torch.int8, {"state_scale": torch.ones(3, 4, 8, dtype=torch.float16)}, "state_scale must be"),
    "rounding-fp32": (torch.float32, {"rounding": "R"}, "fp32 state is stored exactly"),
    "rounding-slots": (torch.bfloat16, {"rounding": "R2"}, "counts 2 slots but the state has 3"),
    "rounding-type": (torch.bfloat16, {"rounding": 3}, "rounding must be a StateRounding"),
}


@pytest.mark.parametrize("case", list(BAD_DECODE))
def test_decode_bad_precision_input(device, case):
    """One ValueError each, before any launch: the state is untouched."""
    dtype, extra, match = BAD_DECODE[case]
    state, inp = _decode_args(device, dtype)
    extra = dict(extra)
    if extra.get("rounding") in ("R", "R2"):
        extra["rounding"] = R.StateRounding.create(3 if extra["rounding"] == "R" else 2, device=device)
    extra = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in extra.items()}
    before = state.clone()
    with pytest.raises(ValueError, match=match):
        gdn.decode(state, **inp, **extra)
    assert torch.equal(state.view(torch.uint8), before.view(torch.uint8))


@pytest.mark.parametrize("state,rnd", [("int8", "stochastic"), ("fp8", "nearest")], ids=["int8-stochastic", "fp8"])
def test_decode_multi_and_accept_snapshot_of_8bit_state(device, assert_close, state, rnd):
    """An 8-bit state's snapshots (rows and scales) and outputs against the reference, each draft continuing from the
    rows it stored; accept_snapshot copies the chosen snapshot's rows and scales."""
    B, H, HV, K, V, T = 2, 2, 4, 16, 20, 3
    dtype = DT[state]
    st, scale = new_state((3, HV, V, K), dtype, device)
    want, want_scale = st.clone(), scale.clone()
    snaps = torch.zeros(3, T, HV, V, K, device=device).to(dtype)
    snap_scale = torch.full((3, T, HV, V), NAN, device=device)
    snaps_ref, snap_scale_ref = snaps.clone(), snap_scale.clone()
    rounding = R.StateRounding.create(3, seed=6, device=device) if rnd == "stochastic" else None
    r_ref = rounding and rounding.clone()
    slots = rows([2, 0], device)
    inp = gdn.random_inputs(B, H, HV, K, V, T=T, io_dtype=torch.bfloat16, device=device)
    out = torch.full((B, T, HV, V), NAN, dtype=torch.bfloat16, device=device)
    y = gdn.decode_multi(st, snaps, **inp, use_qk_l2norm_in_kernel=True, slots=slots, out=out, rounding=rounding,
                         state_scale=scale, snapshot_scale=snap_scale)
    y_ref = gdn.decode_multi_ref(want, snaps_ref, **inp, use_qk_l2norm_in_kernel=True, slots=slots, rounding=r_ref,
                                 state_scale=want_scale, snapshot_scale=snap_scale_ref)
    assert_close(y, y_ref, torch.bfloat16, torch.float32, what="o")
    for t in range(T):
        assert_stored(snaps[[2, 0], t], snaps_ref[[2, 0], t], dtype, snap_scale[[2, 0], t], snap_scale_ref[[2, 0], t],
                      what=f"snapshot {t}")
    n = rows([T, 0], device)
    gdn.accept_snapshot(st, snaps, n, slots, state_scale=scale, snapshot_scale=snap_scale)
    gdn.accept_snapshot_ref(want, snaps_ref, n, slots, state_scale=want_scale, snapshot_scale=snap_scale_ref)
    assert torch.equal(st[2].view(torch.uint8), snaps[2, T - 1].view(torch.uint8))
    assert torch.equal(scale[2], snap_scale[2, T - 1])
    assert_stored(st[[2, 0]], want[[2, 0]], dtype, scale[[2, 0]], want_scale[[2, 0]], what="state after accept")
    with pytest.raises(ValueError, match="needs snapshot_scale"):
        gdn.decode_multi(st, snaps, **inp, slots=slots, state_scale=scale)


BAD_CACHE = {
    "read-copy-over-8bit": ({"state_dtype": "int8", "read_dtype": "bf16"}, "takes no read copy"),
    "stochastic-fp32": ({"state_dtype": "fp32", "rounding": "stochastic"}, "fp32 checkpoint is stored exactly"),
    "rounding-name": ({"state_dtype": "bf16", "rounding": "up"}, "rounding must be 'nearest' or 'stochastic'"),
    "seed": ({"state_dtype": "bf16", "rounding": "stochastic", "seed": -3}, "seed must be an integer"),
    "8bit-buffers": ({"state_dtype": "int8", "buffer_dtype": "int8"}, "buffer_dtype must be one of fp32, bf16, fp16"),
    "state-dtype": ({"state_dtype": "fp64"}, "state_dtype must be one of fp32, bf16, fp16, fp8, int8"),
}


@pytest.mark.parametrize("case", list(BAD_CACHE))
def test_cache_bad_precision_input(case):
    kwargs, match = BAD_CACHE[case]
    kwargs = {"io_dtype": "bf16", **kwargs}
    with pytest.raises(ValueError, match=match):
        gdn.ReplayCache.create(2, 1, 2, 16, 8, 4, device="cpu", **kwargs)


def test_fp8_state_needs_sm89(monkeypatch):
    """An fp8 state (conventional or checkpoint) is refused before sm_89 in one line naming int8; int8 is not."""
    monkeypatch.setattr(families, "capability", lambda device: 80)
    with pytest.raises(families.UnsupportedOnChip, match="fp8 state needs sm_89 or newer.*int8"):
        gdn.ReplayCache.create(2, 1, 2, 16, 8, 4, state_dtype="fp8", io_dtype="bf16", device="cpu")
    state, inp = _decode_args("cpu", torch.float8_e4m3fn)
    with pytest.raises(families.UnsupportedOnChip, match="fp8 state needs sm_89"):
        gdn.decode(state, **inp, state_scale=torch.ones(3, 4, 8))
    gdn.ReplayCache.create(2, 1, 2, 16, 8, 4, state_dtype="int8", io_dtype="bf16", device="cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [2, 16, 64], ids=["small-grid", "medium-grid", "large-grid"])
@pytest.mark.parametrize("state,rnd", [("bf16", "stochastic"), ("int8", "stochastic"), ("fp8", "nearest")])
def test_shipped_rows_round_as_the_reference_on_gpu(assert_close, batch, state, rnd):
    """The Qwen3.5-122B layer shape (H=16, HV=64, K=V=128) through the rows `select` gives on this GPU: decode, six
    replay steps (W = 4, staggered so rows flush on different steps), verify + accept with a fold, each call against
    the references from the same state."""
    device, (H, HV, K, V) = "cuda", (16, 64, 128, 128)
    dtype = DT[state]
    slots = torch.randperm(batch, device=device).to(torch.int32)
    st, scale = new_state((batch, HV, V, K), dtype, device)
    rounding = R.StateRounding.create(batch, seed=5, device=device) if rnd == "stochastic" else None
    want, want_scale, want_rounding = st.clone(), clone(scale), rounding and rounding.clone()
    inp = gdn.random_inputs(batch, H, HV, K, V, device=device)
    y = gdn.decode(st, **inp, use_qk_l2norm_in_kernel=True, slots=slots, state_scale=scale, rounding=rounding)
    y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=slots, state_scale=want_scale,
                           rounding=want_rounding)
    assert_close(y, y_ref, torch.bfloat16, torch.float32, what="decode o")
    assert_stored(st, want, dtype, scale, want_scale, what="decode state")
    cache = make_cache((batch, H, HV, K, V), 4, device, state, rnd, max_draft=2)
    for step in range(6):
        live = torch.where(torch.arange(batch, device=device) % 4 <= step, slots, -1)
        ref = cache.clone()
        inp = gdn.random_inputs(batch, H, HV, K, V, device=device)
        y = gdn.replay(cache, **inp, use_qk_l2norm_in_kernel=True, slots=live)
        y_ref = gdn.replay_ref(ref, **inp, use_qk_l2norm_in_kernel=True, slots=live)
        rows_ = (live >= 0).nonzero().flatten()
        assert_close(y[rows_], y_ref[rows_], torch.bfloat16, torch.float32, what=f"replay o at step {step}")
        assert_caches(cache, ref, assert_close, f"replay step {step}")
    for i, n in enumerate((2, 1)):
        ref = cache.clone()
        inp = gdn.random_inputs(batch, H, HV, K, V, T=2, device=device)
        y = gdn.verify(cache, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        y_ref = gdn.verify_ref(ref, **inp, use_qk_l2norm_in_kernel=True, slots=slots)
        accepted = torch.full((batch,), n, dtype=torch.int32, device=device)
        gdn.accept(cache, accepted, slots)
        gdn.accept_ref(ref, accepted, slots)
        assert_close(y, y_ref, torch.bfloat16, torch.float32, what=f"verify {i} o")
        coarse = torch.float8_e4m3fn if dtype in R.EIGHT_BIT else dtype
        assert_caches(cache, ref, assert_close, f"verify {i}", buffers=(torch.float32, coarse))


@pytest.mark.gpu
@pytest.mark.parametrize("state", ["bf16", "int8"])
def test_stochastic_steps_in_cuda_graph(state):
    """Two windows of stochastically rounded replay steps, and decode steps, captured once (the store counts advance
    on the device) give the eager loop's bits."""
    device, (B, H, HV, K, V), W = "cuda", (4, 2, 8, 128, 128), 4
    eager = make_cache((8, H, HV, K, V), W, device, state, "stochastic")
    graphed = eager.clone()
    slots = torch.tensor([7, 0, -1, 3], dtype=torch.int32, device=device)
    steps = [gdn.random_inputs(B, H, HV, K, V, device=device) for _ in range(2 * W)]
    ys_eager = [gdn.replay(eager, **inp, use_qk_l2norm_in_kernel=True, slots=slots) for inp in steps]
    st, scale = new_state((8, HV, V, K), DT[state], device)
    st_eager, scale_eager = st.clone(), clone(scale)
    r_eager = R.StateRounding.create(8, seed=9, device=device)
    for inp in steps:
        gdn.decode(st_eager, **inp, use_qk_l2norm_in_kernel=True, slots=slots, state_scale=scale_eager,
                   rounding=r_eager)
    # compile on copies first, so that the capture compiles nothing
    gdn.replay(graphed.clone(), **steps[0], use_qk_l2norm_in_kernel=True, slots=slots, check=False)
    gdn.decode(st.clone(), **steps[0], use_qk_l2norm_in_kernel=True, slots=slots, state_scale=clone(scale),
               rounding=R.StateRounding.create(8, seed=9, device=device), check=False)
    st_graph, scale_graph = st.clone(), clone(scale)
    r_graph = R.StateRounding.create(8, seed=9, device=device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [gdn.replay(graphed, **inp, use_qk_l2norm_in_kernel=True, slots=slots, check=False) for inp in steps]
        for inp in steps:
            gdn.decode(st_graph, **inp, use_qk_l2norm_in_kernel=True, slots=slots, state_scale=scale_graph,
                       rounding=r_graph, check=False)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(ys, ys_eager):
        assert torch.equal(a[[0, 1, 3]], b[[0, 1, 3]])
    assert torch.equal(graphed.checkpoint.view(torch.uint8), eager.checkpoint.view(torch.uint8))
    assert torch.equal(graphed.rounding.step, eager.rounding.step) and torch.equal(r_graph.step, r_eager.step)
    assert torch.equal(st_graph.view(torch.uint8), st_eager.view(torch.uint8))
    if scale is not None:
        assert torch.equal(graphed.checkpoint_scale, eager.checkpoint_scale) and torch.equal(scale_graph, scale_eager)
