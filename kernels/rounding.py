"""How the kernels store a state: rounded to nearest or stochastically, in 16 bits or in 8-bit rows with a scale.

Stochastic rounding takes one of the two neighbours of a value in the stored dtype, the upper with probability equal
to the value's distance from the lower over the gap between them, so the stored state is unbiased and its rounding
errors average out over a long decode instead of drifting. Each store of a (slot, head) state takes one Philox4x32-10
draw (Triton's `tl.philox`) keyed by a seed and counted by (slot, head, step), where `step` is the slot's own count
of stores, and each element's 16 random bits come from a 32-bit integer hash of its place in the state plus that
draw (Mamba-2's neighbours 2i and 2i + 1 taking the two halves of one hash of i, GDN's elements a hash each): a run is
reproducible, a slot's rounding does not depend on which rows share its batch, nothing is read on the host (CUDA
graphs capture it), and the bits are computed where the kernel holds the elements (neighbours along a row lie in one
thread's registers; no draw's words to share between threads).

An 8-bit state row, fp8 e4m3 or int8, holds the row's values over its row's fp32 scale: Mamba-2's row is one
(slot, head, p) over N, Gated DeltaNet's one (slot, head, v) over K. The scale is the row's largest magnitude over
the format's largest value (448 for e4m3, 127 for int8); a read multiplies the row back by it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Philox rounds per random draw (Philox4x32-10, the generator's standard strength).
ROUNDS = tl.constexpr(10)
EIGHT_BIT = (torch.float8_e4m3fn, torch.int8)
QMAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}
# The fields that a format's rounding works with: its mantissa bits dropped from fp32's 23 and its smallest normal
# (below it the format's spacing is fixed, as fp32's is once the smallest normal is added).
_FORMATS = {torch.bfloat16: (16, 0.0), torch.float16: (13, 2.0**-14), torch.float8_e4m3fn: (20, 2.0**-6)}


@dataclass
class StateRounding:
    """Stochastic rounding of the states a kernel stores: bits keyed by `seed` and drawn per (slot, head, step[slot])
    and element (`store_key`, `paired_bits`, `element_bits`); step (nslots,) int64 counts each slot's stores,
    advanced on the device by the launch that stores (`count_stores`, `count_listed`) or in one small launch after it
    (`advance`), and zeroed with the slot (`reset`)."""

    seed: int
    step: torch.Tensor
    # (nslots,) int32: the programs of a launch done with each slot's count, zero between launches (`count_stores`)
    arrive: torch.Tensor | None = None

    def __post_init__(self):
        if self.arrive is None:
            self.arrive = torch.zeros(self.step.shape[0], dtype=torch.int32, device=self.step.device)

    @classmethod
    def create(cls, nslots: int, seed: int = 0, *, device) -> "StateRounding":
        if not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"the rounding seed must be an integer in [0, 2^63), got {seed!r}")
        if not isinstance(nslots, int) or nslots < 1:
            raise ValueError(f"nslots must be a positive integer, got {nslots!r}")
        return cls(seed, torch.zeros(nslots, dtype=torch.int64, device=device))

    @property
    def nslots(self) -> int:
        return self.step.shape[0]

    def check(self, nslots: int, device: torch.device) -> None:
        if self.nslots != nslots:
            raise ValueError(f"the rounding counts {self.nslots} slots but the state has {nslots}")
        if self.step.device != device:
            raise ValueError(f"the rounding's step counts are on {self.step.device}, the state on {device}")

    def advance(self, slots: torch.Tensor | None, batch: int, by: int = 1) -> None:
        """`by` more stores (default one) for each slot of a launch's rows (row b's slot without a slot table; -1 rows
        skipped): a launch that stores T states per slot draws at steps step .. step + T - 1 and advances by T. One
        small launch, after a launch that does not advance its own counts (`verify`, `load`)."""
        if batch <= 0:
            return
        BB = min(1024, triton.next_power_of_2(batch))
        _advance_kernel[(triton.cdiv(batch, BB),)](self.step, slots, batch, by, HAS_SLOTS=slots is not None, BB=BB)

    def reset(self, slots: torch.Tensor | None = None) -> None:
        if slots is None:
            self.step.zero_()
        else:
            self.step[slots.long()] = 0

    def clone(self) -> "StateRounding":
        return StateRounding(self.seed, self.step.clone())


@triton.jit
def _advance_kernel(step, slots, batch, by, HAS_SLOTS: tl.constexpr, BB: tl.constexpr):
    o_b = tl.program_id(0) * BB + tl.arange(0, BB)
    m_b = o_b < batch
    if HAS_SLOTS:
        o_s = tl.load(slots + o_b, mask=m_b, other=-1).to(tl.int64)
        m_b = m_b & (o_s >= 0)
    else:
        o_s = o_b.to(tl.int64)
    # atomic: a slot listed twice in one launch counts twice, as two stores do
    tl.atomic_add(step + o_s, (o_s * 0 + by).to(tl.int64), mask=m_b)


def check_rounding(rounding, state_dtype: torch.dtype, nslots: int, device: torch.device,
                   row: int | None = None) -> None:
    """A StateRounding (or None) fit for a state of `state_dtype` with `nslots` slots on `device`; with `row`, one
    whose rows of that many elements pair their neighbours (`paired_bits`), so rows are of even length."""
    if rounding is None:
        return
    if not isinstance(rounding, StateRounding):
        raise ValueError(f"rounding must be a StateRounding or None, got {type(rounding).__name__}")
    if state_dtype == torch.float32:
        raise ValueError("stochastic rounding applies to a 16-bit or 8-bit state; an fp32 state is stored exactly")
    if row is not None and row % 2:
        raise ValueError(f"stochastic rounding takes states whose rows have an even number of elements (neighbours "
                         f"share one hash), got rows of {row}")
    rounding.check(nslots, device)


def rounding_args(rounding: StateRounding | None, state: torch.Tensor | None = None) -> tuple:
    """(seed, step counts, RANDOM) of a launch; (None, None, False) when rounding is off, so that the seed and the
    counts are compile-time Nones and a launch rounding to nearest compiles to the kernel it was without them."""
    if rounding is None:
        return None, None, False
    return rounding.seed, rounding.step, True


def step_arrivals(rounding: StateRounding | None) -> torch.Tensor | None:
    """The arrival counts a launch that advances its own store counts takes (`count_stores`); None without rounding."""
    return None if rounding is None else rounding.arrive


@triton.jit
def count_stores(steps, step_arrive, i_s, n_programs, by):
    """Called once by each of the n_programs of a launch that store slot i_s's state, after its last read of the
    slot's store count: the last of them advances the count by `by` and clears the arrivals, so that the launch
    advances its own counts and needs no launch after it."""
    if tl.atomic_add(step_arrive + i_s, 1, sem="acq_rel") == n_programs - 1:
        tl.store(step_arrive + i_s, 0)
        tl.store(steps + i_s, tl.load(steps + i_s) + by)


@triton.jit
def slot_key(seed, step, i_s, i_h, N_ROUNDS: tl.constexpr = ROUNDS):
    """The key of the (slot i_s, head i_h) state's store `step`: the first word of one Philox draw."""
    b_s = tl.cast(i_s, tl.uint32)
    b_k, _, _, _ = tl.philox(seed, b_s * 0, b_s, tl.cast(i_h, tl.uint32), tl.cast(step, tl.uint32),
                             N_ROUNDS)
    return b_k


@triton.jit
def mix(b_x):
    """lowbias32 (C. Wellons' hash-prospector): a bijection of uint32 whose every output bit flips with about half of
    the input bits."""
    b_x ^= b_x >> 16
    b_x = tl.mul(b_x, 0x7FEB352D, sanitize_overflow=False)
    b_x ^= b_x >> 15
    b_x = tl.mul(b_x, 0x846CA68B, sanitize_overflow=False)
    return b_x ^ (b_x >> 16)


@triton.jit
def store_key(seed, steps, i_s, i_h, RANDOM: tl.constexpr):
    """The key (`slot_key`) of the (slot i_s, head i_h) state's store at the slot's store count: drawn once
    for the whole store, before any loop over its rows (a count loaded inside a loop that stores cannot be hoisted
    by the compiler); 0 (unused) without RANDOM."""
    if RANDOM:
        b_k = slot_key(seed, tl.load(steps + i_s), i_s, i_h)
    else:
        b_k = tl.full([], 0, tl.uint32)
    return b_k


# Two rules give a store's elements their 16 bits from its key, each op's kernels and reference keeping to one, the
# one measured faster for how its kernels hold a state (benchmarks/notes/run-77.md): Mamba-2's stores pair
# neighbours (`paired_bits`: one hash per pair of a row), GDN's hash each element (`element_bits`: in its 16-bit
# decode tile a pair's hash made the conventional step 13% slower).


@triton.jit
def element_bits(b_k, o_e):
    """16 random bits (as uint32) for elements o_e (an int block: their places in a (slot, head) state) of the store
    keyed b_k: the top half of `mix` of each element's place plus the key."""
    return mix(tl.add(o_e.to(tl.uint32), b_k, sanitize_overflow=False)) >> 16


@triton.jit
def store_bits(b_k, o_e, RANDOM: tl.constexpr):
    """`element_bits` of elements o_e under the store's key b_k (`store_key`); zeros (unused) when RANDOM is off."""
    if RANDOM:
        b_r = element_bits(b_k, o_e)
    else:
        b_r = o_e.to(tl.uint32) * 0
    return b_r


@triton.jit
def paired_bits(b_k, o_e):
    """16 random bits (as uint32) for elements o_e of the store keyed b_k, by pairs: elements 2i and 2i + 1 take the
    low and the high half of `mix`(i + key). For any places; `pair_bits` and `row_bits` compute it a pair at once."""
    b_e = o_e.to(tl.uint32)
    b_h = mix(tl.add(b_e >> 1, b_k, sanitize_overflow=False))
    return (b_h >> ((b_e & 1) << 4)) & 0xFFFF


@triton.jit
def pair_bits(b_k, o_even):
    """`paired_bits` of the places o_even (even, [..., C]) and o_even + 1, interleaved along the last axis as
    [..., 2C]: one hash for each pair, its halves joined in registers (no layout change)."""
    b_h = mix(tl.add(o_even.to(tl.uint32) >> 1, b_k, sanitize_overflow=False))
    return tl.interleave(b_h & 0xFFFF, b_h >> 16)


@triton.jit
def row_bits(b_k, o_r, N, C0, BC: tl.constexpr):
    """`paired_bits` of the elements o_r[:, None] · N + C0 + [0, BC) (columns C0 .. of rows o_r [R] of N elements, N
    and C0 even) as [R, BC]."""
    return pair_bits(b_k, o_r[:, None] * N + C0 + 2 * tl.arange(0, BC // 2)[None, :])


@triton.jit
def _drop_bits(b_a, b_add, DROP: tl.constexpr):
    # b_a (fp32, non-negative) with b_add added to its DROP low bits, which are then cleared: b_add = half the gap
    # rounds to nearest, uniform random bits round stochastically; a carry moves into the exponent as it should.
    b_i = b_a.to(tl.int32, bitcast=True) + b_add
    return (b_i & -(1 << DROP)).to(tl.float32, bitcast=True)


@triton.jit
def rounded(b_x, b_r, DTYPE: tl.constexpr, RANDOM: tl.constexpr):
    """fp32 b_x rounded to bf16, fp16 or fp8 e4m3 (DTYPE), still as fp32 values that DTYPE holds exactly: to nearest
    even, or with RANDOM stochastically by the 16 random bits b_r (uint32), added to the dropped bits' top: bf16
    drops 16 bits and fp16 13, so both round exactly; e4m3 drops 20 and rounds up with a probability within 2^-16 of
    the exact one. e4m3 saturates at 448; inf and NaN stay as they are.
    Rounded by hand, so the CPU interpreter (which truncates bf16 and drops fp8's carries) rounds as the GPU does."""
    if RANDOM and DTYPE == tl.bfloat16:
        # bf16 keeps fp32's exponent: the bits added to the magnitude's dropped half carry away from zero for either
        # sign, into inf past the largest value, as the general path below does; NaN stays as it is.
        b_q = ((b_x.to(tl.int32, bitcast=True) + b_r.to(tl.int32)) & -0x10000).to(tl.float32, bitcast=True)
        return tl.where(b_x == b_x, b_q, b_x)
    if DTYPE == tl.bfloat16:
        DROP: tl.constexpr = 16
        TINY: tl.constexpr = 0.0
    elif DTYPE == tl.float16:
        DROP: tl.constexpr = 13
        TINY: tl.constexpr = 2.0**-14
    else:
        DROP: tl.constexpr = 20
        TINY: tl.constexpr = 2.0**-6
    b_a = tl.abs(b_x)
    if TINY > 0:
        b_sub = b_a < TINY
        b_a = tl.where(b_sub, b_a + TINY, b_a)
    if RANDOM:
        if DROP <= 16:
            b_add = (b_r >> (16 - DROP)).to(tl.int32)
        else:
            b_add = (b_r << (DROP - 16)).to(tl.int32)
    else:
        b_add = (1 << (DROP - 1)) - 1 + ((b_a.to(tl.int32, bitcast=True) >> DROP) & 1)
    b_q = _drop_bits(b_a, b_add, DROP)
    if TINY > 0:
        b_q = tl.where(b_sub, b_q - TINY, b_q)
    if DTYPE == tl.float8e4nv:
        b_q = tl.minimum(b_q, 448.0)
    # the sign put back bitwise, so that a negative value rounded to zero gives -0 as a cast does
    b_q = (b_q.to(tl.int32, bitcast=True) | (b_x.to(tl.int32, bitcast=True) & -0x80000000)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(b_x) < float("inf"), b_q, b_x)


@triton.jit
def stored(b_x, b_r, DTYPE: tl.constexpr, RANDOM: tl.constexpr):
    """fp32 b_x as DTYPE (fp32, bf16 or fp16) for a state store, rounded to nearest or with RANDOM stochastically."""
    if DTYPE == tl.float32:
        return b_x
    else:
        return rounded(b_x, b_r, DTYPE, RANDOM).to(DTYPE)


@triton.jit
def quantized_rows(b_s, b_r, DTYPE: tl.constexpr, RANDOM: tl.constexpr):
    """Rows b_s [R, C] (fp32) as 8-bit DTYPE (fp8 e4m3 or int8) values and their scales [R]: each row over its
    largest magnitude / QMAX, rounded to nearest (int8: ties away from zero) or with RANDOM stochastically by the 16
    random bits b_r (int8 rounds up with a probability within 2^-16 of the exact one)."""
    if DTYPE == tl.int8:
        QMAX_: tl.constexpr = 127.0
    else:
        QMAX_: tl.constexpr = 448.0
    b_amax = tl.max(tl.abs(b_s), axis=1)
    b_scale = tl.math.div_rn(b_amax, QMAX_ + tl.zeros_like(b_amax))
    b_inv = tl.where(b_amax > 0, tl.math.div_rn(QMAX_ + tl.zeros_like(b_amax), b_amax), 0.0)
    b_q = tl.minimum(tl.maximum(b_s * b_inv[:, None], -QMAX_), QMAX_)
    if DTYPE == tl.int8:
        if RANDOM:
            b_u = b_r.to(tl.float32) * 1.52587890625e-05  # 2^-16: uniform on [0, 1) in steps of 2^-16
            b_q = tl.math.floor(b_q + b_u)
        else:
            b_q = tl.where(b_q < 0, -tl.math.floor(0.5 - b_q), tl.math.floor(b_q + 0.5))
        b_q = tl.minimum(tl.maximum(b_q, -QMAX_), QMAX_)
    else:
        b_q = rounded(b_q, b_r, DTYPE, RANDOM)
    return b_q.to(DTYPE), b_scale


# --- references (plain PyTorch) -----------------------------------------------------------------------------------


def _drop_bits_reference(a: torch.Tensor, add: torch.Tensor, drop: int) -> torch.Tensor:
    bits = (a.view(torch.int32).long() & 0xFFFFFFFF) + add.long()
    bits = (bits & ~((1 << drop) - 1)) & 0xFFFFFFFF
    return bits.to(torch.int64).where(bits < 2**31, bits - 2**32).to(torch.int32).view(torch.float32)


def rounded_reference(x: torch.Tensor, bits: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """`rounded` in PyTorch: fp32 x to bf16, fp16 or fp8 e4m3 values (as fp32), to nearest even without bits, else
    stochastically by the 16 random bits of each element (held in an int64 tensor, as `draw_bits` gives them)."""
    drop, tiny = _FORMATS[dtype]
    x = x.float()
    a = x.abs()
    sub = a < tiny
    a = torch.where(sub, a + tiny, a)
    if bits is None:
        raw = a.view(torch.int32).long() & 0xFFFFFFFF
        add = (1 << (drop - 1)) - 1 + ((raw >> drop) & 1)
    else:
        add = bits.long() >> (16 - drop) if drop <= 16 else bits.long() << (drop - 16)
    q = _drop_bits_reference(a, add, drop)
    q = torch.where(sub, q - tiny, q)
    if dtype == torch.float8_e4m3fn:
        q = q.clamp_max(448.0)
    q = (q.view(torch.int32) | (x.view(torch.int32) & -0x80000000)).view(torch.float32)
    return torch.where(x.abs() < float("inf"), q, x)


def quantized_rows_reference(s: torch.Tensor, bits: torch.Tensor | None, dtype: torch.dtype):
    """`quantized_rows` in PyTorch over the last axis: (8-bit values, fp32 scales over the other axes)."""
    qmax = QMAX[dtype]
    s = s.float()
    amax = s.abs().amax(-1)
    scale = amax / qmax
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    q = (s * inv[..., None]).clamp(-qmax, qmax)
    if dtype == torch.int8:
        if bits is None:
            q = torch.where(q < 0, -torch.floor(0.5 - q), torch.floor(q + 0.5))
        else:
            q = torch.floor(q + bits.long().float() * 2.0**-16)
        q = q.clamp(-qmax, qmax)
    else:
        q = rounded_reference(q, bits, dtype)
    return q.to(dtype), scale


def dequantized_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """An 8-bit state's fp32 values: each row times its scale."""
    return q.float() * scale[..., None]


@triton.jit
def _bits_kernel(out, seed, steps, slots, H, E, BE: tl.constexpr, PAIRED: tl.constexpr):
    i_b, i_h, i_e = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_s = tl.load(slots + i_b).to(tl.int64)
    o_e = i_e * BE + tl.arange(0, BE)
    b_k = store_key(seed, steps, i_s, i_h, True)
    if PAIRED:
        b_r = paired_bits(b_k, o_e)
    else:
        b_r = element_bits(b_k, o_e)
    tl.store(out + (i_b * H + i_h) * E + o_e, b_r.to(tl.int64), mask=o_e < E)


def draw_bits(rounding: StateRounding, slots: torch.Tensor, heads: int, elements: int, ahead: int = 0, *,
              paired: bool) -> torch.Tensor:
    """The random bits a kernel draws at each slot's current step (plus `ahead`), (len(slots), heads, elements) int64
    holding 16-bit values: element e of a head's state gets bits [slot, head, e], by pairs (`paired_bits`, Mamba-2)
    or each element's own (`element_bits`, GDN). For references and tests."""
    slots = slots.to(device=rounding.step.device, dtype=torch.int64)
    out = torch.empty(slots.shape[0], heads, elements, dtype=torch.int64, device=rounding.step.device)
    BE = min(1024, triton.next_power_of_2(elements))
    grid = (slots.shape[0], heads, triton.cdiv(elements, BE))
    _bits_kernel[grid](out, rounding.seed, rounding.step + ahead, slots, heads, elements, BE=BE, PAIRED=paired)
    return out
