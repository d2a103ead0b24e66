"""Speculative Mamba-2 decode: verify + accept and decode_multi + accept_snapshot against one-at-a-time decoding."""

from __future__ import annotations

import pytest
import torch

from replayssm_kernels import mamba2
from replayssm_kernels import common
from replayssm_kernels.mamba2.verify import SMALL_GRID, VerifyConfig

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, None: None}
NAN = float("nan")


def _as64(inp: dict) -> dict:
    return {k: v.double() for k, v in inp.items()}


def _draft(inp: dict, t: int) -> dict:
    """Draft t of a (batch, T, ...) input set, as one decode step's (batch, ...) inputs."""
    return {k: (v[:, t] if k in ("x", "dt", "B", "C", "z") else v) for k, v in inp.items()}


CASES = [(4, 3, "fp32", None, "bf16"), (3, 4, "fp32", "bf16", "bf16"), (5, 2, "bf16", "fp8", "fp16"),
         (2, 1, "fp32", "fp16", "fp32")]


@pytest.mark.parametrize("W,T,state,read,io", CASES,
                         ids=[f"B3-H4-P12-N10-G2-W{w}-T{t}-{s}-{r or 'full'}-{i}" for w, t, s, r, i in CASES])
def test_verify_accept_equals_one_at_a_time(device, assert_close, W, T, state, read, io):
    """Rounds of verify + random accept, then replay steps: every draft's output and the committed state
    match an fp64 decode of the same tokens one at a time."""
    nslots, H, P, N, G = 4, 4, 12, 10, 2
    cache = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype=state, read_dtype=read, io_dtype=io,
                                      max_draft=T, device=device)
    start = torch.randn(nslots, H, P, N, device=device)
    cache.load(start)
    exact = start.to(DT[state]).double()
    want = cache.clone()
    rows = torch.tensor([3, -1, 1], dtype=torch.int32, device=device)
    live = rows >= 0
    dts = (DT[io], DT[state], *([DT[read]] if read else []))
    for round_ in range(5):
        inp = mamba2.random_inputs(3, H, P, N, G, T=T, io_dtype=DT[io], device=device)
        out = torch.full((3, T, H, P), NAN, dtype=DT[io], device=device)
        y = mamba2.verify(cache, **inp, dt_softplus=True, slots=rows, out=out)
        y_ref = mamba2.verify_ref(want, **inp, dt_softplus=True, slots=rows)
        assert y[1].isnan().all()
        assert_close(y, y_ref, *dts, what=f"verify vs verify_ref, round {round_}")
        n = torch.randint(0, T + 1, (3,), dtype=torch.int32, device=device)
        trial = exact.clone()
        for t in range(T):
            y_t = mamba2.decode_ref(trial, **_as64(_draft(inp, t)), dt_softplus=True, slots=rows)
            assert_close(y[:, t][live], y_t[live], *dts, what=f"draft {t}, round {round_}")
            for b in torch.nonzero(live).flatten().tolist():
                if t < int(n[b]):
                    exact[int(rows[b])] = trial[int(rows[b])]
        mamba2.accept(cache, n, rows)
        mamba2.accept_ref(want, n, rows)
        assert torch.equal(cache.fill, want.fill)
        assert_close(mamba2.materialize(cache), exact, *dts, what=f"committed state, round {round_}")
    for step in range(W + 1):
        inp = mamba2.random_inputs(3, H, P, N, G, io_dtype=DT[io], device=device)
        y = mamba2.replay(cache, **inp, dt_softplus=True, slots=rows)
        mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        y_exact = mamba2.decode_ref(exact, **_as64(inp), dt_softplus=True, slots=rows)
        assert_close(y[live], y_exact[live], *dts, what=f"replay after verify, step {step}")
    assert_close(mamba2.materialize(cache), exact, *dts, what="final state")
    assert_close(mamba2.materialize(cache), mamba2.materialize_ref(want), DT[state], what="kernel vs reference cache")


def test_verify_folds_a_full_buffer_first(device, assert_close):
    """A row whose accepted drafts bring its fill to ≥ W folds on the next verify: fill 0 + T drafts after it."""
    W, T = 2, 3
    cache = mamba2.ReplayCache.create(2, 2, 8, 8, 1, W, io_dtype="fp32", max_draft=T, device=device)
    cache.load(torch.randn(2, 2, 8, 8, device=device))
    rows = torch.tensor([0, 1], dtype=torch.int32, device=device)
    mamba2.verify(cache, **mamba2.random_inputs(2, 2, 8, 8, 1, T=T, io_dtype=torch.float32, device=device),
                  dt_softplus=True, slots=rows)
    mamba2.accept(cache, torch.tensor([3, 1], dtype=torch.int32, device=device), rows)
    assert cache.fill[:, 0].tolist() == [3, 1]
    committed = mamba2.materialize(cache)
    ck = cache.checkpoint.clone()
    mamba2.verify(cache, **mamba2.random_inputs(2, 2, 8, 8, 1, T=T, io_dtype=torch.float32, device=device),
                  dt_softplus=True, slots=rows)
    assert cache.fill[:, 0].tolist() == [0, 1]
    assert_close(cache.checkpoint[0], committed[0], torch.float32, what="folded checkpoint")
    assert torch.equal(cache.checkpoint[1], ck[1]), "a row below W must not fold"
    mamba2.accept(cache, torch.tensor([0, 0], dtype=torch.int32, device=device), rows)
    assert_close(mamba2.materialize(cache), committed, torch.float32, what="state after rejecting every draft")



# (config, read copy): P split over several programs per head (the shipped rows cover it whole at P ≤ 64), with the
# entries' B·C summed per group first or in each program
CONFIGS = [(VerifyConfig(rows=16, piece=16, bc_pass=False, warps=4, maxnreg=None), None),
           (VerifyConfig(rows=16, piece=16, bc_pass=True, warps=2, maxnreg=None), "fp8")]


@pytest.mark.parametrize("config,read", CONFIGS, ids=["B4-H4-P40-N40-G2-W5-T3-rows16-fp32-full-bf16",
                                                      "B4-H4-P40-N40-G2-W5-T3-rows16-bc-pass-fp32-fp8-bf16"])
def test_verify_split_rows_match_reference(device, assert_close, config, read):
    """P split over programs, through rounds that fold: the outputs, fills and committed states equal the
    reference's."""
    rows = torch.tensor([4, -1, 1, 0], dtype=torch.int32, device=device)
    verify_rounds(5, rows, 4, 40, 40, 2, 5, 3, read, device, assert_close, config=config)


def verify_rounds(nslots, rows, H, P, N, G, W, T, read, device, assert_close, config=None, rounds=5, state="fp32"):
    """Rounds of verify + accept over `rows` (slots, -1 for padding), accepting every draft on even rounds (the
    fills pass W within 2W / T rounds, so that rows fold): outputs pre-filled with NaN, fills, arrival counters
    and committed states as the reference's."""
    cache = mamba2.ReplayCache.create(nslots, H, P, N, G, W, state_dtype=state, read_dtype=read, io_dtype="bf16",
                                      max_draft=T, device=device)
    cache.load(torch.randn(nslots, H, P, N, device=device))
    want = cache.clone()
    batch = rows.shape[0]
    for round_ in range(rounds):
        inp = mamba2.random_inputs(batch, H, P, N, G, T=T, device=device)
        out = torch.full((batch, T, H, P), NAN, dtype=torch.bfloat16, device=device)
        y = mamba2.verify(cache, **inp, dt_softplus=True, slots=rows, out=out, config=config)
        y_ref = mamba2.verify_ref(want, **inp, dt_softplus=True, slots=rows)
        assert y[rows < 0].isnan().all()
        assert_close(y, y_ref, torch.bfloat16, DT[state], *([DT[read]] if read else []),
                     what=f"verify vs verify_ref, round {round_}")
        n = torch.randint(0, T + 1, (batch,), dtype=torch.int32, device=device)
        if round_ % 2 == 0:
            n.fill_(T)
        mamba2.accept(cache, n, rows)
        mamba2.accept_ref(want, n, rows)
        assert torch.equal(cache.fill, want.fill)
        assert torch.equal(cache.arrive, torch.zeros_like(cache.arrive)), "arrival counters must be reset"
        assert_close(mamba2.materialize(cache), mamba2.materialize_ref(want), DT[state],
                     what=f"committed state, round {round_}")


@pytest.mark.gpu
@pytest.mark.parametrize("state", ["fp32", "bf16"])
def test_verify_on_a_grid_that_takes_the_bc_pass(assert_close, state):
    """A batch that takes the B·C pass (12 (row, head) pairs per SM and up), padding rows among its rows, through
    rounds that fold, with an fp32 or a 2-byte checkpoint: outputs, fills and committed states as the reference's."""
    device = torch.device("cuda")
    H, P, N, G, W, T = 128, 64, 128, 8, 16, 4
    batch = SMALL_GRID * common.sm_count(device) // H + 4
    r = torch.arange(batch, device=device)
    rows = torch.where(r % 7 != 3, torch.randperm(batch + 2, device=device)[:batch], -1).to(torch.int32)
    verify_rounds(batch + 2, rows, H, P, N, G, W, T, None, device, assert_close, rounds=10, state=state)


@pytest.mark.parametrize("T", [2, 4], ids=["B3-H4-P12-N10-G2-T2-fp32-bf16", "B3-H4-P12-N10-G2-T4-fp32-bf16"])
def test_decode_multi_accept_snapshot_equals_one_at_a_time(device, assert_close, T):
    """The conventional speculative path over rounds of random acceptance matches fp64 one-at-a-time decoding."""
    nslots, H, P, N, G = 4, 4, 12, 10, 2
    state = torch.randn(nslots, H, P, N, device=device)
    exact = state.double()
    snaps = torch.zeros(nslots, T, H, P, N, device=device)
    rows = torch.tensor([2, -1, 0], dtype=torch.int32, device=device)
    live = rows >= 0
    for round_ in range(3):
        inp = mamba2.random_inputs(3, H, P, N, G, T=T, device=device)
        y = mamba2.decode_multi(state, snaps, **inp, dt_softplus=True, slots=rows)
        n = torch.randint(0, T + 1, (3,), dtype=torch.int32, device=device)
        trial = exact.clone()
        for t in range(T):
            y_t = mamba2.decode_ref(trial, **_as64(_draft(inp, t)), dt_softplus=True, slots=rows)
            assert_close(y[:, t][live], y_t[live], torch.bfloat16, what=f"draft {t}, round {round_}")
            for b in torch.nonzero(live).flatten().tolist():
                if t < int(n[b]):
                    exact[int(rows[b])] = trial[int(rows[b])]
        mamba2.accept_snapshot(state, snaps, n, rows)
        assert_close(state, exact, torch.float32, what=f"state after accept, round {round_}")


def test_verify_bad_input(device):
    cache = mamba2.ReplayCache.create(3, 2, 8, 8, 1, 4, io_dtype="fp32", max_draft=2, device=device)
    rows = torch.tensor([0, 1], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="accept needs a verify"):
        mamba2.accept(cache, torch.tensor([0, 0], dtype=torch.int32, device=device), rows)
    with pytest.raises(ValueError, match="max_draft = 2"):
        mamba2.verify(cache, **mamba2.random_inputs(2, 2, 8, 8, 1, T=3, io_dtype=torch.float32, device=device))
    with pytest.raises(ValueError, match="x must have shape"):
        mamba2.verify(cache, **mamba2.random_inputs(2, 2, 8, 8, 1, io_dtype=torch.float32, device=device))
    mamba2.verify(cache, **mamba2.random_inputs(2, 2, 8, 8, 1, T=2, io_dtype=torch.float32, device=device),
                  slots=rows)
    with pytest.raises(ValueError, match=r"n_accepted must be in \[0, 2\]"):
        mamba2.accept(cache, torch.tensor([3, 0], dtype=torch.int32, device=device), rows)
    with pytest.raises(ValueError, match="n_accepted must be"):
        mamba2.accept(cache, torch.tensor([1.0, 0.0], device=device), rows)
    assert cache.fill.sum() == 0
