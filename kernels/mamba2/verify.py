"""ReplaySSM speculative decode for Mamba-2: verify T drafts from one checkpoint read, then accept a prefix."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families
from replayssm_kernels.common import dot_fp32, fills_read, slot_of
from replayssm_kernels.mamba2 import args
from replayssm_kernels.mamba2.cache import ReplayCache
from replayssm_kernels.mamba2.common import finish_output, step_delta, store_read_copy, store_rows
from replayssm_kernels.mamba2.replay import store_args, check_cache
from replayssm_kernels.rounding import store_key


@triton.jit
def mamba2_verify_bc_kernel(
    B, C, slots, b_buf, fill, bc,
    H, G, N,
    stride_B_b, stride_B_t, stride_B_g,
    stride_C_b, stride_C_t, stride_C_g,
    T: tl.constexpr, CAP: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr, BT: tl.constexpr, BTD: tl.constexpr,
    HAS_SLOTS: tl.constexpr, IS_HALF_IO: tl.constexpr,
):
    """B_j·C_t of a row's group for its entries j < f + T (the f committed ones, then the drafts) and drafts t:
    [BJ, BT] fp32 into bc, the same for every head of the group, which `mamba2_verify_kernel` weights per head.
    One [BJ, BN] x [BN, BTD] product (columns t >= T zero); 16-bit B and C are exact in TF32. A group's heads
    share its buffered B, so they share a fill: its first head's."""
    i_b, i_g = tl.program_id(0), tl.program_id(1)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    f = tl.load(fill + i_s * H + i_g * (H // G))
    o_j, o_n, o_t = tl.arange(0, BJ), tl.arange(0, BN), tl.arange(0, BTD)
    m_n = o_n < N
    m_jc = o_j < f
    m_jd = (o_j >= f) & (o_j < f + T)
    p_bj = tl.where(m_jc, b_buf + (i_s * G + i_g) * CAP * N + o_j * N,
                    B + i_b * stride_B_b + i_g * stride_B_g + (o_j - f) * stride_B_t)
    b_bj = tl.load(p_bj[:, None] + o_n[None, :], mask=(m_jc | m_jd)[:, None] & m_n[None, :], other=0.0)
    p_C = C + i_b * stride_C_b + i_g * stride_C_g
    b_C = tl.load(p_C + o_t[None, :] * stride_C_t + o_n[:, None], mask=m_n[:, None] & (o_t < T)[None, :], other=0.0)
    b_bc = dot_fp32(b_bj.to(tl.float32), b_C.to(tl.float32), IS_HALF_IO, IS_HALF_IO)
    tl.store(bc + (i_b * G + i_g) * BJ * BT + o_j[:, None] * BT + o_t[None, :], b_bc, mask=(o_t < BT)[None, :])


@triton.jit
def mamba2_verify_kernel(
    x, dt, A, B, C, D, z, dt_bias, slots, y,
    checkpoint, read_copy, read_scale, x_buf, b_buf, dt_buf, lam_buf, b_draft, fill, arrive, bc, ck_scale, seed, steps,
    H, G, P, N,
    stride_ck_s, stride_ck_h, stride_ck_p,
    stride_rc_s, stride_rc_h, stride_rc_p,
    stride_x_b, stride_x_t, stride_x_h,
    stride_dt_b, stride_dt_t, stride_dt_h,
    stride_B_b, stride_B_t, stride_B_g,
    stride_C_b, stride_C_t, stride_C_g,
    stride_z_b, stride_z_t, stride_z_h,
    stride_y_b, stride_y_t, stride_y_h,
    HPG: tl.constexpr, T: tl.constexpr, TMAX: tl.constexpr, W: tl.constexpr, CAP: tl.constexpr,
    ROWS: tl.constexpr, FOLD_CHUNK: tl.constexpr, BN: tl.constexpr, BJ: tl.constexpr, BT: tl.constexpr,
    BTD: tl.constexpr,
    PIECE: tl.constexpr, VEC: tl.constexpr, NPB: tl.constexpr, BC_PASS: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr,
    HAS_SLOTS: tl.constexpr, HAS_COPY: tl.constexpr, IS_FP8: tl.constexpr, IS_HALF_IO: tl.constexpr,
    Q8: tl.constexpr = False, RANDOM: tl.constexpr = False,
):
    # Q8: the checkpoint is 8-bit rows with scales ck_scale (nslots, H, P); RANDOM: a fold stores it rounded
    # stochastically
    i_b, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    i_g = i_h // HPG
    i_sh = i_s * H + i_h
    o_p, o_n, o_j, o_t = i_p * ROWS + tl.arange(0, ROWS), tl.arange(0, BN), tl.arange(0, BJ), tl.arange(0, BT)
    m_p, m_n, m_t = o_p < P, o_n < N, o_t < T

    # The tile and the entries' B are held as [rows, BN / PIECE, PIECE] so that each thread sums its PIECE-wide pieces
    # of a row in registers and only the PIECE lanes of a row meet in shuffles. Both are read VEC elements at a time,
    # whatever their dtypes, so that they share one layout and each draft's C is laid out once for both.
    NC: tl.constexpr = BN // PIECE
    o_n3 = tl.max_contiguous(tl.arange(0, NC)[:, None] * PIECE + tl.arange(0, PIECE)[None, :], [1, VEC])
    m_n3 = o_n3 < N
    m_s3 = m_p[:, None, None] & m_n3[None, :, :]
    p_ck = checkpoint + i_s * stride_ck_s + i_h * stride_ck_h
    # The tile read bounds the step, so it is issued before anything it does not depend on.
    if HAS_COPY:
        p_rc = read_copy + i_s * stride_rc_s + i_h * stride_rc_h
        b_r = tl.load(p_rc + o_p[:, None, None] * stride_rc_p + o_n3[None, :, :], mask=m_s3, other=0.0)
    else:
        b_r = tl.load(p_ck + o_p[:, None, None] * stride_ck_p + o_n3[None, :, :], mask=m_s3, other=0.0)
    f = tl.load(fill + i_sh)
    p_xb = x_buf + i_sh * CAP * P
    p_bb = b_buf + (i_s * G + i_g) * CAP * N
    p_db = dt_buf + i_sh * CAP
    p_lb = lam_buf + i_sh * CAP
    p_x = x + i_b * stride_x_b + i_h * stride_x_h
    p_B = B + i_b * stride_B_b + i_g * stride_B_g
    p_C = C + i_b * stride_C_b + i_g * stride_C_g

    # Draft t answers from the checkpoint and the entries j <= f + t: the f committed ones, then drafts 0..t.
    # A row that folds first answers the same way, from the checkpoint it folds; that equals the folded state.
    m_jc = o_j < f
    m_jd = (o_j >= f) & (o_j < f + T)
    # x and B of the entries, [BJ, ROWS] and [BJ, NC, PIECE]: one load each, a row from the buffer or the drafts
    p_xj = tl.where(m_jc, p_xb + o_j * P, p_x + (o_j - f) * stride_x_t)
    b_xj = tl.load(p_xj[:, None] + o_p[None, :], mask=(m_jc | m_jd)[:, None] & m_p[None, :], other=0.0)
    p_bj = tl.where(m_jc, p_bb + o_j * N, p_B + (o_j - f) * stride_B_t)
    o_td = tl.arange(0, BTD)
    if BC_PASS:
        # the entries' B·C_t, [BJ, BTD] (columns t >= T zero), summed once per group by `mamba2_verify_bc_kernel`
        b_bc = tl.load(bc + (i_b * G + i_g) * BJ * BT + o_j[:, None] * BT + o_td[None, :], mask=o_td[None, :] < T,
                       other=0.0)
    else:
        b_bj = tl.load(p_bj[:, None, None] + o_n3[None, :, :], mask=(m_jc | m_jd)[:, None, None] & m_n3[None, :, :],
                       other=0.0).to(tl.float32)
    b_lamj = tl.load(p_lb + o_j, mask=m_jc, other=0.0)
    b_dtj = tl.load(p_db + o_j, mask=m_jc, other=0.0)
    b_lam0 = tl.load(p_lb + f - 1, mask=f > 0, other=0.0)

    b_s3 = b_r.to(tl.float32)
    if IS_FP8:
        b_s3 = b_s3 * tl.load(read_scale + i_sh * P + o_p, mask=m_p, other=0.0)[:, None, None]
    if Q8:
        b_s3 = b_s3 * tl.load(ck_scale + i_sh * P + o_p, mask=m_p, other=0.0)[:, None, None]
    if HAS_COPY:
        # a fold answers from the full-precision checkpoint, not its read copy
        if f >= W:
            b_s3 = tl.load(p_ck + o_p[:, None, None] * stride_ck_p + o_n3[None, :, :], mask=m_s3, other=0.0)
            b_s3 = b_s3.to(tl.float32)

    # y[p, t] = exp(lam_t) S[p, :]·C_t + sum_j x_j[p] k[j, t], with k[j, t] = exp(lam_t - lam_j) dt_j B_j·C_t for
    # j <= f + t. Per draft the tile and B take one reduction each; the sum over j is one [ROWS, BJ] x [BJ, BTD]
    # product.
    b_A = tl.load(A + i_h).to(tl.float32)
    b_c = 0.0
    b_dtd = tl.zeros([BT], dtype=tl.float32)
    b_cd = tl.zeros([BT], dtype=tl.float32)
    b_y = tl.zeros([ROWS, BT], dtype=tl.float32)
    b_k = tl.zeros([BJ, BTD], dtype=tl.float32)
    b_cdd = tl.zeros([BTD], dtype=tl.float32)
    for t in tl.static_range(T):
        b_dt = step_delta(tl.load(dt + i_b * stride_dt_b + t * stride_dt_t + i_h * stride_dt_h), dt_bias, i_h,
                          HAS_DT_BIAS, USE_SOFTPLUS)
        # lam since the last committed entry (b_c), and since the checkpoint (b_lt)
        b_c += b_A * b_dt
        b_lt = b_lam0 + b_c
        b_lamj = tl.where(o_j == f + t, b_lt, b_lamj)
        b_dtj = tl.where(o_j == f + t, b_dt, b_dtj)
        b_C3 = tl.load(p_C + t * stride_C_t + o_n3, mask=m_n3, other=0.0).to(tl.float32)
        if BC_PASS:
            b_cdd = tl.where(o_td == t, b_c, b_cdd)
        else:
            b_kt = tl.sum(tl.sum(b_bj * b_C3[None, :, :], axis=1), axis=1)
            b_kt = tl.where(o_j <= f + t, tl.exp(b_lt - b_lamj) * b_dtj * b_kt, 0.0)
            b_k = tl.where(o_td[None, :] == t, b_kt[:, None], b_k)
        b_yt = tl.sum(tl.sum(b_s3 * b_C3[None, :, :], axis=1), axis=1) * tl.exp(b_lt)
        b_y = tl.where(o_t[None, :] == t, b_yt[:, None], b_y)
        b_dtd = tl.where(o_t == t, b_dt, b_dtd)
        b_cd = tl.where(o_t == t, b_c, b_cd)
    if BC_PASS:
        # entry j's weight for draft t, j <= f + t: the drafts' lam and Δ are all in b_lamj and b_dtj by now
        m_k = (o_j[:, None] <= f + o_td[None, :]) & (o_td[None, :] < T)
        b_k = tl.where(m_k, tl.exp(b_lam0 + b_cdd[None, :] - b_lamj[:, None]) * b_dtj[:, None] * b_bc, 0.0)
    b_xk = dot_fp32(tl.trans(b_xj.to(tl.float32)), b_k, IS_HALF_IO, False)
    # columns t >= T of k are zero, so folding BTD columns onto BT keeps those of the drafts
    b_y += tl.sum(tl.reshape(b_xk, (ROWS, BTD // BT, BT)), axis=1)
    m_pt = m_p[:, None] & m_t[None, :]
    b_xt = tl.load(p_x + o_t[None, :] * stride_x_t + o_p[:, None], mask=m_pt, other=0.0).to(tl.float32)
    o_z = i_b * stride_z_b + i_h * stride_z_h + o_t[None, :] * stride_z_t + o_p[:, None]
    b_y = finish_output(b_y, b_xt, D, z, o_z, m_pt, i_h, HAS_D, HAS_Z)
    p_y = y + i_b * stride_y_b + i_h * stride_y_h + o_t[None, :] * stride_y_t + o_p[:, None]
    tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=m_pt)

    if f >= W:
        # Fold the f committed entries into the checkpoint, FOLD_CHUNK rows at a time, each a [FOLD_CHUNK, BJ] x
        # [BJ, BN] product; the drafts' rows of B meet zero coefficients.
        b_cf = tl.where(m_jc, tl.exp(b_lam0 - b_lamj) * b_dtj, 0.0)
        if BC_PASS:
            b_bf = tl.load(p_bj[:, None] + o_n[None, :], mask=m_jc[:, None] & m_n[None, :], other=0.0).to(tl.float32)
        else:
            b_bf = tl.reshape(b_bj, (BJ, BN))
        b_key = store_key(seed, steps, i_s, i_h, RANDOM)
        for i_c in range(0, ROWS, FOLD_CHUNK):
            o_c = i_p * ROWS + i_c + tl.arange(0, FOLD_CHUNK)
            m_c = o_c < P
            m_sc = m_c[:, None] & m_n[None, :]
            b_xf = tl.load(p_xb + o_j[:, None] * P + o_c[None, :], mask=m_jc[:, None] & m_c[None, :], other=0.0)
            p_cks = p_ck + o_c[:, None] * stride_ck_p + o_n[None, :]
            b_s = tl.load(p_cks, mask=m_sc, other=0.0).to(tl.float32)
            if Q8:
                b_s = b_s * tl.load(ck_scale + i_sh * P + o_c, mask=m_c, other=0.0)[:, None]
            b_s = b_s * tl.exp(b_lam0)
            b_s += dot_fp32(tl.trans(b_xf.to(tl.float32) * b_cf[:, None]), b_bf, False, IS_HALF_IO)
            # rounding to nearest stays inline: through store_rows its PTX would gain the call's debug labels
            if Q8 or RANDOM:
                store_rows(p_cks, b_s, m_sc, ck_scale, i_sh * P + o_c, m_c, b_key, o_c, N, Q8, RANDOM)
            else:
                tl.store(p_cks, b_s.to(p_cks.dtype.element_ty), mask=m_sc)
            if HAS_COPY:
                p_rcs = read_copy + i_s * stride_rc_s + i_h * stride_rc_h + o_c[:, None] * stride_rc_p + o_n[None, :]
                store_read_copy(b_s, p_rcs, read_scale, i_sh * P + o_c, m_sc, m_c, IS_FP8)
        # the fold read the entries this program's drafts are about to overwrite
        tl.debug_barrier()
        f_c = f * 0
    else:
        f_c = f
    # the drafts go after the entries that stay committed
    tl.store(p_xb + (o_j - f + f_c)[:, None] * P + o_p[None, :], b_xj, mask=m_jd[:, None] & m_p[None, :])
    if i_h % HPG == 0 and i_p == 0:
        m_tn = m_t[:, None] & m_n[None, :]
        b_Bd = tl.load(p_B + o_t[:, None] * stride_B_t + o_n[None, :], mask=m_tn, other=0.0)
        tl.store(b_draft + (i_s * G + i_g) * TMAX * N + o_t[:, None] * N + o_n[None, :], b_Bd, mask=m_tn)
    # Every P-block reads this head's Δ and lam entries; the last one done writes the drafts' and the fill.
    # Relaxed order suffices: every program has consumed what it read of them before it arrives.
    fills_read()
    if NPB == 1:
        is_last = True
    else:
        is_last = tl.atomic_add(arrive + i_sh, 1, sem="relaxed") == NPB - 1
    if is_last:
        tl.store(p_db + f_c + o_t, b_dtd, mask=m_t)
        # a fold restarts lam at its checkpoint
        tl.store(p_lb + f_c + o_t, tl.where(f_c > 0, b_lam0 + b_cd, b_cd), mask=m_t)
        tl.store(fill + i_sh, f_c)
        if NPB > 1:
            tl.store(arrive + i_sh, 0)


@triton.jit
def mamba2_accept_kernel(
    n_accepted, slots, fill, b_buf, b_draft,
    H, G, N,
    HPG: tl.constexpr, BH: tl.constexpr, TMAX: tl.constexpr, CAP: tl.constexpr, BN: tl.constexpr,
    BT: tl.constexpr, HAS_SLOTS: tl.constexpr,
):
    """A program per (row, group): its heads' fills advance by n, and the group's first n drafts' B go into the
    buffer after its committed entries."""
    i_b, i_g = tl.program_id(0), tl.program_id(1)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    n = tl.load(n_accepted + i_b).to(tl.int32)
    o_h = tl.arange(0, BH)
    m_h = o_h < HPG
    p_f = fill + i_s * H + i_g * HPG + o_h
    b_f = tl.load(p_f, mask=m_h, other=0)
    f = tl.load(fill + i_s * H + i_g * HPG)
    i_sg = i_s * G + i_g
    o_t, o_n = tl.arange(0, BT), tl.arange(0, BN)
    m = (o_t < n)[:, None] & (o_n < N)[None, :]
    b_B = tl.load(b_draft + i_sg * TMAX * N + o_t[:, None] * N + o_n[None, :], mask=m, other=0.0)
    tl.store(b_buf + i_sg * CAP * N + (f + o_t)[:, None] * N + o_n[None, :], b_B, mask=m)
    fills_read()
    tl.store(p_f, b_f + n, mask=m_h)


# verify mutates the cache, so it is not autotuned (a trial launch would advance it): each checkpoint width and grid
# class has a fixed row, chosen by `select`.
@dataclass(frozen=True)
class VerifyConfig:
    """How `verify` is launched: P in blocks of `rows` per program, as in replay."""

    # rows of P per program: 64
    rows: int
    # lanes of a row in the reductions over N: 16 or 32
    piece: int
    # True: the entries' B·C summed once per group in a launch before the verify's (`mamba2_verify_bc_kernel`)
    bc_pass: bool
    # warps per program: 4
    warps: int
    # registers per thread the programs are capped at: 128 (with the pass: four programs fit an SM) or 168 (three)
    maxnreg: int | None


VERIFY_LAUNCH = {
    "verify-fp32": VerifyConfig(rows=64, piece=32, bc_pass=True, warps=4, maxnreg=128),
    "verify-bf16": VerifyConfig(rows=64, piece=32, bc_pass=True, warps=4, maxnreg=128),
    # a grid of few programs keeps B·C in the verify's: there the launch before it is the step's serial start
    "verify-fp32-small": VerifyConfig(rows=64, piece=32, bc_pass=False, warps=4, maxnreg=168),
    "verify-bf16-small": VerifyConfig(rows=64, piece=32, bc_pass=False, warps=4, maxnreg=168),
}
# verify takes its small-grid rows under this many (row, head) programs per SM.
SMALL_GRID = 12
# A fold walks its rows 16 at a time (one product).
FOLD_CHUNK = 16


def select(cache: ReplayCache, batch: int) -> str:
    """The VERIFY_LAUNCH row of a `verify` of `batch` rows: by the checkpoint's width and the grid's (row, head)
    programs per SM (medium on the CPU)."""
    width = "fp32" if cache.checkpoint.element_size() == 4 else "bf16"
    per_sm = common.per_sm(batch * cache.shape[1], cache.device)
    return f"verify-{width}-small" if per_sm is not None and per_sm < SMALL_GRID else f"verify-{width}"


@families.refuse_out_of_resources
def verify(cache: ReplayCache, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None,
           out=None, config: VerifyConfig | None = None, check: bool = True) -> torch.Tensor:
    """Outputs of T draft tokens per row from one checkpoint read; the drafts are buffered, not committed.

    Draft t's output is what `replay` would give after drafts 0..t-1. A row whose fill is ≥ W (after an
    accept) first folds its committed entries into the checkpoint, as a flush does. The drafts' x, Δ and
    lam are written to the buffer after the committed entries and their B to `cache.b_draft`; the fill is
    unchanged until `accept` commits a prefix, so a rejected draft is simply overwritten later.

    Args:
        cache: a ReplayCache created with max_draft ≥ T; mutated as above. A fold stores the checkpoint as
            `replay`'s flush does, and the rounding counts of the rows' slots advance by one.
        x: (batch, T, H, P) and B: (batch, T, G, N) in cache.io_dtype, 1 ≤ T ≤ 8. dt: (batch, T, H).
        C: (batch, T, G, N). A, D, dt_bias: (H,). z: optional (batch, T, H, P).
        slots, check: as in `replay`. out: optional (batch, T, H, P).
        config: the launch settings (default: the VERIFY_LAUNCH row `select` chooses); for benchmarks.

    Returns:
        y (batch, T, H, P) in x's dtype (or `out`).
    """
    nslots, H, P, N, G = check_cache(cache, mamba2_verify_kernel)
    batch, T, G_in = args.check_inputs(x, dt, A, B, C, D, z, dt_bias, H=H, P=P, N=N, device=cache.device,
                                       tokens=True, io_dtypes=(cache.io_dtype,))
    if G_in != G:
        raise ValueError(f"B must have the cache's G = {G} groups, got {G_in}")
    common.check_draft(T, cache.max_draft)
    common.check_slots(slots, batch, nslots, cache.device, check)
    args.check_out(out, (batch, T, H, P), "(batch, T, H, P)", cache.device)
    c = VERIFY_LAUNCH[select(cache, batch)] if config is None else config
    # tl.dot needs every dimension of its products to be at least 16.
    ROWS = max(16, min(c.rows, common.block(P)))
    NPB = triton.cdiv(P, ROWS)
    BN = max(16, common.block(N))
    PIECE = min(c.piece, BN)
    y = torch.empty_like(x) if out is None else out
    BJ, BT = max(16, common.block(cache.capacity + T)), common.block(T)
    bcpass = c.bc_pass
    bc = None
    if bcpass:
        bc = torch.empty(batch, G, BJ, BT, dtype=torch.float32, device=cache.device)
        mamba2_verify_bc_kernel[(batch, G)](
            B=B, C=C, slots=slots, b_buf=cache.b_buf, fill=cache.fill, bc=bc, H=H, G=G, N=N,
            stride_B_b=B.stride(0), stride_B_t=B.stride(1), stride_B_g=B.stride(2),
            stride_C_b=C.stride(0), stride_C_t=C.stride(1), stride_C_g=C.stride(2),
            T=T, CAP=cache.capacity, BN=BN, BJ=BJ, BT=BT, BTD=16, HAS_SLOTS=slots is not None,
            IS_HALF_IO=cache.x_buf.element_size() == 2, **common.compile_options(2, None),
        )
    ck, rc = cache.checkpoint, cache.read_copy
    rcs = rc.stride() if rc is not None else (0, 0, 0, 0)
    zs = z.stride() if z is not None else (0, 0, 0, 0)
    mamba2_verify_kernel[(batch, H, NPB)](
        x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, slots=slots, y=y,
        checkpoint=ck, read_copy=rc, read_scale=cache.read_scale, x_buf=cache.x_buf, b_buf=cache.b_buf,
        dt_buf=cache.dt_buf, lam_buf=cache.lam_buf, b_draft=cache.b_draft, fill=cache.fill, arrive=cache.arrive,
        bc=bc, H=H, G=G, P=P, N=N,
        stride_ck_s=ck.stride(0), stride_ck_h=ck.stride(1), stride_ck_p=ck.stride(2),
        stride_rc_s=rcs[0], stride_rc_h=rcs[1], stride_rc_p=rcs[2],
        stride_x_b=x.stride(0), stride_x_t=x.stride(1), stride_x_h=x.stride(2),
        stride_dt_b=dt.stride(0), stride_dt_t=dt.stride(1), stride_dt_h=dt.stride(2),
        stride_B_b=B.stride(0), stride_B_t=B.stride(1), stride_B_g=B.stride(2),
        stride_C_b=C.stride(0), stride_C_t=C.stride(1), stride_C_g=C.stride(2),
        stride_z_b=zs[0], stride_z_t=zs[1], stride_z_h=zs[2],
        stride_y_b=y.stride(0), stride_y_t=y.stride(1), stride_y_h=y.stride(2),
        HPG=H // G, T=T, TMAX=cache.b_draft.shape[2], W=cache.window, CAP=cache.capacity,
        ROWS=ROWS, FOLD_CHUNK=FOLD_CHUNK, BN=BN, BJ=BJ, BT=BT, BTD=16,
        PIECE=PIECE, VEC=min(PIECE, 4), NPB=NPB, BC_PASS=bcpass,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, USE_SOFTPLUS=bool(dt_softplus),
        HAS_SLOTS=slots is not None, HAS_COPY=rc is not None, IS_FP8=cache.read_scale is not None,
        IS_HALF_IO=cache.x_buf.element_size() == 2, **store_args(cache),
        **common.compile_options(c.warps, c.maxnreg),
    )
    if cache.rounding is not None:
        # a fold stores the checkpoint: one more store for every row's slot
        cache.rounding.advance(slots, batch)
    cache.last_draft = T
    return y


@families.refuse_out_of_resources
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
    common.check_tensor("n_accepted", n_accepted, (batch,), "(batch,)", common.INDEX_DTYPES, cache.device)
    common.check_slots(slots, batch, nslots, cache.device, check)
    T = cache.last_draft
    if T == 0:
        raise ValueError("accept needs a verify on this cache first: there are no drafts to accept")
    if common.host_checks(check):
        bad = [n for n in n_accepted.tolist() if not 0 <= n <= T]
        if bad:
            raise ValueError(f"n_accepted must be in [0, {T}] (the last verify's T), got {bad[0]}")
    mamba2_accept_kernel[(batch, G)](
        n_accepted=n_accepted, slots=slots, fill=cache.fill, b_buf=cache.b_buf, b_draft=cache.b_draft,
        H=H, G=G, N=N,
        HPG=H // G, BH=common.block(H // G), TMAX=cache.b_draft.shape[2], CAP=cache.capacity, BN=common.block(N),
        BT=common.block(T),
        HAS_SLOTS=slots is not None,
        **common.compile_options(1, None),
    )
