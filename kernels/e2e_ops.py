"""The whole-model step's non-SSM kernels: residual add with RMS norm, the short causal convolution, Mamba-2's gated norm,
the fused QKV split with norms and rotary into the KV cache, and fp8 quantization of activations."""

from __future__ import annotations
import torch
import triton
import triton.language as tl

CONV_WIDTH = 4
EPS = 1e-6


@triton.jit
def _add_rms_norm_kernel(h, r, w, y, s_hb, s_rb, s_yb, D, eps, HAS_ADD: tl.constexpr, BD: tl.constexpr):
    i_b = tl.program_id(0)
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    b_h = tl.load(h + i_b * s_hb + o_d, mask=m_d, other=0.0).to(tl.float32)
    if HAS_ADD:
        b_h += tl.load(r + i_b * s_rb + o_d, mask=m_d, other=0.0).to(tl.float32)
        tl.store(h + i_b * s_hb + o_d, b_h.to(h.dtype.element_ty), mask=m_d)
    b_rs = tl.rsqrt(tl.sum(b_h * b_h, 0) / D + eps)
    b_w = tl.load(w + o_d, mask=m_d, other=0.0).to(tl.float32)
    tl.store(y + i_b * s_yb + o_d, (b_h * b_rs * b_w).to(y.dtype.element_ty), mask=m_d)


@triton.jit
def _conv_update_kernel(x, state, w, bias, y, s_xb, s_sb, s_st, s_yb, C, BC: tl.constexpr):
    i_b, i_c = tl.program_id(0), tl.program_id(1)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    p_s = state + i_b * s_sb + o_c
    b_x = tl.load(x + i_b * s_xb + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_s0 = tl.load(p_s, mask=m_c, other=0.0).to(tl.float32)
    b_s1 = tl.load(p_s + s_st, mask=m_c, other=0.0).to(tl.float32)
    b_s2 = tl.load(p_s + 2 * s_st, mask=m_c, other=0.0).to(tl.float32)
    b_acc = tl.load(bias + o_c, mask=m_c, other=0.0).to(tl.float32)
    b_acc += b_s0 * tl.load(w + o_c * 4, mask=m_c, other=0.0).to(tl.float32)
    b_acc += b_s1 * tl.load(w + o_c * 4 + 1, mask=m_c, other=0.0).to(tl.float32)
    b_acc += b_s2 * tl.load(w + o_c * 4 + 2, mask=m_c, other=0.0).to(tl.float32)
    b_acc += b_x * tl.load(w + o_c * 4 + 3, mask=m_c, other=0.0).to(tl.float32)
    tl.store(p_s, b_s1.to(state.dtype.element_ty), mask=m_c)
    tl.store(p_s + s_st, b_s2.to(state.dtype.element_ty), mask=m_c)
    tl.store(p_s + 2 * s_st, b_x.to(state.dtype.element_ty), mask=m_c)
    b_y = b_acc * tl.sigmoid(b_acc)
    tl.store(y + i_b * s_yb + o_c, b_y.to(y.dtype.element_ty), mask=m_c)


@triton.jit
def _gated_rms_norm_kernel(x, z, w, y, s_xb, s_zb, s_yb, GS, eps, BG: tl.constexpr):
    i_b, i_g = tl.program_id(0), tl.program_id(1)
    o_g = tl.arange(0, BG)
    m_g = o_g < GS
    o_d = i_g * GS + o_g
    b_x = tl.load(x + i_b * s_xb + o_d, mask=m_g, other=0.0).to(tl.float32)
    b_z = tl.load(z + i_b * s_zb + o_d, mask=m_g, other=0.0).to(tl.float32)
    b_x = b_x * b_z * tl.sigmoid(b_z)
    b_rs = tl.rsqrt(tl.sum(b_x * b_x, 0) / GS + eps)
    b_w = tl.load(w + o_d, mask=m_g, other=0.0).to(tl.float32)
    tl.store(y + i_b * s_yb + o_d, (b_x * b_rs * b_w).to(y.dtype.element_ty), mask=m_g)


@triton.jit
def _qk_prepare_kernel(
    qkv, q, kc, vc, w_qk, cos, sin,
    s_xb, s_qb, s_qh, s_kb, s_kh, s_kt, s_vb, s_vh, s_vt,
    pos, eps,
    NH: tl.constexpr, NKV: tl.constexpr, HD: tl.constexpr, QW: tl.constexpr, R: tl.constexpr,
    IS_QK_NORM: tl.constexpr, BD: tl.constexpr,
):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    o_d = tl.arange(0, BD)
    m_d = o_d < HD
    # Row layout: QW query-width heads (queries, then gates when gated), NKV keys, NKV values.
    src = tl.where(i_h < NH, i_h, QW + i_h - NH) * HD
    p_x = qkv + i_b * s_xb + src
    b_x = tl.load(p_x + o_d, mask=m_d, other=0.0).to(tl.float32)
    if i_h >= NH + NKV:
        tl.store(vc + i_b * s_vb + (i_h - NH - NKV) * s_vh + pos * s_vt + o_d, b_x.to(vc.dtype.element_ty), mask=m_d)
    else:
        p_w = w_qk + (i_h >= NH).to(tl.int32) * HD
        b_rs = 1.0
        if IS_QK_NORM:
            b_rs = tl.rsqrt(tl.sum(b_x * b_x, 0) / HD + eps)
            b_x = b_x * b_rs * tl.load(p_w + o_d, mask=m_d, other=0.0).to(tl.float32)
        b_y = b_x
        if R > 0:
            m_r = o_d < R
            o_c = tl.where(o_d < R // 2, o_d, o_d - R // 2)
            o_p = tl.where(o_d < R // 2, o_d + R // 2, o_d - R // 2)
            b_p = tl.load(p_x + o_p, mask=m_r, other=0.0).to(tl.float32)
            if IS_QK_NORM:
                b_p = b_p * b_rs * tl.load(p_w + o_p, mask=m_r, other=0.0).to(tl.float32)
            b_cos = tl.load(cos + o_c, mask=m_r, other=1.0)
            b_sin = tl.load(sin + o_c, mask=m_r, other=0.0)
            b_sign = tl.where(o_d < R // 2, -1.0, 1.0)
            b_y = tl.where(m_r, b_x * b_cos + b_sign * b_p * b_sin, b_x)
        if i_h < NH:
            tl.store(q + i_b * s_qb + i_h * s_qh + o_d, b_y.to(q.dtype.element_ty), mask=m_d)
        else:
            tl.store(kc + i_b * s_kb + (i_h - NH) * s_kh + pos * s_kt + o_d, b_y.to(kc.dtype.element_ty), mask=m_d)


def add_rms_norm(h: torch.Tensor, r: torch.Tensor | None, w: torch.Tensor, y: torch.Tensor, *, eps: float = EPS) -> None:
    """y = rms_norm(h + r) * w with h updated to h + r in place (the residual add); r None: y = rms_norm(h) * w.

    h, r, y (batch, D) with unit stride along D; w (D,).
    """
    batch, D = h.shape
    if y.shape != h.shape or w.shape != (D,) or (r is not None and r.shape != h.shape):
        raise ValueError(f"add_rms_norm takes h, r, y of one shape (batch, D) and w (D,); got {tuple(h.shape)}, {tuple(w.shape)}")
    _add_rms_norm_kernel[(batch,)](
        h=h, r=r if r is not None else h, w=w, y=y,
        s_hb=h.stride(0), s_rb=(r if r is not None else h).stride(0), s_yb=y.stride(0),
        D=D, eps=eps, HAS_ADD=r is not None, BD=triton.next_power_of_2(D),
        num_warps=8 if D > 2048 else 4,
    )


def conv_update(x: torch.Tensor, state: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, y: torch.Tensor) -> None:
    """One step of the short causal convolution (width 4) with SiLU; updates `state` in place.

    x (batch, C) the new inputs, any row stride; state (batch, 3, C) the last three inputs, oldest
    first; w (C, 4) the taps, oldest first; bias (C,); y (batch, C) silu(w · [state, x] + bias).
    """
    batch, C = x.shape
    if state.shape != (batch, CONV_WIDTH - 1, C) or w.shape != (C, CONV_WIDTH) or y.shape != (batch, C):
        raise ValueError(f"conv_update takes x (batch, C), state (batch, 3, C), w (C, 4), y (batch, C); got {tuple(x.shape)}, {tuple(state.shape)}, {tuple(w.shape)}")
    BC = min(triton.next_power_of_2(C), 1024)
    _conv_update_kernel[(batch, triton.cdiv(C, BC))](
        x=x, state=state, w=w, bias=bias, y=y,
        s_xb=x.stride(0), s_sb=state.stride(0), s_st=state.stride(1), s_yb=y.stride(0),
        C=C, BC=BC, num_warps=4,
    )


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, y: torch.Tensor, group: int, *, eps: float = EPS) -> None:
    """y = rms_norm(x * silu(z)) * w over groups of `group` channels, as Mamba-2's gated norm.

    x, z, y (batch, D) with unit stride along D (any row stride); w (D,); D a multiple of group.
    """
    batch, D = x.shape
    if D % group or z.shape != x.shape or y.shape != x.shape:
        raise ValueError(f"gated_rms_norm takes x, z, y (batch, D) with D a multiple of group={group}; got {tuple(x.shape)}")
    _gated_rms_norm_kernel[(batch, D // group)](
        x=x, z=z, w=w, y=y, s_xb=x.stride(0), s_zb=z.stride(0), s_yb=y.stride(0),
        GS=group, eps=eps, BG=triton.next_power_of_2(group), num_warps=4 if group <= 2048 else 8,
    )


def qk_prepare(
    qkv: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, w_qk: torch.Tensor,
    cos: torch.Tensor, sin: torch.Tensor, *, pos: int, heads: int, kv_heads: int, q_width: int, rotary: int,
    qk_norm: bool, kv_layout: str = "bhtd", eps: float = EPS,
) -> None:
    """Split a fused QKV row: queries (RMS-normed and rotated) into q, keys (the same) and values into the KV cache at `pos`.

    qkv (batch, (q_width + 2 kv_heads) head_dim): q_width query-width heads (queries, then output gates
    when q_width = 2 heads), keys, values; q (batch, heads, head_dim); k_cache, v_cache (batch,
    kv_heads, T, head_dim) for kv_layout "bhtd" or (batch, T, kv_heads, head_dim) for "bthd"; w_qk
    (2, head_dim) the query and key norm weights; cos, sin (rotary // 2,) fp32 at `pos`; rotary the
    leading dims rotated (NeoX halves, 0 for none).
    """
    batch, _, hd = q.shape
    h_dim, t_dim = (1, 2) if kv_layout == "bhtd" else (2, 1)
    if rotary % 2 or rotary > hd:
        raise ValueError(f"rotary dims must be even and at most head_dim={hd}; got {rotary}")
    _qk_prepare_kernel[(batch, heads + 2 * kv_heads)](
        qkv=qkv, q=q, kc=k_cache, vc=v_cache, w_qk=w_qk, cos=cos, sin=sin,
        s_xb=qkv.stride(0), s_qb=q.stride(0), s_qh=q.stride(1),
        s_kb=k_cache.stride(0), s_kh=k_cache.stride(h_dim), s_kt=k_cache.stride(t_dim),
        s_vb=v_cache.stride(0), s_vh=v_cache.stride(h_dim), s_vt=v_cache.stride(t_dim),
        pos=pos, eps=eps, NH=heads, NKV=kv_heads, HD=hd, QW=q_width, R=rotary,
        IS_QK_NORM=qk_norm, BD=triton.next_power_of_2(hd), num_warps=4,
    )


@triton.jit
def _fp8_quant_kernel(x, y, s_xb, s_yb, N, inv_scale, BN: tl.constexpr):
    i_b, i_n = tl.program_id(0), tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_x = tl.load(x + i_b * s_xb + o_n, mask=m_n, other=0.0).to(tl.float32) * inv_scale
    # Saturate: e4m3fn has no infinity, and a cast past +-448 gives NaN.
    b_x = tl.minimum(tl.maximum(b_x, -448.0), 448.0)
    tl.store(y + i_b * s_yb + o_n, b_x.to(y.dtype.element_ty), mask=m_n)


def fp8_quantize(x: torch.Tensor, scale: float, out: torch.Tensor) -> torch.Tensor:
    """out = saturate(x / scale) in fp8 e4m3, row by row (x and out: (rows, N), unit stride along N); returns out."""
    rows, n = x.shape
    bn = min(1024, triton.next_power_of_2(n))
    _fp8_quant_kernel[(rows, triton.cdiv(n, bn))](x, out, s_xb=x.stride(0), s_yb=out.stride(0), N=n, inv_scale=1.0 / scale,
                                                  BN=bn, num_warps=4)
    return out
