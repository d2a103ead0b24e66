"""ReplaySSM Mamba-2 decode: one launch per step that answers from checkpoint plus buffer, flushing full rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families, rounding as rnd
from replayssm_kernels.common import (
    LIST_ENTRY,
    LIST_HEADER,
    advance_heads,
    fills_read,
    list_done,
    list_flush,
    listed_flush,
    slot_of,
    tail_claim,
    tail_heads_done,
    tail_ticket,
    tail_wait,
)
from replayssm_kernels.mamba2 import args
from replayssm_kernels.mamba2.cache import ReplayCache
from replayssm_kernels.mamba2.common import (
    finish_output, fold_entries, step_delta, store_read_copy, store_rows, z_gate,
)
from replayssm_kernels.rounding import count_stores, store_key


@triton.jit
def _step_inputs(x, dt, B, C, dt_bias, i_b, i_h, i_g, o_p, m_p, o_n, m_n, stride_x_b, stride_x_h, stride_dt_b,
                 stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, HAS_DT_BIAS: tl.constexpr,
                 USE_SOFTPLUS: tl.constexpr):
    """The step's x [ROWS] and B [BN] as given (they are buffered as they come), and C [BN] and Δ as fp32."""
    b_xr = tl.load(x + i_b * stride_x_b + i_h * stride_x_h + o_p, mask=m_p, other=0.0)
    b_Br = tl.load(B + i_b * stride_B_b + i_g * stride_B_g + o_n, mask=m_n, other=0.0)
    b_C = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_dt = step_delta(tl.load(dt + i_b * stride_dt_b + i_h * stride_dt_h), dt_bias, i_h, HAS_DT_BIAS, USE_SOFTPLUS)
    return b_xr, b_Br, b_C, b_dt


@triton.jit
def _chunk_inputs(p_xb, p_x, z, o_z, o_r, m_r, o_w, m_w, P, HAS_Z: tl.constexpr):
    """A chunk's buffered x [BW, CHUNK] (the f entries of rows o_r), this token's x [CHUNK] and z [CHUNK] as given (z is
    x without HAS_Z)."""
    b_xw = tl.load(p_xb + o_w[:, None] * P + o_r[None, :], mask=m_w[:, None] & m_r[None, :], other=0.0)
    b_xc = tl.load(p_x + o_r, mask=m_r, other=0.0)
    b_z = b_xc
    if HAS_Z:
        b_z = tl.load(z + o_z + o_r, mask=m_r, other=0.0)
    return b_xw, b_xc, b_z


@triton.jit
def _chunk_output(
    checkpoint, read_copy, read_scale, D, p_y, p_xb, p_x, z, o_z, i_h, i_s, i_sh, o_r, b_C3, b_kw, b_decay, b_bc,
    o_n3, m_n3, o_w, m_w, P, stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr,
    b_xw, b_xc, b_z, PREFETCH: tl.constexpr, ck_scale, Q8: tl.constexpr,
):
    """A non-flush step's outputs for rows o_r of a head: y = e^{Λ_t}(S₀C) + Σ_j w_j x_j + ΔB·C x from the tile (the
    read copy, else the checkpoint; with Q8 8-bit rows, times their scales ck_scale) [CHUNK, NC, PIECE], the buffered x
    [BW, CHUNK] with weights b_kw, and this token's x, which it returns as given. With PREFETCH the caller has read the
    buffered x, x and z (b_xw, b_xc, b_z, from `_chunk_inputs`); else they are read here, after the tile."""
    m_r = o_r < P
    if HAS_COPY:
        p_t = read_copy + i_s * stride_rc_s + i_h * stride_rc_h + o_r * stride_rc_p
    else:
        p_t = checkpoint + i_s * stride_ck_s + i_h * stride_ck_h + o_r * stride_ck_p
    b_t = tl.load(p_t[:, None, None] + o_n3[None, :, :], mask=m_r[:, None, None] & m_n3[None, :, :], other=0.0)
    b_yc = tl.sum(tl.sum(b_t.to(tl.float32) * b_C3[None, :, :], axis=1), axis=1)
    if not PREFETCH:
        # z is read with the output's gate below
        b_xw, b_xc, _ = _chunk_inputs(p_xb, p_x, z, o_z, o_r, m_r, o_w, m_w, P, False)
    if IS_FP8:
        b_yc = b_yc * tl.load(read_scale + i_sh * P + o_r, mask=m_r, other=0.0)
    if Q8:
        b_yc = b_yc * tl.load(ck_scale + i_sh * P + o_r, mask=m_r, other=0.0)
    b_yc = b_decay * b_yc + tl.sum(b_kw[:, None] * b_xw.to(tl.float32), axis=0)
    b_yc += b_bc * b_xc.to(tl.float32)
    if PREFETCH:
        b_yc = finish_output(b_yc, b_xc.to(tl.float32), D, z, o_z + o_r, m_r, i_h, HAS_D, False)
        if HAS_Z:
            b_yc = z_gate(b_yc, b_z)
    else:
        b_yc = finish_output(b_yc, b_xc.to(tl.float32), D, z, o_z + o_r, m_r, i_h, HAS_D, HAS_Z)
    tl.store(p_y + o_r, b_yc.to(p_y.dtype.element_ty), mask=m_r)
    return b_xc


@triton.jit
def _flush_rows(
    checkpoint, read_copy, read_scale, x, D, z, p_y, p_xb, p_bb,
    i_b, i_h, i_p, i_s, i_sh, f, b_lam, b_cw, b_dt, b_B, b_C, o_s, o_z, o_n, m_n, o_w,
    P, N, stride_x_b, stride_x_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p,
    ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr, STAGES: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, PRECISION: tl.constexpr,
    ck_scale, seed, steps, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """The step that fills the window for rows i_p·ROWS .. of a (slot, head): fold the f buffered entries (weights b_cw
    [BW]) and this token into a new checkpoint (and read copy), answer from it (from the fp32 values). With Q8
    the checkpoint is 8-bit rows with scales ck_scale, read and stored as such; with RANDOM it is stored rounded
    stochastically."""
    m_w = o_w < f
    # The flush walks its rows FLUSH_CHUNK at a time (a pipelined loop) so that this rare branch does not raise the
    # register count of the common one; each chunk's rank-f update is one [FLUSH_CHUNK, BW] x [BW, BN] fp32 product.
    b_bwf = tl.load(p_bb + o_w[:, None] * N + o_n[None, :], mask=m_w[:, None] & m_n[None, :], other=0.0)
    b_bwf = b_bwf.to(tl.float32)
    b_decay = tl.exp(b_lam)
    b_sB = b_dt * b_B
    b_key = store_key(seed, steps, i_s, i_h, RANDOM)
    for i_c in tl.range(0, ROWS, FLUSH_CHUNK, num_stages=STAGES):
        o_c = i_p * ROWS + i_c + tl.arange(0, FLUSH_CHUNK)
        # A chunk is at least 16 rows (the fold is one product); with ROWS < 16 it is masked to this program's rows.
        m_c = (o_c < P) & (i_c + tl.arange(0, FLUSH_CHUNK) < ROWS)
        m_sc = m_c[:, None] & m_n[None, :]
        p_ckc = checkpoint + o_s + o_c[:, None] * stride_ck_p + o_n[None, :]
        b_s = tl.load(p_ckc, mask=m_sc, other=0.0).to(tl.float32)
        if Q8:
            b_s = b_s * tl.load(ck_scale + i_sh * P + o_c, mask=m_c, other=0.0)[:, None]
        b_xc = tl.load(p_xb + o_w[:, None] * P + o_c[None, :], mask=m_w[:, None] & m_c[None, :], other=0.0)
        b_xt = tl.load(x + i_b * stride_x_b + i_h * stride_x_h + o_c, mask=m_c, other=0.0).to(tl.float32)
        b_u = tl.dot(tl.trans(b_xc.to(tl.float32) * b_cw[:, None]), b_bwf, input_precision=PRECISION)
        b_s = b_s * b_decay + b_u + b_xt[:, None] * b_sB[None, :]
        # rounding to nearest stays inline: through store_rows its PTX would gain the call's debug labels
        if Q8 or RANDOM:
            store_rows(p_ckc, b_s, m_sc, ck_scale, i_sh * P + o_c, m_c, b_key, o_c, N, Q8, RANDOM)
        else:
            tl.store(p_ckc, b_s.to(p_ckc.dtype.element_ty), mask=m_sc)
        if HAS_COPY:
            p_rcc = read_copy + i_s * stride_rc_s + i_h * stride_rc_h + o_c[:, None] * stride_rc_p + o_n[None, :]
            store_read_copy(b_s, p_rcc, read_scale, i_sh * P + o_c, m_sc, m_c, IS_FP8)
        b_yc = tl.sum(b_s * b_C[None, :], axis=1)
        b_yc = finish_output(b_yc, b_xt, D, z, o_z + o_c, m_c, i_h, HAS_D, HAS_Z)
        tl.store(p_y + o_c, b_yc.to(p_y.dtype.element_ty), mask=m_c)


@triton.jit
def mamba2_replay_kernel(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, fill, arrive, work, ck_scale, seed, steps,
    step_arrive,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    W: tl.constexpr, CAP: tl.constexpr, ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr, BN: tl.constexpr,
    BW: tl.constexpr, PIECE: tl.constexpr, CHUNK: tl.constexpr, STAGES: tl.constexpr, NPB: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr,
    HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, EARLY: tl.constexpr, PRECISION: tl.constexpr,
    PHASE: tl.constexpr, PREFETCH: tl.constexpr, Q8: tl.constexpr = False, RANDOM: tl.constexpr = False,
):
    # PHASE 0 takes every row's step; 1 only the non-flush steps, and lists the (row, head, fill) of each head that
    # flushes in `work` for `mamba2_flush_kernel` (`replay` launches the two for a heads row lowered to one head per
    # program). Both advance every fill; with RANDOM a flushing slot's store count advances in the launch that
    # flushes it.
    i_b, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    HPG = H // G
    i_g = i_h // HPG
    o_p, o_n, o_w = i_p * ROWS + tl.arange(0, ROWS), tl.arange(0, BN), tl.arange(0, BW)
    m_p, m_n = o_p < P, o_n < N
    # The non-flush step reduces the tile over N. It is held as [ROWS, BN / PIECE, PIECE] so that each thread sums its
    # PIECE-wide pieces of a row in registers and only the PIECE lanes of a row meet in shuffles.
    NC: tl.constexpr = BN // PIECE
    o_n3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    m_n3 = o_n3 < N
    if EARLY:
        # The slot's load issued first (in flight while the inputs' layouts wait), then the step's own inputs: they
        # depend on neither the slot nor the fill and so leave the chain of dependent loads too.
        i_s = slot_of(slots, i_b, HAS_SLOTS)
        b_xr, b_Br, b_C, b_dt = _step_inputs(
            x, dt, B, C, dt_bias, i_b, i_h, i_g, o_p, m_p, o_n, m_n, stride_x_b, stride_x_h, stride_dt_b,
            stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, HAS_DT_BIAS, USE_SOFTPLUS)
        b_C3 = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n3, mask=m_n3, other=0.0).to(tl.float32)
    else:
        i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    i_sh = i_s * H + i_h
    m_s3 = m_p[:, None, None] & m_n3[None, :, :]
    o_s = i_s * stride_ck_s + i_h * stride_ck_h
    # The tile read bounds the step, so it is issued before anything it does not depend on, unless the
    # non-flush step streams the tile CHUNK rows at a time through shared memory (a pipelined loop, few registers).
    if CHUNK >= ROWS:
        if HAS_COPY:
            p_rc = read_copy + i_s * stride_rc_s + i_h * stride_rc_h + o_p[:, None, None] * stride_rc_p + o_n3[None, :, :]
            b_r = tl.load(p_rc, mask=m_s3, other=0.0)
        else:
            b_r = tl.load(checkpoint + o_s + o_p[:, None, None] * stride_ck_p + o_n3[None, :, :], mask=m_s3, other=0.0)
    p_xb = x_buf + i_sh * CAP * P
    p_bb = b_buf + (i_s * G + i_g) * CAP * N
    p_db = dt_buf + i_sh * CAP
    p_lb = lam_buf + i_sh * CAP
    if EARLY:
        # The buffer is read whole, before the fill it is masked by: the fill then leaves the chain of dependent
        # loads (slot, fill, buffer) that bounds a small grid. Entries past the fill are weighted by zero below.
        m_cap = o_w < CAP
        b_lw = tl.load(p_lb + o_w, mask=m_cap, other=0.0)
        b_dw = tl.load(p_db + o_w, mask=m_cap, other=0.0)
        # [BW, NC, PIECE] and [BW, ROWS]
        b_bw = tl.load(p_bb + o_w[:, None, None] * N + o_n3[None, :, :],
                       mask=m_cap[:, None, None] & m_n3[None, :, :], other=0.0)
        if CHUNK >= ROWS:
            b_xw = tl.load(p_xb + o_w[:, None] * P + o_p[None, :], mask=m_cap[:, None] & m_p[None, :], other=0.0)
    f = tl.load(fill + i_sh)
    m_w = o_w < f
    if EARLY:
        if NPB > 1:
            # Arrive as soon as every thread has read the fill.
            fills_read()
            b_arrived = tl.atomic_add(arrive + i_sh, tl.where(f >= 0, 1, 0), sem="relaxed")
        b_lprev = tl.sum(tl.where(o_w == f - 1, b_lw, 0.0))
    else:
        # The f buffered entries, one read each: [BW].
        b_lprev = tl.load(p_lb + f - 1, mask=f > 0, other=0.0)
        b_lw = tl.load(p_lb + o_w, mask=m_w, other=0.0)
        b_dw = tl.load(p_db + o_w, mask=m_w, other=0.0)

    if not EARLY:
        b_xr, b_Br, b_C, b_dt = _step_inputs(
            x, dt, B, C, dt_bias, i_b, i_h, i_g, o_p, m_p, o_n, m_n, stride_x_b, stride_x_h, stride_dt_b,
            stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, HAS_DT_BIAS, USE_SOFTPLUS)
    b_lam = b_lprev + tl.load(A + i_h).to(tl.float32) * b_dt
    b_x, b_B = b_xr.to(tl.float32), b_Br.to(tl.float32)
    b_cw = tl.where(m_w, tl.exp(b_lam - b_lw) * b_dw, 0.0)
    o_z = i_b * stride_z_b + i_h * stride_z_h
    p_y = y + i_b * stride_y_b + i_h * stride_y_h

    if f + 1 < W:
        if not EARLY:
            b_C3 = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n3, mask=m_n3, other=0.0).to(tl.float32)
            # [BW, NC, PIECE]
            b_bw = tl.load(p_bb + o_w[:, None, None] * N + o_n3[None, :, :],
                           mask=m_w[:, None, None] & m_n3[None, :, :], other=0.0)
        b_kw = tl.where(m_w, b_cw * tl.sum(tl.sum(b_bw.to(tl.float32) * b_C3[None, :, :], axis=1), axis=1), 0.0)
        if CHUNK >= ROWS:
            if EARLY:
                b_xw = tl.where(m_w[:, None], b_xw, 0.0)
            else:
                # [BW, ROWS]
                b_xw = tl.load(p_xb + o_w[:, None] * P + o_p[None, :], mask=m_w[:, None] & m_p[None, :], other=0.0)
            b_y = tl.sum(tl.sum(b_r.to(tl.float32) * b_C3[None, :, :], axis=1), axis=1)
            if IS_FP8:
                b_y = b_y * tl.load(read_scale + i_sh * P + o_p, mask=m_p, other=0.0)
            if Q8:
                b_y = b_y * tl.load(ck_scale + i_sh * P + o_p, mask=m_p, other=0.0)
            b_y = tl.exp(b_lam) * b_y + tl.sum(b_kw[:, None] * b_xw.to(tl.float32), axis=0)
            b_y += (b_dt * tl.sum(b_B * b_C, axis=0)) * b_x
            b_y = finish_output(b_y, b_x, D, z, o_z + o_p, m_p, i_h, HAS_D, HAS_Z)
            tl.store(p_y + o_p, b_y.to(p_y.dtype.element_ty), mask=m_p)
        else:
            b_decay = tl.exp(b_lam)
            b_bc = b_dt * tl.sum(b_B * b_C, axis=0)
            p_x = x + i_b * stride_x_b + i_h * stride_x_h
            if PREFETCH:
                o_r = i_p * ROWS + tl.arange(0, CHUNK)
                b_xw_n, b_xc_n, b_z_n = _chunk_inputs(p_xb, p_x, z, o_z, o_r, o_r < P, o_w, m_w, P, HAS_Z)
            for i_r in tl.range(0, ROWS, CHUNK, num_stages=STAGES):
                o_r = i_p * ROWS + i_r + tl.arange(0, CHUNK)
                if PREFETCH:
                    # This chunk's buffered x, x and z were read a chunk ahead, and the next chunk's are read now:
                    # the pipelined loop does not prefetch these 2-byte loads, which the compiler otherwise issues
                    # just before their use.
                    b_xw, b_xc, b_z = b_xw_n, b_xc_n, b_z_n
                    b_xw_n, b_xc_n, b_z_n = _chunk_inputs(p_xb, p_x, z, o_z, o_r + CHUNK,
                                                          (o_r + CHUNK < P) & (i_r + CHUNK < ROWS), o_w, m_w, P, HAS_Z)
                else:
                    b_xw, b_xc, b_z = None, None, None
                _chunk_output(
                    checkpoint, read_copy, read_scale, D, p_y, p_xb, p_x, z, o_z, i_h, i_s, i_sh, o_r, b_C3, b_kw,
                    b_decay, b_bc, o_n3, m_n3, o_w, m_w, P, stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s,
                    stride_rc_h, stride_rc_p, HAS_D, HAS_Z, HAS_COPY, IS_FP8, b_xw, b_xc, b_z, PREFETCH, ck_scale,
                    Q8,
                )
        tl.store(p_xb + f * P + o_p, b_xr, mask=m_p)
        if i_p == 0:
            tl.store(p_db + f, b_dt)
            tl.store(p_lb + f, b_lam)
            if i_h % HPG == 0:
                tl.store(p_bb + f * N + o_n, b_Br, mask=m_n)
        f_next = f + 1
    else:
        if PHASE == 0:
            _flush_rows(
                checkpoint, read_copy, read_scale, x, D, z, p_y, p_xb, p_bb,
                i_b, i_h, i_p, i_s, i_sh, f, b_lam, b_cw, b_dt, b_B, b_C, o_s, o_z, o_n, m_n, o_w,
                P, N, stride_x_b, stride_x_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p,
                ROWS, FLUSH_CHUNK, STAGES, HAS_D, HAS_Z, HAS_COPY, IS_FP8, PRECISION, ck_scale, seed, steps, Q8, RANDOM,
            )
            if RANDOM:
                # every head of a slot flushes on the same step: H · NPB programs
                count_stores(steps, step_arrive, i_s, H * NPB, 1)
        f_next = f * 0

    if not (EARLY and NPB > 1):
        fills_read()
    if NPB == 1:
        tl.store(fill + i_sh, f_next)
        b_last = f >= 0
    else:
        # The P-blocks of a (slot, head) all read its fill; the last to arrive advances it. Relaxed order
        # suffices: every program has consumed the fill it read before it arrives.
        if not EARLY:
            b_arrived = tl.atomic_add(arrive + i_sh, 1, sem="relaxed")
        b_last = b_arrived == NPB - 1
        if b_last:
            tl.store(fill + i_sh, f_next)
            tl.store(arrive + i_sh, 0)
    if PHASE == 1:
        if b_last & (f + 1 >= W):
            # The flush launch reads the buffer, which no step of this launch overwrites, and this fill.
            list_flush(work, i_b, i_h, f, False)


@triton.jit
def _heads_step(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, fill, work, ck_scale,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    i_b, h0,
    W: tl.constexpr, CAP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, PIECE: tl.constexpr,
    CHUNK: tl.constexpr, STAGES: tl.constexpr, HEADS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_FP8: tl.constexpr, PREFETCH: tl.constexpr, TAIL: tl.constexpr, Q8: tl.constexpr,
):
    """Heads h0 .. h0 + HEADS of row i_b (mamba2_heads_kernel)."""
    HPG = H // G
    i_g = h0 // HPG
    o_n, o_w = tl.arange(0, BN), tl.arange(0, BW)
    m_n = o_n < N
    NC: tl.constexpr = BN // PIECE
    o_n3 = tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :]
    m_n3 = o_n3 < N
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    # The heads of a slot share its fill (ReplayCache).
    f = tl.load(fill + i_s * H + h0)
    if f + 1 < W:
        m_w = o_w < f
        p_bb = b_buf + (i_s * G + i_g) * CAP * N
        b_Br = tl.load(B + i_b * stride_B_b + i_g * stride_B_g + o_n, mask=m_n, other=0.0)
        b_C = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n, mask=m_n, other=0.0).to(tl.float32)
        b_C3 = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n3, mask=m_n3, other=0.0).to(tl.float32)
        # [BW, NC, PIECE]: the group's buffered B, against this token's C once for every head of the program.
        b_bw = tl.load(p_bb + o_w[:, None, None] * N + o_n3[None, :, :],
                       mask=m_w[:, None, None] & m_n3[None, :, :], other=0.0)
        b_cbw = tl.sum(tl.sum(b_bw.to(tl.float32) * b_C3[None, :, :], axis=1), axis=1)
        b_cb = tl.sum(b_Br.to(tl.float32) * b_C, axis=0)
        p_x, o_z = x + i_b * stride_x_b, i_b * stride_z_b
        if PREFETCH:
            o_r = tl.arange(0, CHUNK)
            b_xw_n, b_xc_n, b_z_n = _chunk_inputs(x_buf + (i_s * H + h0) * CAP * P, p_x + h0 * stride_x_h, z,
                                                  o_z + h0 * stride_z_h, o_r, o_r < P, o_w, m_w, P, HAS_Z)
        for i_t in tl.range(0, HEADS * ROWS, CHUNK, num_stages=STAGES):
            i_h = h0 + i_t // ROWS
            i_sh = i_s * H + i_h
            o_r = i_t % ROWS + tl.arange(0, CHUNK)
            if PREFETCH:
                # As in mamba2_replay_kernel: this chunk's x, buffered x and z read a chunk ahead, the next
                # chunk's (of this head or the next) now.
                b_xw, b_xc, b_z = b_xw_n, b_xc_n, b_z_n
                i_hn = h0 + (i_t + CHUNK) // ROWS
                o_rn = (i_t + CHUNK) % ROWS + tl.arange(0, CHUNK)
                b_xw_n, b_xc_n, b_z_n = _chunk_inputs(x_buf + (i_s * H + i_hn) * CAP * P, p_x + i_hn * stride_x_h, z,
                                                      o_z + i_hn * stride_z_h, o_rn,
                                                      (o_rn < P) & (i_t + CHUNK < HEADS * ROWS), o_w, m_w, P, HAS_Z)
            else:
                b_xw, b_xc, b_z = None, None, None
            b_dt = step_delta(tl.load(dt + i_b * stride_dt_b + i_h * stride_dt_h), dt_bias, i_h, HAS_DT_BIAS,
                              USE_SOFTPLUS)
            p_lb, p_db, p_xb = lam_buf + i_sh * CAP, dt_buf + i_sh * CAP, x_buf + i_sh * CAP * P
            b_lam = tl.load(p_lb + f - 1, mask=f > 0, other=0.0) + tl.load(A + i_h).to(tl.float32) * b_dt
            b_kw = tl.exp(b_lam - tl.load(p_lb + o_w, mask=m_w, other=0.0)) * tl.load(p_db + o_w, mask=m_w, other=0.0)
            b_kw = tl.where(m_w, b_kw * b_cbw, 0.0)
            b_xc = _chunk_output(
                checkpoint, read_copy, read_scale, D, y + i_b * stride_y_b + i_h * stride_y_h, p_xb,
                p_x + i_h * stride_x_h, z, o_z + i_h * stride_z_h, i_h, i_s, i_sh, o_r, b_C3, b_kw, tl.exp(b_lam),
                b_dt * b_cb, o_n3, m_n3, o_w, m_w, P, stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s, stride_rc_h,
                stride_rc_p, HAS_D, HAS_Z, HAS_COPY, IS_FP8, b_xw, b_xc, b_z, PREFETCH, ck_scale, Q8,
            )
            # This token's entry: x's rows with each chunk, Δ and lam with each head's first.
            tl.store(p_xb + f * P + o_r, b_xc, mask=o_r < P)
            tl.store(p_db + f, b_dt, mask=i_t % ROWS == 0)
            tl.store(p_lb + f, b_lam, mask=i_t % ROWS == 0)
        if h0 % HPG == 0:
            tl.store(p_bb + f * N + o_n, b_Br, mask=m_n)
    advance_heads(fill + i_s * H, work, i_b, h0, f, W, HEADS, TAIL)


@triton.jit
def mamba2_heads_kernel(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, fill, work, ck_scale, seed, steps,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    NHP, NE,
    W: tl.constexpr, CAP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, PIECE: tl.constexpr,
    CHUNK: tl.constexpr, STAGES: tl.constexpr, HEADS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr,
    IS_FP8: tl.constexpr, PREFETCH: tl.constexpr, TAIL: tl.constexpr, FLUSH_CHUNK: tl.constexpr,
    FLUSH_STAGES: tl.constexpr, PRECISION: tl.constexpr, Q8: tl.constexpr = False, RANDOM: tl.constexpr = False,
):
    """A two-launch step's non-flush launch with HEADS heads of one group per program (whole heads, ROWS ≥ P): the
    group's C·B of the buffered entries is summed once for all of them, and one pipelined loop streams their tiles
    CHUNK rows at a time, head after head. Heads that flush are
    listed in `work` for `mamba2_flush_kernel`.

    With TAIL the flushes run in this launch instead: a flat grid of NHP heads programs and then flushing programs,
    in the order they start (`tail_ticket`), so that the flushing programs take the heads' places as those finish
    and flush each listed head (of at most NE) as soon as it is published (in FLUSH_CHUNK-row chunks, FLUSH_STAGES deep,
    products at PRECISION)."""
    if TAIL:
        i_t = tail_ticket(work)
        heads = i_t < NHP
        i_b, h0 = i_t % (NHP // (H // HEADS)), (i_t // (NHP // (H // HEADS))) * HEADS
    else:
        heads = True
        i_b, h0 = tl.program_id(0), tl.program_id(1) * HEADS
    if heads:
        _heads_step(
            x, dt, A, B, C, D, z, dt_bias, slots, y,
            checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, fill, work, ck_scale,
            H, G, P, N,
            stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p, stride_x_b, stride_x_h,
            stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, stride_z_b, stride_z_h,
            stride_y_b, stride_y_h, i_b, h0,
            W, CAP, ROWS, BN, BW, PIECE, CHUNK, STAGES, HEADS, HAS_D, HAS_Z, HAS_DT_BIAS, USE_SOFTPLUS, HAS_SLOTS,
            HAS_COPY, IS_FP8, PREFETCH, TAIL, Q8,
        )
        if TAIL:
            tail_heads_done(work)
    else:
        i_e = tail_claim(work)
        listed = tail_wait(work, i_e, NHP, NE)
        while listed:
            _flush_item(
                x, dt, A, B, C, D, z, dt_bias, slots, y,
                checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, work, i_e, 0,
                H, G, P, N,
                stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p, stride_x_b,
                stride_x_h, stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, stride_z_b,
                stride_z_h, stride_y_b, stride_y_h,
                CAP, ROWS, FLUSH_CHUNK, BN, BW, FLUSH_STAGES, HAS_D, HAS_Z, HAS_DT_BIAS, USE_SOFTPLUS, HAS_SLOTS,
                HAS_COPY, IS_FP8, PRECISION, ck_scale, seed, steps, Q8, RANDOM,
            )
            i_e = tail_claim(work)
            listed = tail_wait(work, i_e, NHP, NE)
        list_done(work, tl.num_programs(0) - NHP, slots, steps, HAS_SLOTS, RANDOM)


@triton.jit
def _flush_item(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, work, i_e, i_p,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    CAP: tl.constexpr, ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr,
    STAGES: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_SOFTPLUS: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr,
    PRECISION: tl.constexpr, ck_scale, seed, steps, Q8: tl.constexpr, RANDOM: tl.constexpr,
):
    """Rows i_p·ROWS .. of the flush the list's entry i_e names."""
    o_n, o_w = tl.arange(0, BN), tl.arange(0, BW)
    m_n = o_n < N
    i_b, i_h, f = listed_flush(work, i_e)
    i_g = i_h // (H // G)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    i_sh = i_s * H + i_h
    o_p = i_p * ROWS + tl.arange(0, ROWS)
    b_xr, b_Br, b_C, b_dt = _step_inputs(
        x, dt, B, C, dt_bias, i_b, i_h, i_g, o_p, o_p < P, o_n, m_n, stride_x_b, stride_x_h, stride_dt_b,
        stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, HAS_DT_BIAS, USE_SOFTPLUS)
    p_lb = lam_buf + i_sh * CAP
    m_w = o_w < f
    b_lam = tl.load(p_lb + f - 1, mask=f > 0, other=0.0) + tl.load(A + i_h).to(tl.float32) * b_dt
    b_cw = tl.where(m_w, tl.exp(b_lam - tl.load(p_lb + o_w, mask=m_w, other=0.0))
                    * tl.load(dt_buf + i_sh * CAP + o_w, mask=m_w, other=0.0), 0.0)
    _flush_rows(
        checkpoint, read_copy, read_scale, x, D, z, y + i_b * stride_y_b + i_h * stride_y_h,
        x_buf + i_sh * CAP * P, b_buf + (i_s * G + i_g) * CAP * N,
        i_b, i_h, i_p, i_s, i_sh, f, b_lam, b_cw, b_dt, b_Br.to(tl.float32), b_C,
        i_s * stride_ck_s + i_h * stride_ck_h, i_b * stride_z_b + i_h * stride_z_h, o_n, m_n, o_w,
        P, N, stride_x_b, stride_x_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p,
        ROWS, FLUSH_CHUNK, STAGES, HAS_D, HAS_Z, HAS_COPY, IS_FP8, PRECISION, ck_scale, seed, steps, Q8, RANDOM,
    )


@triton.jit
def mamba2_flush_kernel(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, work, ck_scale, seed, steps,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    CAP: tl.constexpr, ROWS: tl.constexpr, FLUSH_CHUNK: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr,
    STAGES: tl.constexpr, NPB: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    USE_SOFTPLUS: tl.constexpr, HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr,
    PRECISION: tl.constexpr, Q8: tl.constexpr = False, RANDOM: tl.constexpr = False,
):
    """The flushes the non-flush launch listed in `work` (mamba2.common's list), ROWS rows of a head per item: each
    program loops over the items, so the launch's programs are a few per SM however few rows flush. The last program
    to finish zeroes the list's header for the next step."""
    n_items = tl.load(work) * NPB
    n_programs = tl.num_programs(0)
    # A while loop: its bounds are device values (the interpreter's range takes only Python integers).
    i_j = tl.program_id(0)
    while i_j < n_items:
        _flush_item(
            x, dt, A, B, C, D, z, dt_bias, slots, y,
            checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, work, i_j // NPB, i_j % NPB,
            H, G, P, N,
            stride_ck_s, stride_ck_h, stride_ck_p, stride_rc_s, stride_rc_h, stride_rc_p, stride_x_b, stride_x_h,
            stride_dt_b, stride_dt_h, stride_B_b, stride_B_g, stride_C_b, stride_C_g, stride_z_b, stride_z_h,
            stride_y_b, stride_y_h,
            CAP, ROWS, FLUSH_CHUNK, BN, BW, STAGES, HAS_D, HAS_Z, HAS_DT_BIAS, USE_SOFTPLUS, HAS_SLOTS, HAS_COPY,
            IS_FP8, PRECISION, ck_scale, seed, steps, Q8, RANDOM,
        )
        i_j += n_programs
    list_done(work, n_programs, slots, steps, HAS_SLOTS, RANDOM)


@triton.jit
def mamba2_materialize_kernel(
    checkpoint, x_buf, b_buf, dt_buf, lam_buf, fill, slots, out, ck_scale,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_out_s, stride_out_h, stride_out_p,
    CAP: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr, JB: tl.constexpr, Q8: tl.constexpr = False,
):
    i_r, i_h = tl.program_id(0), tl.program_id(1)
    i_s = tl.load(slots + i_r).to(tl.int64)
    i_g = i_h // (H // G)
    i_sh = i_s * H + i_h
    o_p, o_n = tl.arange(0, ROWS), tl.arange(0, BN)
    m_p, m_n = o_p < P, o_n < N
    m_s = m_p[:, None] & m_n[None, :]
    p_ck = checkpoint + i_s * stride_ck_s + i_h * stride_ck_h + o_p[:, None] * stride_ck_p + o_n[None, :]
    b_s = tl.load(p_ck, mask=m_s, other=0.0).to(tl.float32)
    if Q8:
        b_s = b_s * tl.load(ck_scale + i_sh * P + o_p, mask=m_p, other=0.0)[:, None]
    f = tl.load(fill + i_sh)
    p_lb = lam_buf + i_sh * CAP
    b_lam = tl.load(p_lb + f - 1, mask=f > 0, other=0.0)
    b_s = fold_entries(b_s, b_lam, x_buf + i_sh * CAP * P, b_buf + (i_s * G + i_g) * CAP * N, dt_buf + i_sh * CAP,
                       p_lb, f, o_p, o_n, m_p, m_n, P, N, CAP, JB)
    p_out = out + i_r * stride_out_s + i_h * stride_out_h + o_p[:, None] * stride_out_p + o_n[None, :]
    tl.store(p_out, b_s, mask=m_s)


# These kernels mutate the cache, so they are not autotuned (a trial launch would advance it): each grid class and
# checkpoint width has a fixed row, chosen by `select` (measured on an H200, benchmarks/notes/).
@dataclass(frozen=True)
class StepConfig:
    """How one `replay` step is launched."""

    # rows of P per program of the non-flush step: 16 (small grids) or 64; a head whose P they do not divide takes one
    # program (rows_per_program)
    rows: int
    # rows per streamed chunk of the tile, 16, 32 or 64; a chunk covering `rows` reads the tile whole
    chunk: int
    # width of the pieces of N a thread sums in registers before a row's lanes meet: 32 or 64
    piece: int
    # depth of the streamed chunks' pipeline: 1 to 3
    stages: int
    # warps per program: 1 or 2
    warps: int
    # registers per thread the programs are capped at (more programs fit an SM): None (the compiler's choice) or
    # 96 to 168
    maxnreg: int | None
    # True: the slot read first, then the step's inputs and the whole buffer before the fill (a latency-bound grid)
    early: bool = False
    # how a flush folds the buffer (tl.dot's input precision): "ieee", "tf32x3", or "tf32" (2-byte checkpoints)
    precision: str = "ieee"
    # 1: the step in one launch; 8: the non-flush steps in a launch of programs of that many whole heads of a group
    # (lowered to a power of two dividing H / G; their buffered C·B summed once), the flushes after them
    heads: int = 1
    # with heads > 1: each chunk's x, buffered x and z read a chunk ahead
    prefetch: bool = False
    # with heads > 1: the flushes run in the heads launch's own programs, after the heads'; else in a second launch
    tail: bool = False
    # with heads > 1 and no tail: the flushes' launch's register cap (None: `maxnreg`)
    flush_maxnreg: int | None = None

    def __post_init__(self):
        _powers_of_two(self, "rows", "chunk", "piece", "warps", "heads")
        if self.precision not in common.PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(common.PRECISIONS)}, got {self.precision!r}")
        if self.heads == 1 and (self.prefetch or self.tail or self.flush_maxnreg is not None):
            raise ValueError("prefetch, tail and flush_maxnreg apply only to the heads launch (heads > 1)")
        if self.heads > 1 and self.early:
            raise ValueError("the heads launch reads the buffer after the fill: early must be False")
        if self.tail and self.flush_maxnreg is not None:
            raise ValueError("with tail the flushes run in the heads launch's programs: flush_maxnreg does not apply")


def _powers_of_two(config, *fields: str) -> None:
    for name in fields:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{type(config).__name__}.{name} must be a power of two, got {value!r}")


# 2-byte tiles (a bf16 checkpoint, a read copy) stream three chunks deep, reduced in 64-wide pieces; a small grid's
# programs take 16 rows with the slot and buffer read early and the flush in 3xTF32; a large grid's fp32 state caps
# its registers at 96, and its 2-byte tiles take the heads launch (a bf16 state: its flushes in its own programs, in
# one TF32 product, its chunks' inputs read ahead; an fp32 checkpoint's copy: its flushes in a launch of their own).
_SMALL_STEP = StepConfig(rows=16, chunk=16, piece=32, stages=1, warps=1, maxnreg=None, early=True, precision="tf32x3")
STEP_LAUNCH = {
    "replay-fp32": StepConfig(rows=64, chunk=32, piece=32, stages=2, warps=2, maxnreg=112),
    "replay-bf16": StepConfig(rows=64, chunk=32, piece=64, stages=3, warps=2, maxnreg=128),
    "replay-fp32-split": StepConfig(rows=64, chunk=32, piece=64, stages=3, warps=2, maxnreg=128),
    "replay-bf16-split": StepConfig(rows=64, chunk=32, piece=32, stages=3, warps=2, maxnreg=128),
    "replay-fp32-small": _SMALL_STEP,
    "replay-bf16-small": _SMALL_STEP,
    "replay-fp32-large": StepConfig(rows=64, chunk=32, piece=32, stages=2, warps=2, maxnreg=96),
    "replay-bf16-large": StepConfig(rows=64, chunk=64, piece=64, stages=3, warps=2, maxnreg=168, precision="tf32",
                                    heads=8, prefetch=True, tail=True),
    "replay-fp32-split-large": StepConfig(rows=64, chunk=64, piece=64, stages=3, warps=2, maxnreg=128, heads=8,
                                          flush_maxnreg=168),
    "replay-bf16-split-large": StepConfig(rows=64, chunk=32, piece=32, stages=3, warps=2, maxnreg=128),
}
# Grid classes in (row, head) programs per SM: a small grid (under 2) is latency-bound, a large one (80 and up) takes
# the heads launch.
SMALL_GRID, LARGE_GRID = 2, 80
# A flush walks its rows 16 at a time (the fold is one [16, BW] x [BW, BN] product); a flush launch has 6 programs per
# SM.
FLUSH_CHUNK, FLUSH_PROGRAMS_PER_SM = 16, 6


def _width(cache: ReplayCache) -> str:
    """A table key's checkpoint width: fp32, or bf16 for any 2-byte checkpoint (fp16 takes bf16's rows)."""
    return "fp32" if cache.checkpoint.element_size() == 4 else "bf16"


def select(cache: ReplayCache, batch: int) -> str:
    """The STEP_LAUNCH row a `replay` step of `batch` rows takes: by the checkpoint's width, its read copy and the
    grid's (row, head) programs per SM (medium on the CPU)."""
    per_sm = common.per_sm(batch * cache.shape[1], cache.device)
    split = "-split" if cache.read_copy is not None else ""
    if per_sm is not None and per_sm < SMALL_GRID:
        # a small grid's split steps take its rows too
        return f"replay-{_width(cache)}-small"
    if per_sm is not None and per_sm >= LARGE_GRID:
        return f"replay-{_width(cache)}{split}-large"
    return f"replay-{_width(cache)}{split}"


def check_cache(cache, kernel) -> tuple[int, int, int, int, int]:
    if not isinstance(cache, ReplayCache):
        raise ValueError(f"cache must be a ReplayCache, got {type(cache).__name__}")
    common.check_device(cache.device, kernel)
    families.check_read_dtype(cache.read_dtype, cache.device)
    families.check_state_dtype(cache.state_dtype, cache.device)
    if cache.checkpoint.stride(-1) != 1 or (cache.read_copy is not None and cache.read_copy.stride(-1) != 1):
        raise ValueError("cache.checkpoint and cache.read_copy must have unit stride on N")
    nslots, H, P, _ = cache.checkpoint.shape
    common.check_state_scale(cache.checkpoint_scale, cache.checkpoint, (nslots, H, P), "(nslots, H, P)",
                             "cache.checkpoint_scale")
    if cache.is_eight_bit and cache.read_copy is not None:
        raise ValueError("an 8-bit checkpoint takes no read copy (it is as narrow as one)")
    rnd.check_rounding(cache.rounding, cache.state_dtype, nslots, cache.device, cache.checkpoint.shape[-1])
    for name in ("x_buf", "b_buf", "dt_buf", "lam_buf", "b_draft", "fill", "arrive", "read_scale"):
        t = getattr(cache, name)
        if t is not None and not t.is_contiguous():
            raise ValueError(f"cache.{name} must be contiguous, as ReplayCache.create makes it")
    return cache.shape


@families.refuse_out_of_resources
def replay(cache: ReplayCache, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None,
           out=None, config: StepConfig | None = None, check: bool = True) -> torch.Tensor:
    """One ReplaySSM decode step (one launch, or two with the heads launch); same inputs and outputs as `decode`,
    state kept in `cache`.

    Each row at fill f appends (x, B, Δ, lam) to its slot's buffer and answers from the checkpoint (its
    read copy under split precision) plus the f buffered entries while f + 1 < W, writing no state. The
    row whose buffer would reach W entries folds the buffer and this token into a new checkpoint (and read
    copy), answers from it, and empties the buffer. Fill counters live on the device: no host sync, so
    the step can be captured in a CUDA graph; rows at different fills flush on their own steps.

    Args:
        cache: a ReplayCache; its checkpoint (and scales), read copy, buffers and fills are mutated. A flush stores
            the checkpoint as the cache rounds (to nearest, or stochastically by `cache.rounding`, whose counts of
            the rows' slots then advance by one, flushed or not); an 8-bit checkpoint is read times its row scales
            and stored as rows with new scales.
        x: (batch, H, P) and B: (batch, G, N) in cache.io_dtype (they are buffered as they come).
        dt: (batch, H). C: (batch, G, N). A, D, dt_bias: (H,). z: optional (batch, H, P).
        slots: (batch,) int32/int64 cache slot per row, -1 for a padding row (skipped, nothing written);
            default row b -> slot b.
        out: optional (batch, H, P) output; padding rows keep what it held.
        config: the launch settings (default: the STEP_LAUNCH row `select` chooses); for benchmarks.
        check: range-check `slots` on the host (a device sync); skipped while a CUDA graph is captured.

    Returns:
        y (batch, H, P) in x's dtype (or `out`).
    """
    nslots, H, P, N, G = check_cache(cache, mamba2_replay_kernel)
    batch, _, G_in = args.check_inputs(x, dt, A, B, C, D, z, dt_bias, H=H, P=P, N=N, device=cache.device,
                                       tokens=False, io_dtypes=(cache.io_dtype,))
    if G_in != G:
        raise ValueError(f"B must have the cache's G = {G} groups, got {G_in}")
    common.check_slots(slots, batch, nslots, cache.device, check)
    args.check_out(out, (batch, H, P), "(batch, H, P)", cache.device)
    c = STEP_LAUNCH[select(cache, batch)] if config is None else config
    # before any launch, so that a refused setting leaves the cache as it was
    common.check_precision(cache.checkpoint, c.precision)
    hpp = c.heads
    while (H // G) % hpp:
        hpp //= 2
    y = torch.empty_like(x) if out is None else out
    step = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, slots=slots, y=y)
    softplus = bool(dt_softplus)
    if c.heads == 1:
        _launch_replay(cache, step, batch, softplus, c, 0)
    elif c.tail and hpp > 1:
        _launch_heads(cache, step, batch, softplus, c, hpp, tail=True)
    else:
        if hpp > 1:
            _launch_heads(cache, step, batch, softplus, c, hpp)
        else:
            _launch_replay(cache, step, batch, softplus, c, 1)
        _launch_flushes(cache, step, batch, softplus, c)
    return y


def _launch_heads(cache: ReplayCache, step: dict, batch: int, softplus: bool, c: StepConfig, hpp: int,
                  tail: bool = False) -> None:
    """The heads launch; with `tail`, its flushes too, in FLUSH_PROGRAMS_PER_SM programs per SM after the heads'."""
    _, H, P, N, G = cache.shape
    BN = max(16, common.block(N))
    rc = cache.read_copy
    nhp = batch * (H // hpp)
    if tail:
        grid = (nhp + common.flush_grid(batch * H, FLUSH_PROGRAMS_PER_SM, cache.device)[0],)
        flush = {"FLUSH_STAGES": c.stages, "PRECISION": c.precision}
    else:
        grid, flush = (batch, H // hpp), {"FLUSH_STAGES": 1, "PRECISION": "ieee"}
    mamba2_heads_kernel[grid](
        **step,
        checkpoint=cache.checkpoint, read_copy=rc, read_scale=cache.read_scale, x_buf=cache.x_buf,
        b_buf=cache.b_buf, dt_buf=cache.dt_buf, lam_buf=cache.lam_buf, fill=cache.fill, work=cache.work,
        H=H, G=G, P=P, N=N,
        **_strides(cache, step),
        NHP=nhp, NE=(cache.work.numel() - LIST_HEADER.value) // LIST_ENTRY.value,
        W=cache.window, CAP=cache.capacity, ROWS=common.block(P), BN=BN, BW=max(16, common.block(cache.capacity)),
        PIECE=min(c.piece, BN), CHUNK=min(c.chunk, common.block(P)), STAGES=c.stages, HEADS=hpp,
        HAS_D=step["D"] is not None, HAS_Z=step["z"] is not None, HAS_DT_BIAS=step["dt_bias"] is not None,
        USE_SOFTPLUS=softplus, HAS_SLOTS=step["slots"] is not None, HAS_COPY=rc is not None,
        IS_FP8=cache.read_scale is not None, PREFETCH=c.prefetch, TAIL=tail, FLUSH_CHUNK=FLUSH_CHUNK, **flush,
        **store_args(cache),
        **common.compile_options(c.warps, c.maxnreg),
    )


def store_args(cache: ReplayCache) -> dict:
    """How a launch stores the checkpoint: its 8-bit rows' scales and the stochastic rounding's seed and counts
    (compile-time Nones and False when the checkpoint is 16-bit or fp32 and rounded to nearest)."""
    seed, steps, random = rnd.rounding_args(cache.rounding)
    return dict(ck_scale=cache.checkpoint_scale, seed=seed, steps=steps, Q8=cache.is_eight_bit, RANDOM=random)


def _strides(cache: ReplayCache, step: dict) -> dict:
    x, dt, B, C, z, y = (step[name] for name in ("x", "dt", "B", "C", "z", "y"))
    ck, rc = cache.checkpoint, cache.read_copy
    rcs = rc.stride() if rc is not None else (0, 0, 0, 0)
    zs = z.stride() if z is not None else (0, 0, 0)
    return dict(
        stride_ck_s=ck.stride(0), stride_ck_h=ck.stride(1), stride_ck_p=ck.stride(2),
        stride_rc_s=rcs[0], stride_rc_h=rcs[1], stride_rc_p=rcs[2],
        stride_x_b=x.stride(0), stride_x_h=x.stride(1),
        stride_dt_b=dt.stride(0), stride_dt_h=dt.stride(1),
        stride_B_b=B.stride(0), stride_B_g=B.stride(1),
        stride_C_b=C.stride(0), stride_C_g=C.stride(1),
        stride_z_b=zs[0], stride_z_h=zs[1],
        stride_y_b=y.stride(0), stride_y_h=y.stride(1),
    )


def rows_per_program(c: StepConfig, P: int) -> int:
    """Rows of P a program of the non-flush step and of the flushes' launch takes: the row's, or the whole head (P up
    to a power of two) where the row's do not divide P and the head is at most two of them, whose second program
    would otherwise hold only the remainder (Nemotron-3-Nano-4B's P = 80: 21-26% slower in 64-row programs than in
    whole heads, benchmarks/notes/run-76.md)."""
    whole = common.block(P)
    return whole if P % c.rows and whole <= 2 * c.rows else c.rows


def _launch_flushes(cache: ReplayCache, step: dict, batch: int, softplus: bool, c: StepConfig) -> None:
    """The flushes the non-flush launch listed: a few programs per SM (all of them on the CPU), each looping over
    the items."""
    _, H, P, N, G = cache.shape
    ROWS = rows_per_program(c, P)
    NPB = triton.cdiv(P, ROWS)
    items = batch * H * NPB
    mamba2_flush_kernel[common.flush_grid(items, FLUSH_PROGRAMS_PER_SM, cache.device)](
        **step,
        checkpoint=cache.checkpoint, read_copy=cache.read_copy, read_scale=cache.read_scale, x_buf=cache.x_buf,
        b_buf=cache.b_buf, dt_buf=cache.dt_buf, lam_buf=cache.lam_buf, work=cache.work,
        H=H, G=G, P=P, N=N,
        **_strides(cache, step),
        CAP=cache.capacity, ROWS=ROWS, FLUSH_CHUNK=FLUSH_CHUNK, BN=max(16, common.block(N)),
        BW=max(16, common.block(cache.capacity)), STAGES=c.stages, NPB=NPB,
        HAS_D=step["D"] is not None, HAS_Z=step["z"] is not None, HAS_DT_BIAS=step["dt_bias"] is not None,
        USE_SOFTPLUS=softplus, HAS_SLOTS=step["slots"] is not None, HAS_COPY=cache.read_copy is not None,
        IS_FP8=cache.read_scale is not None, PRECISION=c.precision, **store_args(cache),
        **common.compile_options(c.warps, c.maxnreg if c.flush_maxnreg is None else c.flush_maxnreg),
    )


def _launch_replay(cache: ReplayCache, step: dict, batch: int, softplus: bool, c: StepConfig, phase: int) -> None:
    _, H, P, N, G = cache.shape
    ROWS = rows_per_program(c, P)
    BN = max(16, common.block(N))
    rc = cache.read_copy
    mamba2_replay_kernel[(batch, H, triton.cdiv(P, ROWS))](
        **step,
        checkpoint=cache.checkpoint, read_copy=rc, read_scale=cache.read_scale, x_buf=cache.x_buf,
        b_buf=cache.b_buf, dt_buf=cache.dt_buf, lam_buf=cache.lam_buf, fill=cache.fill, arrive=cache.arrive,
        work=cache.work,
        H=H, G=G, P=P, N=N,
        **_strides(cache, step),
        W=cache.window, CAP=cache.capacity, ROWS=ROWS, FLUSH_CHUNK=FLUSH_CHUNK, BN=BN,
        BW=max(16, common.block(cache.capacity)), PIECE=min(c.piece, BN), CHUNK=min(c.chunk, ROWS), STAGES=c.stages,
        NPB=triton.cdiv(P, ROWS),
        HAS_D=step["D"] is not None, HAS_Z=step["z"] is not None, HAS_DT_BIAS=step["dt_bias"] is not None,
        USE_SOFTPLUS=softplus,
        HAS_SLOTS=step["slots"] is not None, HAS_COPY=rc is not None, IS_FP8=cache.read_scale is not None,
        EARLY=c.early, PRECISION=c.precision, PHASE=phase, PREFETCH=c.prefetch, **store_args(cache),
        step_arrive=rnd.step_arrivals(cache.rounding),
        **common.compile_options(c.warps, c.maxnreg),
    )


@dataclass(frozen=True)
class MaterializeConfig:
    """How `materialize` is launched: one program per (slot, head) folds the whole (P, N) tile."""

    # warps per program: 4 to 16, more for larger tiles
    warps: int


MATERIALIZE_LAUNCH = {
    "materialize-fp32-n64-p64": MaterializeConfig(warps=4),
    "materialize-fp32-n128-p64": MaterializeConfig(warps=8),
    "materialize-fp32-n128-p128": MaterializeConfig(warps=8),
    "materialize-fp32": MaterializeConfig(warps=16),
    "materialize-bf16-n128-p64": MaterializeConfig(warps=4),
    "materialize-bf16-n128-p128": MaterializeConfig(warps=8),
    "materialize-bf16": MaterializeConfig(warps=16),
}
# The buffered entries folded as rank-1 updates this many at a time.
MATERIALIZE_ENTRIES = 4


def select_materialize(cache: ReplayCache) -> str:
    """The MATERIALIZE_LAUNCH row of this cache: the first whose N and P bounds (in its name) cover the shape."""
    _, _, P, N, _ = cache.shape
    prefix = f"materialize-{_width(cache)}"
    for name in MATERIALIZE_LAUNCH:
        if name.startswith(prefix + "-"):
            n, p = (int(part[1:]) for part in name[len(prefix) + 1:].split("-"))
            if N <= n and P <= p:
                return name
    return prefix


@families.refuse_out_of_resources
def materialize(cache: ReplayCache, slots=None, *, config: MaterializeConfig | None = None) -> torch.Tensor:
    """Full fp32 states (len(slots), H, P, N): each slot's checkpoint folded with its committed buffer entries.

    For tests, prefix caching and debugging; not on the decode path (an 8-bit checkpoint is taken as its rows
    times their scales). slots: 1-D tensor or list of slot indices (default: every slot). The cache is not changed. config: the launch (default: `select_materialize`'s).
    """
    nslots, H, P, N, G = check_cache(cache, mamba2_materialize_kernel)
    idx = cache.slot_index(slots, "slots")
    ck = cache.checkpoint
    out = torch.empty((idx.shape[0], H, P, N), dtype=torch.float32, device=cache.device)
    if idx.shape[0] == 0:
        return out
    c = MATERIALIZE_LAUNCH[select_materialize(cache)] if config is None else config
    mamba2_materialize_kernel[(idx.shape[0], H)](
        checkpoint=ck, x_buf=cache.x_buf, b_buf=cache.b_buf, dt_buf=cache.dt_buf, lam_buf=cache.lam_buf,
        fill=cache.fill, slots=idx, out=out, ck_scale=cache.checkpoint_scale,
        H=H, G=G, P=P, N=N,
        stride_ck_s=ck.stride(0), stride_ck_h=ck.stride(1), stride_ck_p=ck.stride(2),
        stride_out_s=out.stride(0), stride_out_h=out.stride(1), stride_out_p=out.stride(2),
        CAP=cache.capacity, ROWS=common.block(P), BN=common.block(N), JB=MATERIALIZE_ENTRIES,
        Q8=cache.is_eight_bit,
        **common.compile_options(c.warps, None),
    )
    return out
