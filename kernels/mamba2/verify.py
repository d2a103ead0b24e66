"""ReplaySSM speculative decode for Mamba-2: verify T drafts from one checkpoint read, then accept a prefix."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_kernels.mamba2 import args
from replayssm_kernels.mamba2.cache import ReplayCache
from replayssm_kernels.mamba2.common import finish_output, step_delta, store_read_copy
from replayssm_kernels.mamba2.replay import check_cache


@triton.jit
def answer_drafts(b_s, o_r, m_r, b_xd, b_Bd, b_dtd, b_lamd, o_t, b_xw, b_bw, b_lw, b_dw, m_w, o_n, m_n,
                  p_C, p_x, p_y, z, o_z, D, i_h, stride_C_t, stride_x_t, stride_y_t, stride_z_t,
                  T: tl.constexpr, HAS_COMMITTED: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    # y_t over the P rows o_r of tile b_s [R, BN], from drafts 0..t (b_xd [BT, R]) and committed entries (b_xw [BW, R])
    for t in tl.static_range(T):
        b_lt = tl.sum(tl.where(o_t == t, b_lamd, 0.0), axis=0)
        b_C = tl.load(p_C + t * stride_C_t + o_n, mask=m_n, other=0.0).to(tl.float32)
        b_cd = tl.where(o_t <= t, tl.exp(b_lt - b_lamd) * b_dtd * tl.sum(b_Bd * b_C[None, :], axis=1), 0.0)
        b_y = tl.exp(b_lt) * tl.sum(b_s * b_C[None, :], axis=1) + tl.sum(b_cd[:, None] * b_xd, axis=0)
        if HAS_COMMITTED:
            b_cw = tl.where(m_w, tl.exp(b_lt - b_lw) * b_dw * tl.sum(b_bw * b_C[None, :], axis=1), 0.0)
            b_y += tl.sum(b_cw[:, None] * b_xw, axis=0)
        b_xt = tl.load(p_x + t * stride_x_t + o_r, mask=m_r, other=0.0).to(tl.float32)
        b_y = finish_output(b_y, b_xt, D, z, o_z + t * stride_z_t + o_r, m_r, i_h, HAS_D, HAS_Z)
        tl.store(p_y + t * stride_y_t + o_r, b_y.to(p_y.dtype.element_ty), mask=m_r)


@triton.jit
def mamba2_verify_kernel(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, b_draft, fill, arrive,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_t, stride_x_h,
    stride_dt_b, stride_dt_t, stride_dt_h,
    stride_B_b, stride_B_t, stride_B_g,
    stride_C_b, stride_C_t, stride_C_g,
    stride_z_b, stride_z_t, stride_z_h,
    stride_y_b, stride_y_t, stride_y_h,
    T: tl.constexpr, MAXT: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr,
    BP: tl.constexpr, BN: tl.constexpr, BW: tl.constexpr, BF: tl.constexpr, BT: tl.constexpr, NPB: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr,
    HAS_SLOTS: tl.constexpr, USE_COPY: tl.constexpr, IS_FP8: tl.constexpr,
):
    i_b, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if HAS_SLOTS:
        i_s = tl.load(slots + i_b).to(tl.int64)
        if i_s < 0:
            return
    else:
        i_s = i_b.to(tl.int64)
    HPG = H // G
    i_g = i_h // HPG
    i_sh = i_s * H + i_h
    o_p, o_n, o_w, o_t = i_p * BP + tl.arange(0, BP), tl.arange(0, BN), tl.arange(0, BW), tl.arange(0, BT)
    m_p, m_n, m_t = o_p < P, o_n < N, o_t < T
    m_s = m_p[:, None] & m_n[None, :]

    # The tile read bounds the step, so it is issued before anything it does not depend on.
    if USE_COPY:
        p_rc = read_copy + i_s * stride_rc_s + i_h * stride_rc_h + o_p[:, None] * stride_rc_p + o_n[None, :]
        b_r = tl.load(p_rc, mask=m_s, other=0.0)
        if IS_FP8:
            b_scale = tl.load(read_scale + i_sh * P + o_p, mask=m_p, other=0.0)
    else:
        p_ck = checkpoint + i_s * stride_ck_s + i_h * stride_ck_h + o_p[:, None] * stride_ck_p + o_n[None, :]
        b_r = tl.load(p_ck, mask=m_s, other=0.0)
    f = tl.load(fill + i_sh)
    p_xb = x_buf + i_sh * CAP * P
    p_bb = b_buf + (i_s * G + i_g) * CAP * N
    p_db = dt_buf + i_sh * CAP
    p_lb = lam_buf + i_sh * CAP
    p_C = C + i_b * stride_C_b + i_g * stride_C_g
    p_x = x + i_b * stride_x_b + i_h * stride_x_h
    p_y = y + i_b * stride_y_b + i_h * stride_y_h
    o_z = i_b * stride_z_b + i_h * stride_z_h

    # committed entries the drafts follow: none when the row folds first
    f_c = tl.where(f >= W, 0, f)
    m_w = o_w < f_c
    b_lw = tl.load(p_lb + o_w, mask=m_w, other=0.0)
    b_dw = tl.load(p_db + o_w, mask=m_w, other=0.0)
    # [BW, BP], [BW, BN]
    b_xw = tl.load(p_xb + o_w[:, None] * P + o_p[None, :], mask=m_w[:, None] & m_p[None, :], other=0.0)
    b_bw = tl.load(p_bb + o_w[:, None] * N + o_n[None, :], mask=m_w[:, None] & m_n[None, :], other=0.0)
    b_xw, b_bw = b_xw.to(tl.float32), b_bw.to(tl.float32)
    # the drafts: [BT, BP], [BT, BN], [BT]
    b_xdr = tl.load(p_x + o_t[:, None] * stride_x_t + o_p[None, :], mask=m_t[:, None] & m_p[None, :], other=0.0)
    o_bd = i_b * stride_B_b + o_t[:, None] * stride_B_t + i_g * stride_B_g + o_n[None, :]
    b_Bdr = tl.load(B + o_bd, mask=m_t[:, None] & m_n[None, :], other=0.0)
    b_Bd = b_Bdr.to(tl.float32)
    b_dtd = tl.load(dt + i_b * stride_dt_b + o_t * stride_dt_t + i_h * stride_dt_h, mask=m_t, other=0.0)
    b_dtd = tl.where(m_t, step_delta(b_dtd, dt_bias, i_h, HAS_DT_BIAS, USE_SOFTPLUS), 0.0)
    b_lam0 = tl.load(p_lb + f_c - 1, mask=f_c > 0, other=0.0)
    b_lamd = b_lam0 + tl.cumsum(tl.load(A + i_h).to(tl.float32) * b_dtd, axis=0)

    if f >= W:
        # Fold the f committed entries into the checkpoint first, one [BP, BF] x [BF, BN] product, then answer.
        b_lend = tl.load(p_lb + f - 1)
        o_f = tl.arange(0, BF)
        m_f = o_f < f
        b_cf = tl.where(m_f, tl.exp(b_lend - tl.load(p_lb + o_f, mask=m_f, other=0.0))
                        * tl.load(p_db + o_f, mask=m_f, other=0.0), 0.0)
        b_xf = tl.load(p_xb + o_f[:, None] * P + o_p[None, :], mask=m_f[:, None] & m_p[None, :], other=0.0)
        b_bf = tl.load(p_bb + o_f[:, None] * N + o_n[None, :], mask=m_f[:, None] & m_n[None, :], other=0.0)
        p_ck = checkpoint + i_s * stride_ck_s + i_h * stride_ck_h + o_p[:, None] * stride_ck_p + o_n[None, :]
        b_s = tl.load(p_ck, mask=m_s, other=0.0).to(tl.float32) * tl.exp(b_lend)
        b_s += tl.dot(tl.trans(b_xf.to(tl.float32) * b_cf[:, None]), b_bf.to(tl.float32), input_precision="tf32x3")
        tl.store(p_ck, b_s.to(p_ck.dtype.element_ty), mask=m_s)
        if USE_COPY:
            store_read_copy(b_s, p_rc, read_scale, i_sh * P + o_p, m_s, m_p, IS_FP8)
        answer_drafts(b_s, o_p, m_p, b_xdr.to(tl.float32), b_Bd, b_dtd, b_lamd, o_t, b_xw, b_bw, b_lw, b_dw, m_w,
                      o_n, m_n, p_C, p_x, p_y, z, o_z, D, i_h, stride_C_t, stride_x_t, stride_y_t, stride_z_t,
                      T, False, HAS_D, HAS_Z)
        # the fold read the entries this program's drafts are about to overwrite
        tl.debug_barrier()
    else:
        b_s = b_r.to(tl.float32)
        if IS_FP8:
            b_s = b_s * b_scale[:, None]
        answer_drafts(b_s, o_p, m_p, b_xdr.to(tl.float32), b_Bd, b_dtd, b_lamd, o_t, b_xw, b_bw, b_lw, b_dw, m_w,
                      o_n, m_n, p_C, p_x, p_y, z, o_z, D, i_h, stride_C_t, stride_x_t, stride_y_t, stride_z_t,
                      T, True, HAS_D, HAS_Z)

    tl.store(p_xb + (f_c + o_t)[:, None] * P + o_p[None, :], b_xdr, mask=m_t[:, None] & m_p[None, :])
    if i_h % HPG == 0 and i_p == 0:
        p_bd = b_draft + (i_s * G + i_g) * MAXT * N + o_t[:, None] * N + o_n[None, :]
        tl.store(p_bd, b_Bdr, mask=m_t[:, None] & m_n[None, :])
    # Every P-block reads this head's Δ and lam entries; the last one done writes the drafts' and the fill.
    # Relaxed order suffices: every program has consumed what it read of them before it arrives.
    if NPB == 1:
        is_last = True
    else:
        is_last = tl.atomic_add(arrive + i_sh, 1, sem="relaxed") == NPB - 1
    if is_last:
        tl.store(p_db + f_c + o_t, b_dtd, mask=m_t)
        tl.store(p_lb + f_c + o_t, b_lamd, mask=m_t)
        tl.store(fill + i_sh, f_c)
        if NPB > 1:
            tl.store(arrive + i_sh, 0)

@triton.jit
def mamba2_accept_kernel(
    n_accepted, slots, fill, b_buf, b_draft,
    H, G, N,
    MAXT: tl.constexpr, CAP: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, HAS_SLOTS: tl.constexpr,
):
    i_b, i_h = tl.program_id(0), tl.program_id(1)
    if HAS_SLOTS:
        i_s = tl.load(slots + i_b).to(tl.int64)
        if i_s < 0:
            return
    else:
        i_s = i_b.to(tl.int64)
    HPG = H // G
    i_sh = i_s * H + i_h
    n = tl.load(n_accepted + i_b).to(tl.int32)
    f = tl.load(fill + i_sh)
    if i_h % HPG == 0:
        i_sg = i_s * G + i_h // HPG
        o_t, o_n = tl.arange(0, BT), tl.arange(0, BN)
        m = (o_t < n)[:, None] & (o_n < N)[None, :]
        b_B = tl.load(b_draft + i_sg * MAXT * N + o_t[:, None] * N + o_n[None, :], mask=m, other=0.0)
        tl.store(b_buf + i_sg * CAP * N + (f + o_t)[:, None] * N + o_n[None, :], b_B, mask=m)
    tl.store(fill + i_sh, f + n)


# verify mutates the cache, so it is not autotuned (a trial launch would advance it); settings are fixed per
# (checkpoint itemsize, max N, max P) and `launch=` overrides them. P is split into BP-row blocks, as in replay.
VERIFY_LAUNCH = [
    ((4, 1 << 30, 1 << 30), {"BP": 64, "num_warps": 4, "num_stages": 1}),
    ((2, 1 << 30, 1 << 30), {"BP": 64, "num_warps": 4, "num_stages": 1}),
]
VERIFY_KEYS = ("BP", "num_warps", "num_stages", "maxnreg")
ACCEPT_LAUNCH = {"num_warps": 1, "num_stages": 1}


def verify(cache: ReplayCache, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None,
           out=None, launch: dict | None = None, check: bool = True) -> torch.Tensor:
    """Outputs of T draft tokens per row from one checkpoint read; the drafts are buffered, not committed.

    Draft t's output is what `replay` would give after drafts 0..t-1. A row whose fill is ≥ W (after an
    accept) first folds its committed entries into the checkpoint, as a flush does. The drafts' x, Δ and
    lam are written to the buffer after the committed entries and their B to `cache.b_draft`; the fill is
    unchanged until `accept` commits a prefix, so a rejected draft is simply overwritten later.

    Args:
        cache: a ReplayCache created with max_draft ≥ T; mutated as above.
        x: (batch, T, H, P) and B: (batch, T, G, N) in cache.io_dtype, 1 ≤ T ≤ 8. dt: (batch, T, H).
        C: (batch, T, G, N). A, D, dt_bias: (H,). z: optional (batch, T, H, P).
        slots, launch, check: as in `replay`. out: optional (batch, T, H, P).

    Returns:
        y (batch, T, H, P) in x's dtype (or `out`).
    """
    nslots, H, P, N, G = check_cache(cache, mamba2_verify_kernel)
    batch, T, G_in = args.check_inputs(x, dt, A, B, C, D, z, dt_bias, H=H, P=P, N=N, device=cache.device,
                                       tokens=True, io_dtypes=(cache.io_dtype,))
    if G_in != G:
        raise ValueError(f"B must have the cache's G = {G} groups, got {G_in}")
    args.check_draft(T, cache.max_draft)
    args.check_slots(slots, batch, nslots, cache.device, check)
    args.check_out(out, (batch, T, H, P), "(batch, T, H, P)", cache.device)
    settings = args.pick_launch(VERIFY_LAUNCH, cache.checkpoint.element_size(), P, N, launch, VERIFY_KEYS)
    # tl.dot needs every dimension of the fold's product to be at least 16.
    BP = max(16, min(settings.pop("BP"), args.block(P)))
    NPB = triton.cdiv(P, BP)
    y = torch.empty_like(x) if out is None else out
    ck, rc = cache.checkpoint, cache.read_copy
    rcs = rc.stride() if rc is not None else (0, 0, 0, 0)
    zs = z.stride() if z is not None else (0, 0, 0, 0)
    mamba2_verify_kernel[(batch, H, NPB)](
        x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, slots=slots, y=y,
        checkpoint=ck, read_copy=rc, read_scale=cache.read_scale, x_buf=cache.x_buf, b_buf=cache.b_buf,
        dt_buf=cache.dt_buf, lam_buf=cache.lam_buf, b_draft=cache.b_draft, fill=cache.fill, arrive=cache.arrive,
        H=H, G=G, P=P, N=N,
        stride_ck_s=ck.stride(0), stride_ck_h=ck.stride(1), stride_ck_p=ck.stride(2),
        stride_rc_s=rcs[0], stride_rc_h=rcs[1], stride_rc_p=rcs[2],
        stride_x_b=x.stride(0), stride_x_t=x.stride(1), stride_x_h=x.stride(2),
        stride_dt_b=dt.stride(0), stride_dt_t=dt.stride(1), stride_dt_h=dt.stride(2),
        stride_B_b=B.stride(0), stride_B_t=B.stride(1), stride_B_g=B.stride(2),
        stride_C_b=C.stride(0), stride_C_t=C.stride(1), stride_C_g=C.stride(2),
        stride_z_b=zs[0], stride_z_t=zs[1], stride_z_h=zs[2],
        stride_y_b=y.stride(0), stride_y_t=y.stride(1), stride_y_h=y.stride(2),
        T=T, MAXT=cache.b_draft.shape[2], W=cache.window, CAP=cache.capacity,
        BP=BP, BN=max(16, args.block(N)), BW=args.block(cache.window), BF=max(16, args.block(cache.capacity)),
        BT=args.block(T), NPB=NPB,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, USE_SOFTPLUS=bool(dt_softplus),
        HAS_SLOTS=slots is not None, USE_COPY=rc is not None, IS_FP8=cache.read_scale is not None,
        **settings,
    )
    cache.last_draft = T
    return y


def accept(cache: ReplayCache, n_accepted, slots=None, *, check: bool = True) -> None:
    """Commit the first n drafts of the last `verify` of each row: the fill advances by n, on the device.

    Args:
        cache: the ReplayCache `verify` wrote to; its fills and B buffer are mutated.
        n_accepted: (batch,) int32/int64 device tensor, each in [0, T] for the last verify's T.
        slots: as in `verify` (the same rows), -1 for padding rows.
        check: range-check slots and n_accepted on the host (a device sync); skipped during graph capture.
    """
    nslots, H, P, N, G = check_cache(cache, mamba2_accept_kernel)
    if not isinstance(n_accepted, torch.Tensor) or n_accepted.dim() != 1:
        raise ValueError("n_accepted must be a 1-D (batch,) integer tensor")
    batch = n_accepted.shape[0]
    args.check_tensor("n_accepted", n_accepted, (batch,), "(batch,)", args.INDEX_DTYPES, cache.device)
    args.check_slots(slots, batch, nslots, cache.device, check)
    T = cache.last_draft
    if T == 0:
        raise ValueError("accept needs a verify on this cache first: there are no drafts to accept")
    if args.host_checks(check):
        bad = [n for n in n_accepted.tolist() if not 0 <= n <= T]
        if bad:
            raise ValueError(f"n_accepted must be in [0, {T}] (the last verify's T), got {bad[0]}")
    mamba2_accept_kernel[(batch, H)](
        n_accepted=n_accepted, slots=slots, fill=cache.fill, b_buf=cache.b_buf, b_draft=cache.b_draft,
        H=H, G=G, N=N,
        MAXT=cache.b_draft.shape[2], CAP=cache.capacity, BN=args.block(N), BT=args.block(T),
        HAS_SLOTS=slots is not None,
        **ACCEPT_LAUNCH,
    )
