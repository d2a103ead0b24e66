"""Speculative Gated DeltaNet decode with ReplaySSM: verify T drafts from one read of each checkpoint, then accept a
prefix."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families
from replayssm_kernels import rounding as R
from replayssm_kernels.common import (
    default_slots,
    dot_fp32,
    fills_read,
    list_done,
    list_heads,
    listed_ahead,
    listed_flush,
    scalar_mask,
)
from replayssm_kernels.gdn.cache import ReplayCache
from replayssm_kernels.gdn.common import (
    cast,
    check_accepted,
    check_out,
    default_scale,
    next_pow2,
    rounded,
    state_bits,
    store_rows,
)
from replayssm_kernels.gdn.replay import (
    _cache_args,
    _cache_constants,
    _check_against_cache,
    _check_cache,
    _copy,
    _correction_weights,
    _folded_rows,
    _grid,
    _row_sums,
    _store_read_copy,
)


@dataclass(frozen=True)
class FoldConfig:
    """How a verify's folds (rows whose fill reached W) run in a launch of their own, after a launch that lists the
    value heads that fold."""

    # rows of V per item: 64 or 128
    rows: int
    # warps per program: 2
    warps: int
    # programs per SM: 4 (room for the key products' and the weights' programs beside them)
    programs_per_sm: int
    # a fold's product's input precision: "ieee" (fp32 FMAs) or "tf32x3"
    precision: str
    # its product in this many pieces of K: 1 or 2
    ksplit: int
    # True: on a second stream, beside the key products and the weights (which read nothing a fold writes)
    stream: bool
    # True: each program's next item's list entry and slot loaded while it folds the one before
    prefetch: bool


@dataclass(frozen=True)
class VerifyConfig:
    """How `verify` is launched: one program per (row, value head), its tile read once in chunks."""

    # rows of the tile per pipelined chunk: 32 or 64
    chunk: int
    # 0: the key products in each program; 1: the products a key head's value heads share (its drafts' and committed
    # keys against each draft's key and query) from a launch before the verify's; 2: also each value head's weights
    # (fill, gates, the [T, T] solve) from a second launch (with mma and no read copy)
    key_pass: int
    # with key_pass: that launch's products in this many pieces of K: 1 or 2
    key_split: int
    # True: each chunk's products with every draft's k and q on the tensor cores; False: row sums in shuffles
    mma: bool
    # the tile's products (and a fold's) in this many pieces of K: 1 or 2
    ksplit: int
    # depth of a fold's pipeline in the verify's own programs: 1 or 3
    fold_stages: int
    # warps per program: 2 or 4
    warps: int
    # registers per thread the programs are capped at: None or 168
    maxnreg: int | None
    # None: rows that fold do so in the verify's own programs; else in a launch of their own
    fold: FoldConfig | None = None
    # 0: a fold's product over the capacity's entries; 1: over the window's where the fill is W; 2: also past it,
    # the few entries after them one by one
    fold_window: int = 0
    # False (with fold only): the drafts' keys written by each key head's first value head, not the last to finish
    arrive: bool = True
    # True (key_pass 2 only): each program's fill read from the weights launch's output, beside its slot
    weights_fill: bool = False


_FOLDS = FoldConfig(rows=128, warps=2, programs_per_sm=4, precision="ieee", ksplit=1, stream=True, prefetch=True)
_VERIFY = VerifyConfig(chunk=32, key_pass=2, key_split=2, mma=True, ksplit=2, fold_stages=3, warps=2, maxnreg=168,
                       fold=_FOLDS, fold_window=2, arrive=False, weights_fill=True)
_COPY_VERIFY = VerifyConfig(chunk=32, key_pass=0, key_split=1, mma=False, ksplit=1, fold_stages=1, warps=4,
                            maxnreg=None)
VERIFY_LAUNCH = {
    "verify": _VERIFY,
    "verify-medium": dataclasses.replace(_VERIFY, fold=dataclasses.replace(_FOLDS, rows=64), key_split=1,
                                         fold_window=1, weights_fill=False),
    "verify-small": VerifyConfig(chunk=64, key_pass=1, key_split=1, mma=True, ksplit=2, fold_stages=1, warps=4,
                                 maxnreg=168),
    "verify-split": _COPY_VERIFY,
    "verify-fp8": _COPY_VERIFY,
}
# Each verify's chunks pipelined two deep, 16 rows per chunk of a fold, in pieces of 32 of K; the key-product and
# weights launches' warps.
VERIFY_STAGES, FOLD_CHUNK, VERIFY_PIECE, GRAM_WARPS, WEIGHTS_WARPS = 2, 16, 32, 2, 1


def select_verify(cache: ReplayCache, batch: int) -> str:
    """The VERIFY_LAUNCH row of a `verify` of `batch` rows: by the read copy and the grid's programs per SM."""
    return _grid(cache, batch, VERIFY_LAUNCH, "verify" + _copy(cache))


@triton.jit
def _columns4(b_x, N: tl.constexpr):
    """The four columns of b_x [N, 4] as [N] vectors. Split in pairs (tl.split keeps a pair in one thread), not summed
    over a middle axis of a broadcast product, which Triton's combining pass turns into a TF32 product, nor over a
    last axis, which it sums across threads."""
    b_02, b_13 = tl.split(tl.reshape(b_x, [N, 2, 2]))
    b_0, b_2 = tl.split(b_02)
    b_1, b_3 = tl.split(b_13)
    return b_0, b_1, b_2, b_3


@triton.jit
def _fold_entries(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl, v0,
    CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, FOLD_CHUNK: tl.constexpr, HAS_COPY: tl.constexpr, IS_SCALED: tl.constexpr,
    FOLD_KSPLIT: tl.constexpr, FOLD_STAGES: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
    BWE: tl.constexpr, FOLD_EXTRA: tl.constexpr, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """`_verify_flush` with the buffer's first BWE entries in its product and, with FOLD_EXTRA = 4, the four after them
    in FMAs of their own (zero past the fill)."""
    BKF: tl.constexpr = BK // FOLD_KSPLIT
    o_w = tl.arange(0, BWE)
    m_w = o_w < b_f
    # The committed entries' log-decays [BWE]
    b_Gw = tl.load(buf_g + (i_s * CAP + o_w) * HV + i_hv, mask=m_w, other=0.0)
    b_key = R.store_key(seed, steps, i_s, i_hv, RANDOM)
    for i_k in tl.static_range(FOLD_KSPLIT):
        o_k = i_k * BKF + tl.arange(0, BKF)
        m_k = o_k < K
        # The committed entries' keys [BWE, BKF], zero past the fill
        b_kw = tl.load(buf_k + ((i_s * CAP + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                       mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_wc = b_kw
        if HAS_COPY:
            b_wc = _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, CAP, HV, PRECISION)
        if FOLD_EXTRA == 4:
            # The entries past the product: their weights e^{G - G_j} [4] and keys, a [BKF] vector each
            o_x = BWE + tl.arange(0, FOLD_EXTRA)
            m_x = o_x < b_f
            b_cx = tl.where(m_x, tl.exp(b_Gl - tl.load(buf_g + (i_s * CAP + o_x) * HV + i_hv, mask=m_x, other=0.0)),
                            0.0)
            b_k0, b_k1, b_k2, b_k3 = _columns4(
                tl.load(buf_k + ((i_s * CAP + o_x[None, :]) * H + i_h) * K + o_k[:, None],
                        mask=m_x[None, :] & m_k[:, None], other=0.0).to(tl.float32), BKF)
        for i_v in tl.range(0, ROWS, FOLD_CHUNK, num_stages=FOLD_STAGES):
            o_v = v0 + i_v + tl.arange(0, FOLD_CHUNK)
            m_v = (o_v < V) & (i_v + tl.arange(0, FOLD_CHUNK) < ROWS)
            b_s, o_s, o_r, m_s = _folded_rows(
                ckpt, cscale, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
                CAP, HV, K, V, HAS_COPY, IS_SCALED, PRECISION, PRECISION, Q8,
            )
            if FOLD_EXTRA == 4:
                # their weighted updates [FOLD_CHUNK, 4] as four [FOLD_CHUNK] vectors, one rank-1 update each
                b_u0, b_u1, b_u2, b_u3 = _columns4(
                    tl.load(buf_u + ((i_s * CAP + o_x[None, :]) * HV + i_hv) * V + o_v[:, None],
                            mask=m_v[:, None] & m_x[None, :], other=0.0).to(tl.float32) * b_cx[None, :], FOLD_CHUNK)
                b_s += (b_u0[:, None] * b_k0[None, :] + b_u1[:, None] * b_k1[None, :]
                        + b_u2[:, None] * b_k2[None, :] + b_u3[:, None] * b_k3[None, :])
            if Q8 or RANDOM:
                # an 8-bit checkpoint's rows are whole here (FOLD_KSPLIT = 1)
                b_r = state_bits(b_key, o_v, o_k, K, RANDOM)
                b_s = store_rows(ckpt, cscale, o_s, o_r, b_s, m_s, m_v, b_r, Q8, RANDOM)
            else:
                b_s = rounded(b_s, ckpt.dtype.element_ty)
                tl.store(ckpt + o_s, b_s.to(ckpt.dtype.element_ty), mask=m_s)
            if HAS_COPY:
                _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_SCALED)


@triton.jit
def _verify_flush(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl, v0,
    CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, FOLD_CHUNK: tl.constexpr, HAS_COPY: tl.constexpr, IS_SCALED: tl.constexpr,
    FOLD_KSPLIT: tl.constexpr, FOLD_STAGES: tl.constexpr, ROWS: tl.constexpr, PRECISION: tl.constexpr,
    FOLD_ENTRIES: tl.constexpr, BW: tl.constexpr, FOLD_EXTRA: tl.constexpr, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """Fold the buffer into a new checkpoint (updates corrected under a read copy) and store it for rows v0 .. v0 +
    ROWS, FOLD_CHUNK rows at a time through a loop pipelined FOLD_STAGES deep, in FOLD_KSPLIT column pieces (the
    buffered keys of one piece at a time; a read copy's correction sums whole rows, so 1 under one), the f buffered
    entries in one product: over FOLD_ENTRIES entries where f <= FOLD_ENTRIES < BW; past FOLD_ENTRIES, with
    FOLD_EXTRA = 4, the same product and the rest one by one (at most 4), else one over BW (the padding's products cost
    as much as the entries')."""
    # past FOLD_ENTRIES: the product over FOLD_ENTRIES and the rest one by one, or over BW
    PAST: tl.constexpr = FOLD_ENTRIES if FOLD_EXTRA > 0 else BW
    if FOLD_ENTRIES < BW and b_f <= FOLD_ENTRIES:
        _fold_entries(ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl,
                      v0, CAP, H, HV, K, V, BK, FOLD_CHUNK, HAS_COPY, IS_SCALED, FOLD_KSPLIT, FOLD_STAGES, ROWS,
                      PRECISION, FOLD_ENTRIES, 0, Q8, RANDOM)
    else:
        _fold_entries(ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl,
                      v0, CAP, H, HV, K, V, BK, FOLD_CHUNK, HAS_COPY, IS_SCALED, FOLD_KSPLIT, FOLD_STAGES, ROWS,
                      PRECISION, PAST, FOLD_EXTRA, Q8, RANDOM)


@triton.jit
def _store_draft_rows(buf_t, b_KK, b_Wck, b_rk, b_bd, i_s, i_hv, b_fe, o_t, o_w, o_wc, m_t, m_wc,
                      T: tl.constexpr, CAP: tl.constexpr, HV: tl.constexpr):
    """Store the drafts' rows of T, t_i = beta_i (e_i - sum_j (k_j·k_i) t_j), j over the committed entries and the
    drafts before i; b_KK [BT, BT] and b_Wck [BWC, BT] are the drafts' and committed keys' products with the
    drafts' keys as given (b_rk their normalising factors)."""
    m_c = o_w < CAP
    # [BWC, BW] the committed entries' rows
    b_tc = tl.load(buf_t + ((i_s * CAP + o_wc[:, None]) * HV + i_hv) * CAP + o_w[None, :],
                   mask=m_wc[:, None] & m_c[None, :], other=0.0)
    # [BT, BW]
    b_r = tl.where(o_w[None, :] == b_fe + o_t[:, None], 1.0, 0.0)
    b_r -= tl.sum((b_Wck * b_rk[None, :])[:, :, None] * b_tc[:, None, :], 0)
    b_kk = b_KK * b_rk[:, None] * b_rk[None, :]
    b_t = tl.zeros(b_r.shape, dtype=tl.float32)
    for i in tl.static_range(T):
        b_kki = tl.sum(tl.where((o_t[:, None] == i) & (o_t[None, :] < i), b_kk, 0.0), 0)
        b_ri = tl.sum(tl.where(o_t[:, None] == i, b_r, 0.0), 0)
        b_bi = tl.sum(tl.where(o_t == i, b_bd, 0.0))
        b_t = tl.where(o_t[:, None] == i, (b_bi * (b_ri - tl.sum(b_kki[:, None] * b_t, 0)))[None, :], b_t)
    tl.store(buf_t + ((i_s * CAP + b_fe + o_t[:, None]) * HV + i_hv) * CAP + o_w[None, :], b_t,
             mask=m_t[:, None] & m_c[None, :])


@triton.jit
def _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk):
    """Draft i's key and query as given, [NC, PIECE] in fp32."""
    b_k3 = tl.load(k + i_b * s_kb + i * s_kt + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
    b_q3 = tl.load(q + i_b * s_qb + i * s_qt + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
    return b_k3, b_q3


@triton.jit
def _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh):
    """The drafts' log-decays and betas [BT], the log-decay after each since the committed state, and its exp."""
    b_gd = tl.load(g + i_b * s_gb + o_t * s_gt + i_hv * s_gh, mask=m_t, other=0.0).to(tl.float32)
    b_bd = tl.load(beta + i_b * s_bb + o_t * s_bt + i_hv * s_bh, mask=m_t, other=0.0).to(tl.float32)
    b_cum = tl.sum(tl.where(m_upto, b_gd[None, :], 0.0), 1)
    return b_gd, b_bd, b_cum, tl.exp(b_cum)


@triton.jit
def _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv):
    """A verify chunk's committed updates [CHUNK, BWC] and the drafts' v [CHUNK, BT] as fp32."""
    b_uw = tl.load(buf_u + o_u[None, :] + o_v[:, None], mask=m_wc[None, :] & m_v[:, None], other=0.0).to(tl.float32)
    b_Vd = tl.load(v + i_b * s_vb + o_t[None, :] * s_vt + i_hv * s_vh + o_v[:, None] * s_vv, mask=m_vt, other=0.0)
    return b_uw, b_Vd.to(tl.float32)


@triton.jit
def _tile_product(b_s, b_KQ, acc, NATIVE: tl.constexpr, IS_TILE_EXACT: tl.constexpr, IS_HALF_IO: tl.constexpr):
    """acc + the tile's rows [CHUNK, BK] times the drafts' columns [BK, BZ] on the tensor cores: a 2-byte tile in its
    own dtype with drafts of the same (exact products), else in TF32 passes (`dot_fp32`)."""
    if NATIVE:
        return tl.dot(b_s, b_KQ, acc)
    return dot_fp32(b_s.to(tl.float32), b_KQ.to(tl.float32), IS_TILE_EXACT, IS_HALF_IO, acc)


@triton.jit
def _draft_columns(q, k, i_b, i_h, o_k, m_k, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T: tl.constexpr,
                   BT: tl.constexpr, BZ: tl.constexpr):
    """[BK, BZ] the drafts' keys (columns z < T) and queries (BT <= z < BT + T) as given, zero elsewhere."""
    o_z = tl.arange(0, BZ)
    m_zk = o_z < T
    m_zq = (o_z >= BT) & (o_z < BT + T)
    b_z = tl.load(k + i_b * s_kb + i_h * s_kh + o_z[None, :] * s_kt + o_k[:, None] * s_kk,
                  mask=m_k[:, None] & m_zk[None, :], other=0.0)
    b_z += tl.load(q + i_b * s_qb + i_h * s_qh + (o_z - BT)[None, :] * s_qt + o_k[:, None] * s_qk,
                   mask=m_k[:, None] & m_zq[None, :], other=0.0)
    return b_z


@triton.jit
def _gram_products(p_gm, o_wc, m_wc, o_t, scale, BT: tl.constexpr, BZ: tl.constexpr, BWC: tl.constexpr,
                   USE_QK_L2NORM: tl.constexpr):
    """The drafts' products from a key head's [BE, BZ] matrix at p_gm (`_verify_gram_kernel`): [BWC, BT] k_j·k_i and
    k_j·q_i of committed entry j (zero where m_wc is not), [BT, BT] row i, column i': k_i'·k_i and k_i'·q_i, all with
    the drafts' q and k as given, and [BT] their factors (l2-norm, scale) for the keys and the queries."""
    b_Wck = tl.load(p_gm + o_wc[:, None] * BZ + o_t[None, :], mask=m_wc[:, None], other=0.0)
    b_Wcq = tl.load(p_gm + o_wc[:, None] * BZ + BT + o_t[None, :], mask=m_wc[:, None], other=0.0)
    b_KK = tl.load(p_gm + (BWC + o_t[None, :]) * BZ + o_t[:, None])
    b_QK = tl.load(p_gm + (BWC + o_t[None, :]) * BZ + BT + o_t[:, None])
    if USE_QK_L2NORM:
        b_rq = scale / tl.sqrt(tl.load(p_gm + (BWC + BT + o_t) * BZ + BT + o_t) + 1e-6)
        b_rk = 1.0 / tl.sqrt(tl.load(p_gm + (BWC + o_t) * BZ + o_t) + 1e-6)
    else:
        b_rq = tl.full([BT], scale, tl.float32)
        b_rk = tl.full([BT], 1.0, tl.float32)
    return b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq


@triton.jit
def _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec, b_G0, b_Gwc, m_wc, o_t, m_upto,
                 T: tl.constexpr, BT: tl.constexpr):
    """The weights a verify's chunks take from the drafts' and the committed entries' products (`_gram_products`'
    layout), their betas b_bd, the log-decay b_cum after each draft since the committed state (b_ec its exp) and the
    committed state's since the tile (b_G0; b_Gwc the entries'): [BT, BT] A and M, U = R Aᵀ and O = S Q + R Mᵀ;
    [BWC, BT] each committed entry's weight in every draft's S k and S q; [BT] those of the tile's row sums."""
    # [BT, BT] row i, column i': weight of draft i''s update in draft i's S k (i' < i) and S q (i' <= i)
    b_Ed = tl.exp(tl.where(m_upto, b_cum[:, None] - b_cum[None, :], 0.0)) * b_rk[None, :]
    b_Wk = tl.where(o_t[None, :] < o_t[:, None], b_Ed * b_KK * b_rk[:, None], 0.0)
    b_Wq = tl.where(m_upto, b_Ed * b_QK * b_rq[:, None], 0.0)
    # [BWC, BT] weight of committed entry j's update in draft i's S k and S q
    b_dc = tl.where(m_wc, tl.exp(b_G0 - b_Gwc), 0.0)
    b_Wck *= b_dc[:, None] * (b_ec * b_rk)[None, :]
    b_Wcq *= b_dc[:, None] * (b_ec * b_rq)[None, :]
    # [BT] weights of the tile's row sums with the raw k_i and q_i
    b_fk = tl.exp(b_G0 + b_cum) * b_rk
    b_fq = tl.exp(b_G0 + b_cum) * b_rq
    # The drafts' recurrence u_i = beta_i (r_i - sum_{i'<i} Wk[i, i'] u_i') solved once: U = R Aᵀ, [BT, BT] A lower
    # triangular; r_i = v_i - S k_i from the committed state. Then O = S Q + Wq U = S Q + R Mᵀ with M = Wq A.
    b_A = tl.zeros([BT, BT], dtype=tl.float32)
    for i in tl.static_range(T):
        b_wki = tl.sum(tl.where(o_t[:, None] == i, b_Wk, 0.0), 0)
        b_bi = tl.sum(tl.where(o_t == i, b_bd, 0.0))
        b_ai = b_bi * (tl.where(o_t == i, 1.0, 0.0) - tl.sum(b_wki[:, None] * b_A, 0))
        b_A = tl.where(o_t[:, None] == i, b_ai[None, :], b_A)
    b_M = tl.sum(b_Wq[:, :, None] * b_A[None, :, :], 1)
    return b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq


@triton.jit
def _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT: tl.constexpr, BZ: tl.constexpr):
    """[BZ] the factor of each column of a chunk's tensor-core product (the drafts' keys, then their queries) and
    [BWC, BZ] the committed entries' weights in the same columns."""
    o_z = tl.arange(0, BZ)
    m_zk = o_z[None, :] == o_t[:, None]
    m_zq = o_z[None, :] == BT + o_t[:, None]
    b_fz = tl.sum(tl.where(m_zk, b_fk[:, None], 0.0) + tl.where(m_zq, b_fq[:, None], 0.0), 0)
    b_Wcz = tl.sum(tl.where(m_zk[None, :, :], b_Wck[:, :, None], 0.0)
                   + tl.where(m_zq[None, :, :], b_Wcq[:, :, None], 0.0), 1)
    return b_fz, b_Wcz


@triton.jit
def _verify_gram_kernel(
    buf_k, fill, q, k, slots, gram,
    s_qb, s_qt, s_qh, s_qk,
    s_kb, s_kt, s_kh, s_kk,
    T: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr, BWC: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr,
    IS_HALF_IO: tl.constexpr, KEY_SPLIT: tl.constexpr,
):
    """The key products a verify's value heads share, once per (row, key head): [BE, BZ] fp32 into gram, row e
    a key or query (the committed entries' keys e < BWC, then the drafts' keys as given, then their queries), column
    z a draft's key (z < BT) or query (BT <= z < 2 BT), as given. One [BE, K] x [K, BZ] product in KEY_SPLIT column
    pieces; the drafts' 16-bit keys and queries are exact in TF32. A key head's value heads share its fill: its first
    one's."""
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    b_f = tl.load(fill + i_s * HV + i_h * (HV // H))
    BKG: tl.constexpr = BK // KEY_SPLIT
    o_e, o_z = tl.arange(0, BE), tl.arange(0, BZ)
    # the entries still committed on top of the tile a verify reads (none once W are buffered: those fold first)
    m_wc = (o_e < BWC) & (o_e < b_f) & scalar_mask(b_f < W)
    m_kd = (o_e >= BWC) & (o_e < BWC + T)
    m_qd = (o_e >= BWC + BT) & (o_e < BWC + BT + T)
    b_g = tl.zeros([BE, BZ], dtype=tl.float32)
    for i_k in tl.static_range(KEY_SPLIT):
        o_k = i_k * BKG + tl.arange(0, BKG)
        m_k = o_k < K
        p_kb = k + i_b * s_kb + i_h * s_kh + o_k[None, :] * s_kk
        p_qb = q + i_b * s_qb + i_h * s_qh + o_k[None, :] * s_qk
        b_e = tl.load(buf_k + ((i_s * CAP + o_e[:, None]) * H + i_h) * K + o_k[None, :],
                      mask=m_wc[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_e += tl.load(p_kb + (o_e - BWC)[:, None] * s_kt, mask=m_kd[:, None] & m_k[None, :],
                       other=0.0).to(tl.float32)
        b_e += tl.load(p_qb + (o_e - BWC - BT)[:, None] * s_qt, mask=m_qd[:, None] & m_k[None, :],
                       other=0.0).to(tl.float32)
        b_z = _draft_columns(q, k, i_b, i_h, o_k, m_k, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T, BT, BZ)
        b_g = dot_fp32(b_e, b_z.to(tl.float32), False, IS_HALF_IO, b_g)
    tl.store(gram + (i_b * H + i_h) * BE * BZ + o_e[:, None] * BZ + o_z[None, :], b_g)


@triton.jit
def _row_fills(fill, i_s, HV: tl.constexpr, BHV: tl.constexpr):
    """Slot i_s's value heads [BHV], their mask and the pointers to their fills."""
    o_h = tl.arange(0, BHV)
    return o_h, o_h < HV, fill + i_s * HV + o_h


@triton.jit
def _verify_list_kernel(fill, slots, work, W: tl.constexpr, HV: tl.constexpr, BHV: tl.constexpr):
    """A row's value heads whose buffers hold W entries or more, listed in `work` for `_verify_fold_kernel` (FOLD_PASS),
    with their fills."""
    i_b = tl.program_id(0)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_h, m_h, p_f = _row_fills(fill, i_s, HV, BHV)
    b_f = tl.load(p_f, mask=m_h, other=0)
    list_heads(work, i_b, o_h, b_f, m_h & (b_f >= W))


@triton.jit
def _verify_fold_kernel(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, slots, work,
    CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, FOLD_CHUNK: tl.constexpr, ROWS: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_SCALED: tl.constexpr, FOLD_KSPLIT: tl.constexpr, FOLD_STAGES: tl.constexpr, PRECISION: tl.constexpr,
    PREFETCH: tl.constexpr, FOLD_ENTRIES: tl.constexpr, BW: tl.constexpr, FOLD_EXTRA: tl.constexpr, Q8: tl.constexpr,
    RANDOM: tl.constexpr,
):
    """The folds a verify's rows take first (FOLD_PASS), in a launch of their own between `_verify_list_kernel`, which
    listed the value heads whose buffers hold W entries or more in `work`, and the verify, which then skips its own
    fold (their fills, read again there, still say W or more: the drafts go to position 0 and the fill to 0): ROWS
    rows of a head per item, each program looping over the items (a few programs per SM however few rows fold). With
    PREFETCH a program loads its next item's list entry and slot while it folds the one before (the entry two items
    ahead, the slot one), so that an item begins with the loads of its rows. The last program to finish zeroes the
    list's counters for the next step."""
    NPB: tl.constexpr = (V + ROWS - 1) // ROWS
    n_items = tl.load(work) * NPB
    n_programs = tl.num_programs(0)
    # A while loop: its bounds are device values (the interpreter's range takes only Python integers).
    i_j = tl.program_id(0)
    if PREFETCH:
        e_b, e_hv, e_f = listed_ahead(work, i_j // NPB, i_j < n_items)
        e_s = tl.load(slots + e_b, mask=i_j < n_items, other=0).to(tl.int64)
        n_b, n_hv, n_f = listed_ahead(work, (i_j + n_programs) // NPB, i_j + n_programs < n_items)
    while i_j < n_items:
        if PREFETCH:
            i_b, i_hv, b_f, i_s = e_b, e_hv, e_f, e_s
            e_b, e_hv, e_f = n_b, n_hv, n_f
            e_s = tl.load(slots + e_b, mask=i_j + n_programs < n_items, other=0).to(tl.int64)
            n_b, n_hv, n_f = listed_ahead(work, (i_j + 2 * n_programs) // NPB,
                                         i_j + 2 * n_programs < n_items)
        else:
            i_b, i_hv, b_f = listed_flush(work, i_j // NPB)
            i_s = tl.load(slots + i_b).to(tl.int64)
        i_h = i_hv // (HV // H)
        b_Gl = tl.load(buf_g + (i_s * CAP + b_f - 1) * HV + i_hv)
        _verify_flush(
            ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl,
            (i_j % NPB) * ROWS, CAP, H, HV, K, V, BK, FOLD_CHUNK, HAS_COPY, IS_SCALED, FOLD_KSPLIT, FOLD_STAGES, ROWS,
            PRECISION, FOLD_ENTRIES, BW, FOLD_EXTRA, Q8, RANDOM,
        )
        i_j += n_programs
    # a verify's rounding counts advance after it (`verify`), not here
    list_done(work, n_programs, None, None, False, False)


@triton.jit
def _verify_weights_kernel(
    buf_g, fill, g, beta, slots, gram, wts,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    scale,
    T: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr,
    BT: tl.constexpr, BWC: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr, NW: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    """A verify's prologue for one (row, value head) from its key head's products (`_verify_gram_kernel`), so that
    the verify's programs begin with independent loads: [NW] into wts, A and M [BT, BT], the column factors [BZ],
    the committed entries' weights [BWC, BZ], the fill (its int32 bits, in a block of BT) and the log-decays [BT]
    the drafts' entries take."""
    i_b, i_hv = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_t, o_wc, o_z = tl.arange(0, BT), tl.arange(0, BWC), tl.arange(0, BZ)
    m_t = o_t < T
    m_upto = o_t[None, :] <= o_t[:, None]
    b_f = tl.load(fill + i_s * HV + i_hv)
    b_flush = b_f >= W
    m_wc = (o_wc < b_f) & scalar_mask(b_f < W)
    b_Gl = tl.load(buf_g + (i_s * CAP + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
    b_G0 = tl.where(b_flush, 0.0, b_Gl)
    b_Gwc = tl.load(buf_g + (i_s * CAP + o_wc) * HV + i_hv, mask=m_wc, other=0.0)
    b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt, s_bh)
    b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq = _gram_products(gram + (i_b * H + i_hv // (HV // H)) * BE * BZ, o_wc, m_wc,
                                                          o_t, scale, BT, BZ, BWC, USE_QK_L2NORM)
    b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq = _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec, b_G0,
                                                      b_Gwc, m_wc, o_t, m_upto, T, BT)
    b_fz, b_Wcz = _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT, BZ)
    p_w = wts + (i_b * HV + i_hv) * NW
    tl.store(p_w + o_t[:, None] * BT + o_t[None, :], b_A)
    tl.store(p_w + BT * BT + o_t[:, None] * BT + o_t[None, :], b_M)
    tl.store(p_w + 2 * BT * BT + o_z, b_fz)
    tl.store(p_w + 2 * BT * BT + BZ + o_wc[:, None] * BZ + o_z[None, :], b_Wcz)
    tl.store(p_w + NW - 2 * BT, b_f.to(tl.float32, bitcast=True))
    tl.store(p_w + NW - BT + o_t, b_G0 + b_cum)


@triton.jit
def _weights(p_w, o_t, BT: tl.constexpr, NW: tl.constexpr):
    """A value head's A, M [BT, BT] and drafts' log-decays [BT] from its row of `_verify_weights_kernel`'s output."""
    b_A = tl.load(p_w + o_t[:, None] * BT + o_t[None, :])
    b_M = tl.load(p_w + BT * BT + o_t[:, None] * BT + o_t[None, :])
    return b_A, b_M, tl.load(p_w + NW - BT + o_t)


@triton.jit
def _weights_fill(p_w, BT: tl.constexpr, NW: tl.constexpr):
    """A value head's fill from its row of `_verify_weights_kernel`'s output, which keeps its int32 bits."""
    return tl.load(p_w + NW - 2 * BT).to(tl.int32, bitcast=True)


@triton.jit
def _verify_kernel(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_b, buf_t, fill, arrivals, gram, wts, seed, steps,
    q, k, v, g, beta, o, slots,
    s_qb, s_qt, s_qh, s_qk,
    s_kb, s_kt, s_kh, s_kk,
    s_vb, s_vt, s_vh, s_vv,
    s_gb, s_gt, s_gh,
    s_bb, s_bt, s_bh,
    s_ob, s_ot, s_oh, s_ov,
    scale,
    T: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, CHUNK: tl.constexpr, FOLD_CHUNK: tl.constexpr, BT: tl.constexpr, BW: tl.constexpr,
    BWC: tl.constexpr, PIECE: tl.constexpr, STAGES: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_SCALED: tl.constexpr, KEY_PASS: tl.constexpr, BE: tl.constexpr, BZ: tl.constexpr, MMA: tl.constexpr,
    NATIVE: tl.constexpr, IS_TILE_EXACT: tl.constexpr, IS_HALF_IO: tl.constexpr, KSPLIT: tl.constexpr,
    FOLD_KSPLIT: tl.constexpr, FOLD_STAGES: tl.constexpr, NW: tl.constexpr, FOLD_PASS: tl.constexpr,
    FOLD_ENTRIES: tl.constexpr, FOLD_EXTRA: tl.constexpr, ARRIVE: tl.constexpr, WEIGHTS_FILL: tl.constexpr,
    Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    i_b, i_hv = tl.program_id(0), tl.program_id(1)
    o_t = tl.arange(0, BT)
    # With KEY_PASS=2 A, M and the drafts' log-decays come from `_verify_weights_kernel`, which took this value head's
    # prologue; with WEIGHTS_FILL its fill too, all read beside the slot rather than after it (the weights of a row
    # without a slot are never used).
    if KEY_PASS == 2:
        p_w = wts + (i_b * HV + i_hv) * NW
    if WEIGHTS_FILL:
        b_A, b_M, b_Gs = _weights(p_w, o_t, BT, NW)
        b_fw = _weights_fill(p_w, BT, NW)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_t = o_t < T
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    m_upto = o_t[None, :] <= o_t[:, None]
    # The tile is held as [CHUNK, BK / PIECE, PIECE] so that each thread sums its PIECE-wide pieces of a row in
    # registers and only the lanes that share a row meet in shuffles; the drafts' and the committed entries' keys
    # likewise.
    NC: tl.constexpr = BK // PIECE
    o_k3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    m_k3 = o_k3 < K
    o_h = (i_s * HV + i_hv) * V
    p_f = fill + i_s * HV + i_hv
    if WEIGHTS_FILL:
        b_f = b_fw
    else:
        b_f = tl.load(p_f)
    b_flush = b_f >= W
    # Position of the first draft: after the committed entries, or at 0 when they are folded first.
    b_fe = tl.where(b_flush, 0, b_f)
    b_Gl = tl.load(buf_g + (i_s * CAP + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
    # Every committed entry is read before any draft's key is written (the arrivals below; with FOLD_PASS the fold
    # launch, before this one, has read the entries the drafts' keys overwrite).
    # With FOLD_PASS `_verify_fold_kernel` has folded the rows with W entries or more.
    if not FOLD_PASS:
        if b_flush:
            # Into a new checkpoint first, as a flush step would; the drafts then read it with no entries left.
            _verify_flush(
                ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, seed, steps, i_s, i_h, i_hv, b_f, b_Gl, 0,
                CAP, H, HV, K, V, BK, FOLD_CHUNK, HAS_COPY, IS_SCALED, FOLD_KSPLIT, FOLD_STAGES, V, "tf32x3",
                FOLD_ENTRIES, BW, FOLD_EXTRA, Q8, RANDOM,
            )
            # The tile reads below see this program's stores, and the drafts' updates overwrite entries it folded.
            tl.debug_barrier()
    # The entries still committed on top of the tile read below (fewer than W), and (for the prologue, unless
    # `_verify_weights_kernel` took it) their log-decay since it.
    o_wc = tl.arange(0, BWC)
    m_wc = (o_wc < b_f) & scalar_mask(b_f < W)
    if KEY_PASS < 2:
        b_G0 = tl.where(b_flush, 0.0, b_Gl)
        b_Gwc = tl.load(buf_g + (i_s * CAP + o_wc) * HV + i_hv, mask=m_wc, other=0.0)
    # [BT, BT] row i, column i': k_i'·k_i and k_i'·q_i; [BWC, BT] k_j·k_i and k_j·q_i of committed entry j; the
    # drafts' q and k as given, their factors (l2-norm, scale) going on the products. b_gd and b_bd: the drafts'
    # log-decays and betas, b_cum [BT] the log-decay after each since the committed state.
    if KEY_PASS == 2:
        if not WEIGHTS_FILL:
            b_A, b_M, b_Gs = _weights(p_w, o_t, BT, NW)
    elif KEY_PASS == 1:
        b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt,
                                               s_bh)
        b_Wck, b_Wcq, b_KK, b_QK, b_rk, b_rq = _gram_products(gram + (i_b * H + i_h) * BE * BZ, o_wc, m_wc, o_t,
                                                              scale, BT, BZ, BWC, USE_QK_L2NORM)
    elif KEY_PASS == 0:
        # [BWC, NC, PIECE] the committed entries' keys, [BT, NC, PIECE] the drafts' keys as given
        b_kw3 = tl.load(buf_k + ((i_s * CAP + o_wc[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                        mask=m_wc[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_K3 = tl.load(k + i_b * s_kb + o_t[:, None, None] * s_kt + i_h * s_kh + o_k3[None, :, :] * s_kk,
                       mask=m_t[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_gd, b_bd, b_cum, b_ec = _draft_gates(g, beta, i_b, i_hv, o_t, m_t, m_upto, s_gb, s_gt, s_gh, s_bb, s_bt,
                                               s_bh)
        if USE_QK_L2NORM:
            b_Q3 = tl.load(q + i_b * s_qb + o_t[:, None, None] * s_qt + i_h * s_qh + o_k3[None, :, :] * s_qk,
                           mask=m_t[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
            b_rq = scale / tl.sqrt(tl.sum(tl.sum(b_Q3 * b_Q3, 2), 1) + 1e-6)
            b_rk = 1.0 / tl.sqrt(tl.sum(tl.sum(b_K3 * b_K3, 2), 1) + 1e-6)
        else:
            b_rq = tl.full([BT], scale, tl.float32)
            b_rk = tl.full([BT], 1.0, tl.float32)
        b_KK = tl.zeros([BT, BT], dtype=tl.float32)
        b_QK = tl.zeros([BT, BT], dtype=tl.float32)
        b_Wck = tl.zeros([BWC, BT], dtype=tl.float32)
        b_Wcq = tl.zeros([BWC, BT], dtype=tl.float32)
        for i in tl.static_range(T):
            b_k3, b_q3 = _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk)
            b_kki, b_qki = _row_sums(b_K3, b_k3, b_q3, 1.0, 1.0)
            b_KK = tl.where(o_t[:, None] == i, b_kki[None, :], b_KK)
            b_QK = tl.where(o_t[:, None] == i, b_qki[None, :], b_QK)
            b_wki, b_wqi = _row_sums(b_kw3, b_k3, b_q3, 1.0, 1.0)
            b_Wck = tl.where(o_t[None, :] == i, b_wki[:, None], b_Wck)
            b_Wcq = tl.where(o_t[None, :] == i, b_wqi[:, None], b_Wcq)
    if KEY_PASS < 2:
        if HAS_COPY:
            _store_draft_rows(buf_t, b_KK, b_Wck, b_rk, b_bd, i_s, i_hv, b_fe, o_t, o_w, o_wc, m_t, m_wc, T, CAP, HV)
        b_A, b_M, b_Wck, b_Wcq, b_fk, b_fq = _draft_solve(b_KK, b_QK, b_Wck, b_Wcq, b_rk, b_rq, b_bd, b_cum, b_ec,
                                                          b_G0, b_Gwc, m_wc, o_t, m_upto, T, BT)
        b_Gs = b_G0 + b_cum

    o_u = ((i_s * CAP + o_wc) * HV + i_hv) * V
    if MMA:
        # [BK, BZ] the drafts' keys, then their queries, as columns, read once for every chunk's product; [BZ] each
        # column's factor, and [BWC, BZ] the committed entries' weights in the same columns
        # (with KSPLIT=2 as two halves of BK / 2 rows, each chunk's product then taken in two, fewer registers live)
        BKS: tl.constexpr = BK // KSPLIT
        o_ka = tl.arange(0, BKS)
        b_KQa = _draft_columns(q, k, i_b, i_h, o_ka, o_ka < K, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh, s_kk, T, BT,
                               BZ)
        if KSPLIT == 2:
            b_KQb = _draft_columns(q, k, i_b, i_h, BKS + o_ka, BKS + o_ka < K, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt,
                                   s_kh, s_kk, T, BT, BZ)
        o_z = tl.arange(0, BZ)
        if KEY_PASS == 2:
            b_fz = tl.load(p_w + 2 * BT * BT + o_z)
            b_Wcz = tl.load(p_w + 2 * BT * BT + BZ + o_wc[:, None] * BZ + o_z[None, :])
        else:
            b_fz, b_Wcz = _column_weights(b_fk, b_fq, b_Wck, b_Wcq, o_t, BT, BZ)
    for i_v in tl.range(0, V, CHUNK, num_stages=STAGES):
        o_v = i_v + tl.arange(0, CHUNK)
        m_v = o_v < V
        m_vt = m_v[:, None] & m_t[None, :]
        # [CHUNK, BT] R = V - S K (draft i's v less the committed state's S k_i), and the committed state's S Q: from
        # one read of the tile (the read copy, refreshed by a flush above, or the checkpoint without one) for every
        # draft's k and q as given, and the committed entries' terms
        if MMA:
            # one [CHUNK, BK] x [BK, BZ] tensor-core product, and the entries' [CHUNK, BWC] x [BWC, BZ] into its
            # columns, folded onto the drafts' (the rest are zero)
            p_s = rcopy + (o_h + o_v[:, None]) * K + o_ka[None, :]
            b_s = tl.load(p_s, mask=m_v[:, None] & (o_ka < K)[None, :], other=0.0)
            b_uw, b_Vd = _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv)
            b_P = _tile_product(b_s, b_KQa, None, NATIVE, IS_TILE_EXACT, IS_HALF_IO)
            if KSPLIT == 2:
                b_s = tl.load(p_s + BKS, mask=m_v[:, None] & (BKS + o_ka < K)[None, :], other=0.0)
                b_P = _tile_product(b_s, b_KQb, b_P, NATIVE, IS_TILE_EXACT, IS_HALF_IO)
            if IS_SCALED:
                b_P *= tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)[:, None]
            b_P = dot_fp32(b_uw, b_Wcz, False, False, b_P * b_fz[None, :])
            b_R = b_Vd - tl.sum(tl.reshape(tl.where(o_z[None, :] < BT, b_P, 0.0), (CHUNK, BZ // BT, BT)), 1)
            b_O = tl.sum(tl.reshape(tl.where(o_z[None, :] >= BT, b_P, 0.0), (CHUNK, BZ // BT, BT)), 1)
        else:
            # [CHUNK, NC, PIECE] the tile, its row sums draft by draft
            b_s = tl.load(rcopy + (o_h + o_v[:, None, None]) * K + o_k3[None, :, :],
                          mask=m_v[:, None, None] & m_k3[None, :, :], other=0.0)
            b_SK = tl.zeros([CHUNK, BT], dtype=tl.float32)
            b_SQ = tl.zeros([CHUNK, BT], dtype=tl.float32)
            for i in tl.static_range(T):
                b_k3, b_q3 = _draft_kq(q, k, i_b, i, i_h, o_k3, m_k3, s_qb, s_qt, s_qh, s_qk, s_kb, s_kt, s_kh,
                                       s_kk)
                b_ski, b_sqi = _row_sums(b_s, b_k3, b_q3, 1.0, 1.0)
                b_SK = tl.where(o_t[None, :] == i, b_ski[:, None], b_SK)
                b_SQ = tl.where(o_t[None, :] == i, b_sqi[:, None], b_SQ)
            if IS_SCALED:
                b_sc = tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)
                b_SK *= b_sc[:, None]
                b_SQ *= b_sc[:, None]
            b_uw, b_Vd = _chunk_inputs(buf_u, v, o_u, o_v, m_v, m_wc, m_vt, o_t, i_b, i_hv, s_vb, s_vt, s_vh, s_vv)
            # each product is ordered so that its sum lands in the tile's layout
            b_R = b_Vd - b_SK * b_fk[None, :] - tl.sum(b_uw[:, None, :] * tl.trans(b_Wck)[None, :, :], 2)
            b_O = b_SQ * b_fq[None, :] + tl.sum(b_uw[:, None, :] * tl.trans(b_Wcq)[None, :, :], 2)
        # U = R Aᵀ, O = S Q + R Mᵀ
        b_U = tl.sum(b_R[:, :, None] * tl.trans(b_A)[None, :, :], 1)
        b_O += tl.sum(b_R[:, :, None] * tl.trans(b_M)[None, :, :], 1)
        p_o = o + i_b * s_ob + o_t[None, :] * s_ot + i_hv * s_oh + o_v[:, None] * s_ov
        tl.store(p_o, cast(b_O, o.dtype.element_ty), mask=m_vt)
        tl.store(buf_u + ((i_s * CAP + b_fe + o_t[None, :]) * HV + i_hv) * V + o_v[:, None],
                 cast(b_U, buf_u.dtype.element_ty), mask=m_vt)
    tl.store(buf_g + (i_s * CAP + b_fe + o_t) * HV + i_hv, b_Gs, mask=m_t)
    if HAS_COPY:
        tl.store(buf_b + (i_s * CAP + b_fe + o_t) * HV + i_hv, b_bd, mask=m_t)
    if b_flush:
        fills_read()
        tl.store(p_f, 0)
    # The drafts' keys overwrite entries that every value head of this key head may still be folding: with ARRIVE
    # the last of them to arrive writes the keys. Without it (FOLD_PASS: no fold here, the fold launch has finished,
    # and the committed entries read above lie before the drafts' places) the key head's first value head does.
    if ARRIVE:
        tl.debug_barrier()
        p_a = arrivals + i_s * H + i_h
        b_write = tl.atomic_add(p_a, 1, sem="acq_rel") == HV // H - 1
        if b_write:
            tl.store(p_a, 0)
    else:
        b_write = i_hv % (HV // H) == 0
    if b_write:
        # [BT, BK]
        b_K = tl.load(k + i_b * s_kb + o_t[:, None] * s_kt + i_h * s_kh + o_k[None, :] * s_kk, mask=m_tk, other=0.0)
        b_K = b_K.to(tl.float32)
        if USE_QK_L2NORM:
            b_K = b_K / tl.sqrt(tl.sum(b_K * b_K, 1) + 1e-6)[:, None]
        tl.store(buf_k + ((i_s * CAP + b_fe + o_t[:, None]) * H + i_h) * K + o_k[None, :],
                 cast(b_K, buf_k.dtype.element_ty), mask=m_tk)


@triton.jit
def _accept_kernel(fill, n, slots, HV: tl.constexpr, BHV: tl.constexpr):
    i_b = tl.program_id(0)
    i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    _, m_h, p_f = _row_fills(fill, i_s, HV, BHV)
    b_f = tl.load(p_f, mask=m_h, other=0)
    fills_read()
    tl.store(p_f, b_f + tl.load(n + i_b).to(tl.int32), mask=m_h)


def _launch_verify(cache, q, k, v, g, beta, out, slots, scale, l2norm, c: VerifyConfig):
    batch, T = q.shape[0], q.shape[1]
    if c.key_pass == 2 and (cache.read_copy is not None or not c.mma):
        raise ValueError("key_pass 2 (each value head's weights from a launch of their own) takes mma and no read "
                         "copy; a read copy's verify stores its drafts' rows of T from its own prologue")
    BT, BWC = next_pow2(T), max(16, next_pow2(cache.window))
    # the Gram pass's rows (committed keys, the drafts' keys, their queries) and columns (keys, queries)
    BE, BZ = next_pow2(BWC + 2 * BT), max(16, 2 * BT)
    # the tile's dtype, and whether the drafts' keys and queries are exact in TF32
    tile = cache.checkpoint.dtype if cache.read_copy is None else cache.read_copy.dtype
    half_io = q.element_size() == 2 and k.element_size() == 2
    constants = _cache_constants(cache)
    BK = constants["BK"]
    # a fold stores whole rows over K for a read copy's correction, which sums them, and an 8-bit checkpoint's scales
    whole_rows = cache.read_copy is not None or cache.checkpoint_scale is not None
    # K pieces of the tile's product (and of a fold's, but for a read copy's: its correction sums whole rows)
    ksplit = c.ksplit if BK >= 32 else 1
    # with KEY_PASS=2, per (row, value head): A and M [BT, BT], the column factors [BZ], the committed entries'
    # weights [BWC, BZ], the fill (in a block of BT, the rows 16-byte aligned), the drafts' log-decays [BT]
    NW = 2 * BT * BT + BZ + BWC * BZ + 2 * BT
    gram = wts = None
    # With the fold's `stream` the folds run on a stream of their own beside the key products and the weights (neither
    # reads what a fold writes), and the verify waits for both.
    side = _side_stream(cache.device) if c.fold is not None and c.fold.stream else None
    fold_widths = _fold_widths(cache, c.fold_window, constants["BW"])
    if c.fold is not None:
        f = c.fold
        _verify_list_kernel[(batch,)](cache.fill, slots, cache.work, W=cache.window, HV=cache.HV,
                                      BHV=next_pow2(cache.HV), num_warps=1)
        ROWS = min(f.rows, next_pow2(cache.V))
        items = batch * cache.HV * triton.cdiv(cache.V, ROWS)
        main = None
        if side is not None:
            main = torch.cuda.current_stream(cache.device)
            side.wait_stream(main)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            _verify_fold_kernel[common.flush_grid(items, f.programs_per_sm, cache.device)](
                **{key: value for key, value in _cache_args(cache).items() if key not in ("buf_b", "fill")},
                slots=slots, work=cache.work,
                **{key: constants[key] for key in ("CAP", "H", "HV", "K", "V", "BK", "BW", "HAS_COPY", "IS_SCALED",
                                                   "Q8", "RANDOM")},
                FOLD_CHUNK=max(16, min(FOLD_CHUNK, ROWS)), ROWS=ROWS,
                FOLD_KSPLIT=1 if whole_rows or BK < 32 else f.ksplit,
                FOLD_STAGES=c.fold_stages, PRECISION=f.precision,
                PREFETCH=f.prefetch, **fold_widths,
                **common.compile_options(f.warps, None),
            )
    qk_strides = dict(s_qb=q.stride(0), s_qt=q.stride(1), s_qh=q.stride(2), s_qk=q.stride(3),
                      s_kb=k.stride(0), s_kt=k.stride(1), s_kh=k.stride(2), s_kk=k.stride(3))
    vo_strides = dict(s_vb=v.stride(0), s_vt=v.stride(1), s_vh=v.stride(2), s_vv=v.stride(3),
                      s_ob=out.stride(0), s_ot=out.stride(1), s_oh=out.stride(2), s_ov=out.stride(3))
    gate_strides = dict(s_gb=g.stride(0), s_gt=g.stride(1), s_gh=g.stride(2),
                        s_bb=beta.stride(0), s_bt=beta.stride(1), s_bh=beta.stride(2))
    # the verify's rows per chunk, and how its tile's product is taken
    CHUNK = max(16, min(c.chunk, next_pow2(cache.V)))
    tile_product = dict(NATIVE=tile.itemsize == 2 and q.dtype == k.dtype == tile, IS_TILE_EXACT=tile != torch.float32,
                        IS_HALF_IO=half_io)
    if c.key_pass:
        gram = torch.empty(batch, cache.H, BE, BZ, dtype=torch.float32, device=cache.device)
        _verify_gram_kernel[(batch, cache.H)](
            buf_k=cache.buf_k, fill=cache.fill, q=q, k=k, slots=slots, gram=gram, **qk_strides,
            T=T, W=cache.window, CAP=cache.capacity, H=cache.H, HV=cache.HV, K=cache.K, BK=BK,
            BT=BT, BWC=BWC, BE=BE, BZ=BZ, IS_HALF_IO=half_io, KEY_SPLIT=min(c.key_split, BK // 16),
            num_warps=GRAM_WARPS,
        )
    if c.key_pass == 2:
        wts = torch.empty(batch, cache.HV, NW, dtype=torch.float32, device=cache.device)
        _verify_weights_kernel[(batch, cache.HV)](
            buf_g=cache.buf_g, fill=cache.fill, g=g, beta=beta, slots=slots, gram=gram, wts=wts, **gate_strides,
            scale=scale,
            T=T, W=cache.window, CAP=cache.capacity, H=cache.H, HV=cache.HV,
            BT=BT, BWC=BWC, BE=BE, BZ=BZ, NW=NW, USE_QK_L2NORM=l2norm,
            num_warps=WEIGHTS_WARPS,
        )
    if side is not None:
        main.wait_stream(side)
    _verify_kernel[(batch, cache.HV)](
        **_cache_args(cache), arrivals=cache.arrivals, gram=gram, wts=wts,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots, **qk_strides, **vo_strides, **gate_strides,
        scale=scale,
        T=T, BT=BT, BWC=BWC,
        **constants,
        CHUNK=CHUNK,
        FOLD_CHUNK=max(16, min(FOLD_CHUNK, next_pow2(cache.V))),
        PIECE=min(VERIFY_PIECE, BK),
        STAGES=VERIFY_STAGES,
        USE_QK_L2NORM=l2norm, KEY_PASS=c.key_pass, BE=BE, BZ=BZ, MMA=c.mma,
        **tile_product, KSPLIT=ksplit, FOLD_KSPLIT=1 if whole_rows else ksplit,
        FOLD_STAGES=c.fold_stages, NW=NW, FOLD_PASS=c.fold is not None, **fold_widths,
        # a verify that folds its own rows counts its arrivals whatever `arrive` says; weights_fill needs the weights
        # launch
        ARRIVE=c.arrive or c.fold is None,
        WEIGHTS_FILL=c.weights_fill and c.key_pass == 2, **common.compile_options(c.warps, c.maxnreg),
    )


def _fold_widths(cache: ReplayCache, fold_window: int, BW: int) -> dict:
    """The entries of a verify's fold product where a fill does not pass them (FOLD_ENTRIES), and how many after them a
    fold takes one by one past it (FOLD_EXTRA). With fold_window FOLD_ENTRIES is the window's (a power of two, at least
    16), so that a fold at a fill of W = 16 takes a product over 16 entries, not over 32 (the buffer's capacity W +
    max_draft to a power of two, which a fill past W needs; 1 takes that product past it); 2 takes the same 16 past it
    and the rest (a folding fill is at most W - 1 + max_draft: up to 4 more) one by one. Without it, or under a read
    copy (whose correction weights are computed for every entry), the capacity's (BW)."""
    if not fold_window or cache.read_copy is not None:
        return {"FOLD_ENTRIES": BW, "FOLD_EXTRA": 0}
    fwm = min(BW, max(16, next_pow2(cache.window)))
    past = cache.capacity - 1 - fwm
    return {"FOLD_ENTRIES": fwm, "FOLD_EXTRA": 4 if fold_window == 2 and 0 < past <= 4 else 0}


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream | None:
    """A second stream of a CUDA device, made on the first call that takes it (an eager one: a kernel's first call
    compiles and loads it, which no graph capture holds), or None elsewhere (the interpreter runs launches in
    order)."""
    if device.type != "cuda":
        return None
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    return _SIDE_STREAMS[device]


def _launch_accept(cache, n_accepted, slots):
    _accept_kernel[(n_accepted.shape[0],)](
        fill=cache.fill, n=n_accepted, slots=slots,
        HV=cache.HV, BHV=next_pow2(cache.HV),
        num_warps=1,
    )


@families.refuse_out_of_resources
def verify(
    cache: ReplayCache,
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
    config: VerifyConfig | None = None,
    check: bool = True,
) -> torch.Tensor:
    """Outputs of T speculative drafts from one read of each checkpoint; commit them with `accept`.

    q, k (batch, T, H, K), v (batch, T, HV, V), g, beta (batch, T, HV), 1 <= T <= cache.max_draft.
    Rows whose buffer holds W or more committed entries are flushed first (as a flush step would, the checkpoint
    stored rounded by cache.rounding; the call then advances every row's store count).
    Each (row, value head) reads its tile once (the read copy, or the new checkpoint after a flush)
    and takes S k_i and S q_i for every draft from that one read; the committed entries and the drafts
    enter through small [entries, T] and [T, T] weight matrices, so draft i's update is exact, from
    the state after drafts 0..i-1. The drafts are appended at fill .. fill + T - 1 (0 .. T - 1
    after a flush) and fill is not advanced, so a later verify or step overwrites the rejected ones.
    Returns o (batch, T, HV, V) in v's dtype (written into `out` when given). `config`: the launch
    settings (default: the VERIFY_LAUNCH row `select_verify` chooses); slots, check: as in `replay`.
    """
    batch, T = _check_against_cache(cache, _verify_kernel, q, k, v, g, beta, tokens=True)
    if not 1 <= T <= cache.max_draft:
        raise ValueError(f"q carries T={T} drafts; verify takes 1 to the cache's max_draft={cache.max_draft}")
    scale = default_scale(cache.K, scale)
    common.check_slots(slots, batch, cache.nslots, q.device, check)
    slots = default_slots(slots, batch, q.device)
    out = check_out(out, v.shape, v.dtype, q.device)
    c = VERIFY_LAUNCH[select_verify(cache, batch)] if config is None else config
    if batch:
        _launch_verify(cache, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel), c)
        if cache.rounding is not None:
            # a row may have folded: every row's slot draws afresh at its next store
            cache.rounding.advance(slots, batch)
    cache.last_draft = T
    return out


@families.refuse_out_of_resources
def accept(
    cache: ReplayCache,
    n_accepted: torch.Tensor,
    slots: torch.Tensor | None = None,
    *,
    check: bool = True,
) -> None:
    """Commit the first n drafts of each row's last `verify`: its fill counters advance by n.

    n_accepted (batch,) int32 or int64 on the cache's device, each in [0, T]; slots as in `replay`.
    `check` range-checks slots and n_accepted on the host (a device sync), skipped while a CUDA graph
    is captured.
    """
    _check_cache(cache, _accept_kernel)
    if not isinstance(n_accepted, torch.Tensor) or n_accepted.dim() != 1:
        raise ValueError("n_accepted must be a 1-D int32 or int64 tensor of shape (batch,)")
    batch = n_accepted.shape[0]
    check_accepted(n_accepted, batch, cache.last_draft, cache.device, check)
    common.check_slots(slots, batch, cache.nslots, cache.device, check)
    slots = default_slots(slots, batch, cache.device)
    if batch:
        _launch_accept(cache, n_accepted, slots)
