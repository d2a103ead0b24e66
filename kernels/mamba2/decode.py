"""Conventional Mamba-2 decode: the in-place state update, and the snapshot-writing speculative step with its accept."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families, rounding as rnd
from replayssm_kernels.common import flat_program_ids, slot_of
from replayssm_kernels.mamba2 import args
from replayssm_kernels.mamba2.common import finish_output, load_rows, step_delta, store_rows
from replayssm_kernels.rounding import count_stores, quantized_rows, rounded, row_bits, slot_key, store_key


@triton.jit
def mamba2_decode_kernel(
    state, state_scale, x, dt, A, B, C, D, z, dt_bias, slots, y, seed, steps, step_arrive,
    H, P, N, HPG,
    stride_state_s, stride_state_h, stride_state_p,
    stride_x_b, stride_x_h,
    stride_dt_b, stride_dt_h,
    stride_B_b, stride_B_g,
    stride_C_b, stride_C_g,
    stride_z_b, stride_z_h,
    stride_y_b, stride_y_h,
    ROWS: tl.constexpr, BN: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr,
    HAS_SLOTS: tl.constexpr, Q8: tl.constexpr = False, RANDOM: tl.constexpr = False,
):
    # Q8: 8-bit state rows with scales (state_scale, contiguous (nslots, H, P)); RANDOM: stochastic rounding, the
    # slot's store count advanced by the launch
    i_b, i_h, i_p = flat_program_ids(H, tl.cdiv(P, ROWS))
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    i_g = i_h // HPG
    o_p = i_p * ROWS + tl.arange(0, ROWS)
    o_n = tl.arange(0, BN)
    m_p, m_n = o_p < P, o_n < N
    m_s = m_p[:, None] & m_n[None, :]

    p_s = state + i_s * stride_state_s + i_h * stride_state_h + o_p[:, None] * stride_state_p + o_n[None, :]
    o_sc = (i_s * H + i_h) * P + o_p
    # [ROWS, BN]
    if Q8:
        b_s = load_rows(p_s, m_s, state_scale, o_sc, m_p, True)
    else:
        b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    b_x = tl.load(x + i_b * stride_x_b + i_h * stride_x_h + o_p, mask=m_p, other=0.0).to(tl.float32)
    b_B = tl.load(B + i_b * stride_B_b + i_g * stride_B_g + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_dt = step_delta(tl.load(dt + i_b * stride_dt_b + i_h * stride_dt_h), dt_bias, i_h, HAS_DT_BIAS, USE_SOFTPLUS)
    b_a = tl.exp(tl.load(A + i_h).to(tl.float32) * b_dt)

    b_s = b_s * b_a + (b_dt * b_x)[:, None] * b_B[None, :]
    # rounding to nearest stays inline: through store_rows its PTX would gain the call's debug labels
    if Q8 or RANDOM:
        store_rows(p_s, b_s, m_s, state_scale, o_sc, m_p, store_key(seed, steps, i_s, i_h, RANDOM), o_p, N, Q8,
                   RANDOM)
        if RANDOM:
            count_stores(steps, step_arrive, i_s, H * tl.cdiv(P, ROWS), 1)
    else:
        tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)
    b_y = tl.sum(b_s * b_C[None, :], axis=1)
    b_y = finish_output(b_y, b_x, D, z, i_b * stride_z_b + i_h * stride_z_h + o_p, m_p, i_h, HAS_D, HAS_Z)
    p_y = y + i_b * stride_y_b + i_h * stride_y_h + o_p
    tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=m_p)


@triton.jit
def mamba2_decode_multi_kernel(
    state, snapshots, x, dt, A, B, C, D, z, dt_bias, slots, y, seed, steps, step_arrive, state_scale, snap_scale,
    H, P, N, HPG, TMAX,
    stride_state_s, stride_state_h, stride_state_p,
    stride_snap_s, stride_snap_t, stride_snap_h, stride_snap_p,
    stride_x_b, stride_x_t, stride_x_h,
    stride_dt_b, stride_dt_t, stride_dt_h,
    stride_B_b, stride_B_t, stride_B_g,
    stride_C_b, stride_C_t, stride_C_g,
    stride_z_b, stride_z_t, stride_z_h,
    stride_y_b, stride_y_t, stride_y_h,
    T: tl.constexpr, ROWS: tl.constexpr, BN: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr,
    HAS_SLOTS: tl.constexpr, RANDOM: tl.constexpr = False, Q8: tl.constexpr = False,
):
    # RANDOM: each snapshot rounded stochastically (draft t at the slot's store count + t), and the next draft
    # continues from the rounded state, as T conventional steps would; Q8: an 8-bit state (scales state_scale
    # (nslots, H, P)) and snapshots (scales snap_scale (nslots, TMAX, H, P)), the next draft continuing from the
    # stored rows
    i_b, i_h, i_p = flat_program_ids(H, tl.cdiv(P, ROWS))
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    i_g = i_h // HPG
    o_p = i_p * ROWS + tl.arange(0, ROWS)
    o_n = tl.arange(0, BN)
    m_p, m_n = o_p < P, o_n < N
    m_s = m_p[:, None] & m_n[None, :]

    p_s = state + i_s * stride_state_s + i_h * stride_state_h + o_p[:, None] * stride_state_p + o_n[None, :]
    if Q8:
        b_s = load_rows(p_s, m_s, state_scale, (i_s * H + i_h) * P + o_p, m_p, True)
    else:
        b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    b_A = tl.load(A + i_h).to(tl.float32)
    p_snap = snapshots + i_s * stride_snap_s + i_h * stride_snap_h + o_p[:, None] * stride_snap_p + o_n[None, :]
    if RANDOM:
        b_n = tl.load(steps + i_s)
    for t in tl.static_range(T):
        b_x = tl.load(x + i_b * stride_x_b + t * stride_x_t + i_h * stride_x_h + o_p, mask=m_p, other=0.0)
        b_x = b_x.to(tl.float32)
        b_B = tl.load(B + i_b * stride_B_b + t * stride_B_t + i_g * stride_B_g + o_n, mask=m_n, other=0.0)
        b_C = tl.load(C + i_b * stride_C_b + t * stride_C_t + i_g * stride_C_g + o_n, mask=m_n, other=0.0)
        b_dt = tl.load(dt + i_b * stride_dt_b + t * stride_dt_t + i_h * stride_dt_h)
        b_dt = step_delta(b_dt, dt_bias, i_h, HAS_DT_BIAS, USE_SOFTPLUS)
        b_s = b_s * tl.exp(b_A * b_dt) + (b_dt * b_x)[:, None] * b_B.to(tl.float32)[None, :]
        if Q8:
            if RANDOM:
                b_r = row_bits(slot_key(seed, b_n + t, i_s, i_h), o_p, N, 0, BN)
            else:
                b_r = tl.zeros([ROWS, BN], dtype=tl.uint32)
            b_q, b_scale = quantized_rows(b_s, b_r, p_snap.dtype.element_ty, RANDOM)
            tl.store(p_snap + t * stride_snap_t, b_q, mask=m_s)
            tl.store(snap_scale + ((i_s * TMAX + t) * H + i_h) * P + o_p, b_scale, mask=m_p)
            b_sr = b_q.to(tl.float32) * b_scale[:, None]
        elif RANDOM:
            b_r = row_bits(slot_key(seed, b_n + t, i_s, i_h), o_p, N, 0, BN)
            b_sr = rounded(b_s, b_r, p_snap.dtype.element_ty, True)
            tl.store(p_snap + t * stride_snap_t, b_sr.to(p_snap.dtype.element_ty), mask=m_s)
        else:
            tl.store(p_snap + t * stride_snap_t, b_s.to(p_snap.dtype.element_ty), mask=m_s)
        b_y = tl.sum(b_s * b_C.to(tl.float32)[None, :], axis=1)
        if RANDOM or Q8:
            b_s = b_sr
        o_z = i_b * stride_z_b + t * stride_z_t + i_h * stride_z_h + o_p
        b_y = finish_output(b_y, b_x, D, z, o_z, m_p, i_h, HAS_D, HAS_Z)
        p_y = y + i_b * stride_y_b + t * stride_y_t + i_h * stride_y_h + o_p
        tl.store(p_y, b_y.to(p_y.dtype.element_ty), mask=m_p)
    if RANDOM:
        count_stores(steps, step_arrive, i_s, H * tl.cdiv(P, ROWS), T)


@triton.jit
def mamba2_accept_snapshot_kernel(
    state, snapshots, n_accepted, slots, state_scale, snap_scale,
    P, N, H, TMAX,
    stride_state_s, stride_state_h, stride_state_p,
    stride_snap_s, stride_snap_t, stride_snap_h, stride_snap_p,
    ROWS: tl.constexpr, BN: tl.constexpr, HAS_SLOTS: tl.constexpr, Q8: tl.constexpr = False,
):
    # Q8: the rows' scales are copied too (snap_scale (nslots, TMAX, H, P) into state_scale (nslots, H, P))
    i_b, i_h, i_p = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = slot_of(slots, i_b, HAS_SLOTS)
    if i_s < 0:
        return
    n = tl.load(n_accepted + i_b).to(tl.int64)
    if n < 1:
        return
    o_p = i_p * ROWS + tl.arange(0, ROWS)
    o_n = tl.arange(0, BN)
    m_s = (o_p < P)[:, None] & (o_n < N)[None, :]
    p_snap = (snapshots + i_s * stride_snap_s + (n - 1) * stride_snap_t + i_h * stride_snap_h
              + o_p[:, None] * stride_snap_p + o_n[None, :])
    p_s = state + i_s * stride_state_s + i_h * stride_state_h + o_p[:, None] * stride_state_p + o_n[None, :]
    b_s = tl.load(p_snap, mask=m_s, other=0.0)
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)
    if Q8:
        m_p = o_p < P
        b_sc = tl.load(snap_scale + ((i_s * TMAX + n - 1) * H + i_h) * P + o_p, mask=m_p, other=0.0)
        tl.store(state_scale + (i_s * H + i_h) * P + o_p, b_sc, mask=m_p)


# These kernels write state in place, so they are not autotuned (a trial launch would advance the state): each state
# width and N has a fixed row, chosen by `select`.
@dataclass(frozen=True)
class DecodeConfig:
    """How `decode`, `decode_multi` and `accept_snapshot` are launched."""

    # rows of P per program (lowered to cover P): 4 to 64, fewer for larger N
    rows: int
    # warps per program: 1 to 8
    warps: int

    def __post_init__(self):
        for name in ("rows", "warps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"DecodeConfig.{name} must be a power of two, got {value!r}")


DECODE_LAUNCH = {
    "decode-fp32-n64": DecodeConfig(rows=32, warps=4),
    "decode-fp32-n128": DecodeConfig(rows=32, warps=8),
    "decode-fp32": DecodeConfig(rows=8, warps=4),
    "decode-bf16-n64": DecodeConfig(rows=64, warps=4),
    "decode-bf16-n128": DecodeConfig(rows=32, warps=4),
    "decode-bf16": DecodeConfig(rows=16, warps=4),
    # an fp32 state on a latency-bound grid: one-warp programs of 4 rows, mamba_ssm's tile
    "decode-fp32-small": DecodeConfig(rows=4, warps=1),
}
# An fp32 state's decode takes its small-grid row at up to this many (row, head) programs per SM.
SMALL_GRID = 16


def select(state: torch.Tensor, batch: int | None = None) -> str:
    """The DECODE_LAUNCH row for this state pool: by its width and N and, given the batch of a `decode`, the grid's
    (row, head) programs per SM."""
    width = "fp32" if state.element_size() == 4 else "bf16"
    N = state.shape[-1]
    if batch is not None and width == "fp32":
        per_sm = common.per_sm(batch * state.shape[1], state.device)
        if per_sm is not None and per_sm <= SMALL_GRID:
            return "decode-fp32-small"
    return f"decode-{width}-n64" if N <= 64 else f"decode-{width}-n128" if N <= 128 else f"decode-{width}"


def _config(state: torch.Tensor, config: DecodeConfig | None, batch: int | None = None) -> tuple[int, dict]:
    """(rows per program, compile options) of a launch on `state`."""
    c = DECODE_LAUNCH[select(state, batch)] if config is None else config
    return min(c.rows, common.block(state.shape[2])), common.compile_options(c.warps, None)


def _check_state(state, kernel, dtypes=common.FLOAT_DTYPES) -> tuple[int, int, int, int]:
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ValueError(f"state must have shape (nslots, H, P, N), got {got}")
    common.check_device(state.device, kernel)
    common.check_tensor("state", state, tuple(state.shape), "(nslots, H, P, N)", dtypes, state.device)
    common.check_dims(tuple(state.shape), "state")
    families.check_state_dtype(state.dtype, state.device)
    return tuple(state.shape)


def _check_rounding(rounding, state: torch.Tensor) -> None:
    rnd.check_rounding(rounding, state.dtype, state.shape[0], state.device, state.shape[-1])


def _q8(state_scale, snapshots) -> dict:
    """Q8 and the snapshots' positions per slot for a launch on an 8-bit state; else TMAX a compile-time None (so
    that the other states' launches take no such parameter)."""
    return {"Q8": True, "TMAX": snapshots.shape[1]} if state_scale is not None else {"TMAX": None}


@families.refuse_out_of_resources
def decode(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None, out=None,
           state_scale=None, rounding: rnd.StateRounding | None = None, config: DecodeConfig | None = None,
           check: bool = True) -> torch.Tensor:
    """One conventional Mamba-2 decode step; the state pool is updated in place through `slots`.

    S = exp(A·Δ) S + Δ x Bᵀ and y = S C + D x, times silu(z) when z is given, with Δ = dt (+ dt_bias, then
    softplus when dt_softplus). Computes in fp32; the state is read once and written once in its dtype (y is
    taken from the fp32 state before it is rounded).

    Args:
        state: (nslots, H, P, N) fp32, bf16, fp16, or 8-bit fp8 e4m3 / int8 rows (one per (slot, head, p), over N),
            unit stride on N; mutated in place.
        state_scale: (nslots, H, P) fp32, contiguous: an 8-bit state's row scales (a row's value is its 8-bit
            values times its scale), required for and only for an 8-bit state; mutated in place.
        rounding: None (round to nearest) or a `rounding.StateRounding` over nslots slots: the stored state is rounded
            stochastically by its Philox stream, and its step counts of the rows' slots advance by one. Refused for
            an fp32 state.
        x: (batch, H, P) bf16, fp16 or fp32. z: optional, same shape.
        dt: (batch, H). A, D, dt_bias: (H,). B, C: (batch, G, N), G dividing H; head h reads group h // (H/G).
        slots: (batch,) int32/int64 state slot of each row, -1 for a padding row (skipped, nothing written);
            default row b -> slot b.
        out: optional (batch, H, P) output; padding rows keep what it held.
        config: the launch settings (default: the DECODE_LAUNCH row `select` chooses); for benchmarks.
        check: range-check `slots` on the host (a device sync); skipped while a CUDA graph is captured.

    Returns:
        y (batch, H, P) in x's dtype (or `out`).
    """
    nslots, H, P, N = _check_state(state, mamba2_decode_kernel, common.STATE_DTYPES)
    common.check_state_scale(state_scale, state, (nslots, H, P), "(nslots, H, P)")
    _check_rounding(rounding, state)
    batch, _, G = args.check_inputs(x, dt, A, B, C, D, z, dt_bias, H=H, P=P, N=N, device=state.device, tokens=False)
    common.check_slots(slots, batch, nslots, state.device, check)
    args.check_out(out, (batch, H, P), "(batch, H, P)", state.device)
    ROWS, options = _config(state, config, batch)
    y = torch.empty_like(x) if out is None else out
    zs = z.stride() if z is not None else (0, 0, 0)
    seed, steps, random = rnd.rounding_args(rounding)
    mamba2_decode_kernel[(batch * H * triton.cdiv(P, ROWS),)](
        state=state, state_scale=state_scale, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, slots=slots, y=y,
        seed=seed, steps=steps, step_arrive=rnd.step_arrivals(rounding),
        H=H, P=P, N=N, HPG=H // G,
        stride_state_s=state.stride(0), stride_state_h=state.stride(1), stride_state_p=state.stride(2),
        stride_x_b=x.stride(0), stride_x_h=x.stride(1),
        stride_dt_b=dt.stride(0), stride_dt_h=dt.stride(1),
        stride_B_b=B.stride(0), stride_B_g=B.stride(1),
        stride_C_b=C.stride(0), stride_C_g=C.stride(1),
        stride_z_b=zs[0], stride_z_h=zs[1],
        stride_y_b=y.stride(0), stride_y_h=y.stride(1),
        ROWS=ROWS, BN=common.block(N),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, USE_SOFTPLUS=bool(dt_softplus),
        HAS_SLOTS=slots is not None, Q8=state_scale is not None, RANDOM=random,
        **options,
    )
    return y


def _check_snapshots(snapshots, state, T: int) -> None:
    nslots, H, P, N = state.shape
    if not isinstance(snapshots, torch.Tensor) or snapshots.dim() != 5:
        got = tuple(snapshots.shape) if isinstance(snapshots, torch.Tensor) else type(snapshots).__name__
        raise ValueError(f"snapshots must have shape (nslots, T, H, P, N), got {got}")
    if snapshots.shape[1] < T:
        raise ValueError(f"snapshots holds {snapshots.shape[1]} positions per slot but x carries T = {T} drafts")
    shape = (nslots, snapshots.shape[1], H, P, N)
    common.check_tensor("snapshots", snapshots, shape, "(nslots, T, H, P, N)", (state.dtype,), state.device)


def _check_scales(state, snapshots, state_scale, snapshot_scale) -> None:
    """An 8-bit state's and its snapshots' row scales, required for and only for an 8-bit state."""
    nslots, H, P, _ = state.shape
    common.check_state_scale(state_scale, state, (nslots, H, P), "(nslots, H, P)")
    common.check_state_scale(snapshot_scale, state, (nslots, snapshots.shape[1], H, P), "(nslots, T, H, P)",
                             "snapshot_scale")


@families.refuse_out_of_resources
def decode_multi(state, snapshots, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None,
                 out=None, state_scale=None, snapshot_scale=None, rounding: rnd.StateRounding | None = None,
                 config: DecodeConfig | None = None, check: bool = True) -> torch.Tensor:
    """T conventional decode steps from one state read, writing the state after each draft to a snapshot.

    The speculative path of vLLM: snapshots[slot, t] receives the state after draft t (state dtype); the
    state itself is not changed, so any prefix can be accepted later with `accept_snapshot`.

    Args:
        state: (nslots, H, P, N) fp32, bf16, fp16, fp8 or int8 (as in `decode`); read only.
        snapshots: (nslots, T_max, H, P, N) in the state's dtype, T_max ≥ T; mutated.
        state_scale, snapshot_scale: an 8-bit state's row scales (nslots, H, P), read, and its snapshots'
            (nslots, T_max, H, P), written; fp32, contiguous, required for and only for an 8-bit state.
        x, z: (batch, T, H, P) with 1 ≤ T ≤ 8. dt: (batch, T, H). B, C: (batch, T, G, N). A, D, dt_bias: (H,).
        slots, out, config, check: as in `decode`; out is (batch, T, H, P).
        rounding: None (round to nearest) or a `rounding.StateRounding` (16-bit and 8-bit states): snapshot t is
            rounded stochastically at its slot's step count + t, draft t + 1 continues from it, and the rows' slots'
            counts advance by T.

    Returns:
        y (batch, T, H, P) in x's dtype (or `out`).
    """
    nslots, H, P, N = _check_state(state, mamba2_decode_multi_kernel, common.STATE_DTYPES)
    batch, T, G = args.check_inputs(x, dt, A, B, C, D, z, dt_bias, H=H, P=P, N=N, device=state.device, tokens=True)
    common.check_draft(T, 8)
    _check_snapshots(snapshots, state, T)
    _check_scales(state, snapshots, state_scale, snapshot_scale)
    _check_rounding(rounding, state)
    common.check_slots(slots, batch, nslots, state.device, check)
    args.check_out(out, (batch, T, H, P), "(batch, T, H, P)", state.device)
    ROWS, options = _config(state, config)
    y = torch.empty_like(x) if out is None else out
    zs = z.stride() if z is not None else (0, 0, 0, 0)
    seed, steps, random = rnd.rounding_args(rounding)
    mamba2_decode_multi_kernel[(batch * H * triton.cdiv(P, ROWS),)](
        state=state, snapshots=snapshots, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias, slots=slots, y=y,
        seed=seed, steps=steps, step_arrive=rnd.step_arrivals(rounding), state_scale=state_scale,
        snap_scale=snapshot_scale,
        H=H, P=P, N=N, HPG=H // G,
        stride_state_s=state.stride(0), stride_state_h=state.stride(1), stride_state_p=state.stride(2),
        stride_snap_s=snapshots.stride(0), stride_snap_t=snapshots.stride(1),
        stride_snap_h=snapshots.stride(2), stride_snap_p=snapshots.stride(3),
        stride_x_b=x.stride(0), stride_x_t=x.stride(1), stride_x_h=x.stride(2),
        stride_dt_b=dt.stride(0), stride_dt_t=dt.stride(1), stride_dt_h=dt.stride(2),
        stride_B_b=B.stride(0), stride_B_t=B.stride(1), stride_B_g=B.stride(2),
        stride_C_b=C.stride(0), stride_C_t=C.stride(1), stride_C_g=C.stride(2),
        stride_z_b=zs[0], stride_z_t=zs[1], stride_z_h=zs[2],
        stride_y_b=y.stride(0), stride_y_t=y.stride(1), stride_y_h=y.stride(2),
        T=T, ROWS=ROWS, BN=common.block(N),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_DT_BIAS=dt_bias is not None, USE_SOFTPLUS=bool(dt_softplus),
        HAS_SLOTS=slots is not None, RANDOM=random, **_q8(state_scale, snapshots),
        **options,
    )
    return y


@families.refuse_out_of_resources
def accept_snapshot(state, snapshots, n_accepted, slots=None, *, state_scale=None, snapshot_scale=None,
                    config: DecodeConfig | None = None, check: bool = True) -> None:
    """Copy snapshots[slot, n - 1] into state[slot] for each row with n ≥ 1; rows with n = 0 keep their state.

    Args:
        state: (nslots, H, P, N); mutated. snapshots: (nslots, T_max, H, P, N) as written by `decode_multi`.
        state_scale, snapshot_scale: an 8-bit state's row scales, as in `decode_multi`; the chosen snapshot's
            scales are copied into state_scale.
        n_accepted: (batch,) int32/int64 on the device, each in [0, T_max]; read on the device (no sync).
        slots, config, check: as in `decode`; `check` also range-checks n_accepted on the host.
    """
    nslots, H, P, N = _check_state(state, mamba2_accept_snapshot_kernel, common.STATE_DTYPES)
    _check_snapshots(snapshots, state, 1)
    _check_scales(state, snapshots, state_scale, snapshot_scale)
    if not isinstance(n_accepted, torch.Tensor) or n_accepted.dim() != 1:
        raise ValueError("n_accepted must be a 1-D (batch,) integer tensor")
    batch = n_accepted.shape[0]
    common.check_tensor("n_accepted", n_accepted, (batch,), "(batch,)", common.INDEX_DTYPES, state.device)
    common.check_slots(slots, batch, nslots, state.device, check)
    if common.host_checks(check):
        T = snapshots.shape[1]
        bad = [n for n in n_accepted.tolist() if not 0 <= n <= T]
        if bad:
            raise ValueError(f"n_accepted must be in [0, {T}], got {bad[0]}")
    ROWS, options = _config(state, config)
    mamba2_accept_snapshot_kernel[(batch, H, triton.cdiv(P, ROWS))](
        state=state, snapshots=snapshots, n_accepted=n_accepted, slots=slots, state_scale=state_scale,
        snap_scale=snapshot_scale, P=P, N=N, H=H if state_scale is not None else None,
        stride_state_s=state.stride(0), stride_state_h=state.stride(1), stride_state_p=state.stride(2),
        stride_snap_s=snapshots.stride(0), stride_snap_t=snapshots.stride(1),
        stride_snap_h=snapshots.stride(2), stride_snap_p=snapshots.stride(3),
        ROWS=ROWS, BN=common.block(N), HAS_SLOTS=slots is not None, **_q8(state_scale, snapshots),
        **options,
    )
