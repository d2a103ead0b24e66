"""Conventional Gated DeltaNet decode (read, update, write the state) and its snapshot-writing speculative path."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families
from replayssm_kernels import rounding as R
from replayssm_kernels.common import default_slots, flat_program_ids, slot_of
from replayssm_kernels.gdn.common import (
    cast,
    check_accepted,
    check_out,
    check_state,
    check_step,
    default_scale,
    next_pow2,
    qk_factors,
    rounding_args,
    state_bits,
    stored,
)


# These kernels mutate state in place, so they are not autotuned (a trial launch would advance the state): each state
# width and grid class has a fixed row, chosen by `select`.
@dataclass(frozen=True)
class DecodeConfig:
    """How `decode`, `decode_multi` and `accept_snapshot` are launched: programs of `rows` rows of a value head."""

    # rows of V per program: 4 to 32
    rows: int
    # warps per program: 1 or 4
    warps: int = 1
    # registers per thread the programs are capped at: None (the compiler's choice) or 64
    maxnreg: int | None = None
    # decode: the state's rows read before q, k and the gates, behind a barrier that keeps them apart (as fla does)
    state_first: bool = False
    # decode: a contiguous (HV, V, K) block's strides compiled in (one base address, constant offsets)
    block_strides: bool = False


# An fp32 state: one-warp programs of 8 rows capped at 64 registers (32 per SM, all loads in flight first); 2-byte
# states 16 rows; a latency-bound grid 4.
DECODE_LAUNCH = {
    "decode": DecodeConfig(rows=8, maxnreg=64, state_first=True, block_strides=True),
    "decode-small": DecodeConfig(rows=4),
    "decode-bf16": DecodeConfig(rows=16),
    "decode-bf16-small": DecodeConfig(rows=4),
    "decode-multi": DecodeConfig(rows=8),
    "accept-snapshot": DecodeConfig(rows=32, warps=4),
}
# Elements per thread whose random bits a stochastically rounded store draws at once (more spill at 1 warp, K = 128).
RANDOM_PER_THREAD = 16
# decode takes its small-grid rows under this many (row, value head) programs per SM; a row is reduced in pieces of
# 128 of K, in one pipeline stage.
SMALL_GRID, DECODE_PIECE, DECODE_STAGES = 2, 128, 1


def select(state: torch.Tensor, batch: int) -> str:
    """The DECODE_LAUNCH row of a `decode` of `batch` rows: by the state's width and the grid's programs per SM."""
    name = "decode" if state.element_size() == 4 else "decode-bf16"
    per_sm = common.per_sm(batch * state.shape[1], state.device)
    return name + "-small" if per_sm is not None and per_sm < SMALL_GRID else name


@triton.jit
def _head_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k3, m_k3, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh,
                 scale, USE_QK_L2NORM: tl.constexpr):
    """A row's head inputs for one step: [NC, PIECE] q and k as given (each thread holds many copies of them, so their
    factors go on the row sums), q's and k's factors, the decay exp(g) and beta."""
    b_q = tl.load(q + i_b * s_qb + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_b * s_kb + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
    b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
    b_eg = tl.exp(tl.load(g + i_b * s_gb + i_hv * s_gh).to(tl.float32))
    b_beta = tl.load(beta + i_b * s_bb + i_hv * s_bh).to(tl.float32)
    return b_q, b_k, b_rq, b_rk, b_eg, b_beta


@triton.jit
def _decode_kernel(
    s, q, k, v, g, beta, o, slots, sscale, seed, steps, step_arrive,
    s_sn, s_sh, s_sv, s_sk,
    s_cn, s_ch, s_cv,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, PIECE: tl.constexpr, STAGES: tl.constexpr,
    STATE_FIRST: tl.constexpr, BLOCK_STRIDES: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_SLOTS: tl.constexpr,
    Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    # Q8: an 8-bit state, each row over K times its scale in sscale; RANDOM: stored with stochastic rounding, the
    # slot's store count advanced by the launch.
    i_b, i_hv, i_p = flat_program_ids(HV, (V + ROWS - 1) // ROWS)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    i_h = i_hv // (HV // H)
    # The tile is held as [CHUNK, BK / PIECE, PIECE] so that each thread sums its PIECE-wide pieces of a row in
    # registers and only the lanes that share a row meet in shuffles.
    NC: tl.constexpr = BK // PIECE
    o_k3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    m_k3 = o_k3 < K
    if not STATE_FIRST:
        b_q, b_k, b_rq, b_rk, b_eg, b_beta = _head_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k3, m_k3, s_qb, s_qh, s_qk,
                                                          s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh, scale,
                                                          USE_QK_L2NORM)
    b_key = R.store_key(seed, steps, i_s, i_hv, RANDOM)
    # The program's ROWS rows, CHUNK at a time: rows are independent, and the loop's loads run STAGES chunks ahead.
    for i_v in tl.range(0, ROWS, CHUNK, num_stages=STAGES):
        o_v = i_p * ROWS + i_v + tl.arange(0, CHUNK)
        m_v = o_v < V
        m_s = m_v[:, None, None] & m_k3[None, :, :]
        if BLOCK_STRIDES:
            # One base address and constant offsets: fewer registers than the rows' runtime strides take.
            p_s = s + i_s * s_sn + i_hv * (V * K) + o_v[:, None, None] * K + o_k3[None, :, :]
        else:
            p_s = s + i_s * s_sn + i_hv * s_sh + o_v[:, None, None] * s_sv + o_k3[None, :, :] * s_sk
        # [CHUNK, NC, PIECE]
        b_s = tl.load(p_s, mask=m_s, other=0.0)
        if Q8:
            p_c = sscale + i_s * s_cn + i_hv * s_ch + o_v * s_cv
            b_s = b_s.to(tl.float32) * tl.load(p_c, mask=m_v, other=0.0)[:, None, None]
        if STATE_FIRST:
            # Every load of the chunk in flight before the head inputs' (L2) loads and their reductions.
            tl.debug_barrier()
            b_q, b_k, b_rq, b_rk, b_eg, b_beta = _head_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k3, m_k3, s_qb, s_qh,
                                                              s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh, scale,
                                                              USE_QK_L2NORM)
        b_s = b_s.to(tl.float32) * b_eg
        b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
        # The chunk axis first: it lies within each thread, and only the PIECE axis's lanes then shuffle.
        b_u = b_beta * (b_v - b_rk * tl.sum(tl.sum(b_s * b_k[None, :, :], 1), 1))
        b_s += (b_rk * b_u)[:, None, None] * b_k[None, :, :]
        b_o = b_rq * tl.sum(tl.sum(b_s * b_q[None, :, :], 1), 1)
        # [CHUNK, NC, PIECE] the bits of the chunk's elements v * K + k (zeros, unused, without RANDOM)
        b_r = tl.reshape(state_bits(b_key, o_v, tl.arange(0, BK), K, RANDOM), [CHUNK, NC, PIECE])
        if Q8:
            # whole rows over K, as [CHUNK, BK]
            b_q8, b_sc = R.quantized_rows(tl.reshape(b_s, [CHUNK, BK]), tl.reshape(b_r, [CHUNK, BK]),
                                          s.dtype.element_ty, RANDOM)
            tl.store(p_s, tl.reshape(b_q8, [CHUNK, NC, PIECE]), mask=m_s)
            tl.store(p_c, b_sc, mask=m_v)
        elif RANDOM:
            tl.store(p_s, stored(b_s, b_r, s.dtype.element_ty, True).to(s.dtype.element_ty), mask=m_s)
        else:
            tl.store(p_s, cast(b_s, s.dtype.element_ty), mask=m_s)
        tl.store(o + i_b * s_ob + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
    if RANDOM:
        R.count_stores(steps, step_arrive, i_s, HV * ((V + ROWS - 1) // ROWS), 1)


@triton.jit
def _decode_multi_kernel(
    s, snap, q, k, v, g, beta, o, slots, seed, steps, step_arrive, sscale, pscale, TMAX,
    s_sn, s_sh, s_sv, s_sk,
    s_pn, s_pt, s_ph, s_pv, s_pk,
    s_qb, s_qt, s_qh, s_qk,
    s_kb, s_kt, s_kh, s_kk,
    s_vb, s_vt, s_vh, s_vv,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    s_ob, s_ot, s_oh, s_ov,
    scale,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, PIECE: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, RANDOM: tl.constexpr, Q8: tl.constexpr = False,
):
    # Q8: an 8-bit state (row scales sscale (nslots, HV, V)) and snapshots (pscale (nslots, TMAX, HV, V)), each
    # draft continuing from the rows it stored
    i_b, i_hv, i_v = flat_program_ids(HV, (V + ROWS - 1) // ROWS)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    i_h = i_hv // (HV // H)
    # The state is held as [ROWS, BK / PIECE, PIECE], as in _decode_kernel.
    NC: tl.constexpr = BK // PIECE
    o_k3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    o_v = i_v * ROWS + tl.arange(0, ROWS)
    m_k3 = o_k3 < K
    m_v = o_v < V
    m_s = m_v[:, None, None] & m_k3[None, :, :]

    p_s = s + i_s * s_sn + i_hv * s_sh + o_v[:, None, None] * s_sv + o_k3[None, :, :] * s_sk
    # [ROWS, NC, PIECE]
    b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    if Q8:
        b_s *= tl.load(sscale + (i_s * HV + i_hv) * V + o_v, mask=m_v, other=0.0)[:, None, None]
    if RANDOM:
        # draft t rounds with the bits of the slot's store count + t, as T conventional steps would
        b_n = tl.load(steps + i_s)
    for i_t in range(T):
        # [NC, PIECE] q and k as given, their factors on the row sums
        b_q = tl.load(q + i_b * s_qb + i_t * s_qt + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
        b_k = tl.load(k + i_b * s_kb + i_t * s_kt + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
        b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
        b_v = tl.load(v + i_b * s_vb + i_t * s_vt + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
        b_g = tl.load(g + i_b * s_gb + i_t * s_gt + i_hv * s_gh).to(tl.float32)
        b_beta = tl.load(beta + i_b * s_bb + i_t * s_bt + i_hv * s_bh).to(tl.float32)
        b_s *= tl.exp(b_g)
        b_u = b_beta * (b_v - b_rk * tl.sum(tl.sum(b_s * b_k[None, :, :], 1), 1))
        b_s += (b_rk * b_u)[:, None, None] * b_k[None, :, :]
        b_o = b_rq * tl.sum(tl.sum(b_s * b_q[None, :, :], 1), 1)
        # Round as a stored state would be, so that drafts equal one conventional step at a time.
        if Q8:
            if RANDOM:
                b_r = R.element_bits(R.slot_key(seed, b_n + i_t, i_s, i_hv),
                                     o_v[:, None] * K + tl.arange(0, BK)[None, :])
            else:
                b_r = tl.zeros([ROWS, BK], dtype=tl.uint32)
            b_q8, b_sc = R.quantized_rows(tl.reshape(b_s, [ROWS, BK]), b_r, snap.dtype.element_ty, RANDOM)
            b_q8 = tl.reshape(b_q8, [ROWS, NC, PIECE])
            p_p = snap + i_s * s_pn + i_t * s_pt + i_hv * s_ph + o_v[:, None, None] * s_pv + o_k3[None, :, :] * s_pk
            tl.store(p_p, b_q8, mask=m_s)
            tl.store(pscale + ((i_s * TMAX + i_t) * HV + i_hv) * V + o_v, b_sc, mask=m_v)
            b_s = b_q8.to(tl.float32) * b_sc[:, None, None]
        else:
            if RANDOM:
                b_r = tl.reshape(R.element_bits(R.slot_key(seed, b_n + i_t, i_s, i_hv),
                                                o_v[:, None] * K + tl.arange(0, BK)[None, :]), [ROWS, NC, PIECE])
                b_s = stored(b_s, b_r, snap.dtype.element_ty, True)
            else:
                b_s = stored(b_s, b_s, snap.dtype.element_ty, False)
            p_p = snap + i_s * s_pn + i_t * s_pt + i_hv * s_ph + o_v[:, None, None] * s_pv + o_k3[None, :, :] * s_pk
            tl.store(p_p, b_s.to(snap.dtype.element_ty), mask=m_s)
        tl.store(o + i_b * s_ob + i_t * s_ot + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
    if RANDOM:
        R.count_stores(steps, step_arrive, i_s, HV * ((V + ROWS - 1) // ROWS), T)


@triton.jit
def _accept_snapshot_kernel(
    s, snap, n, slots, sscale, pscale, HV, TMAX,
    s_sn, s_sh, s_sv, s_sk,
    s_pn, s_pt, s_ph, s_pv, s_pk,
    K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, Q8: tl.constexpr = False,
):
    # Q8: the rows' scales are copied too, pscale (nslots, TMAX, HV, V) into sscale (nslots, HV, V)
    i_b, i_hv, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(slots + i_b).to(tl.int64)
    i_n = tl.load(n + i_b).to(tl.int64)
    if (i_s < 0) | (i_n < 1):
        return
    o_k = tl.arange(0, BK)
    o_v = i_v * ROWS + tl.arange(0, ROWS)
    m_s = (o_v < V)[:, None] & (o_k < K)[None, :]
    p_p = snap + i_s * s_pn + (i_n - 1) * s_pt + i_hv * s_ph + o_v[:, None] * s_pv + o_k[None, :] * s_pk
    p_s = s + i_s * s_sn + i_hv * s_sh + o_v[:, None] * s_sv + o_k[None, :] * s_sk
    tl.store(p_s, tl.load(p_p, mask=m_s, other=0.0), mask=m_s)
    if Q8:
        m_v = o_v < V
        b_sc = tl.load(pscale + ((i_s * TMAX + i_n - 1) * HV + i_hv) * V + o_v, mask=m_v, other=0.0)
        tl.store(sscale + (i_s * HV + i_hv) * V + o_v, b_sc, mask=m_v)


def _check_scales(state, snapshots, state_scale, snapshot_scale) -> None:
    """An 8-bit state's and its snapshots' row scales, required for and only for an 8-bit state."""
    nslots, HV, V, _ = state.shape
    common.check_state_scale(state_scale, state, (nslots, HV, V), "(nslots, HV, V)")
    common.check_state_scale(snapshot_scale, state, (nslots, snapshots.shape[1], HV, V), "(nslots, T, HV, V)",
                             "snapshot_scale")


def random_rows(rows: int, K: int, warps: int) -> int:
    """The rows a stochastically rounded store takes at a time, of `rows`: each thread draws Philox bits for at most
    RANDOM_PER_THREAD elements at once (every element's draw holds its counter and key words in registers)."""
    return max(1, min(rows, RANDOM_PER_THREAD * 32 * warps // next_pow2(K)))


def _block_contiguous(state) -> bool:
    """Whether each slot's (HV, V, K) block of the state is contiguous (its slots may lie at any stride)."""
    _, HV, V, K = state.shape
    return state.stride(3) == 1 and state.stride(2) == K and state.stride(1) == V * K


def _launch_decode(state, q, k, v, g, beta, out, slots, scale, l2norm, c: DecodeConfig, state_scale, rounding):
    batch, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    ROWS = min(c.rows, next_pow2(V))
    # without a scale its strides are None too: constants, out of the kernel's signature
    scale_strides = (None,) * 3 if state_scale is None else state_scale.stride()
    _decode_kernel[(batch * HV * triton.cdiv(V, ROWS),)](
        s=state, q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots, sscale=state_scale,
        s_sn=state.stride(0), s_sh=state.stride(1), s_sv=state.stride(2), s_sk=state.stride(3),
        s_cn=scale_strides[0], s_ch=scale_strides[1], s_cv=scale_strides[2],
        s_qb=q.stride(0), s_qh=q.stride(1), s_qk=q.stride(2),
        s_kb=k.stride(0), s_kh=k.stride(1), s_kk=k.stride(2),
        s_vb=v.stride(0), s_vh=v.stride(1), s_vv=v.stride(2),
        s_gb=g.stride(0), s_gh=g.stride(1),
        s_bb=beta.stride(0), s_bh=beta.stride(1),
        s_ob=out.stride(0), s_oh=out.stride(1), s_ov=out.stride(2),
        scale=scale,
        H=H, HV=HV, K=K, V=V, BK=next_pow2(K), ROWS=ROWS,
        CHUNK=ROWS if rounding is None else random_rows(ROWS, K, c.warps),
        PIECE=min(DECODE_PIECE, next_pow2(K)), STAGES=DECODE_STAGES, STATE_FIRST=c.state_first,
        BLOCK_STRIDES=c.block_strides and _block_contiguous(state),
        USE_QK_L2NORM=l2norm, HAS_SLOTS=slots is not None, Q8=state_scale is not None,
        **rounding_args(rounding), step_arrive=R.step_arrivals(rounding),
        **common.compile_options(c.warps, c.maxnreg),
    )


def _quant(state_scale, snapshots) -> dict:
    """An 8-bit launch's Q8 and snapshot positions per slot; else None for both scale tensors and TMAX (constants:
    the other states' launches take no such parameters)."""
    return {"Q8": True, "TMAX": snapshots.shape[1]} if state_scale is not None else {"TMAX": None}


def _launch_decode_multi(state, snapshots, q, k, v, g, beta, out, slots, scale, l2norm, c: DecodeConfig, rounding,
                         state_scale, snapshot_scale):
    batch, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    ROWS = min(c.rows, next_pow2(V))
    if rounding is not None:
        ROWS = random_rows(ROWS, K, c.warps)
    _decode_multi_kernel[(batch * HV * triton.cdiv(V, ROWS),)](
        s=state, snap=snapshots, q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots, sscale=state_scale,
        pscale=snapshot_scale, **_quant(state_scale, snapshots),
        s_sn=state.stride(0), s_sh=state.stride(1), s_sv=state.stride(2), s_sk=state.stride(3),
        s_pn=snapshots.stride(0), s_pt=snapshots.stride(1), s_ph=snapshots.stride(2),
        s_pv=snapshots.stride(3), s_pk=snapshots.stride(4),
        s_qb=q.stride(0), s_qt=q.stride(1), s_qh=q.stride(2), s_qk=q.stride(3),
        s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2), s_kk=k.stride(3),
        s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), s_vv=v.stride(3),
        s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2),
        s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2),
        s_ob=out.stride(0), s_ot=out.stride(1), s_oh=out.stride(2), s_ov=out.stride(3),
        scale=scale,
        T=T, H=H, HV=HV, K=K, V=V, BK=next_pow2(K), ROWS=ROWS, PIECE=min(DECODE_PIECE, next_pow2(K)),
        USE_QK_L2NORM=l2norm, **rounding_args(rounding), step_arrive=R.step_arrivals(rounding),
        **common.compile_options(c.warps, c.maxnreg),
    )


def _launch_accept_snapshot(state, snapshots, n_accepted, slots, c: DecodeConfig, state_scale, snapshot_scale):
    batch = slots.shape[0]
    HV, V, K = state.shape[1:]
    ROWS = min(c.rows, next_pow2(V))
    _accept_snapshot_kernel[(batch, HV, triton.cdiv(V, ROWS))](
        s=state, snap=snapshots, n=n_accepted, slots=slots, sscale=state_scale, pscale=snapshot_scale,
        HV=None if state_scale is None else HV, **_quant(state_scale, snapshots),
        s_sn=state.stride(0), s_sh=state.stride(1), s_sv=state.stride(2), s_sk=state.stride(3),
        s_pn=snapshots.stride(0), s_pt=snapshots.stride(1), s_ph=snapshots.stride(2),
        s_pv=snapshots.stride(3), s_pk=snapshots.stride(4),
        K=K, V=V, BK=next_pow2(K), ROWS=ROWS,
        **common.compile_options(c.warps, c.maxnreg),
    )


@families.refuse_out_of_resources
def decode(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    slots: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    check: bool = True,
    state_scale: torch.Tensor | None = None,
    rounding: R.StateRounding | None = None,
) -> torch.Tensor:
    """One conventional Gated DeltaNet decode step; updates `state` (and `state_scale`) in place.

    state (nslots, HV, V, K) fp32, bf16, fp16, or 8-bit (fp8 e4m3, sm_89 and newer, or int8) with state_scale
    (nslots, HV, V) fp32 contiguous, the scale of each row over K (a row's values are state * scale; required for an
    8-bit state, refused for any other), any strides; q, k (batch, H, K) and v (batch, HV, V)
    in fp32, bf16 or fp16; g (batch, HV) the log-decay (<= 0); beta (batch, HV) in (0, 1). HV is a
    multiple of H: the HV // H value heads of a key head share its q and k. q and k are L2-normalised
    in the kernel when use_qk_l2norm_in_kernel is set; q is scaled by `scale` (default K ** -0.5).
    slots (batch,) int32 maps rows to state slots (default: row i uses slot i, with no slot table read);
    rows with slot -1 are padding: neither their state nor their output is touched.
    Per value head: S = e^g S; u = beta (v - S k); S += u kᵀ; o = S q, from S in fp32; S is then stored rounded
    to nearest, or with `rounding` (a rounding.StateRounding over the pool's slots; a 16-bit or 8-bit state)
    stochastically by the bits of (slot, value head, element v * K + k) at the slot's store count, which the call
    then advances. An 8-bit state's rows are stored over their new scales (`rounding.quantized_rows`).
    Returns o (batch, HV, V) in v's dtype (written into `out` when given; padding rows keep what it
    held). `config`: the launch settings (default: the DECODE_LAUNCH row `select` chooses); for benchmarks.
    `check` range-checks slots on the host (a device sync), skipped while a CUDA graph is captured.
    """
    batch, _, H, HV, K, V = check_step(q, k, v, g, beta, tokens=False)
    check_state(state, "state", HV, V, K, q.device)
    common.check_state_scale(state_scale, state, (state.shape[0], HV, V), "(nslots, HV, V)")
    R.check_rounding(rounding, state.dtype, state.shape[0], q.device)
    common.check_device(q.device, _decode_kernel)
    scale = default_scale(K, scale)
    # Without slots, row b updates slot b and the kernel reads no slot table.
    common.check_slots(slots, batch, state.shape[0], q.device, check)
    out = check_out(out, v.shape, v.dtype, q.device)
    c = DECODE_LAUNCH[select(state, batch)] if config is None else config
    if batch:
        _launch_decode(state, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel), c, state_scale,
                       rounding)
    return out


@families.refuse_out_of_resources
def decode_multi(
    state: torch.Tensor,
    snapshots: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    slots: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: DecodeConfig | None = None,
    check: bool = True,
    rounding: R.StateRounding | None = None,
    state_scale: torch.Tensor | None = None,
    snapshot_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """T conventional steps of speculative drafts, writing the state after each draft to `snapshots`.

    Inputs as in `decode` with a token axis: q, k (batch, T, H, K), v (batch, T, HV, V), g, beta
    (batch, T, HV). `state` (nslots, HV, V, K) is read and left unchanged; snapshots (nslots, T', HV,
    V, K) with T' >= T and the state's dtype receives snapshots[slot, t] = the state after draft t,
    rounded to the state dtype after every draft as `decode` would: to nearest, or with `rounding` (a 16-bit or
    8-bit state) stochastically, draft t with the bits `decode` would take t steps on, the slot's store count then
    advanced by T. An 8-bit state (fp8 or int8, as in `decode`) reads its rows times state_scale (nslots, HV, V) and
    stores each snapshot as 8-bit rows with their scales in snapshot_scale (nslots, T', HV, V), the next draft
    continuing from the stored rows; both fp32, contiguous, required for and only for an 8-bit state.
    Returns o (batch, T, HV, V). slots, out, config, check: as in `decode`. Commit n drafts with `accept_snapshot`.
    """
    batch, T, H, HV, K, V = check_step(q, k, v, g, beta, tokens=True)
    check_state(state, "state", HV, V, K, q.device)
    R.check_rounding(rounding, state.dtype, state.shape[0], q.device)
    if (
        not isinstance(snapshots, torch.Tensor)
        or snapshots.dim() != 5
        or snapshots.shape[0] != state.shape[0]
        or snapshots.shape[1] < T
        or tuple(snapshots.shape[2:]) != (HV, V, K)
    ):
        raise ValueError(f"snapshots must have shape ({state.shape[0]}, >= {T}, {HV}, {V}, {K})")
    if snapshots.dtype != state.dtype or snapshots.device != state.device:
        raise ValueError("snapshots must have the dtype and device of state")
    _check_scales(state, snapshots, state_scale, snapshot_scale)
    common.check_device(q.device, _decode_multi_kernel)
    scale = default_scale(K, scale)
    common.check_slots(slots, batch, state.shape[0], q.device, check)
    slots = default_slots(slots, batch, q.device)
    out = check_out(out, v.shape, v.dtype, q.device)
    c = DECODE_LAUNCH["decode-multi"] if config is None else config
    if batch and T:
        _launch_decode_multi(state, snapshots, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel), c,
                             rounding, state_scale, snapshot_scale)
    return out


@families.refuse_out_of_resources
def accept_snapshot(
    state: torch.Tensor,
    snapshots: torch.Tensor,
    n_accepted: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    config: DecodeConfig | None = None,
    check: bool = True,
    state_scale: torch.Tensor | None = None,
    snapshot_scale: torch.Tensor | None = None,
) -> None:
    """Commit n accepted drafts of `decode_multi`: state[slot] = snapshots[slot, n - 1] for rows with n >= 1.

    n_accepted (batch,) int32 or int64 on the state's device, each in [0, T]; slots, config, check as
    in `decode` (`check` also range-checks n_accepted on the host). An 8-bit state's chosen snapshot's scales are
    copied with its rows (state_scale, snapshot_scale as in `decode_multi`).
    """
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        raise ValueError("state must have shape (nslots, HV, V, K)")
    nslots, HV, V, K = state.shape
    check_state(state, "state", HV, V, K, state.device)
    if not isinstance(snapshots, torch.Tensor) or snapshots.dim() != 5 or snapshots.shape[0] != nslots:
        raise ValueError(f"snapshots must have shape ({nslots}, T, {HV}, {V}, {K})")
    if tuple(snapshots.shape[2:]) != (HV, V, K) or snapshots.dtype != state.dtype:
        raise ValueError(f"snapshots must have shape ({nslots}, T, {HV}, {V}, {K}) and the state's dtype")
    _check_scales(state, snapshots, state_scale, snapshot_scale)
    if not isinstance(n_accepted, torch.Tensor) or n_accepted.dim() != 1:
        raise ValueError("n_accepted must be a 1-D int32 or int64 tensor of shape (batch,)")
    common.check_device(state.device, _accept_snapshot_kernel)
    check_accepted(n_accepted, n_accepted.shape[0], snapshots.shape[1], state.device, check)
    common.check_slots(slots, n_accepted.shape[0], nslots, state.device, check)
    slots = default_slots(slots, n_accepted.shape[0], state.device)
    c = DECODE_LAUNCH["accept-snapshot"] if config is None else config
    if n_accepted.shape[0]:
        _launch_accept_snapshot(state, snapshots, n_accepted, slots, c, state_scale, snapshot_scale)
