"""Shared by both ops' kernels: argument checks, devices and grids, the fill protocol, the flush work list."""

from __future__ import annotations

import dataclasses
import functools
from enum import Enum

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
READ_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
# a state or checkpoint: fp32, 16-bit, or 8-bit rows with an fp32 scale each (replayssm_kernels.rounding)
STATE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn, torch.int8)
INDEX_DTYPES = (torch.int32, torch.int64)
DTYPE_NAMES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float8_e4m3fn: "fp8",
    torch.int8: "int8",
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
    """Streaming multiprocessors of a CUDA device; 0 for the CPU (the interpreter), where no grid has an SM count."""
    if device.type != "cuda":
        return 0
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def per_sm(programs: int, device: torch.device) -> float | None:
    """A grid's programs per SM, each program one (row, head) pair; None on the CPU (the interpreter), where every
    op takes its medium-grid rows. The one measure each op's `select` chooses its grid rows by."""
    sms = sm_count(device)
    return programs / sms if sms else None


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


def check_state_scale(scale, state: torch.Tensor, shape: tuple, dims: str, name: str = "state_scale") -> None:
    """An 8-bit state's fp32 row scales (`shape`, contiguous), required for an 8-bit state and refused for any other."""
    eight_bit = state.dtype in (torch.float8_e4m3fn, torch.int8)
    if scale is None:
        if eight_bit:
            raise ValueError(f"an {dtype_name(state.dtype)} state needs {name}: its fp32 row scales {dims}")
        return
    if not eight_bit:
        raise ValueError(f"{name} applies only to an 8-bit (fp8 or int8) state; this state is "
                         f"{dtype_name(state.dtype)}: pass {name}=None")
    check_tensor(name, scale, shape, dims, (torch.float32,), state.device)
    if not scale.is_contiguous():
        raise ValueError(f"{name} must be contiguous {dims}, got strides {scale.stride()}")


def check_dims(shape: tuple, names: str) -> None:
    if any(d < 1 for d in shape):
        raise ValueError(f"every dimension of {names} must be at least 1, got {tuple(shape)}")


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


def default_slots(slots, batch: int, device) -> torch.Tensor:
    """`slots`, or without one the table of row b -> slot b, for kernels that always read a slot table."""
    return torch.arange(batch, dtype=torch.int32, device=device) if slots is None else slots


def check_window(window: int) -> None:
    if not isinstance(window, int) or not 1 <= window <= 64:
        raise ValueError(f"window must be an integer in [1, 64], got {window!r}")


def check_draft(T: int, max_draft: int, name: str = "x") -> None:
    if not 1 <= T <= 8:
        raise ValueError(f"{name} carries T = {T} drafts; T must be in [1, 8]")
    if T > max_draft:
        raise ValueError(f"{name} carries T = {T} drafts but the cache was created with max_draft = {max_draft}")


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


def block(n: int) -> int:
    """A block size covering n entries; at least 2, so no block is a single element."""
    return max(2, triton.next_power_of_2(n))


@triton.jit
def flat_program_ids(NH, NPB):
    """(row, head, block) of a program in a flat grid of rows x NH heads x NPB blocks, a head's blocks adjacent.

    Programs that run together then read neighbouring memory (measured on an H200: 5-8% faster decode than a
    grid whose fastest axis is the row, benchmarks/notes/).
    """
    pid = tl.program_id(0)
    return pid // (NPB * NH), (pid // NPB) % NH, pid % NPB


@triton.jit
def dot_fp32(a, b, IS_A_EXACT: tl.constexpr, IS_B_EXACT: tl.constexpr, acc=None):
    # acc + a @ b to about fp32 accuracy on TF32 tensor cores; an operand exact in TF32 (16-bit data) needs no low
    # part
    if IS_A_EXACT and IS_B_EXACT:
        b_ab = tl.dot(a, b, acc, input_precision="tf32")
    elif IS_A_EXACT:
        b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b_ab = tl.dot(a, b - b_hi, tl.dot(a, b_hi, acc, input_precision="tf32"), input_precision="tf32")
    elif IS_B_EXACT:
        a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b_ab = tl.dot(a - a_hi, b, tl.dot(a_hi, b, acc, input_precision="tf32"), input_precision="tf32")
    else:
        b_ab = tl.dot(a, b, acc, input_precision="tf32x3")
    return b_ab


@triton.jit
def slot_of(slots, i_b, HAS_SLOTS: tl.constexpr):
    """The state slot of row i_b as int64: slots[i_b] (-1 for a padding row) or, without a slot table, i_b."""
    if HAS_SLOTS:
        i_s = tl.load(slots + i_b).to(tl.int64)
    else:
        i_s = i_b.to(tl.int64)
    return i_s


@triton.jit
def fills_read():
    """Order every thread's read of the program's fills before what comes next: a fill's store, or an arrival that
    lets another program store it. Triton loads a scalar in every thread, so without this barrier a warp that has
    not yet read a fill can see the value another warp just stored and take the other branch of the step
    (kernels/README.md, "The fill protocol")."""
    tl.debug_barrier()


# A replay in two launches passes the heads that flush from its first launch to its second in `work`, int32: a header
# of LIST_HEADER words, all zero between steps ([0] the count, [1] the programs done with the list, and for a tail
# (TAIL): [2] the tickets taken, [3] the heads programs done, [4] the entries claimed), then LIST_ENTRY words per
# listed head: (row, head, fill, and with TAIL a flag set once the other three are written).
LIST_HEADER = tl.constexpr(8)


LIST_ENTRY = tl.constexpr(4)


@triton.jit
def list_flush(work, i_b, i_h, f, TAIL: tl.constexpr):
    """Append (row, head, fill) to the list of heads that flush (the non-flush launch); with TAIL, publish it to the
    programs of the same launch that wait for it."""
    i_e = tl.atomic_add(work, 1, sem="relaxed")
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    tl.store(p_e, i_b)
    tl.store(p_e + 1, i_h)
    tl.store(p_e + 2, f)
    if TAIL:
        tl.atomic_xchg(p_e + 3, 1, sem="release")


@triton.jit
def list_heads(work, i_b, o_h, f, m_l):
    """Append (row, head o_h, fill f) for each lane of m_l to the list of heads that flush, with one atomic for the
    whole row: its entries take consecutive places in lane order."""
    b_n = m_l.to(tl.int32)
    n = tl.sum(b_n, 0)
    if n > 0:
        i_e = tl.atomic_add(work, n, sem="relaxed") + tl.cumsum(b_n, 0) - 1
        p_e = work + LIST_HEADER + LIST_ENTRY * i_e
        tl.store(p_e, tl.zeros_like(b_n) + i_b, mask=m_l)
        tl.store(p_e + 1, o_h, mask=m_l)
        tl.store(p_e + 2, f, mask=m_l)


@triton.jit
def advance_heads(p_fill, work, i_b, h0, f, W: tl.constexpr, HEADS: tl.constexpr, TAIL: tl.constexpr):
    """After a non-flush launch's step of heads h0 .. h0 + HEADS of row i_b at fill f (p_fill: the slot's fills): their
    fills to f + 1, or, where the step fills the window, to 0 with each head listed for the flushes."""
    o_hh = tl.arange(0, HEADS)
    fills_read()
    if f + 1 < W:
        tl.store(p_fill + h0 + o_hh, tl.zeros([HEADS], dtype=tl.int32) + f + 1)
    else:
        tl.store(p_fill + h0 + o_hh, tl.zeros([HEADS], dtype=tl.int32))
        for hh in tl.static_range(HEADS):
            list_flush(work, i_b, h0 + hh, f, TAIL)


@triton.jit
def listed_flush(work, i_e):
    """(row, head, fill) of the list's entry i_e (the flushes)."""
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    # From L2: with TAIL the entry was written during this launch, maybe after its line came into this SM's L1.
    return (tl.load(p_e, cache_modifier=".cg"), tl.load(p_e + 1, cache_modifier=".cg"),
            tl.load(p_e + 2, cache_modifier=".cg"))


@triton.jit
def listed_ahead(work, i_e, m_e):
    """(row, head, fill) of the list's entry i_e where m_e, zeros where not: an entry loaded before it is needed
    (an entry past the list's count is never read)."""
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    return tl.load(p_e, mask=m_e, other=0), tl.load(p_e + 1, mask=m_e, other=0), tl.load(p_e + 2, mask=m_e, other=0)


@triton.jit
def count_listed(work, slots, steps, HAS_SLOTS: tl.constexpr):
    """Advance by one the store count of each slot the list flushed (once: at its head 0's entry)."""
    n = tl.load(work, cache_modifier=".cg")
    i_e = 0
    while i_e < n:
        o_e = i_e + tl.arange(0, 64)
        m_e = o_e < n
        p_e = work + LIST_HEADER + LIST_ENTRY * o_e
        b_row = tl.load(p_e, mask=m_e, other=0, cache_modifier=".cg")
        m_c = m_e & (tl.load(p_e + 1, mask=m_e, other=1, cache_modifier=".cg") == 0)
        if HAS_SLOTS:
            o_s = tl.load(slots + b_row, mask=m_c, other=0).to(tl.int64)
        else:
            o_s = b_row.to(tl.int64)
        tl.atomic_add(steps + o_s, tl.full([64], 1, tl.int64), mask=m_c, sem="relaxed")
        i_e += 64


@triton.jit
def list_done(work, n_programs, slots, steps, HAS_SLOTS: tl.constexpr, RANDOM: tl.constexpr):
    """Each of the n_programs that take the list's flushes calls this after its last entry; the last of them zeroes
    the header for the next step, and with RANDOM first advances the store counts of the slots that flushed (no
    program of the launch reads them any more)."""
    if tl.atomic_add(work + 1, 1, sem="acq_rel") == n_programs - 1:
        if RANDOM:
            count_listed(work, slots, steps, HAS_SLOTS)
        for i in tl.static_range(5):
            if i != 1:
                tl.store(work + i, 0)
        tl.store(work + 1, 0)


@triton.jit
def tail_ticket(work):
    """A tail launch's order of starting: its first tickets take the heads programs, the rest the flushes. Programs
    that start later take later tickets, so a flushing program waits only on heads programs already running."""
    return tl.atomic_add(work + 2, 1, sem="relaxed")


@triton.jit
def tail_heads_done(work):
    """A tail launch's heads program after its heads, its list entries published."""
    tl.atomic_add(work + 3, 1, sem="release")


@triton.jit
def tail_claim(work):
    """The next list entry for a tail launch's flushing program."""
    return tl.atomic_add(work + 4, 1, sem="relaxed")


@triton.jit
def tail_wait(work, i_e, n_heads, n_entries):
    """Wait until the list's entry i_e is published (True; its fields then readable, its flag cleared for the next
    step) or all n_heads heads programs are done with fewer entries (False; at once past the list's n_entries).
    Polls with atomics: each is made by one thread and its value given to the program's others, so that all take
    the same branch."""
    p_flag = work + LIST_HEADER + LIST_ENTRY * i_e + 3
    state = tl.where(i_e < n_entries, 0, 2)
    while state == 0:
        if tl.atomic_add(p_flag, 0, sem="acquire") != 0:
            tl.store(p_flag, 0)
            state = 1
        elif tl.atomic_add(work + 3, 0, sem="acquire") == n_heads:
            # Every heads program has listed its entries: i_e is among them if the count passed it (then its
            # flag shows on the next poll).
            if tl.atomic_add(work, 0, sem="relaxed") <= i_e:
                state = 2
    return state == 1


@triton.jit
def scalar_mask(cond):
    """A scalar condition that block masks may take in: `True &` folds away when compiled, and in Triton's interpreter
    makes it boolean (there a bare comparison takes its operands' integer type, which 3.9's loads refuse as a mask)."""
    return True & cond


def flush_list(nslots: int, heads: int, device) -> torch.Tensor:
    """The zeroed list a two-launch replay passes its flushing heads in (`list_flush`)."""
    return torch.zeros(LIST_HEADER.value + LIST_ENTRY.value * nslots * heads, dtype=torch.int32, device=device)


def flush_grid(items: int, pps: int, device: torch.device) -> tuple[int]:
    """A flush launch's grid: `pps` programs per SM (`pps` in all on the CPU), no more than the items it may get."""
    return (min(items, pps * max(1, sm_count(device))),)


# How a flush folds its buffered entries into the checkpoint (tl.dot's input precision): fp32 FMAs, three TF32
# products (about fp32's accuracy), or one TF32 product (about 2^-11 of the update, under a 2-byte checkpoint's own
# rounding).
PRECISIONS = ("ieee", "tf32x3", "tf32")


def check_precision(checkpoint: torch.Tensor, precision: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "tf32" and checkpoint.element_size() > 2:
        raise ValueError("precision 'tf32' (one TF32 product per flush) applies only to a 2-byte checkpoint; an fp32 "
                         "checkpoint's flush takes 'ieee' or 'tf32x3'")


def compile_options(num_warps: int, maxnreg: int | None) -> dict:
    """Triton's compile options of a launch: its warps, one pipeline stage outside explicit loops, a register cap."""
    return {"num_warps": num_warps, "num_stages": 1, **({} if maxnreg is None else {"maxnreg": maxnreg})}


def override(config, fields: dict | None):
    """`config` (a frozen launch configuration) with `fields` replaced, for the benchmarks that sweep settings; a
    field it lacks is a ValueError naming its fields, and 0 / 1 given for a flag are taken as False / True."""
    if not fields:
        return config
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"{type(config).__name__} has no field {unknown[0]!r}; its fields: {', '.join(sorted(names))}")
    fields = {k: bool(v) if isinstance(getattr(config, k), bool) else v for k, v in fields.items()}
    return dataclasses.replace(config, **fields)
