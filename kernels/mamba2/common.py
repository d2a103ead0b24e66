"""Triton pieces every Mamba-2 kernel shares: Δ, the D and gate terms, folding buffered entries, the read copy, how
a state's rows are loaded and stored."""

from __future__ import annotations

import triton
import triton.language as tl

from replayssm_kernels.common import scalar_mask
from replayssm_kernels.rounding import quantized_rows, rounded, row_bits

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def step_delta(b_dt, dt_bias, i_h, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr):
    b_dt = b_dt.to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(dt_bias + i_h).to(tl.float32)
    if USE_SOFTPLUS:
        b_dt = tl.where(b_dt <= 20.0, tl.log(1.0 + tl.exp(b_dt)), b_dt)
    return b_dt


@triton.jit
def finish_output(b_y, b_x, D, z, o_z, m_p, i_h, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    if HAS_D:
        b_y += tl.load(D + i_h).to(tl.float32) * b_x
    if HAS_Z:
        b_y = z_gate(b_y, tl.load(z + o_z, mask=m_p, other=0.0))
    return b_y


@triton.jit
def z_gate(b_y, b_z):
    """y gated by the SiLU of z (as loaded)."""
    b_z = b_z.to(tl.float32)
    return b_y * b_z * tl.sigmoid(b_z)


@triton.jit
def fold_entries(b_s, b_lam, p_x, p_b, p_dt, p_lam, n, o_p, o_n, m_p, m_n, P, N,
                 CAP: tl.constexpr, JB: tl.constexpr):
    # b_s [ROWS, BN] -> exp(lam) b_s + sum_{j<n} exp(lam - lam_j) dt_j x_j B_j^T, as rank-1 updates JB at a time
    b_s = b_s * tl.exp(b_lam)
    for j0 in range(0, CAP, JB):
        if j0 < n:
            for jj in tl.static_range(JB):
                j = j0 + jj
                m_j = scalar_mask(j < n)
                b_lj = tl.load(p_lam + j, mask=m_j, other=0.0)
                b_c = tl.where(m_j, tl.load(p_dt + j, mask=m_j, other=0.0) * tl.exp(b_lam - b_lj), 0.0)
                b_xj = tl.load(p_x + j * P + o_p, mask=m_p & m_j, other=0.0).to(tl.float32)
                b_bj = tl.load(p_b + j * N + o_n, mask=m_n & m_j, other=0.0).to(tl.float32)
                b_s += (b_c * b_xj)[:, None] * b_bj[None, :]
    return b_s


@triton.jit
def store_read_copy(b_s, p_copy, read_scale, o_scale, m_s, m_p, IS_FP8: tl.constexpr):
    if IS_FP8:
        b_scale = tl.max(tl.abs(b_s), axis=1) / FP8_MAX
        b_q = b_s / tl.where(b_scale > 0, b_scale, 1.0)[:, None]
        # Round to e4m3's 3 mantissa bits here so the cast is exact: Triton's interpreter does not round fp8 casts.
        b_bits = b_q.to(tl.int32, bitcast=True)
        b_bits = (b_bits + 0x7FFFF + ((b_bits >> 20) & 1)) & -0x100000
        b_q = b_bits.to(tl.float32, bitcast=True)
        tl.store(read_scale + o_scale, b_scale, mask=m_p)
        tl.store(p_copy, b_q.to(p_copy.dtype.element_ty), mask=m_s)
    else:
        tl.store(p_copy, b_s.to(p_copy.dtype.element_ty), mask=m_s)


@triton.jit
def load_rows(p_s, m_s, scale, o_r, m_r, Q8: tl.constexpr):
    """State rows [R, BN] as fp32: as stored, or with Q8 8-bit rows times their scales (scale + o_r, [R])."""
    b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    if Q8:
        b_s = b_s * tl.load(scale + o_r, mask=m_r, other=0.0)[:, None]
    return b_s


@triton.jit
def store_rows(p_s, b_s, m_s, scale, o_sc, m_r, b_key, o_p, N, Q8: tl.constexpr, RANDOM: tl.constexpr):
    """fp32 rows b_s [R, BN] (rows o_p of a (slot, head) state, element p·N + n, whole over N; masked elements zero)
    stored in the state's dtype: a cast (to nearest), with RANDOM rounded stochastically by the bits of the store's
    key b_key (`rounding.store_key`), or with Q8 as 8-bit rows and their scales (scale + o_sc, [R])."""
    DTYPE: tl.constexpr = p_s.dtype.element_ty
    BN: tl.constexpr = b_s.shape[1]
    if RANDOM:
        b_r = row_bits(b_key, o_p, N, 0, BN)
    else:
        b_r = tl.zeros(b_s.shape, dtype=tl.uint32)
    if Q8:
        b_q, b_scale = quantized_rows(b_s, b_r, DTYPE, RANDOM)
        tl.store(p_s, b_q, mask=m_s)
        tl.store(scale + o_sc, b_scale, mask=m_r)
    elif RANDOM:
        tl.store(p_s, rounded(b_s, b_r, DTYPE, True).to(DTYPE), mask=m_s)
    else:
        tl.store(p_s, b_s.to(DTYPE), mask=m_s)
