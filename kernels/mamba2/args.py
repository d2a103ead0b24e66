"""Argument checks and launch settings shared by the Mamba-2 launchers; every bad argument is a ValueError naming it."""

from __future__ import annotations

import functools
from enum import Enum

import torch
import triton

from replayssm_kernels.mamba2.common import LIST_ENTRY, LIST_HEADER

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
READ_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
INDEX_DTYPES = (torch.int32, torch.int64)
DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8",
    torch.float64: "fp64",
    torch.int32: "int32",
    torch.int64: "int64",
}
_BY_NAME = {name: dtype for dtype, name in DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _names(dtypes) -> str:
    names = [dtype_name(d) for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def as_dtype(value, what: str, allowed) -> torch.dtype:
    """A torch dtype from a torch dtype, a name such as "bf16", or one of the dtype enums."""
    if isinstance(value, Enum):
        value = value.value
    dtype = _BY_NAME.get(value) if isinstance(value, str) else value
    if dtype not in allowed:
        raise ValueError(f"{what} must be {_names(allowed)}, got {value!r}")
    return dtype


def is_interpreting(kernel) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 0 for the CPU (the interpreter), where every grid counts as large."""
    if device.type != "cuda":
        return 0
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def small_grid(programs: int, device: torch.device) -> bool:
    """A grid of under two programs per SM: latency-bound, so the kernels take their small-grid rows (never on the
    CPU)."""
    return programs < 2 * sm_count(device)


def medium_grid(programs: int, device: torch.device) -> bool:
    """A grid of under 16 programs per SM (GDN's verify at batch 32 and under on an H200), where that verify takes its
    medium-grid row (never on the CPU)."""
    return programs < 16 * sm_count(device)


def large_grid(heads: int, device: torch.device) -> bool:
    """At least 80 (row, head) pairs per SM (batch 83 and up at H = 128 on an H200), where the replay steps take their
    large-grid rows (never on the CPU)."""
    return device.type == "cuda" and heads >= 80 * sm_count(device)


def check_device(device: torch.device, kernel) -> None:
    if device.type == "cpu" and not is_interpreting(kernel):
        raise ValueError(
            "the tensors are on the CPU; these Triton kernels need a CUDA device, "
            "or TRITON_INTERPRET=1 set before import to run them on the CPU"
        )
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the tensors are on {device}; expected a CUDA device (or the CPU under TRITON_INTERPRET=1)")


def check_tensor(name: str, t, shape: tuple, dims: str, dtypes, device: torch.device, *, unit_stride: bool = True):
    """Shape, dtype, device and (for tensors with a P or N axis) a unit stride on the last axis."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)} {dims}, got {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise ValueError(f"{name} must be {_names(dtypes)}, got {dtype_name(t.dtype)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like the state, got {t.device}")
    if unit_stride and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride on its last axis for wide loads, got strides {t.stride()}")
    if any(st < 0 for st in t.stride()):
        raise ValueError(f"{name} has a negative stride {t.stride()}; the kernels take non-negative strides")


def check_optional(name: str, t, shape: tuple, dims: str, dtypes, device: torch.device, **kwargs) -> None:
    if t is not None:
        check_tensor(name, t, shape, dims, dtypes, device, **kwargs)


def check_dims(shape: tuple, names: str) -> None:
    if any(d < 1 for d in shape):
        raise ValueError(f"every dimension of {names} must be at least 1, got {tuple(shape)}")


def check_group(H: int, G: int, name: str = "B") -> None:
    if G < 1 or H % G != 0:
        raise ValueError(f"{name} has G = {G} groups, which must divide the H = {H} heads")


def host_checks(check: bool) -> bool:
    """Whether to read device tensors on the host for range checks: never while a CUDA graph is captured."""
    if not check:
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_slots(slots, batch: int, nslots: int, device: torch.device, check: bool, *, padding: bool = True) -> None:
    """slots (batch,) int32/int64 on the state's device, each in [0, nslots) (or -1 for padding), no repeats."""
    if slots is None:
        if batch > nslots:
            raise ValueError(f"without slots, row b uses slot b, so batch {batch} must not exceed nslots {nslots}")
        return
    check_tensor("slots", slots, (batch,), "(batch,)", INDEX_DTYPES, device)
    if not host_checks(check):
        return
    values = slots.tolist()
    low = -1 if padding else 0
    bad = [s for s in values if not low <= s < nslots]
    if bad:
        allowed = f"in [0, {nslots})" + (" or -1 for padding" if padding else "")
        raise ValueError(f"slots must be {allowed}, got {bad[0]}")
    used = [s for s in values if s >= 0]
    if len(set(used)) != len(used):
        raise ValueError("slots must not repeat a slot within one call (two rows would race on one state)")


def check_window(window: int) -> None:
    if not isinstance(window, int) or not 1 <= window <= 64:
        raise ValueError(f"window must be an integer in [1, 64], got {window!r}")


def check_draft(T: int, max_draft: int, name: str = "x") -> None:
    if not 1 <= T <= 8:
        raise ValueError(f"{name} carries T = {T} drafts; T must be in [1, 8]")
    if T > max_draft:
        raise ValueError(f"{name} carries T = {T} drafts but the cache was created with max_draft = {max_draft}")


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


def flush_list(nslots: int, heads: int, device) -> torch.Tensor:
    """The zeroed list a two-launch replay passes its flushing heads in (mamba2.common.list_flush)."""
    return torch.zeros(LIST_HEADER.value + LIST_ENTRY.value * nslots * heads, dtype=torch.int32, device=device)


def flush_grid(items: int, pps: int, device: torch.device) -> tuple[int]:
    """The flush launch's grid: PPS programs per SM (PPS in all on the CPU), no more than the items it may get."""
    return (min(items, pps * max(1, sm_count(device))),)


# 64K 32-bit registers per SM (every NVIDIA GPU since Volta), allocated to a warp 8 per thread at a time.
REGISTERS_PER_SM = 65536


def flush_cap(maxnreg: int | None, fcap: int | None, items: int, num_warps: int, pps: int, sms: int) -> int | None:
    """A flush launch's register cap: `fcap` (fewer programs per SM, each faster) where a step's `items` take no more
    rounds of the launch's resident programs at it than at `maxnreg`, else `maxnreg` (and on the CPU, `sms` 0)."""
    if fcap is None or maxnreg is None or not sms:
        return maxnreg

    def rounds(cap: int) -> int:
        per_sm = min(pps, REGISTERS_PER_SM // (-(-cap // 8) * 8 * 32 * num_warps))
        return -(-items // (max(1, per_sm) * sms))

    return fcap if rounds(fcap) <= rounds(maxnreg) else maxnreg


def compile_options(settings: dict) -> dict:
    """The settings that go to Triton as compile options rather than kernel constants."""
    options = {key: settings[key] for key in ("num_warps", "num_stages") if key in settings}
    if settings.get("maxnreg") is not None:
        options["maxnreg"] = settings["maxnreg"]
    return options


def check_flush_keys(flush: dict, phases: int) -> None:
    if flush and phases == 1:
        raise ValueError(f"launch keys {', '.join(FLUSH_PREFIX + key for key in flush)} apply only with PHASES=2")


def pick_launch(table: list, itemsize: int, P: int, N: int, launch: dict | None, keys: tuple) -> dict:
    """The first table row whose (itemsize, max N, max P) covers the shape, overridden by `launch`."""
    settings = None
    for (size, max_n, max_p), row in table:
        if size == itemsize and N <= max_n and P <= max_p:
            settings = dict(row)
            break
    if settings is None:
        settings = dict(table[-1][1])
    if launch:
        unknown = sorted(set(launch) - set(keys))
        if unknown:
            raise ValueError(f"launch has unknown key {unknown[0]!r}; expected some of {', '.join(keys)}")
        for key, value in launch.items():
            # a flush_ key (the settings of a second launch's flushes) obeys its setting's rules
            base = key[len(FLUSH_PREFIX):] if key.startswith(FLUSH_PREFIX) else key
            if base in CHOICE_KEYS:
                allowed = CHOICE_KEYS[base]
                if isinstance(value, bool) or value not in allowed:
                    raise ValueError(f"launch[{key!r}] must be {' or '.join(map(str, allowed))}, got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"launch[{key!r}] must be a positive integer, got {value!r}")
            if base in ("num_warps", "BP", "BPF", "HPP", "RC", "VN") and value & (value - 1):
                raise ValueError(f"launch[{key!r}] must be a power of two, got {value}")
        settings.update(launch)
        if settings.get("PHASES") == 1:
            # a row's flush_ settings are its second launch's: asked for one launch, the row's go (a caller's stay, and
            # are refused)
            for key in [key for key in settings if key.startswith(FLUSH_PREFIX) and key not in launch]:
                del settings[key]
    return settings


def check_inputs(x, dt, A, B, C, D, z, dt_bias, *, H: int, P: int, N: int, device: torch.device, tokens: bool,
                 io_dtypes=FLOAT_DTYPES) -> tuple[int, int | None, int]:
    """The step inputs against the state's (H, P, N); returns (batch, T or None, G)."""
    lead_dims = "(batch, T, " if tokens else "(batch, "
    rank = 4 if tokens else 3
    if not isinstance(x, torch.Tensor) or x.dim() != rank:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x must have shape {lead_dims}H, P), got {got}")
    lead = tuple(x.shape[: rank - 2])
    batch, T = lead[0], (lead[1] if tokens else None)
    if batch < 1:
        raise ValueError("x must hold at least one row (batch ≥ 1)")
    check_tensor("x", x, (*lead, H, P), lead_dims + "H, P)", io_dtypes, device)
    check_tensor("dt", dt, (*lead, H), lead_dims + "H)", FLOAT_DTYPES, device, unit_stride=False)
    check_tensor("A", A, (H,), "(H,)", FLOAT_DTYPES, device)
    if not isinstance(B, torch.Tensor) or B.dim() != rank:
        got = tuple(B.shape) if isinstance(B, torch.Tensor) else type(B).__name__
        raise ValueError(f"B must have shape {lead_dims}G, N), got {got}")
    G = B.shape[-2]
    check_group(H, G)
    check_tensor("B", B, (*lead, G, N), lead_dims + "G, N)", io_dtypes, device)
    check_tensor("C", C, (*lead, G, N), lead_dims + "G, N)", FLOAT_DTYPES, device)
    check_optional("D", D, (H,), "(H,)", FLOAT_DTYPES, device)
    check_optional("dt_bias", dt_bias, (H,), "(H,)", FLOAT_DTYPES, device)
    check_optional("z", z, (*lead, H, P), lead_dims + "H, P)", FLOAT_DTYPES, device)
    return batch, T, G


def check_out(out, shape: tuple, dims: str, device: torch.device) -> None:
    check_optional("out", out, shape, dims, FLOAT_DTYPES, device)


def block(n: int) -> int:
    """A block size covering n entries; at least 2, so no block is a single element."""
    return max(2, triton.next_power_of_2(n))
