"""ReplaySSM Gated DeltaNet decode: read the checkpoint, replay the buffered updates, write state only at flushes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from replayssm_kernels import common, families
from replayssm_kernels import rounding as R
from replayssm_kernels.common import default_slots, fills_read, flat_program_ids, list_done, list_flush, listed_flush
from replayssm_kernels.gdn.cache import ReplayCache, dequantize_read
from replayssm_kernels.gdn.common import (
    EIGHT_BIT,
    cast,
    check_out,
    check_state_dtype,
    check_step,
    default_scale,
    next_pow2,
    qk_factors,
    quantize_e4m3,
    rounded,
    rounding_args,
    state_bits,
    store_rows,
)

# These kernels mutate the cache in place, so they are not autotuned (a trial launch would advance it): each read copy
# and grid class has a fixed row, chosen by `select`; a read copy gets rows of its own because correcting the buffered
# updates at a flush holds a second tile.
@dataclass(frozen=True)
class FlushConfig:
    """How the second launch of a two-launch `replay` step, its flushes, is launched."""

    # rows of V per item: 64 or 256 (whole heads)
    rows: int
    # rows per chunk of a flush's fold (one product each): 32
    flush_chunk: int
    # depth of the chunks' pipeline: 2
    stages: int
    # warps per program: 4
    warps: int
    # registers per thread the programs are capped at: 168 (three programs per SM)
    maxnreg: int | None
    # a higher cap, taken where a staggered step's flushes need no more rounds of resident programs at it
    # (`flush_cap`): None or 255
    round_cap: int | None
    # how a flush folds the buffer (tl.dot's input precision): "ieee" or "tf32x3"
    precision: str
    # the correction of the buffered updates under a read copy: None (as `precision`) or "tf32" (one TF32 pass, a
    # 2-byte copy only)
    correction: str | None


@dataclass(frozen=True)
class ReplayConfig:
    """How one `replay` step is launched."""

    # rows of V per program: 16 (small grids: a head's programs share its fill) or 256 (whole heads)
    rows: int
    # rows per streamed chunk of a non-flush step's tile: 16 or 32
    chunk: int
    # rows per chunk of a flush's fold: 16
    flush_chunk: int
    # width of the pieces of K a thread sums in registers before a row's lanes meet: 32, 64 or 128 (an fp8 copy's
    # 16-byte loads)
    piece: int
    # depth of the streamed chunks' pipeline: 1 or 3
    stages: int
    # warps per program: 1 or 2
    warps: int
    # registers per thread the programs are capped at: None (the compiler's choice) or 128
    maxnreg: int | None
    # True: the slot read first, then the step's inputs and the whole buffer before the fill (a latency-bound grid)
    early: bool = False
    # with early and rows < V: a head's programs count their arrivals lane by lane (no lane waits on the count)
    lane_count: bool = False
    # how a flush in this launch folds the buffer: "ieee" or "tf32x3"
    precision: str = "ieee"
    # its correction under a read copy: None (as `precision`) or "tf32" (a 2-byte copy only)
    correction: str | None = None
    # None: the step in one launch; else the non-flush steps in one launch that lists the heads that flush, and
    # the flushes in a second launched so
    flush: FlushConfig | None = None
    # with flush: the flushes' launch begun while the non-flush launch's last programs run (a programmatic dependent
    # launch, sm_90 and newer)
    pdl: bool = False

    def __post_init__(self):
        if self.pdl and self.flush is None:
            raise ValueError("pdl (the flushes' launch begun early) applies only with a flush launch")
        if self.lane_count and not self.early:
            raise ValueError("lane_count applies only with early")


# A split copy's flushes: 4-warp programs of whole heads (64 rows under 16 programs per SM), 3xTF32 folds, 168
# registers or 255 where that takes no more rounds; a 2-byte copy's correction in one TF32 pass.
_COPY_FLUSH = FlushConfig(rows=256, flush_chunk=32, stages=2, warps=4, maxnreg=168, round_cap=255,
                          precision="tf32x3", correction=None)
_SPLIT = ReplayConfig(rows=256, chunk=32, flush_chunk=16, piece=64, stages=3, warps=1, maxnreg=128,
                      flush=dataclasses.replace(_COPY_FLUSH, correction="tf32"), pdl=True)
_FP8 = dataclasses.replace(_SPLIT, piece=128, flush=_COPY_FLUSH)
_SMALL = ReplayConfig(rows=16, chunk=16, flush_chunk=16, piece=32, stages=1, warps=1, maxnreg=None, early=True,
                      lane_count=True)
REPLAY_LAUNCH = {
    "replay": ReplayConfig(rows=256, chunk=32, flush_chunk=16, piece=32, stages=3, warps=2, maxnreg=128),
    "replay-small": _SMALL,
    "replay-split": _SPLIT,
    "replay-split-medium": dataclasses.replace(_SPLIT, flush=dataclasses.replace(_SPLIT.flush, rows=64)),
    "replay-split-small": dataclasses.replace(_SMALL, precision="tf32x3", correction="tf32"),
    "replay-fp8": _FP8,
    "replay-fp8-medium": dataclasses.replace(_FP8, flush=dataclasses.replace(_COPY_FLUSH, rows=64)),
    "replay-fp8-small": dataclasses.replace(_SMALL, precision="tf32x3"),
    # an 8-bit checkpoint's large grid: the fp8 copy's rows at 160 registers, as its non-flush programs also scale
    # their rows (at 128 they spill 128 bytes a thread, and the spills' traffic runs through L2)
    "replay-q8": dataclasses.replace(_FP8, maxnreg=160),
}
# Grid classes in (row, value head) programs per SM: under 2 a small grid (latency-bound), under 16 a medium one.
SMALL_GRID, MEDIUM_GRID = 2, 16
# A flush launch's programs per SM.
FLUSH_PROGRAMS_PER_SM = 6


def _grid(cache: ReplayCache, batch: int, table: dict, name: str) -> str:
    """`name`, or its small- or medium-grid row where `table` has one for this grid."""
    per_sm = common.per_sm(batch * cache.HV, cache.device)
    if per_sm is not None:
        for size, bound in (("small", SMALL_GRID), ("medium", MEDIUM_GRID)):
            if f"{name}-{size}" in table and per_sm < bound:
                return f"{name}-{size}"
    return name


def _copy(cache: ReplayCache) -> str:
    return "" if cache.read_copy is None else "-fp8" if cache.read_scale is not None else "-split"


def select(cache: ReplayCache, batch: int) -> str:
    """The REPLAY_LAUNCH row of a `replay` step of `batch` rows: by the cache's read copy (or 8-bit checkpoint) and
    the grid's (row, value head) programs per SM (medium on the CPU)."""
    # an 8-bit checkpoint's 1-byte tile takes an fp8 copy's rows (16-byte loads, its flushes in a launch of their own):
    # under the base rows' register cap its steps spill more than twice the bytes; on a large grid its own row
    eight_bit = cache.checkpoint_scale is not None
    name = _grid(cache, batch, REPLAY_LAUNCH, "replay" + ("-fp8" if eight_bit else _copy(cache)))
    return "replay-q8" if eight_bit and name == "replay-fp8" else name


@triton.jit
def _read_copy(rcopy, rscale, o_s, o_r, m_s, m_v, IS_SCALED: tl.constexpr):
    """Rows [R, BK] of the read copy as fp32 values."""
    b_c = tl.load(rcopy + o_s, mask=m_s, other=0.0).to(tl.float32)
    if IS_SCALED:
        b_c *= tl.load(rscale + o_r, mask=m_v, other=0.0)[:, None]
    return b_c


@triton.jit
def _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_SCALED: tl.constexpr):
    """Store the read copy of checkpoint rows b_s [R, BK]; return the values a read of the copy gives."""
    if IS_SCALED:
        b_amax = tl.max(tl.abs(b_s), 1)
        b_sc = tl.where(b_amax > 0, tl.math.div_rn(b_amax, tl.full(b_amax.shape, 448.0, tl.float32)), 1.0)
        b_c = quantize_e4m3(tl.math.div_rn(b_s, tl.broadcast_to(b_sc[:, None], b_s.shape)))
        tl.store(rcopy + o_s, b_c, mask=m_s)
        tl.store(rscale + o_r, b_sc, mask=m_v)
        b_r = b_c.to(tl.float32) * b_sc[:, None]
    else:
        b_c = cast(b_s, rcopy.dtype.element_ty)
        tl.store(rcopy + o_s, b_c, mask=m_s)
        b_r = b_c.to(tl.float32)
    return b_r


@triton.jit
def _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, CAP: tl.constexpr, HV: tl.constexpr,
                        PRECISION: tl.constexpr):
    """[BW, BK] rows w_j = -e^{G_j} y_j with u_j - û_j = (checkpoint - copy) · w_j for every row of a head: y_j =
    sum_l t_jl k_l from the rows t_j of T the appends stored and the buffered keys b_kw [BW, BK] (zero past the
    fill)."""
    m_w = o_w < b_f
    b_t = tl.load(buf_t + ((i_s * CAP + o_w[:, None]) * HV + i_hv) * CAP + o_w[None, :],
                  mask=m_w[:, None] & (o_w < CAP)[None, :], other=0.0)
    return tl.where(m_w, -tl.exp(b_Gw), 0.0)[:, None] * tl.dot(b_t, b_kw, input_precision=PRECISION)


@triton.jit
def _fold(
    b_s, b_d, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_G, b_Gw, b_kw, b_wc,
    CAP: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, HAS_COPY: tl.constexpr, PRECISION: tl.constexpr,
    CORRECTION: tl.constexpr,
):
    """b_s [R, BK] plus sum_{j<f} e^{G - G_j} u_j k_jᵀ; with HAS_COPY, u_j corrected by b_d · w_j, b_d =
    checkpoint - copy [R, BK] and b_wc [BW, BK] the rows w_j (`_correction_weights`), one product in CORRECTION.

    b_Gw [BW] and b_kw [BW, BK] are the buffered log-decays and keys, zero past the fill.
    """
    m_w = o_w < b_f
    # [BW, R]
    b_uw = tl.load(
        buf_u + ((i_s * CAP + o_w[:, None]) * HV + i_hv) * V + o_v[None, :], mask=m_w[:, None] & m_v[None, :],
        other=0.0,
    ).to(tl.float32)
    if HAS_COPY:
        b_uw += tl.dot(b_wc, tl.trans(b_d), input_precision=CORRECTION)
    b_cw = tl.where(m_w, tl.exp(b_G - b_Gw), 0.0)
    # One product for the whole rank-f update: fp32 FMAs ("ieee") in a replay flush's small chunks unless its PRECISION
    # asks for 3xTF32 on the tensor cores, which verify's larger ones always use (benchmarks/notes/).
    return b_s + tl.dot(tl.trans(b_uw * b_cw[:, None]), b_kw, input_precision=PRECISION)


@triton.jit
def _folded_rows(
    ckpt, cscale, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
    CAP: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    HAS_COPY: tl.constexpr, IS_SCALED: tl.constexpr, PRECISION: tl.constexpr, CORRECTION: tl.constexpr,
    Q8: tl.constexpr,
):
    """Checkpoint rows o_v (an 8-bit one's times their scales, Q8) with the f buffered entries folded in
    (corrected under a read copy), and their offsets."""
    m_s = m_v[:, None] & m_k[None, :]
    o_s = ((i_s * HV + i_hv) * V + o_v[:, None]) * K + o_k[None, :]
    o_r = (i_s * HV + i_hv) * V + o_v
    b_s = tl.load(ckpt + o_s, mask=m_s, other=0.0).to(tl.float32)
    if Q8:
        b_s *= tl.load(cscale + o_r, mask=m_v, other=0.0)[:, None]
    if HAS_COPY:
        b_d = b_s - _read_copy(rcopy, rscale, o_s, o_r, m_s, m_v, IS_SCALED)
        b_s = _fold(b_s * tl.exp(b_Gl), b_d, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
                    CAP, HV, V, True, PRECISION, CORRECTION)
    else:
        b_s = _fold(b_s * tl.exp(b_Gl), b_s, buf_u, i_s, i_hv, o_v, m_v, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
                    CAP, HV, V, False, PRECISION, CORRECTION)
    return b_s, o_s, o_r, m_s


@triton.jit
def _replay_flush(
    ckpt, cscale, rcopy, rscale, buf_u, buf_t, v, o, seed, steps,
    i_b, i_s, i_h, i_hv, v0, b_f, b_k, b_q, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
    s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
    CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr,
    STAGES: tl.constexpr, HAS_COPY: tl.constexpr, IS_SCALED: tl.constexpr, PRECISION: tl.constexpr,
    CORRECTION: tl.constexpr, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """The step that fills the window for rows v0 .. v0 + ROWS: fold the buffer into the full checkpoint, take this
    step from it, store it (rounded, stochastically with RANDOM; as 8-bit rows with Q8)."""
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    b_wc = b_kw
    if HAS_COPY:
        b_wc = _correction_weights(buf_t, b_kw, b_Gw, i_s, i_hv, o_w, b_f, CAP, HV, PRECISION)
    # FLUSH_CHUNK rows at a time (a pipelined loop), so that this rare branch does not raise the register count of the
    # common one.
    b_key = R.store_key(seed, steps, i_s, i_hv, RANDOM)
    for i_v in tl.range(0, ROWS, FLUSH_CHUNK, num_stages=STAGES):
        o_v = v0 + i_v + tl.arange(0, FLUSH_CHUNK)
        # A chunk is at least 16 rows (the fold is one product); with ROWS < 16 it is masked to this program's rows.
        m_v = (o_v < V) & (i_v + tl.arange(0, FLUSH_CHUNK) < ROWS)
        # [FLUSH_CHUNK, BK] the checkpoint, brought to the state after the buffered entries
        b_s, o_s, o_r, m_s = _folded_rows(
            ckpt, cscale, rcopy, rscale, buf_u, i_s, i_hv, o_v, m_v, o_k, m_k, o_w, b_f, b_Gl, b_Gw, b_kw, b_wc,
            CAP, HV, K, V, HAS_COPY, IS_SCALED, PRECISION, CORRECTION, Q8,
        )
        b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
        b_s *= tl.exp(b_g)
        b_u = b_beta * (b_v - tl.sum(b_s * b_k[None, :], 1))
        b_s += b_u[:, None] * b_k[None, :]
        b_o = tl.sum(b_s * b_q[None, :], 1)
        tl.store(o + i_b * s_ob + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
        if Q8 or RANDOM:
            b_r = state_bits(b_key, o_v, o_k, K, RANDOM)
            b_s = store_rows(ckpt, cscale, o_s, o_r, b_s, m_s, m_v, b_r, Q8, RANDOM)
        else:
            # inline, as before stores were rounded: the nearest kernels compile to the code they always had
            b_s = rounded(b_s, ckpt.dtype.element_ty)
            tl.store(ckpt + o_s, b_s.to(ckpt.dtype.element_ty), mask=m_s)
        if HAS_COPY:
            _store_read_copy(rcopy, rscale, o_s, o_r, b_s, m_s, m_v, IS_SCALED)


@triton.jit
def _row_sums(b_s, b_k3, b_q3, b_rk, b_rq):
    """[CHUNK] sums of the rows of b_s [CHUNK, NC, PIECE] times k and q [NC, PIECE], scaled by b_rk and b_rq."""
    b_s = b_s.to(tl.float32)
    # The chunk axis first: it lies within each thread, and only the PIECE axis's lanes then shuffle.
    b_sk = tl.sum(tl.sum(b_s * b_k3[None, :, :], 1), 1)
    b_sq = tl.sum(tl.sum(b_s * b_q3[None, :, :], 1), 1)
    return b_sk * b_rk, b_sq * b_rq


@triton.jit
def _tile(rcopy, o_h, o_v, m_v, o_k3, m_k3, K: tl.constexpr):
    """Rows o_v of the tile a non-flush step reads, [CHUNK, NC, PIECE]."""
    return tl.load(rcopy + (o_h + o_v[:, None, None]) * K + o_k3[None, :, :],
                   mask=m_v[:, None, None] & m_k3[None, :, :], other=0.0)


@triton.jit
def _nonflush_rows(
    o, buf_u, rscale, b_sk, b_sq, b_uw, b_v, b_wk, b_wq, b_beta, b_eG, b_kq, i_b, i_s, i_hv, b_f, o_h, o_v, m_v,
    s_ob, s_oh, s_ov, CAP: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, IS_SCALED: tl.constexpr,
):
    """A non-flush step's rows o_v: from the tile's row sums times k and q (b_sk, b_sq), the buffered updates b_uw
    [BW, CHUNK] with their weights in S_{t-1} k_t and S_t q_t (b_wk, b_wq) and v, this token's update u, appended to
    the buffer, and its output o."""
    b_bk = tl.sum(b_wk[:, None] * b_uw, 0)
    b_bq = tl.sum(b_wq[:, None] * b_uw, 0)
    if IS_SCALED:
        b_sc = tl.load(rscale + o_h + o_v, mask=m_v, other=0.0)
        b_sk *= b_sc
        b_sq *= b_sc
    b_u = b_beta * (b_v - b_eG * b_sk - b_bk)
    b_o = b_eG * b_sq + b_bq + b_kq * b_u
    tl.store(o + i_b * s_ob + i_hv * s_oh + o_v * s_ov, cast(b_o, o.dtype.element_ty), mask=m_v)
    tl.store(buf_u + ((i_s * CAP + b_f) * HV + i_hv) * V + o_v, cast(b_u, buf_u.dtype.element_ty), mask=m_v)


@triton.jit
def _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh):
    """The step's g, beta, q and k [BK] as given, as fp32."""
    b_g = tl.load(g + i_b * s_gb + i_hv * s_gh).to(tl.float32)
    b_beta = tl.load(beta + i_b * s_bb + i_hv * s_bh).to(tl.float32)
    b_q = tl.load(q + i_b * s_qb + i_h * s_qh + o_k * s_qk, mask=m_k, other=0.0).to(tl.float32)
    b_k = tl.load(k + i_b * s_kb + i_h * s_kh + o_k * s_kk, mask=m_k, other=0.0).to(tl.float32)
    return b_g, b_beta, b_q, b_k


@triton.jit
def _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh,
                 s_bb, s_bh):
    """The step's g, beta, q and k [BK], and q and k [NC, PIECE] as given, in the shape of the tiles (their factors go
    on the row sums instead), all as fp32."""
    b_g, b_beta, b_q, b_k = _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh, s_kk,
                                          s_gb, s_gh, s_bb, s_bh)
    b_q3 = tl.load(q + i_b * s_qb + i_h * s_qh + o_k3 * s_qk, mask=m_k3, other=0.0).to(tl.float32)
    b_k3 = tl.load(k + i_b * s_kb + i_h * s_kh + o_k3 * s_kk, mask=m_k3, other=0.0).to(tl.float32)
    return b_g, b_beta, b_q, b_k, b_q3, b_k3


@triton.jit
def _replay_kernel(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_b, buf_t, fill, arrive, work, seed, steps, step_arrive,
    q, k, v, g, beta, o, slots,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    W: tl.constexpr, CAP: tl.constexpr,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr, FLUSH_CHUNK: tl.constexpr, BW: tl.constexpr,
    PIECE: tl.constexpr, STAGES: tl.constexpr, USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_SCALED: tl.constexpr, EARLY: tl.constexpr, PRECISION: tl.constexpr, PHASE: tl.constexpr,
    LANE_COUNT: tl.constexpr, LANES: tl.constexpr, CORRECTION: tl.constexpr, PDL: tl.constexpr,
    Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    # PHASE 0 takes every row's step; 1 only the non-flush steps, and lists the (row, head, fill) of each head that
    # flushes in `work` for `_flush_kernel` (`replay` launches the two where a cache's row asks for two launches).
    # Both advance every fill. With PDL the flushes' launch may begin once every program here has begun.
    if PDL:
        gdc_launch_dependents()
    # Each program takes ROWS rows of its (row, value head): NPB programs share the head's buffer and fill counter.
    NPB: tl.constexpr = (V + ROWS - 1) // ROWS
    i_b, i_hv, i_p = flat_program_ids(HV, NPB)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_k = o_k < K
    # A non-flush step reduces its tiles over K. They are held as [CHUNK, BK / PIECE, PIECE] so that each thread sums
    # its PIECE-wide pieces of a row in registers and only the lanes that share a row meet in shuffles.
    NC: tl.constexpr = BK // PIECE
    o_k3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    m_k3 = o_k3 < K
    if EARLY:
        # The slot's load issued first (in flight while the layout changes of q and k wait on theirs), then the
        # step's own inputs: they depend on neither the slot nor the fill and so leave the chain of loads too.
        i_s = tl.load(slots + i_b).to(tl.int64)
        b_g, b_beta, b_q, b_k, b_q3, b_k3 = _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3,
                                                         s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh)
    else:
        i_s = tl.load(slots + i_b).to(tl.int64)
    if i_s < 0:
        return
    o_h = (i_s * HV + i_hv) * V
    v0 = i_p * ROWS
    # The tile read bounds a non-flush step: when it is one chunk, it is issued before the fill it does not depend on.
    if CHUNK >= ROWS:
        o_v = v0 + tl.arange(0, CHUNK)
        # rcopy is the checkpoint itself when the cache has no read copy (`_cache_args`).
        b_r = _tile(rcopy, o_h, o_v, o_v < V, o_k3, m_k3, K)
    m_c = o_w < CAP
    if EARLY:
        # The buffer is read whole, before the fill it is masked by: the fill then leaves the chain of dependent
        # loads (slot, fill, buffer) that bounds a small grid. Entries past the fill are weighted by zero below.
        b_Gw = tl.load(buf_g + (i_s * CAP + o_w) * HV + i_hv, mask=m_c, other=0.0)
        # [BW, NC, PIECE] the buffered keys
        b_kw3 = tl.load(buf_k + ((i_s * CAP + o_w[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                        mask=m_c[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        if CHUNK >= ROWS:
            # [BW, CHUNK] the buffered updates of this program's rows, and the rows' v: with one chunk they are read
            # here rather than after the tile's row sums, which they do not depend on.
            b_uw1 = tl.load(buf_u + ((i_s * CAP + o_w[:, None]) * HV + i_hv) * V + o_v[None, :],
                            mask=m_c[:, None] & (o_v < V)[None, :], other=0.0).to(tl.float32)
            b_v1 = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=o_v < V, other=0.0)
    p_f = fill + i_s * HV + i_hv
    # a (slot, head)'s LANES arrival counts; without LANE_COUNT only the first
    o_a = tl.arange(0, LANES)
    p_a = arrive + (i_s * HV + i_hv) * LANES
    b_f = tl.load(p_f)
    m_w = o_w < b_f
    f_next = tl.where(b_f + 1 >= W, 0, b_f + 1)
    if EARLY:
        if NPB > 1:
            # Arrive as soon as every thread has read the fill.
            fills_read()
            if LANE_COUNT:
                # each lane counts on its own counter: no lane waits for another's count (a scalar atomic's result
                # is broadcast to the warp where it is issued), so the round trip is waited on only at the end
                b_arrived = tl.atomic_add(p_a + o_a, tl.where(b_f >= 0, 1, 0) + o_a * 0, sem="relaxed")
            else:
                b_arrived = tl.atomic_add(p_a, tl.where(b_f >= 0, 1, 0), sem="relaxed")
        b_Gl = tl.sum(tl.where(o_w == b_f - 1, b_Gw, 0.0))
        b_Gw = tl.where(m_w, b_Gw, 0.0)
    else:
        # The f buffered entries' log-decays [BW], and the log-decay since the checkpoint after the last of them.
        b_Gw = tl.load(buf_g + (i_s * CAP + o_w) * HV + i_hv, mask=m_w, other=0.0)
        b_Gl = tl.load(buf_g + (i_s * CAP + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)

    if not EARLY:
        b_g, b_beta, b_q, b_k, b_q3, b_k3 = _step_inputs(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, o_k3, m_k3,
                                                         s_qb, s_qh, s_qk, s_kb, s_kh, s_kk, s_gb, s_gh, s_bb, s_bh)
    b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
    b_k = b_k * b_rk
    b_q = b_q * b_rq
    if CHUNK >= ROWS:
        # Reduced before the branch, so that the tile is not held through the buffer's reads.
        b_sk, b_sq = _row_sums(b_r, b_k3, b_q3, b_rk, b_rq)

    if b_f + 1 >= W:
        if PHASE == 0:
            # [BW, BK] the buffered keys
            b_kw = tl.load(buf_k + ((i_s * CAP + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                           mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            _replay_flush(
                ckpt, cscale, rcopy, rscale, buf_u, buf_t, v, o, seed, steps,
                i_b, i_s, i_h, i_hv, v0, b_f, b_k, b_q, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
                s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
                CAP, H, HV, K, V, BK, ROWS, FLUSH_CHUNK, STAGES, HAS_COPY, IS_SCALED, PRECISION, CORRECTION, Q8, RANDOM,
            )
            if RANDOM:
                # every value head of a slot flushes on the same step (every call moves a slot's fills together):
                # HV · NPB programs
                R.count_stores(steps, step_arrive, i_s, HV * NPB, 1)
    else:
        if not EARLY:
            # [BW, NC, PIECE] the buffered keys
            b_kw3 = tl.load(buf_k + ((i_s * CAP + o_w[:, None, None]) * H + i_h) * K + o_k3[None, :, :],
                            mask=m_w[:, None, None] & m_k3[None, :, :], other=0.0).to(tl.float32)
        b_Gt = b_Gl + b_g
        # [BW] weights of the committed updates in S_{t-1} k_t and S_t q_t
        b_decay = tl.where(m_w, tl.exp(b_Gt - b_Gw), 0.0)
        b_wk, b_wq = _row_sums(b_kw3, b_k3, b_q3, b_rk, b_rq)
        if HAS_COPY:
            # This entry's row t of T (its correction key y = sum_l t_l k_l, for the flush's one product):
            # t = beta (e_f - sum_{j<f} (k_j·k) t_j).
            b_tw = tl.load(buf_t + ((i_s * CAP + o_w[:, None]) * HV + i_hv) * CAP + o_w[None, :],
                           mask=m_w[:, None] & m_c[None, :], other=0.0)
            b_t = b_beta * (tl.where(o_w == b_f, 1.0, 0.0) - tl.sum(tl.where(m_w, b_wk, 0.0)[:, None] * b_tw, 0))
        b_wk = tl.where(m_w, b_wk * b_decay, 0.0)
        b_wq = tl.where(m_w, b_wq * b_decay, 0.0)
        b_kq = tl.sum(b_k * b_q)
        b_eG = tl.exp(b_Gt)
        o_u = ((i_s * CAP + o_w) * HV + i_hv) * V
        # With CHUNK < V the tile streams CHUNK rows at a time through a pipelined loop (cp.async into shared memory).
        for i_v in tl.range(0, ROWS, CHUNK, num_stages=STAGES):
            o_v = v0 + i_v + tl.arange(0, CHUNK)
            m_v = o_v < V
            if CHUNK < ROWS:
                # the read copy, or the checkpoint without one
                b_s = _tile(rcopy, o_h, o_v, m_v, o_k3, m_k3, K)
                b_sk, b_sq = _row_sums(b_s, b_k3, b_q3, b_rk, b_rq)
            # [BW, CHUNK]
            if EARLY:
                if CHUNK >= ROWS:
                    b_uw, b_v = b_uw1, b_v1.to(tl.float32)
                else:
                    b_uw = tl.load(buf_u + o_u[:, None] + o_v[None, :], mask=m_c[:, None] & m_v[None, :],
                                   other=0.0).to(tl.float32)
                    b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
                b_uw = tl.where(m_w[:, None], b_uw, 0.0)
            else:
                b_uw = tl.load(buf_u + o_u[:, None] + o_v[None, :], mask=m_w[:, None] & m_v[None, :],
                               other=0.0).to(tl.float32)
                b_v = tl.load(v + i_b * s_vb + i_hv * s_vh + o_v * s_vv, mask=m_v, other=0.0).to(tl.float32)
            _nonflush_rows(o, buf_u, rscale, b_sk, b_sq, b_uw, b_v, b_wk, b_wq, b_beta, b_eG, b_kq, i_b, i_s, i_hv,
                           b_f, o_h, o_v, m_v, s_ob, s_oh, s_ov, CAP, HV, V, IS_SCALED)
        if i_p == 0:
            if i_hv % (HV // H) == 0:
                tl.store(buf_k + ((i_s * CAP + b_f) * H + i_h) * K + o_k, cast(b_k, buf_k.dtype.element_ty), mask=m_k)
            tl.store(buf_g + (i_s * CAP + b_f) * HV + i_hv, b_Gt)
            if HAS_COPY:
                tl.store(buf_b + (i_s * CAP + b_f) * HV + i_hv, b_beta)
                tl.store(buf_t + ((i_s * CAP + b_f) * HV + i_hv) * CAP + o_w, b_t, mask=m_c)

    if not (EARLY and NPB > 1):
        fills_read()
    if NPB == 1:
        tl.store(p_f, f_next)
        b_last = b_f >= 0
    else:
        # The row blocks of a (slot, head) all read its fill; the last to arrive advances it. Relaxed order
        # suffices: every program has consumed the fill it read before it arrives.
        if not EARLY:
            b_arrived = tl.atomic_add(p_a, 1, sem="relaxed")
        if EARLY and LANE_COUNT:
            # Every lane's counter saw each program once: the program last on a lane's resets it, the one last on
            # the first lane's advances the fill.
            tl.store(p_a + o_a, 0, mask=b_arrived == NPB - 1)
            b_last = tl.sum(tl.where((o_a == 0) & (b_arrived == NPB - 1), 1, 0)) > 0
        else:
            b_last = b_arrived == NPB - 1
            if b_last:
                tl.store(p_a, 0)
        if b_last:
            tl.store(p_f, f_next)
    if PHASE == 1:
        if b_last & (b_f + 1 >= W):
            # The flush launch reads the buffer, which no step of this launch overwrites, and this fill.
            list_flush(work, i_b, i_hv, b_f, False)


@triton.jit
def _flush_kernel(
    ckpt, cscale, rcopy, rscale, buf_u, buf_k, buf_g, buf_t, work, seed, steps,
    q, k, v, g, beta, o, slots,
    s_qb, s_qh, s_qk,
    s_kb, s_kh, s_kk,
    s_vb, s_vh, s_vv,
    s_gb, s_gh,
    s_bb, s_bh,
    s_ob, s_oh, s_ov,
    scale,
    CAP: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr, BW: tl.constexpr, STAGES: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr, HAS_COPY: tl.constexpr, IS_SCALED: tl.constexpr, PRECISION: tl.constexpr,
    CORRECTION: tl.constexpr, PDL: tl.constexpr, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """The flushes the non-flush launch listed in `work` (a count, a done counter, then (row, head, fill) per
    flushing head), ROWS rows of a head per item: each program loops over the items, so the launch's programs are a
    few per SM however few rows flush. The last program to finish zeroes the counters for the next step. With PDL
    (a programmatic dependent launch) its programs may begin while the non-flush launch's last ones run, and wait
    for that launch's end, its writes visible, before they read anything."""
    if PDL:
        gdc_wait()
    NPB: tl.constexpr = (V + ROWS - 1) // ROWS
    n_items = tl.load(work) * NPB
    n_programs = tl.num_programs(0)
    o_k = tl.arange(0, BK)
    o_w = tl.arange(0, BW)
    m_k = o_k < K
    # A while loop: its bounds are device values (the interpreter's range takes only Python integers).
    i_j = tl.program_id(0)
    while i_j < n_items:
        i_b, i_hv, b_f = listed_flush(work, i_j // NPB)
        i_h = i_hv // (HV // H)
        i_s = tl.load(slots + i_b).to(tl.int64)
        m_w = o_w < b_f
        b_g, b_beta, b_q, b_k = _step_vectors(q, k, g, beta, i_b, i_h, i_hv, o_k, m_k, s_qb, s_qh, s_qk, s_kb, s_kh,
                                              s_kk, s_gb, s_gh, s_bb, s_bh)
        b_rq, b_rk = qk_factors(b_q, b_k, scale, USE_QK_L2NORM)
        b_Gw = tl.load(buf_g + (i_s * CAP + o_w) * HV + i_hv, mask=m_w, other=0.0)
        b_Gl = tl.load(buf_g + (i_s * CAP + tl.maximum(b_f - 1, 0)) * HV + i_hv, mask=b_f > 0, other=0.0)
        # [BW, BK] the buffered keys
        b_kw = tl.load(buf_k + ((i_s * CAP + o_w[:, None]) * H + i_h) * K + o_k[None, :],
                       mask=m_w[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        _replay_flush(
            ckpt, cscale, rcopy, rscale, buf_u, buf_t, v, o, seed, steps,
            i_b, i_s, i_h, i_hv, (i_j % NPB) * ROWS, b_f, b_k * b_rk, b_q * b_rq, b_g, b_beta, b_Gl, b_Gw, b_kw, o_w,
            s_vb, s_vh, s_vv, s_ob, s_oh, s_ov,
            CAP, H, HV, K, V, BK, ROWS, FLUSH_CHUNK, STAGES, HAS_COPY, IS_SCALED, PRECISION, CORRECTION, Q8, RANDOM,
        )
        i_j += n_programs
    list_done(work, tl.num_programs(0), slots, steps, True, RANDOM)


def _cache_args(cache: ReplayCache) -> dict:
    """The cache's tensors a launch takes: the tile non-flush steps read (rcopy: the read copy, else the checkpoint)
    with its row scales (rscale: an fp8 copy's or an 8-bit checkpoint's; a stand-in otherwise), the checkpoint's
    scales (cscale) and the rounding's seed and store counts (None when absent: constants, out of the signature)."""
    if cache.read_scale is not None:
        rscale = cache.read_scale
    else:
        rscale = cache.buf_g if cache.checkpoint_scale is None else cache.checkpoint_scale
    return {
        "ckpt": cache.checkpoint,
        "cscale": cache.checkpoint_scale,
        "rcopy": cache.checkpoint if cache.read_copy is None else cache.read_copy,
        "rscale": rscale,
        **{key: value for key, value in rounding_args(cache.rounding).items() if key != "RANDOM"},
        "buf_u": cache.buf_u,
        "buf_k": cache.buf_k,
        "buf_g": cache.buf_g,
        "buf_b": cache.buf_g if cache.buf_beta is None else cache.buf_beta,
        "buf_t": cache.buf_g if cache.buf_t is None else cache.buf_t,
        "fill": cache.fill,
    }


def _correction_precision(cache: ReplayCache, precision: str, correction: str | None) -> str:
    """The input precision of a flush's correction product under a read copy: the fold's, or "tf32" (one TF32 pass)
    for a 2-byte copy only (checkpoint - copy is about 2^-9 of the state under a bf16 copy, so TF32's 2^-11 of it is
    about 2^-20 of the state; an fp8 copy's is about 2^-4)."""
    common.check_precision(cache.checkpoint, precision)
    if correction is None:
        return precision
    if correction != "tf32":
        raise ValueError(f"correction must be None or 'tf32', got {correction!r}")
    if cache.read_dtype is None or cache.read_dtype.itemsize != 2:
        copy = "no read copy" if cache.read_dtype is None else f"a {cache.read_dtype} read copy"
        raise ValueError(f"correction 'tf32' (a flush's correction in one TF32 pass) applies only to a bf16 or fp16 "
                         f"read copy; this cache has {copy}")
    return "tf32"


def _cache_constants(cache: ReplayCache) -> dict:
    return {
        "W": cache.window, "CAP": cache.capacity,
        "H": cache.H, "HV": cache.HV, "K": cache.K, "V": cache.V,
        "BK": max(16, next_pow2(cache.K)), "BW": max(16, next_pow2(cache.capacity)),
        # the tile non-flush steps read carries row scales: an fp8 read copy, or an 8-bit checkpoint (Q8)
        "HAS_COPY": cache.read_copy is not None,
        "IS_SCALED": cache.read_scale is not None or cache.checkpoint_scale is not None,
        "Q8": cache.checkpoint_scale is not None, "RANDOM": cache.rounding is not None,
    }


def _step_strides(q, k, v, g, beta, out) -> dict:
    return dict(
        s_qb=q.stride(0), s_qh=q.stride(1), s_qk=q.stride(2),
        s_kb=k.stride(0), s_kh=k.stride(1), s_kk=k.stride(2),
        s_vb=v.stride(0), s_vh=v.stride(1), s_vv=v.stride(2),
        s_gb=g.stride(0), s_gh=g.stride(1),
        s_bb=beta.stride(0), s_bh=beta.stride(1),
        s_ob=out.stride(0), s_oh=out.stride(1), s_ov=out.stride(2),
    )


def _launch_flushes(cache, q, k, v, g, beta, out, slots, scale, l2norm, c: FlushConfig, pdl):
    """The flushes a PHASE 1 launch listed: a few programs per SM (all of them on the CPU), each looping over the
    items; their register cap `round_cap` where a step with the rows' fills staggered (batch / W rows flushing) takes
    no more rounds of resident programs at it than at `maxnreg` (`flush_cap`)."""
    ROWS = min(c.rows, next_pow2(cache.V))
    per_row = cache.HV * triton.cdiv(cache.V, ROWS)
    items = q.shape[0] * per_row
    staggered = triton.cdiv(q.shape[0], cache.window) * per_row
    maxnreg = common.flush_cap(c.maxnreg, c.round_cap, staggered, c.warps, FLUSH_PROGRAMS_PER_SM,
                               common.sm_count(cache.device))
    constants = _cache_constants(cache)
    _flush_kernel[common.flush_grid(items, FLUSH_PROGRAMS_PER_SM, cache.device)](
        **{key: value for key, value in _cache_args(cache).items() if key not in ("buf_b", "fill")}, work=cache.work,
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots,
        **_step_strides(q, k, v, g, beta, out),
        scale=scale,
        **{key: constants[key] for key in ("CAP", "H", "HV", "K", "V", "BK", "BW", "HAS_COPY", "IS_SCALED", "Q8",
                                           "RANDOM")},
        ROWS=ROWS,
        FLUSH_CHUNK=max(16, min(c.flush_chunk, ROWS)),
        STAGES=c.stages,
        USE_QK_L2NORM=l2norm,
        PRECISION=c.precision,
        CORRECTION=_correction_precision(cache, c.precision, c.correction),
        PDL=pdl,
        **common.compile_options(c.warps, maxnreg),
        **({"launch_pdl": True} if pdl else {}),
    )


def _launch_replay(cache, q, k, v, g, beta, out, slots, scale, l2norm, c: ReplayConfig, phase, pdl=False):
    ROWS = min(c.rows, next_pow2(cache.V))
    _replay_kernel[(q.shape[0] * cache.HV * triton.cdiv(cache.V, ROWS),)](
        **_cache_args(cache), arrive=cache.arrive, work=cache.work, step_arrive=R.step_arrivals(cache.rounding),
        q=q, k=k, v=v, g=g, beta=beta, o=out, slots=slots,
        **_step_strides(q, k, v, g, beta, out),
        scale=scale,
        **_cache_constants(cache),
        ROWS=ROWS,
        CHUNK=min(c.chunk, ROWS),
        FLUSH_CHUNK=max(16, min(c.flush_chunk, ROWS)),
        PIECE=min(c.piece, max(16, next_pow2(cache.K))),
        STAGES=c.stages,
        USE_QK_L2NORM=l2norm,
        EARLY=c.early,
        LANE_COUNT=c.lane_count,
        LANES=cache.arrive.shape[-1],
        PRECISION=c.precision,
        CORRECTION=_correction_precision(cache, c.precision, c.correction),
        PHASE=phase,
        PDL=pdl,
        **common.compile_options(c.warps, c.maxnreg),
    )


def _check_cache(cache, kernel) -> None:
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache must be a ReplayCache; got {type(cache).__name__}")
    common.check_device(cache.device, kernel)
    families.check_read_dtype(None if cache.read_copy is None else cache.read_copy.dtype, cache.device)
    for name in ("checkpoint", "checkpoint_scale", "read_copy", "read_scale", "buf_u", "buf_k", "buf_g", "buf_beta",
                 "buf_t", "fill", "arrive", "arrivals"):
        value = getattr(cache, name)
        if value is not None and not value.is_contiguous():
            raise ValueError(f"cache.{name} must be contiguous, as ReplayCache.create makes it")
    if (cache.checkpoint_scale is None) != (cache.state_dtype not in EIGHT_BIT):
        raise ValueError("cache.checkpoint_scale must be (nslots, HV, V) fp32 for an 8-bit checkpoint and None "
                         "otherwise, as ReplayCache.create makes it")
    if cache.read_copy is not None and cache.state_dtype in EIGHT_BIT:
        raise ValueError(f"an {cache.state_dtype} checkpoint takes no read copy (none is narrower)")
    check_state_dtype(cache.state_dtype, cache.device)
    R.check_rounding(cache.rounding, cache.state_dtype, cache.nslots, cache.device)


def _check_against_cache(cache: ReplayCache, kernel, q, k, v, g, beta, tokens: bool):
    _check_cache(cache, kernel)
    batch, T, H, HV, K, V = check_step(q, k, v, g, beta, tokens=tokens, io_dtype=cache.io_dtype)
    if (H, HV, K, V) != (cache.H, cache.HV, cache.K, cache.V):
        raise ValueError(
            f"q, k, v have H={H}, HV={HV}, K={K}, V={V} but the cache has "
            f"H={cache.H}, HV={cache.HV}, K={cache.K}, V={cache.V}"
        )
    if q.device != cache.device:
        raise ValueError(f"q, k, v are on {q.device} but the cache is on {cache.device}")
    return batch, T


@families.refuse_out_of_resources
def replay(
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
    config: ReplayConfig | None = None,
    check: bool = True,
) -> torch.Tensor:
    """One ReplaySSM Gated DeltaNet decode step; the fill counters live on the device.

    Inputs and output as in `decode` (q, k, v in the cache's io_dtype; slots index the cache's slots,
    -1 for padding rows). Each (row, value head) reads its checkpoint (the read copy when the cache
    has one), replays its f buffered updates, appends (u_t, k_t, G_t, and beta_t and its row of T
    under split precision) and advances its fill counter; the step that fills the window (f + 1 >= W)
    instead folds the buffer into the full-precision checkpoint (correcting the updates the copy gave),
    takes this step from it, stores it, refreshes the read copy and empties the buffer. A row with a flush
    launch (split precision, or an 8-bit checkpoint, on grids of two or more programs per SM) takes the flushes in a
    second launch, over the heads the first listed in cache.work. A flush stores the checkpoint rounded by
    cache.rounding (to nearest without one; an 8-bit checkpoint as rows over new scales in cache.checkpoint_scale),
    and the call then advances every row's store count.
    Mutates the cache; returns o (batch, HV, V) in v's dtype (written into `out` when given).
    `config`: the launch settings (default: the REPLAY_LAUNCH row `select` chooses); for benchmarks.
    `check` range-checks slots on the host, a device sync: pass check=False for a step with no host
    synchronisation (it is skipped anyway while a CUDA graph is captured).
    """
    batch, _ = _check_against_cache(cache, _replay_kernel, q, k, v, g, beta, tokens=False)
    scale = default_scale(cache.K, scale)
    common.check_slots(slots, batch, cache.nslots, q.device, check)
    slots = default_slots(slots, batch, q.device)
    out = check_out(out, v.shape, v.dtype, q.device)
    c = REPLAY_LAUNCH[select(cache, batch)] if config is None else config
    for row in (c, c.flush or c):
        # before either launch, so that a refused setting leaves the cache as it was
        _correction_precision(cache, row.precision, row.correction)
    # On the CPU the interpreter runs the launches one after the other: nothing to overlap, no GPU instruction.
    pdl = families.pdl(c.pdl, config is not None, cache.device)
    if batch:
        args = (cache, q, k, v, g, beta, out, slots, scale, bool(use_qk_l2norm_in_kernel))
        if c.flush is None:
            _launch_replay(*args, c, 0)
        else:
            _launch_replay(*args, c, 1, pdl)
            _launch_flushes(*args, c.flush, pdl)
    return out


@families.refuse_out_of_resources
def materialize(cache: ReplayCache, slots: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 full states (n, HV, V, K) of `slots` (default: all): checkpoint plus committed buffer.

    S = e^{G_f} S_0 + sum_{j<f} e^{G_f - G_j} u_j k_jᵀ per value head, from the full-precision
    checkpoint, with the buffered updates corrected as a flush corrects them: the state the next flush
    would store. Plain torch, for tests, prefix caching and debugging; the cache is not changed.
    """
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache must be a ReplayCache; got {type(cache).__name__}")
    idx = cache._index(slots, "slots")
    f = cache.fill[idx].long()
    used = torch.arange(cache.capacity, device=cache.device)[None, :, None] < f[:, None, :]
    G = torch.where(used, cache.buf_g[idx], 0.0)
    keys = torch.where(used[..., None], cache.buf_k[idx].float().repeat_interleave(cache.HV // cache.H, dim=2), 0.0)
    u = torch.where(used[..., None], cache.buf_u[idx].float(), 0.0)
    if cache.read_copy is not None:
        scale = None if cache.read_scale is None else cache.read_scale[idx]
        D = cache.checkpoint_values(idx) - dequantize_read(cache.read_copy[idx], scale)
        beta = torch.where(used, cache.buf_beta[idx], 0.0)
        G_prev = torch.zeros_like(G[:, 0])
        corrected = []
        for j in range(cache.capacity):
            a = torch.where(used[:, j], torch.exp(G[:, j] - G_prev), 1.0)
            d = -(beta[:, j] * a)[..., None] * torch.einsum("nhvk,nhk->nhv", D, keys[:, j])
            D = a[..., None, None] * D + d[..., None] * keys[:, j, :, None, :]
            corrected.append(u[:, j] + d)
            G_prev = torch.where(used[:, j], G[:, j], G_prev)
        u = torch.stack(corrected, dim=1)
    G_last = torch.where(f > 0, G.gather(1, (f - 1).clamp(min=0)[:, None, :]).squeeze(1), 0.0)
    w = torch.where(used, torch.exp(G_last[:, None, :] - G), 0.0)
    S = torch.exp(G_last)[..., None, None] * cache.checkpoint_values(idx)
    return S + torch.einsum("njhv,njhk->nhvk", w[..., None] * u, keys)
