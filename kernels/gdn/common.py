"""Shared by the Gated DeltaNet kernels: in-kernel rounding and normalisation, argument checks."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from replayssm_kernels import common, families
from replayssm_kernels import rounding as R

FP8_MAX = 448.0
L2NORM_EPS = 1e-6

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "int8": torch.int8,
}
# States (conventional and checkpoints): fp32, 16-bit, or 8-bit rows over K with an fp32 scale each.
STATE_DTYPES = common.STATE_DTYPES
EIGHT_BIT = R.EIGHT_BIT
ROUNDINGS = ("nearest", "stochastic")
IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
READ_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


@triton.jit
def _round_bf16(b_x):
    b_i = b_x.to(tl.uint32, bitcast=True)
    b_i = (b_i + 0x7FFF + ((b_i >> 16) & 1)) & 0xFFFF0000
    return b_i.to(tl.float32, bitcast=True)


@triton.jit
def _round_mantissa3(b_a):
    b_i = b_a.to(tl.uint32, bitcast=True)
    b_i = (b_i + 0x7FFFF + ((b_i >> 20) & 1)) & 0xFFF00000
    return b_i.to(tl.float32, bitcast=True)


@triton.jit
def rounded(b_x, DTYPE: tl.constexpr):
    """b_x (fp32) rounded to nearest even in DTYPE, still as fp32 values."""
    # Rounded by hand because the CPU interpreter truncates fp32 to bf16; the GPU result is the same.
    if DTYPE == tl.bfloat16:
        b_x = _round_bf16(b_x)
    elif DTYPE == tl.float16:
        b_x = b_x.to(tl.float16).to(tl.float32)
    return b_x


@triton.jit
def cast(b_x, DTYPE: tl.constexpr):
    return rounded(b_x, DTYPE).to(DTYPE)


@triton.jit
def quantize_e4m3(b_y):
    """b_y (fp32, |b_y| <= 448 up to rounding) as float8 e4m3, rounded to nearest even."""
    # Rounded by hand because the CPU interpreter's fp8 conversion drops the carry into the exponent.
    b_a = tl.abs(b_y)
    b_r = tl.where(b_a < 0.015625, _round_mantissa3(b_a + 0.015625) - 0.015625, _round_mantissa3(b_a))
    b_r = tl.minimum(b_r, 448.0)
    return tl.where(b_y < 0, -b_r, b_r).to(tl.float8e4nv)


@triton.jit
def stored(b_x, b_r, DTYPE: tl.constexpr, RANDOM: tl.constexpr):
    """b_x (fp32) as the fp32 values a DTYPE (fp32, bf16, fp16) state holds: rounded to nearest even as `rounded`
    does, or with RANDOM stochastically by the uint32 bits b_r (`rounding.rounded`)."""
    if RANDOM:
        b_x = R.rounded(b_x, b_r, DTYPE, True)
    else:
        b_x = rounded(b_x, DTYPE)
    return b_x


@triton.jit
def state_bits(b_key, o_v, o_k, K: tl.constexpr, RANDOM: tl.constexpr):
    """The random bits [R, C] of rows o_v and columns o_k of a (slot, value head) state (element v·K + k) under its
    store's key b_key (`rounding.store_key`, `rounding.store_bits`); zeros (unused) without RANDOM."""
    return R.store_bits(b_key, o_v[:, None] * K + o_k[None, :], RANDOM)


@triton.jit
def store_rows(ckpt, cscale, o_s, o_r, b_s, m_s, m_v, b_r, Q8: tl.constexpr, RANDOM: tl.constexpr):
    """Store fp32 state rows b_s [R, BK], whole rows over K, at ckpt + o_s in its dtype: rounded to nearest, or with
    RANDOM stochastically by the bits b_r, or with Q8 as 8-bit rows (`rounding.quantized_rows`) with their scales
    [R] at cscale + o_r. Returns the values a read gives back."""
    DTYPE: tl.constexpr = ckpt.dtype.element_ty
    if Q8:
        b_q, b_sc = R.quantized_rows(b_s, b_r, DTYPE, RANDOM)
        tl.store(ckpt + o_s, b_q, mask=m_s)
        tl.store(cscale + o_r, b_sc, mask=m_v)
        b_s = b_q.to(tl.float32) * b_sc[:, None]
    else:
        b_s = stored(b_s, b_r, DTYPE, RANDOM)
        tl.store(ckpt + o_s, b_s.to(DTYPE), mask=m_s)
    return b_s


@triton.jit
def l2norm_factor(b_x):
    """The scalar that L2-normalises b_x, to apply to it or to its row sums in whatever shape they are held."""
    return 1.0 / tl.sqrt(tl.sum(b_x * b_x) + 1e-6)


@triton.jit
def qk_factors(b_q, b_k, scale, USE_QK_L2NORM: tl.constexpr):
    """(q's, k's) factors: the l2-norm's and, for q, the attention scale; applied to row sums, not to q and k."""
    if USE_QK_L2NORM:
        b_rq = l2norm_factor(b_q) * scale
        b_rk = l2norm_factor(b_k)
    else:
        b_rq = scale
        b_rk = 1.0
    return b_rq, b_rk


def resolve_dtype(name, what: str, allowed) -> torch.dtype:
    """A torch dtype from a torch dtype or one of our names ("fp32", "bf16", "fp16", "fp8")."""
    dtype = name if isinstance(name, torch.dtype) else DTYPES.get(getattr(name, "value", name))
    if dtype not in allowed:
        names = ", ".join(k for k, v in DTYPES.items() if v in allowed)
        raise ValueError(f"{what} must be one of {names}; got {name!r}")
    return dtype


def default_scale(K: int, scale: float | None) -> float:
    if scale is None:
        return K**-0.5
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite number; got {scale!r}")
    return float(scale)


def check_accepted(n_accepted, batch: int, most: int, device, check: bool) -> None:
    common.check_tensor("n_accepted", n_accepted, (batch,), "(batch,)", common.INDEX_DTYPES, device)
    if common.host_checks(check):
        bad = [n for n in n_accepted.tolist() if not 0 <= n <= most]
        if bad:
            raise ValueError(f"n_accepted must be in [0, {most}], the drafts of the last verify; got {bad[0]}")


def check_step(q, k, v, g, beta, *, tokens: bool, io_dtype=None):
    """Check one step's (or, with tokens, T drafts') inputs; return (batch, T, H, HV, K, V)."""
    lead = 2 if tokens else 1
    names = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    for name, x in names.items():
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor; got {type(x).__name__}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor; got {x.dtype}")
        want = lead + (1 if name in ("g", "beta") else 2)
        if x.dim() != want:
            axes = "(batch, T, " if tokens else "(batch, "
            tail = {"q": "H, K)", "k": "H, K)", "v": "HV, V)", "g": "HV)", "beta": "HV)"}[name]
            raise ValueError(f"{name} must have shape {axes}{tail}; got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{name} is on {x.device} but q is on {q.device}")
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {tuple(q.shape)}; got {tuple(k.shape)}")
    batch, H, K = q.shape[0], q.shape[-2], q.shape[-1]
    T = q.shape[1] if tokens else 1
    HV, V = v.shape[-2], v.shape[-1]
    if v.shape[:lead] != q.shape[:lead]:
        raise ValueError(f"v must have the leading axes of q {tuple(q.shape[:lead])}; got {tuple(v.shape)}")
    if HV % H:
        raise ValueError(f"v's head count HV={HV} must be a multiple of q's H={H}")
    for name in ("g", "beta"):
        if names[name].shape != v.shape[:-1]:
            raise ValueError(f"{name} must have shape {tuple(v.shape[:-1])}; got {tuple(names[name].shape)}")
    for name in ("q", "k", "v"):
        dtype = names[name].dtype
        if dtype not in IO_DTYPES:
            raise ValueError(f"{name} must be fp32, bf16 or fp16; got {dtype}")
        if io_dtype is not None and dtype != io_dtype:
            raise ValueError(f"{name} must be {io_dtype} like the cache's io_dtype; got {dtype}")
    if K > 256 or V > 256:
        raise ValueError(f"K and V must be at most 256; got K={K}, V={V}")
    return batch, T, H, HV, K, V


def check_out(out, shape, dtype, device):
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out must be a {dtype} tensor of shape {tuple(shape)}")
    if out.device != device:
        raise ValueError(f"out must be on {device}; got {out.device}")
    return out


def check_state(state, name: str, HV: int, V: int, K: int, device, dtypes=STATE_DTYPES) -> None:
    if not isinstance(state, torch.Tensor) or state.dim() != 4 or tuple(state.shape[1:]) != (HV, V, K):
        got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ValueError(f"{name} must have shape (nslots, {HV}, {V}, {K}); got {got}")
    if state.dtype not in dtypes:
        names = ", ".join(k for k, v in DTYPES.items() if v in dtypes)
        raise ValueError(f"{name} must be one of {names}; got {state.dtype}")
    if state.device != device:
        raise ValueError(f"{name} must be on {device} like q; got {state.device}")
    check_state_dtype(state.dtype, device)


def check_state_dtype(dtype: torch.dtype, device) -> None:
    """Refuse an fp8 state on a chip without e4m3 conversions (before sm_89), as fp8 read copies are refused."""
    arch = families.capability(torch.device(device))
    if arch is None or dtype != torch.float8_e4m3fn or families.family_of(arch).fp8:
        return
    raise families.UnsupportedOnChip(f"an fp8 state needs sm_89 or newer (float8 e4m3 conversions); this GPU is "
                                     f"sm_{arch}: use state_dtype='int8' (int8 rows with scales) or 'bf16'")


def resolve_rounding(rounding) -> str:
    """One of ROUNDINGS from its name (or an Enum whose value is one)."""
    name = getattr(rounding, "value", rounding)
    if name not in ROUNDINGS:
        raise ValueError(f"rounding must be 'nearest' or 'stochastic'; got {rounding!r}")
    return name


def rounding_args(rounding: R.StateRounding | None) -> dict:
    """A launch's seed, step counts and RANDOM (`rounding.rounding_args`: None for the first two when rounding to
    nearest, constants out of the kernel's signature, so that it compiles as without them)."""
    seed, steps, random = R.rounding_args(rounding)
    return {"seed": seed, "steps": steps, "RANDOM": random}


def draw_state_bits(rounding, idx: torch.Tensor, shape: tuple, step: int = 0):
    """The bits a kernel draws for slots idx's states of `shape` (n, HV, V, K), `step` stores past each slot's
    count; None without rounding."""
    if rounding is None:
        return None
    n, HV, V, K = shape
    return R.draw_bits(rounding, idx, HV, V * K, ahead=step, paired=False).view(n, HV, V, K)


def stored_state(S: torch.Tensor, dtype: torch.dtype, bits) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fp32 states S (..., V, K) as a state of `dtype` stores them: (values, None), or for an 8-bit state (values,
    scales (..., V)); rounded to nearest without bits, else stochastically by them."""
    if dtype in R.EIGHT_BIT:
        return R.quantized_rows_reference(S, bits, dtype)
    if bits is None:
        return S.to(dtype), None
    return R.rounded_reference(S.float(), bits, dtype).to(dtype), None


def state_value(state: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A stored state's values in fp32 (fp64 kept): an 8-bit state's rows times their scales."""
    if scale is not None:
        return R.dequantized_rows(state, scale)
    return state if state.dtype == torch.float64 else state.float()


def raw(t: torch.Tensor) -> torch.Tensor:
    """t, or an fp8 tensor's bytes: torch has no index_fill_/index_copy_/index_put_ for fp8 (zero bytes are 0.0)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
