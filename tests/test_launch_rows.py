"""Every shipped launch row of both ops, read from the kernels' tables, through the kernels at a tiny shape against
the plain-PyTorch references: outputs pre-filled with NaN, buffers poisoned with NaN, the mutated state compared."""

from __future__ import annotations

import importlib

import pytest
import torch

from replayssm_kernels import mamba2

m2_decode = importlib.import_module("replayssm_kernels.mamba2.decode")
m2_replay = importlib.import_module("replayssm_kernels.mamba2.replay")
m2_verify = importlib.import_module("replayssm_kernels.mamba2.verify")

DT = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn, None: None}
NAN = float("nan")
# Mamba-2: three rows of a pool of five slots, P = 24 (not a power of two), N = 20, two heads in one group.
M2 = dict(nslots=5, H=2, P=24, N=20, G=1)
SLOTS = [3, 0, 4]


def _state_of(row: str) -> str:
    return "bf16" if "-bf16" in row else "fp32"


def _m2_reads(row: str) -> list:
    """The read copies a Mamba-2 replay row serves: a split row's, and a small-grid row's too."""
    state = _state_of(row)
    copies = ["bf16", "fp8"] if state == "fp32" else ["fp8"]
    if "-split" in row:
        return copies
    return [None] + copies[-1:] if row.endswith("-small") else [None]


M2_STEP = [(row, read) for row in m2_replay.STEP_LAUNCH for read in _m2_reads(row)]


def _m2_cache(W, device, state, read=None, max_draft=0):
    cache = mamba2.ReplayCache.create(M2["nslots"], M2["H"], M2["P"], M2["N"], M2["G"], W, state_dtype=state,
                                      read_dtype=read, io_dtype="bf16", max_draft=max_draft, device=device)
    cache.load(torch.randn(M2["nslots"], M2["H"], M2["P"], M2["N"], device=device))
    for name in ("x_buf", "b_buf", "dt_buf", "lam_buf"):
        getattr(cache, name).fill_(NAN)
    return cache


def _inputs(device, T=None):
    return mamba2.random_inputs(len(SLOTS), M2["H"], M2["P"], M2["N"], M2["G"], T=T, io_dtype=torch.bfloat16,
                                device=device)


def _assert_m2_caches(got, want, assert_close):
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert not got.arrive.any() and not got.work[:5].any(), "arrival or list counters not back to zero"
    assert_close(got.checkpoint, want.checkpoint, got.state_dtype, what="checkpoint")
    assert_close(mamba2.materialize(got), mamba2.materialize_ref(want), got.state_dtype, what="materialized state")


@pytest.mark.parametrize("row,read", M2_STEP, ids=[f"{r}-{c or 'full'}" for r, c in M2_STEP])
def test_mamba2_replay_row(device, assert_close, row, read):
    """2W + 1 steps (W = 2), row r joining at step r: every row flushes, in different steps."""
    W, state = 2, _state_of(row)
    got = _m2_cache(W, device, state, read)
    want = got.clone()
    for step in range(2 * W + 1):
        inp = _inputs(device)
        rows = torch.tensor([s if step >= r else -1 for r, s in enumerate(SLOTS)], dtype=torch.int32, device=device)
        out = torch.full((len(SLOTS), M2["H"], M2["P"]), NAN, dtype=torch.bfloat16, device=device)
        y = mamba2.replay(got, **inp, dt_softplus=True, slots=rows, out=out, config=m2_replay.STEP_LAUNCH[row])
        y_ref = mamba2.replay_ref(want, **inp, dt_softplus=True, slots=rows)
        live = rows >= 0
        assert y[~live].isnan().all()
        assert_close(y[live], y_ref[live], torch.bfloat16, DT[state], *([DT[read]] if read else []),
                     what=f"y at step {step}")
    _assert_m2_caches(got, want, assert_close)


@pytest.mark.parametrize("row", list(m2_decode.DECODE_LAUNCH))
def test_mamba2_decode_row(device, assert_close, row):
    """decode, then (rows other than the small grid's, which only decode takes) decode_multi and accept_snapshot."""
    state = DT[_state_of(row)]
    config = m2_decode.DECODE_LAUNCH[row]
    pool = torch.randn(M2["nslots"], M2["H"], M2["P"], M2["N"], device=device).to(state)
    want = pool.clone()
    rows = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    inp = _inputs(device)
    y = mamba2.decode(pool, **inp, dt_softplus=True, slots=rows, config=config,
                      out=torch.full((3, M2["H"], M2["P"]), NAN, dtype=torch.bfloat16, device=device))
    y_ref = mamba2.decode_ref(want, **inp, dt_softplus=True, slots=rows)
    assert_close(y, y_ref, torch.bfloat16, state, what="decode y")
    assert_close(pool, want, state, what="decode state")
    if row.endswith("-small"):
        return
    T = 3
    snaps = torch.full((M2["nslots"], T, M2["H"], M2["P"], M2["N"]), NAN, device=device).to(state)
    snaps_ref = snaps.clone()
    tokens = _inputs(device, T=T)
    y = mamba2.decode_multi(pool, snaps, **tokens, dt_softplus=True, slots=rows, config=config)
    y_ref = mamba2.decode_multi_ref(want, snaps_ref, **tokens, dt_softplus=True, slots=rows)
    assert_close(y, y_ref, torch.bfloat16, state, what="decode_multi y")
    assert_close(snaps[SLOTS], snaps_ref[SLOTS], state, what="snapshots")
    n = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
    mamba2.accept_snapshot(pool, snaps, n, rows, config=config)
    mamba2.accept_snapshot_ref(want, snaps_ref, n, rows)
    assert_close(pool, want, state, what="accepted state")


@pytest.mark.parametrize("row", list(m2_verify.VERIFY_LAUNCH))
def test_mamba2_verify_row(device, assert_close, row):
    """Rounds of verify and accept across a flush (fills past W fold first): drafts' outputs and the cache."""
    W, T, state = 3, 2, _state_of(row)
    got = _m2_cache(W, device, state, max_draft=T)
    want = got.clone()
    rows = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    for round_ in range(3):
        tokens = _inputs(device, T=T)
        out = torch.full((3, T, M2["H"], M2["P"]), NAN, dtype=torch.bfloat16, device=device)
        y = mamba2.verify(got, **tokens, dt_softplus=True, slots=rows, out=out, config=m2_verify.VERIFY_LAUNCH[row])
        y_ref = mamba2.verify_ref(want, **tokens, dt_softplus=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, DT[state], what=f"verify y, round {round_}")
        n = torch.tensor([2, 1, 2], dtype=torch.int32, device=device)
        mamba2.accept(got, n, rows)
        mamba2.accept_ref(want, n, rows)
    _assert_m2_caches(got, want, assert_close)


@pytest.mark.parametrize("row", list(m2_replay.MATERIALIZE_LAUNCH))
def test_mamba2_materialize_row(device, assert_close, row):
    state = _state_of(row)
    got = _m2_cache(4, device, state)
    rows = torch.tensor(SLOTS, dtype=torch.int32, device=device)
    for _ in range(2):
        mamba2.replay(got, **_inputs(device), dt_softplus=True, slots=rows)
    config = m2_replay.MATERIALIZE_LAUNCH[row]
    assert_close(mamba2.materialize(got, SLOTS, config=config), mamba2.materialize_ref(got, torch.tensor(SLOTS)),
                 DT[state], what="materialized state")


from replayssm_kernels import gdn  # noqa: E402

g_decode = importlib.import_module("replayssm_kernels.gdn.decode")
g_replay = importlib.import_module("replayssm_kernels.gdn.replay")
g_verify = importlib.import_module("replayssm_kernels.gdn.verify")
# GDN: three rows of a pool of four slots, two key heads of two value heads each, K = 24, V = 20 (not powers of two).
GD = dict(nslots=4, H=2, HV=4, K=24, V=20)
G_SLOTS = [2, 0, 3]


def _g_read(row: str):
    return "fp8" if "-fp8" in row else "bf16" if "-split" in row else None


# the rows without a read copy serve both state widths
G_REPLAY = [(row, state) for row in g_replay.REPLAY_LAUNCH for state in (["fp32", "bf16"] if _g_read(row) is None
                                                                         else ["fp32"])]


def _g_cache(W, device, state="fp32", read=None, max_draft=0):
    cache = gdn.ReplayCache.create(GD["nslots"], GD["H"], GD["HV"], GD["K"], GD["V"], W, state_dtype=state,
                                   read_dtype=read, io_dtype="bf16", max_draft=max_draft, device=device)
    cache.load(torch.randn(GD["nslots"], GD["HV"], GD["V"], GD["K"], device=device) * 0.5)
    for name in ("buf_u", "buf_k", "buf_g", "buf_beta", "buf_t"):
        if getattr(cache, name) is not None:
            getattr(cache, name).fill_(NAN)
    return cache


def _g_inputs(device, T=None):
    return gdn.random_inputs(len(G_SLOTS), GD["H"], GD["HV"], GD["K"], GD["V"], T=T, io_dtype=torch.bfloat16,
                             device=device)


def _assert_g_caches(got, want, assert_close):
    assert torch.equal(got.fill, want.fill), "fill counters differ"
    assert not got.arrive.any() and not got.work[:2].any(), "arrival or list counters not back to zero"
    dtypes = (got.state_dtype,) + ((got.read_dtype,) if got.read_dtype else ())
    assert_close(got.checkpoint, want.checkpoint, *dtypes, what="checkpoint")
    assert_close(gdn.materialize(got), gdn.materialize_ref(want), *dtypes, what="materialized state")


@pytest.mark.parametrize("row,state", G_REPLAY, ids=[f"{r}-{s}" for r, s in G_REPLAY])
def test_gdn_replay_row(device, assert_close, row, state):
    """2W + 1 steps (W = 2), row r joining at step r: every row flushes, in different steps."""
    W, read = 2, _g_read(row)
    got = _g_cache(W, device, state, read)
    want = got.clone()
    for step in range(2 * W + 1):
        inp = _g_inputs(device)
        rows = torch.tensor([s if step >= r else -1 for r, s in enumerate(G_SLOTS)], dtype=torch.int32, device=device)
        out = torch.full((3, GD["HV"], GD["V"]), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.replay(got, **inp, use_qk_l2norm_in_kernel=True, slots=rows, out=out,
                       config=g_replay.REPLAY_LAUNCH[row])
        y_ref = gdn.replay_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        live = rows >= 0
        assert y[~live].isnan().all()
        assert_close(y[live], y_ref[live], torch.bfloat16, DT[state], *([DT[read]] if read else []),
                     what=f"o at step {step}")
    _assert_g_caches(got, want, assert_close)


@pytest.mark.parametrize("row", list(g_verify.VERIFY_LAUNCH))
def test_gdn_verify_row(device, assert_close, row):
    """Rounds of verify and accept across W (a round whose fills passed W folds first): outputs and the cache."""
    W, T, read = 3, 2, _g_read(row)
    got = _g_cache(W, device, read=read, max_draft=T)
    want = got.clone()
    rows = torch.tensor(G_SLOTS, dtype=torch.int32, device=device)
    for round_ in range(3):
        tokens = _g_inputs(device, T=T)
        out = torch.full((3, T, GD["HV"], GD["V"]), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.verify(got, **tokens, use_qk_l2norm_in_kernel=True, slots=rows, out=out,
                       config=g_verify.VERIFY_LAUNCH[row])
        y_ref = gdn.verify_ref(want, **tokens, use_qk_l2norm_in_kernel=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, torch.float32, *([DT[read]] if read else []),
                     what=f"verify o, round {round_}")
        n = torch.tensor([2, 1, 2], dtype=torch.int32, device=device)
        gdn.accept(got, n, rows)
        gdn.accept_ref(want, n, rows)
    assert not got.arrivals.any(), "arrival counters not back to zero"
    _assert_g_caches(got, want, assert_close)


@pytest.mark.parametrize("row", list(g_decode.DECODE_LAUNCH))
def test_gdn_decode_row(device, assert_close, row):
    """decode's rows through decode; decode_multi's and accept_snapshot's through theirs."""
    state = torch.bfloat16 if "-bf16" in row else torch.float32
    config = g_decode.DECODE_LAUNCH[row]
    pool = (torch.randn(GD["nslots"], GD["HV"], GD["V"], GD["K"], device=device) * 0.5).to(state)
    want = pool.clone()
    rows = torch.tensor(G_SLOTS, dtype=torch.int32, device=device)
    T = 3
    snaps = torch.full((GD["nslots"], T, GD["HV"], GD["V"], GD["K"]), NAN, device=device).to(state)
    snaps_ref = snaps.clone()
    if row == "accept-snapshot":
        tokens = _g_inputs(device, T=T)
        gdn.decode_multi(pool, snaps, **tokens, slots=rows)
        gdn.decode_multi_ref(want, snaps_ref, **tokens, slots=rows)
        n = torch.tensor([2, 0, 3], dtype=torch.int32, device=device)
        gdn.accept_snapshot(pool, snaps, n, rows, config=config)
        gdn.accept_snapshot_ref(want, snaps_ref, n, rows)
    elif row == "decode-multi":
        tokens = _g_inputs(device, T=T)
        y = gdn.decode_multi(pool, snaps, **tokens, use_qk_l2norm_in_kernel=True, slots=rows, config=config)
        y_ref = gdn.decode_multi_ref(want, snaps_ref, **tokens, use_qk_l2norm_in_kernel=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, state, what="decode_multi o")
        assert_close(snaps[G_SLOTS], snaps_ref[G_SLOTS], state, what="snapshots")
    else:
        inp = _g_inputs(device)
        out = torch.full((3, GD["HV"], GD["V"]), NAN, dtype=torch.bfloat16, device=device)
        y = gdn.decode(pool, **inp, use_qk_l2norm_in_kernel=True, slots=rows, out=out, config=config)
        y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True, slots=rows)
        assert_close(y, y_ref, torch.bfloat16, state, what="decode o")
    assert_close(pool, want, state, what="state")
