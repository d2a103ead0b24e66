"""Shared by the Gated DeltaNet kernels: in-kernel rounding and normalisation, argument checks, launch settings."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from replayssm_kernels.common import (  # noqa: F401
    advance_heads,
    dot_fp32,
    fills_read,
    flat_program_ids,
    flush_cap,
    flush_grid,
    flush_list,
    list_done,
    list_flush,
    list_heads,
    listed_ahead,
    listed_flush,
    per_sm,
    scalar_mask,
    slot_of,
    sm_count,
)

FP8_MAX = 448.0
L2NORM_EPS = 1e-6

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}
STATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
IO_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
READ_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)


# Launch keys that choose a kernel's variant rather than size it, and their values: EARLY, MMA, PREFETCH, TAIL, the
# verify's BCPASS (Mamba-2) and GPASS (GDN; 2: each value head's weights from that pass too) and the GDN decode's
# SFIRST and CSTRIDES switch a variant on (1) or off (0); PHASES is the number of launches a replay step takes (2: the
# flushes in a launch of their own, or with TAIL in the heads launch's programs after the heads').
# TF32 is how a replay's flush folds its buffered entries into the checkpoint: 0 in fp32 FMAs, 1 in three TF32
# products (about fp32's accuracy), 2 in one TF32 product, for a 2-byte checkpoint only (its error, about 2^-11 of
# the update, is under the checkpoint's own rounding; `flush_precision`).
CHOICE_KEYS = {"EARLY": (0, 1, 2), "TF32": (0, 1, 2), "MMA": (0, 1), "PHASES": (1, 2), "SFIRST": (0, 1),
               "CSTRIDES": (0, 1), "PREFETCH": (0, 1), "TAIL": (0, 1), "BCPASS": (0, 1),
               "GPASS": (0, 1, 2), "KSPLIT": (1, 2), "FPASS": (0, 1),
               "FKSPLIT": (1, 2), "FSTREAM": (0, 1), "FPREF": (0, 1),
               "FSPLITW": (0, 1, 2), "ARRIVE": (0, 1),
               "WFILL": (0, 1), "LCOUNT": (0, 1), "CTF32": (0, 1),
               "SLOAD": (0, 1, 2), "PDL": (0, 1)}

FLUSH_PREFIX = "flush_"

_PRECISION = {0: "ieee", 1: "tf32x3", 2: "tf32"}


def flush_precision(checkpoint: torch.Tensor, tf32: int) -> str:
    """A flush's tl.dot input precision for launch key TF32 (CHOICE_KEYS) on this checkpoint."""
    if tf32 == 2 and checkpoint.element_size() > 2:
        raise ValueError("launch TF32 = 2 (one TF32 product per flush) applies only to a 2-byte checkpoint; an fp32 "
                         "checkpoint's flush takes TF32 = 0 or 1")
    return _PRECISION[tf32]


def pop_flush_keys(launch: dict) -> dict:
    """Remove the keys prefixed flush_ (the settings of a replay's second launch, for its flushes) from `launch`;
    return them without the prefix."""
    return {key[len(FLUSH_PREFIX):]: launch.pop(key) for key in list(launch) if key.startswith(FLUSH_PREFIX)}


def check_flush_keys(flush: dict, phases: int) -> None:
    if flush and phases == 1:
        raise ValueError(f"launch keys {', '.join(FLUSH_PREFIX + key for key in flush)} apply only with PHASES=2")


def compile_options(settings: dict) -> dict:
    """The settings that go to Triton as compile options rather than kernel constants."""
    options = {key: settings[key] for key in ("num_warps", "num_stages") if key in settings}
    if settings.get("maxnreg") is not None:
        options["maxnreg"] = settings["maxnreg"]
    return options


def small_grid(programs: int, device: torch.device) -> bool:
    """A grid of under two programs per SM: latency-bound, so the kernels take their small-grid rows (never on the
    CPU)."""
    n = per_sm(programs, device)
    return n is not None and n < 2


def medium_grid(programs: int, device: torch.device) -> bool:
    """A grid of under 16 programs per SM (GDN's verify at batch 32 and under on an H200), where that verify takes its
    medium-grid row (never on the CPU)."""
    n = per_sm(programs, device)
    return n is not None and n < 16


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


def launch_settings(table: dict, name: str, launch: dict | None) -> dict:
    """The fixed settings of kernel `name` with the caller's overrides; unknown keys are an error."""
    settings = dict(table[name])
    for key, value in (launch or {}).items():
        if key not in settings:
            raise ValueError(f"launch has unknown key {key!r} for {name}; expected some of {', '.join(settings)}")
        if key in ("maxnreg", "FMAXNREG", "FCAP") and value is None:
            settings[key] = None
            continue
        if key in CHOICE_KEYS:
            allowed = CHOICE_KEYS[key]
            if value not in allowed or isinstance(value, bool):
                raise ValueError(f"launch[{key!r}] must be {' or '.join(map(str, allowed))}; got {value!r}")
            settings[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"launch[{key!r}] must be a positive integer; got {value!r}")
        if key in ("BV", "BVF", "VK", "VP", "num_warps", "HPP", "FVP", "FWARPS", "GKSPLIT") and value & (value - 1):
            raise ValueError(f"launch[{key!r}] must be a power of two; got {value}")
        settings[key] = value
    return settings


def host_checks(check: bool) -> bool:
    """Whether to read device tensors on the host for range checks: never while a CUDA graph is captured."""
    return check and not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_device(device: torch.device, kernel) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    if device.type == "cpu" and not isinstance(kernel, InterpretedFunction):
        raise ValueError(
            "the tensors are on the CPU; these Triton kernels need a CUDA device, "
            "or TRITON_INTERPRET=1 set before import to run them on the CPU"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the tensors are on {device}; expected a CUDA device (or the CPU under TRITON_INTERPRET=1)")


def check_index(name: str, x, batch: int, device) -> None:
    if not isinstance(x, torch.Tensor) or x.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be an int32 or int64 tensor of shape ({batch},)")
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must have shape ({batch},); got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on {device}; got {x.device}")


def check_rows_fit(batch: int, nslots: int) -> None:
    """Without slots, row b uses slot b: the pool must hold the batch."""
    if batch > nslots:
        raise ValueError(f"without slots, row b uses slot b, so batch {batch} must not exceed nslots {nslots}")


def check_slots(slots, batch: int, nslots: int, device, check: bool) -> torch.Tensor:
    """slots (batch,) int32/int64, each in [0, nslots) or -1 for padding, no repeats; default arange(batch)."""
    if slots is None:
        check_rows_fit(batch, nslots)
        return torch.arange(batch, dtype=torch.int32, device=device)
    check_index("slots", slots, batch, device)
    if host_checks(check):
        values = slots.tolist()
        bad = [s for s in values if not -1 <= s < nslots]
        if bad:
            raise ValueError(f"slots must be in [0, {nslots}) or -1 for padding; got {bad[0]}")
        used = [s for s in values if s >= 0]
        if len(set(used)) != len(used):
            raise ValueError("slots must not repeat a slot within one call (two rows would race on one state)")
    return slots


def check_accepted(n_accepted, batch: int, most: int, device, check: bool) -> None:
    check_index("n_accepted", n_accepted, batch, device)
    if host_checks(check):
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


def check_state(state, name: str, HV: int, V: int, K: int, device) -> None:
    if not isinstance(state, torch.Tensor) or state.dim() != 4 or tuple(state.shape[1:]) != (HV, V, K):
        got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
        raise ValueError(f"{name} must have shape (nslots, {HV}, {V}, {K}); got {got}")
    if state.dtype not in STATE_DTYPES:
        raise ValueError(f"{name} must be fp32, bf16 or fp16; got {state.dtype}")
    if state.device != device:
        raise ValueError(f"{name} must be on {device} like q; got {state.device}")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))
