"""Modelled DRAM bytes, FLOPs and memory of one decode step of one SSM layer, for every kernel and phase."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from replayssm_cli.model import ops
from replayssm_cli.model.dtypes import EIGHT_BIT, itemsize, precision_problem
from replayssm_cli.model.shapes import SCALE_BYTES, SSMShape

VARIANTS = ("conventional", "replay", "split", "spec-conventional", "spec-replay")
PHASES = ("avg", "nonflush", "flush")
STATE_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
ROUNDINGS = ("nearest", "stochastic")
READ_DTYPES = ("bf16", "fp16", "fp8")
IO_DTYPES = ("bf16", "fp16", "fp32")
MAX_WINDOW = 64
MAX_DRAFT = 8

# Five small launches at batch 1 took 11 µs on the H200 here, about 1 µs of it the 4 MiB state read (docs/design.md §6).
LAUNCH_US = 2.0

_F32 = 4
_I32 = 4
# A StateRounding's store count per slot (int64), read and advanced by every step that stores the state.
_STEP_COUNT = 8
# Stochastic rounding's random bits per state store (kernels/rounding.py): one Philox4x32-10 draw per (sequence, head)
# keys the store (10 rounds of 2 umulhi, 2 multiplies, 4 xors and 2 adds: triton.language.random.philox_impl). In
# Mamba-2 each pair of stored neighbours takes the two halves of lowbias32 of its index plus the key (the halving
# shift, an add, three xor-shifts of two operations each and two multiplies), each element its half (a mask or a
# shift); in GDN each element takes the top half of lowbias32 of its place plus the key (an add, the xor-shifts, the
# multiplies and the last shift).
PHILOX_ROUNDS = 10
PHILOX_INT_OPS = PHILOX_ROUNDS * (2 + 2 + 4 + 2)
PAIR_INT_OPS = 1 + 1 + 3 * 2 + 2
HALF_INT_OPS = 1
HASH_INT_OPS = 1 + 3 * 2 + 2 + 1


def _bits_ops(op, elements: int) -> int:
    """The integer operations of one store's random bits for `elements` elements, by the op's rule."""
    if op.paired_bits:
        return elements // 2 * PAIR_INT_OPS + elements * HALF_INT_OPS
    return elements * HASH_INT_OPS


@dataclass(frozen=True)
class Cost:
    """DRAM bytes read, bytes written and FLOPs of one decode step of one layer over the whole batch; int_ops counts
    the integer operations of stochastic rounding's random bits, apart from the FLOPs."""

    bytes_read: int
    bytes_written: int
    flops: int
    int_ops: int = 0

    @property
    def total_bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte moved."""
        return self.flops / self.total_bytes if self.total_bytes else math.inf

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            self.bytes_read + other.bytes_read, self.bytes_written + other.bytes_written, self.flops + other.flops,
            self.int_ops + other.int_ops,
        )

    def scaled(self, k: float) -> Cost:
        """This cost times k, rounded to whole bytes and FLOPs (k = layers for a whole model step)."""
        return Cost(round(self.bytes_read * k), round(self.bytes_written * k), round(self.flops * k), round(self.int_ops * k))

    def as_dict(self) -> dict[str, float]:
        return {
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "total_bytes": self.total_bytes,
            "flops": self.flops,
            "int_ops": self.int_ops,
            "intensity": self.intensity,
        }


@dataclass(frozen=True)
class _Count:
    """A Cost before rounding: averages over a window or a speculative cycle are fractional."""

    read: float = 0
    written: float = 0
    flops: float = 0
    ints: float = 0

    def __add__(self, other: _Count) -> _Count:
        return _Count(self.read + other.read, self.written + other.written, self.flops + other.flops, self.ints + other.ints)

    def __sub__(self, other: _Count) -> _Count:
        return _Count(self.read - other.read, self.written - other.written, self.flops - other.flops, self.ints - other.ints)

    def __mul__(self, k: float) -> _Count:
        return _Count(self.read * k, self.written * k, self.flops * k, self.ints * k)

    def __truediv__(self, k: float) -> _Count:
        return _Count(self.read / k, self.written / k, self.flops / k, self.ints / k)

    def cost(self) -> Cost:
        return Cost(round(self.read), round(self.written), round(self.flops), round(self.ints))


@dataclass(frozen=True)
class _Sizes:
    """Bytes per batch row of one layer at given dtypes (params: per step, read once whatever the batch)."""

    state: int
    copy: int
    inputs: int
    outputs: int
    params: int
    entry: int
    draft_b: int
    counters: int
    heads: int
    # Whether the tile a nonflush step or verify reads is 8-bit with row scales (an fp8 copy, or an 8-bit checkpoint).
    fp8: bool
    # What a split-precision flush reads of the copy: GDN carries checkpoint - copy through the entries
    # (it reads both); Mamba-2's buffered updates need no correction (the checkpoint only).
    flush_copy: int = 0
    # Whether the state itself is 8-bit: dequantised where it is read, quantised where it is stored.
    eight_bit: bool = False
    # Per state store: the integer operations of stochastic rounding's random bits and the rounding's store count.
    rng_ops: int = 0
    step_count: int = 0


def _sizes(shape: SSMShape, st: str, rd: str | None, io: str, has_z: bool, rounding: str = "nearest",
           buffer: str | None = None) -> _Sizes:
    s, r = itemsize(st), itemsize(rd)
    op = _op(shape)
    part = op.step_sizes(shape, itemsize(io), has_z, itemsize(buffer or "fp32"))
    scales = part["rows"] * SCALE_BYTES if rd == "fp8" else 0
    copy = shape.state_elems * r + scales if rd else 0
    eight_bit = st in EIGHT_BIT
    stochastic = rounding == "stochastic"
    return _Sizes(
        state=shape.state_elems * s + (part["rows"] * SCALE_BYTES if eight_bit else 0),
        copy=copy,
        inputs=part["inputs"],
        outputs=part["outputs"],
        params=part["params"],
        entry=part["entry"],
        draft_b=part["draft_b"],
        counters=part["heads"] * _I32,
        heads=part["heads"],
        fp8=rd == "fp8" or (rd is None and eight_bit),
        flush_copy=copy if op.split_flush_reads_copy else 0,
        eight_bit=eight_bit,
        rng_ops=part["heads"] * PHILOX_INT_OPS + _bits_ops(op, shape.state_elems) if stochastic else 0,
        step_count=_STEP_COUNT if stochastic else 0,
    )


def _op(shape: SSMShape):
    try:
        return ops.of(shape)
    except ValueError:
        raise ValueError(f"shape must be a Mamba2Shape or a GDNShape, got {shape!r}") from None


def _with_capacity(s: _Sizes, shape: SSMShape, rd: str | None, capacity: int) -> _Sizes:
    """GDN under split precision buffers, per value head and entry, beta and the entry's row of T (capacity wide),
    from which a flush corrects the buffered updates."""
    if rd is None or not _op(shape).split_flush_reads_copy:
        return s
    return replace(s, entry=s.entry + s.heads * (1 + capacity) * _F32)


def _name(value: str | Enum | None) -> str | None:
    if value is None:
        return None
    return value.value if isinstance(value, Enum) else str(value)


def _choice(value: str | Enum | None, allowed: tuple[str, ...], what: str) -> str:
    name = _name(value)
    if name not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(allowed)}, got {name!r}")
    return name


def _check_int(value: Any, lo: int, hi: int | None, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ValueError(f"{what} must be {bound}, got {value}")
    return value


def _check_window(window: int | None) -> int:
    if window is None:
        raise ValueError("the replay variants need a window (1 to 64)")
    return _check_int(window, 1, MAX_WINDOW, "window")


def _check_draft(draft: int) -> int:
    return _check_int(draft, 1, MAX_DRAFT, "draft (the speculative variants' draft width T)")


def _check_accepted(accepted: float | None, T: int) -> float:
    if accepted is None:
        return float(T)
    if isinstance(accepted, bool) or not isinstance(accepted, (int, float)) or not 0 < accepted <= T:
        raise ValueError(f"accepted must be a mean number of drafts in (0, {T}], got {accepted!r}")
    return float(accepted)


def spec_replay_cycle(window: int, accepted: float) -> tuple[float, float, float]:
    """The steady state of speculative ReplaySSM: (mean fill at a verify, entries per flush, flushes per step).

    Each step commits `accepted` = a entries on average, and a verify that finds the committed fill at W or
    more first folds the F entries it holds into a new checkpoint and runs at fill 0. Taking the fill to grow
    by exactly a per step, F = max(W, a), a cycle is F / a steps with fills 0, a, 2a, ..., F - a at their
    verifies, so the mean fill is (F - a) / 2 (for a = 1: (W - 1) / 2, the plain replay figure) and a flush
    comes every F / a steps. Exact when every step accepts the same whole a dividing W; with random
    acceptance the overshoot past W (at most T - 1 entries) is left out.
    """
    window = _check_window(window)
    if isinstance(accepted, bool) or not isinstance(accepted, (int, float)) or accepted <= 0:
        raise ValueError(f"accepted must be a positive mean number of drafts, got {accepted!r}")
    folded = max(float(window), float(accepted))
    return (folded - accepted) / 2, folded, accepted / folded


def _dequant(s: _Sizes, fl: Any) -> float:
    """Reading a whole 8-bit state: each element times its row's scale."""
    return fl.tile_dequant if s.eight_bit else 0


def _conventional(s: _Sizes, fl: Any, b: int, T: int) -> _Count:
    row = _Count(
        s.state + T * s.inputs + s.step_count,
        T * s.state + T * s.outputs + s.step_count,
        fl.conventional(T) + (_dequant(s, fl) + T * fl.quant if s.eight_bit else 0),
        T * s.rng_ops,
    )
    return row * b + _Count(read=s.params)


def _verify(s: _Sizes, fl: Any, b: int, f: float, T: int) -> _Count:
    row = _Count(
        (s.copy or s.state) + f * s.entry + T * s.inputs + s.counters,
        T * s.entry + T * s.outputs,
        fl.verify(f, T) + (fl.tile_dequant if s.fp8 else 0),
    )
    return row * b + _Count(read=s.params)


def _nonflush(s: _Sizes, fl: Any, b: int, f: float) -> _Count:
    row = _Count(
        (s.copy or s.state) + f * s.entry + s.inputs + s.counters,
        s.entry + s.outputs + s.counters,
        fl.verify(f, 1) + (fl.row_dequant if s.fp8 else 0),
    )
    return row * b + _Count(read=s.params)


def _flush(s: _Sizes, fl: Any, b: int, f: int) -> _Count:
    # Under split precision a flush reads the checkpoint, and GDN's the copy too (measured with Nsight Compute
    # on an H200, profiles/reference/ncu/).
    row = _Count(
        s.state + s.flush_copy + f * s.entry + s.inputs + s.counters + s.step_count,
        s.state + s.copy + s.outputs + s.counters + s.step_count,
        fl.flush(f, quantise=s.fp8) + (fl.correction(f, s.fp8) if s.flush_copy else 0) + _dequant(s, fl),
        s.rng_ops,
    )
    return row * b + _Count(read=s.params)


def _verify_after_fold(s: _Sizes, fl: Any, b: int, F: float, T: int) -> _Count:
    row = _Count(
        s.state + F * s.entry + T * s.inputs + s.counters + s.step_count,
        s.state + s.copy + T * s.entry + T * s.outputs + s.counters + s.step_count,
        fl.fold(F, quantise=s.fp8) + (fl.correction(F, s.fp8) if s.flush_copy else 0) + fl.verify(0, T) + _dequant(s, fl),
        s.rng_ops,
    )
    return row * b + _Count(read=s.params)


def _accept(s: _Sizes, b: int, a: float) -> _Count:
    return _Count(_I32 + s.counters + a * s.draft_b, s.counters + a * s.draft_b, s.heads) * b


def _replay(s: _Sizes, fl: Any, b: int, W: int, phase: str, fill: float | None) -> _Count:
    if phase == "nonflush":
        if W == 1:
            raise ValueError("a window of 1 flushes on every step: there is no nonflush phase")
        if fill is None:
            return _nonflush(s, fl, b, (W - 2) / 2)
        return _nonflush(s, fl, b, _check_int(fill, 0, W - 2, f"a nonflush fill at window {W}"))
    if phase == "flush":
        if fill is not None and fill != W - 1:
            raise ValueError(f"a replay flush happens at fill W - 1 = {W - 1}, got fill {fill!r}")
        return _flush(s, fl, b, W - 1)
    total = _flush(s, fl, b, W - 1)
    for f in range(W - 1):
        total = total + _nonflush(s, fl, b, f)
    return total / W


def _spec_replay(s: _Sizes, fl: Any, b: int, W: int, T: int, a: float, phase: str, fill: float | None) -> _Count:
    mean_fill, folded, flush_rate = spec_replay_cycle(W, a)
    accept = _accept(s, b, a)
    if phase == "nonflush":
        f = mean_fill if fill is None else _check_int(fill, 0, W - 1, f"a verify's fill at window {W}")
        return _verify(s, fl, b, f, T) + accept
    if phase == "flush":
        F = folded if fill is None else _check_int(fill, W, W + T - 1, "the fill a flushing verify folds")
        return _verify_after_fold(s, fl, b, F, T) + accept
    fold_extra = _verify_after_fold(s, fl, b, folded, T) - _verify(s, fl, b, 0, T)
    return _verify(s, fl, b, mean_fill, T) + accept + fold_extra * flush_rate


def step_cost(
    shape: SSMShape,
    variant: str,
    phase: str = "avg",
    *,
    batch: int,
    window: int | None = None,
    fill: int | None = None,
    state_dtype: str = "fp32",
    read_dtype: str | None = None,
    io_dtype: str = "bf16",
    draft: int = 0,
    accepted: float | None = None,
    has_z: bool = True,
    rounding: str = "nearest",
    buffer_dtype: str | None = None,
) -> Cost:
    """Modelled DRAM bytes read and written and FLOPs of one decode step of one layer, whole batch.

    Args:
        shape: a Mamba2Shape (state (H, P, N) per sequence) or a GDNShape (state (HV, V, K)).
        variant: "conventional" (decode), "replay", "split" (replay reading a read_dtype copy of the
            checkpoint; "replay" with a read_dtype is the same), "spec-conventional" (decode_multi writing
            T snapshots) or "spec-replay" (verify plus accept). Conventional variants have one kind of step,
            which every phase gives.
        phase: "nonflush", "flush" or "avg". Replay: avg = (sum of nonflush(f) for f = 0..W-2, plus
            flush) / W. Spec-replay: see spec_replay_cycle.
        batch: sequences decoded per step (>= 1).
        window: W, 1 to 64, for the replay variants.
        fill: replay nonflush: the f entries already in the buffer, 0..W-2 (default: their mean, (W-2)/2);
            replay flush: W-1 only. Spec-replay nonflush: the committed fill at the verify, 0..W-1
            (default: the steady-state mean); flush: the committed entries folded, W..W+T-1 (default W).
            Ignored by phase avg.
        state_dtype, read_dtype, io_dtype: dtype names (read_dtype ignored by the conventional variants). A read
            copy must be narrower than the state (so an 8-bit state, fp8 or int8, has none).
        draft: T, 1 to 8, for the speculative variants (ignored by the others).
        accepted: mean drafts committed per spec-replay step, in (0, T] (default T, the most flushes).
        has_z: Mamba-2 only: the kernel reads z and gates its output with it (a preset's has_z says).
        rounding: "nearest" or "stochastic" (a 16-bit or 8-bit state only): how every state store rounds.
        buffer_dtype: GDN only: the dtype of the buffered u and k, "fp32" or a 2-byte state's own (None: fp32, the
            ReplayCache's default); G, beta and T stay fp32.

    Bytes are unique DRAM bytes per step (io = io_dtype size, st = state, rd = read copy), what the kernels
    move; a tensor shared by several programs (B and C by the heads of a group, k by the value heads of a
    key head) counts once:

    - per row: inputs x, z (H, P), dt (H), B, C (G, N) in io (GDN: q, k (H, K), v (HV, V), g, beta (HV));
      output y (H, P) (GDN: o (HV, V)); Mamba-2's A, D, dt_bias (H) fp32 are read once per step.
    - buffer entry per row: x (H, P) and B (G, N) in io, delta and lam (H) fp32 (GDN: u (HV, V), k (H, K) in
      buffer_dtype, G (HV) fp32); fill counters (H) int32 (GDN: (HV)).
    - conventional: state read and written. Replay nonflush at fill f: the checkpoint (split: the read copy,
      plus (rows) fp32 scales for fp8) and f entries read, this token's entry written, no state write.
      Flush (f = W-1): the full-precision checkpoint and f entries read, the checkpoint (split: and the copy)
      written; this token's entry stays in registers (the kernels store entries on the nonflush path only).
      Counters are read and written on every replay step.
    - spec-conventional: the state read once, T snapshots written, inputs and outputs T times; the accept is a
      pointer move as in vLLM: 0 bytes, no launch. Spec-replay: verify reads the checkpoint (or copy), the f
      committed entries, the counters, and writes T entries; a verify that flushes first reads the
      full-precision checkpoint and F entries and writes the checkpoint (and copy) and counters; accept (a
      separate launch) reads n (one int32 per row) and the counters and writes the counters, and for Mamba-2
      copies the accepted drafts' B (G, N) from the draft buffer into the ring (`accepted` of them).

    FLOPs as the kernels execute them: an add or a multiply is 1, an FMA 2, an exp, log or division 1;
    comparisons (fp8 amax), conversions and masked-off lanes (padding, a draft's later drafts) are free.
    Per head, Mamba-2:

    - conventional: 5 per state element (decay, rank-1 FMA, output dot); delta = softplus(dt + dt_bias) 4
      and exp(A delta) 2; per p: delta x 1, D x 2, z gate 5 (sigmoid 3, two multiplies).
    - verify of T drafts at fill f (nonflush is T = 1): per draft S0 C 2 per element, delta 4, lam 2,
      exp(lam) 1, per p 4 + gate (scale and add, D x); per buffer term (f + 1 + i terms for draft i)
      B_j C 2N, coefficient 4, x_j combination 2P. An fp8 copy costs 1 per row p on a nonflush step (the
      dot is scaled) and 1 per element once per verify (the tile is).
    - flush at f: 1 + 2 (f + 1) + 2 per element (decay, f + 1 rank-1 FMAs, output dot), per entry 3 + P
      (coefficient, scaled x_j), 7 scalars, per p 2 + gate; an fp8 copy adds 1 per element, 1 per row.
    - fold of F entries before a verify: 1 + 2 F per element, per entry 3 + P, 1 scalar.

    Gated DeltaNet, per value head (q scaling K; k.q 2K; the coefficient e^(G_t - G_j) is shared by both sums;
    the optional in-kernel L2 normalisation of q and k is not counted):

    - conventional: 7 per element (decay 1, S k 2, update 2, S q 2), 1 + K + 2V more.
    - verify of T drafts at fill f: per draft S0 k and S0 q 4 per element, 2 + 3K + 8V more; per buffer term
      (f + i terms for draft i) two key dots 4K, coefficient 4, two accumulations 4V. An fp8 copy costs 2
      per row v on a nonflush step and 1 per element once per verify.
    - flush at f: the nonflush work plus 1 + 2 (f + 1) per element and (f + 1) V; fold of F: 1 + 2F per
      element, F (2 + V) + 1 more; an fp8 copy adds 1 per element, 1 per row. Under split precision each also
      corrects its f (or F) updates: 1 + 2f per element (checkpoint - copy and its product with the keys y_j; an
      fp8 copy 1 more to dequantise it), 2f²K + fK for y_j and fV to add the corrections.

    Accept: one add per counter.

    An 8-bit state (fp8 e4m3 or int8) carries one fp32 scale per row (Mamba-2 (H, P), GDN (HV, V)), read and
    written with its row: the state's bytes are elements + 4 per row everywhere it moves. Its reads dequantise as an
    fp8 copy does (a nonflush step 1 per row, a verify 1 per element; a conventional step, a flush or a fold reading
    the whole state 1 per element) and its stores quantise as an fp8 copy's (1 per element, 1 per row).

    Stochastic rounding's random bits (`int_ops`, integer operations, not FLOPs) wherever the state is stored:
    every conventional step (T snapshots for spec-conventional), a flush, a fold: one Philox4x32-10 draw per head
    (PHILOX_INT_OPS = 100) and the bits of the stored elements: in Mamba-2 a hash per pair (PAIR_INT_OPS = 10) and
    each element's half of it (HALF_INT_OPS = 1), in GDN a hash per element (HASH_INT_OPS = 10); each such step reads
    and writes the slot's store count (int64).
    """
    variant = _choice(variant, VARIANTS, "variant")
    phase = _choice(phase, PHASES, "phase")
    b = _check_int(batch, 1, None, "batch")
    st = _choice(state_dtype, STATE_DTYPES, "state_dtype")
    io = _choice(io_dtype, IO_DTYPES, "io_dtype")
    conventional = variant in ("conventional", "spec-conventional")
    rd = _read_dtype(variant, st, read_dtype, conventional)
    s = _sizes(shape, st, rd, io, has_z, _rounding(st, rounding), _buffer_dtype(shape, st, buffer_dtype))
    fl = _op(shape).flops(shape, has_z)
    if variant == "conventional":
        return _conventional(s, fl, b, 1).cost()
    if variant == "spec-conventional":
        return _conventional(s, fl, b, _check_draft(draft)).cost()
    W = _check_window(window)
    if variant in ("replay", "split"):
        s = _with_capacity(s, shape, rd, W + _check_int(draft, 0, MAX_DRAFT, "draft"))
        return _replay(s, fl, b, W, phase, fill).cost()
    T = _check_draft(draft)
    s = _with_capacity(s, shape, rd, W + T)
    return _spec_replay(s, fl, b, W, T, _check_accepted(accepted, T), phase, fill).cost()


def _read_dtype(variant: str, st: str, read_dtype: str | Enum | None, conventional: bool) -> str | None:
    rd = None if conventional or read_dtype is None else _choice(read_dtype, READ_DTYPES, "read_dtype")
    if variant == "split" and rd is None:
        raise ValueError("the split variant needs a read_dtype (bf16, fp16 or fp8)")
    why = precision_problem(st, rd)
    if why:
        raise ValueError(why)
    return rd


def _buffer_dtype(shape: SSMShape, st: str, buffer_dtype: str | Enum | None) -> str | None:
    """The checked buffer dtype (None: the cache's default), as ReplayCache.create takes it."""
    if buffer_dtype is None:
        return None
    allowed = _op(shape).buffer_dtypes
    if not allowed:
        raise ValueError(f"buffer_dtype applies to Gated DeltaNet only ({_op(shape).title} buffers its inputs in "
                         f"io_dtype), got {_name(buffer_dtype)!r}")
    name = _choice(buffer_dtype, allowed, "buffer_dtype")
    if name not in ("fp32", st):
        raise ValueError(f"buffer_dtype must be fp32 or the state dtype ({st}), got {name}")
    return name


def _rounding(st: str, rounding: str | Enum | None) -> str:
    ro = _choice(rounding or "nearest", ROUNDINGS, "rounding")
    why = precision_problem(st, None, ro)
    if why:
        raise ValueError(why)
    return ro


def launches_per_step(variant: str, phase: str = "avg") -> float:
    """Kernel launches per decode step: 1 for every variant but spec-replay (verify, then accept: 2).

    The phase does not change it: a replay flush is a branch inside the one launch, and spec-conventional's
    accept is a pointer move with no launch. (GDN's split-precision replay takes its flushes in a second launch on
    grids of two or more programs per SM, and Mamba-2's steps on 2-byte and 1-byte tiles from 80 (row, head) pairs
    per SM, a few programs per SM over a list of the heads that flush, where one launch's overhead is under 1% of
    the step; not counted.)
    """
    variant = _choice(variant, VARIANTS, "variant")
    _choice(phase, PHASES, "phase")
    return 2.0 if variant == "spec-replay" else 1.0


# The int32 counters a ReplayCache holds per (slot, head) beside the fill that a step reads and writes (the traffic
# counts the fill only): the arrival counts of the programs that share a head (the op's `arrive_lanes`), the head's
# entry in the flush list a two-launch replay passes (4 int32; its 8-int32 header belongs to no slot), and under drafts
# the op's `verify_arrivals`.
FLUSH_LIST_ENTRY = 4


def _held_counters(s: _Sizes, shape: SSMShape, draft: int) -> int:
    """Bytes of one sequence's counters in one layer's ReplayCache: the fills (s.counters) and the arrival counters."""
    op = _op(shape)
    arrivals = op.verify_arrivals(shape) if draft else 0
    return s.counters + ((op.arrive_lanes + FLUSH_LIST_ENTRY) * s.heads + arrivals) * _I32


def memory_per_seq(
    shape: SSMShape,
    variant: str,
    *,
    window: int | None = None,
    state_dtype: str = "fp32",
    read_dtype: str | None = None,
    io_dtype: str = "bf16",
    draft: int = 0,
    rounding: str = "nearest",
    buffer_dtype: str | None = None,
) -> dict[str, int]:
    """Bytes one sequence holds in one layer, by part, for a variant.

    Returns a dict with state (the state, or the replay variants' full-precision checkpoint), read_copy (with
    its fp8 scales), buffers (W + draft entries: the ReplayCache's capacity; Mamba-2 adds the drafts' B, at least
    one draft's (G, N), as its cache holds), counters (`_held_counters`: fills, arrival counts, flush-list
    entries; with stochastic rounding also the store count), snapshots (T states for spec-conventional) and total:
    what a ReplayCache allocates per slot. draft is required (1 to 8) for the speculative variants and sizes the
    replay buffers when given for the others. An 8-bit state's row scales count with the state and each snapshot.
    buffer_dtype is step_cost's.
    """
    variant = _choice(variant, VARIANTS, "variant")
    st = _choice(state_dtype, STATE_DTYPES, "state_dtype")
    io = _choice(io_dtype, IO_DTYPES, "io_dtype")
    conventional = variant in ("conventional", "spec-conventional")
    rd = _read_dtype(variant, st, read_dtype, conventional)
    s = _sizes(shape, st, rd, io, has_z=True, rounding=_rounding(st, rounding),
               buffer=_buffer_dtype(shape, st, buffer_dtype))
    parts = {"state": s.state, "read_copy": 0, "buffers": 0, "counters": s.step_count, "snapshots": 0}
    if variant == "spec-conventional":
        parts["snapshots"] = _check_draft(draft) * s.state
    elif not conventional:
        W = _check_window(window)
        T = _check_draft(draft) if variant == "spec-replay" else _check_int(draft, 0, MAX_DRAFT, "draft")
        s = _with_capacity(s, shape, rd, W + T)
        parts.update(read_copy=s.copy, buffers=(W + T) * s.entry + max(T, 1) * s.draft_b,
                     counters=_held_counters(s, shape, T) + s.step_count)
    parts["total"] = sum(parts.values())
    return parts


def _ceiling(ceilings: Any, name: str) -> float | None:
    value = getattr(ceilings, name, None)
    return float(value) if value else None


def predict_us(cost: Cost, ceilings: Any, launches: float = 1.0, *, launch_us: float = LAUNCH_US) -> float:
    """Predicted time of one decode step, µs: launches * launch_us + max(memory time, FP32 compute time).

    ceilings is anything with copy_gbs (measured copy bandwidth, reads plus writes, or the datasheet HBM figure
    where nothing was measured; hbm_gbs is taken when copy_gbs is absent), read_gbs (the read-only stream, may
    be None) and fp32_tflops, as replayssm_cli.model.gpus.Ceilings. With a read-only figure, bytes read move at
    read_gbs and bytes written at the rate that makes an even copy take its measured time, so a read-dominated
    kernel runs at the read stream and a conventional step at the copy rate; without one, all bytes move at
    copy_gbs. launch_us defaults to LAUNCH_US, the H200's cost of one small launch in a CUDA graph.
    """
    copy = _ceiling(ceilings, "copy_gbs") or _ceiling(ceilings, "hbm_gbs")
    flop_rate = _ceiling(ceilings, "fp32_tflops")
    if not copy or copy < 0 or not flop_rate or flop_rate < 0:
        raise ValueError(f"ceilings need a positive copy_gbs (or hbm_gbs) and fp32_tflops, got {ceilings!r}")
    read = _ceiling(ceilings, "read_gbs")
    if read and read > copy / 2:
        read_gbs, write_gbs = read, 1 / (2 / copy - 1 / read)
    else:
        read_gbs = write_gbs = copy
    memory_s = cost.bytes_read / (read_gbs * 1e9) + cost.bytes_written / (write_gbs * 1e9)
    compute_s = cost.flops / (flop_rate * 1e12)
    return launches * launch_us + max(memory_s, compute_s) * 1e6


def cost_table(
    shape: SSMShape,
    *,
    batch: int,
    window: int,
    state_dtype: str = "fp32",
    read_dtype: str | None = None,
    io_dtype: str = "bf16",
    draft: int = 0,
    accepted: float | None = None,
    has_z: bool = True,
    rounding: str = "nearest",
) -> list[dict[str, Any]]:
    """The rows `replayssm cost` prints: every variant and phase at one batch, window and set of dtypes.

    Rows: conventional; replay at nonflush fills 0 and W-2, its flush and its window average; the same for
    split when read_dtype is given; with draft > 0, spec-conventional and spec-replay (nonflush at the
    steady-state mean fill, flush, average). Each row has variant, phase, fill, window, state_dtype,
    read_dtype, io_dtype, rounding, draft, accepted, bytes_read, bytes_written, total_bytes, flops, int_ops, intensity,
    bytes_ratio (the conventional counterpart's bytes over this row's: conventional for replay and split,
    spec-conventional for spec-replay), launches, mem_per_seq and memory (its parts).
    """
    st = _choice(state_dtype, STATE_DTYPES, "state_dtype")
    io = _choice(io_dtype, IO_DTYPES, "io_dtype")
    rd = _read_dtype("replay", st, read_dtype, False)
    ro = _rounding(st, rounding)
    W = _check_window(window)
    T = _check_int(draft, 0, MAX_DRAFT, "draft")
    common = {"batch": batch, "state_dtype": st, "io_dtype": io, "has_z": has_z, "rounding": ro}
    rows: list[dict[str, Any]] = []

    def row(variant: str, phase: str, fill: float | None, baseline: Cost | None, **kw: Any) -> Cost:
        # The speculative fills are steady-state means (maybe fractional): step_cost's defaults are those.
        c = step_cost(shape, variant, phase, fill=fill if variant != "spec-replay" else None, **common, **kw)
        mem = memory_per_seq(
            shape, variant, state_dtype=st, io_dtype=io, rounding=ro,
            window=kw.get("window"), read_dtype=kw.get("read_dtype"), draft=kw.get("draft", 0),
        )
        rows.append({
            "variant": variant,
            "phase": phase,
            "fill": int(fill) if fill is not None and float(fill).is_integer() else fill,
            "window": kw.get("window"),
            "state_dtype": st,
            "read_dtype": kw.get("read_dtype"),
            "io_dtype": io,
            "rounding": ro,
            "draft": kw.get("draft", 0),
            "accepted": kw.get("accepted"),
            **c.as_dict(),
            "bytes_ratio": (baseline or c).total_bytes / c.total_bytes,
            "launches": launches_per_step(variant, phase),
            "mem_per_seq": mem["total"],
            "memory": mem,
        })
        return c

    conventional = row("conventional", "avg", None, None)
    replays = [("replay", None)] + ([("split", rd)] if rd else [])
    for variant, read in replays:
        fills = sorted({0, W - 2}) if W >= 2 else []
        for f in fills:
            row(variant, "nonflush", f, conventional, window=W, read_dtype=read)
        row(variant, "flush", W - 1, conventional, window=W, read_dtype=read)
        row(variant, "avg", None, conventional, window=W, read_dtype=read)
    if T:
        a = _check_accepted(accepted, T)
        mean_fill, folded, _ = spec_replay_cycle(W, a)
        spec = {"window": W, "draft": T, "accepted": a}
        snapshots = row("spec-conventional", "avg", None, None, draft=T)
        row("spec-replay", "nonflush", mean_fill, snapshots, **spec)
        row("spec-replay", "flush", folded, snapshots, **spec)
        row("spec-replay", "avg", None, snapshots, **spec)
    return rows


def kernel_step_bytes(shape: SSMShape, kernel: str, fills: int | Iterable[int], *, state_dtype: str = "fp32",
                      io_dtype: str = "bf16", window: int = 16, draft: int = 4, accepted: float = 3, has_z: bool = True,
                      buffer_dtype: str | None = None) -> int:
    """DRAM bytes one step of one kernel moves with its rows at these fills (one int: a single row): what a
    launch-settings sweep divides its time by. Each row is step_cost's at batch 1 at its fill, and the layer's
    parameters, which each such count holds, are read once per step. kernel: "decode", "decode-multi" (T = draft
    snapshots), "verify" (with accept; fill >= W folds first), "replay" or "split-<read dtype>" (optionally "-nonflush"
    or "-flush": the phase is the fill's, f + 1 = W flushes)."""
    rows = Counter([fills] if isinstance(fills, int) else fills)
    if not rows:
        raise ValueError("kernel_step_bytes needs the fill of at least one row")
    common = dict(batch=1, window=window, state_dtype=state_dtype, io_dtype=io_dtype, has_z=has_z,
                  buffer_dtype=buffer_dtype)
    total = 0
    for fill, count in rows.items():
        if kernel == "decode":
            c = step_cost(shape, "conventional", **common)
        elif kernel == "decode-multi":
            c = step_cost(shape, "spec-conventional", draft=draft, **common)
        elif kernel == "verify":
            c = step_cost(shape, "spec-replay", "flush" if fill >= window else "nonflush", fill=fill, draft=draft,
                          accepted=accepted, **common)
        elif _phased(kernel):
            read = kernel.split("-")[1] if kernel.startswith("split-") else None
            c = step_cost(shape, "split" if read else "replay", "flush" if fill + 1 >= window else "nonflush",
                          fill=fill, read_dtype=read, **common)
        else:
            raise ValueError(
                f"kernel must be decode, decode-multi, verify, replay[-phase] or split-<dtype>[-phase], got {kernel!r}")
        total += count * c.total_bytes
    params = _op(shape).step_sizes(shape, itemsize(_name(io_dtype)), has_z)["params"]
    return total - (rows.total() - 1) * params


def _phased(kernel: str) -> bool:
    """Whether `kernel` names replay or split-<read dtype>, alone or with -nonflush or -flush."""
    base = next((kernel[: -len(s)] for s in ("-nonflush", "-flush") if kernel.endswith(s)), kernel)
    return base == "replay" or (base.startswith("split-") and base[len("split-"):] in READ_DTYPES)
