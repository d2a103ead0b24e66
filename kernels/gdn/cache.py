"""The Gated DeltaNet ReplaySSM cache: checkpoints, an optional low-precision read copy, buffers, fill counters."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from replayssm_kernels import families
from replayssm_kernels import rounding as R
from replayssm_kernels.common import flush_list, host_checks
from replayssm_kernels.gdn.common import (
    EIGHT_BIT,
    FP8_MAX,
    IO_DTYPES,
    READ_DTYPES,
    STATE_DTYPES,
    check_state_dtype,
    draw_state_bits,
    raw,
    resolve_dtype,
    resolve_rounding,
    stored_state,
)

# The buffered updates' and keys' dtypes: fp32, or a 16-bit state's own.
BUFFER_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A warp's lanes: a small grid's replay programs (one warp) may each count their arrival at a (slot, head) on a
# counter of their own lane (a replay row's lane_count).
ARRIVE_LANES = 32


def quantize_read(state: torch.Tensor, read_dtype: torch.dtype):
    """The read copy of fp32 states (..., V, K) and its per-row scales (None unless read_dtype is fp8)."""
    if read_dtype != torch.float8_e4m3fn:
        return state.to(read_dtype), None
    amax = state.abs().amax(-1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (state / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(read_dtype), scale


def dequantize_read(copy: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    value = copy.float()
    return value if scale is None else value * scale[..., None]


@dataclass
class ReplayCache:
    """Per-slot ReplaySSM state of one Gated DeltaNet layer.

    checkpoint (nslots, HV, V, K) in the state dtype, and for an 8-bit one (fp8 e4m3 or int8) checkpoint_scale
    (nslots, HV, V) fp32, the scale of each row over K (a row's values are checkpoint * scale); rounding: None
    (every checkpoint store rounds to nearest) or a rounding.StateRounding whose per-slot store counts key the
    stochastic rounding of every checkpoint store, advanced after each launch that may store; read_copy
    (nslots, HV, V, K) in the read dtype and read_scale (nslots, HV, V) fp32 (fp8 only), refreshed at every flush;
    buffers of capacity C = window + max_draft: buf_u (nslots, C, HV, V) corrected updates u and buf_k
    (nslots, C, H, K) L2-normalised unscaled keys, both in the buffer dtype (fp32 unless a 2-byte state asks for its
    own), buf_g (nslots, C, HV) fp32 log-decay summed since the checkpoint; fill (nslots, HV) int32, the entries in
    use. Entries at or past fill are never read.
    arrive (nslots, HV, ARRIVE_LANES) int32 counts the row-block programs of a step that are done with a
    (slot, head), zero between steps: in its first column, or with the replay's LANE_COUNT in each lane's own.
    With a read copy a flush corrects the buffered updates, computed from the copy, to those of the full
    checkpoint, so the copy's rounding does not reach the checkpoint: buf_t (nslots, C, HV, C) fp32 keeps row
    j of the lower-triangular T with t_j = beta_j (e_j - sum_{i<j} (k_i·k_j) t_i), entry j's correction key
    being y_j = sum_l t_jl k_l, and the correction one product with them (in one TF32 pass under a 2-byte copy,
    which leaves about 2^-20 of the state of the copy's rounding in the checkpoint); buf_beta (nslots, C, HV) fp32
    keeps each entry's beta, with which `materialize` carries the correction entry by entry. With max_draft > 0,
    arrivals (nslots, H) int32, zero between calls, lets `verify` elect the last value head of each key head to
    write the drafts' keys; last_draft is the T of the last `verify` (what `accept` may commit).
    work (8 + 4·nslots·HV) int32 is the list a replay in two launches passes from its non-flush launch to its
    flushes' launch (a header of counters, zero between steps, then (row, head, fill, flag) per flushing
    head; mamba2.common); it belongs to no slot.
    """

    checkpoint: torch.Tensor
    buf_u: torch.Tensor
    buf_k: torch.Tensor
    buf_g: torch.Tensor
    fill: torch.Tensor
    arrive: torch.Tensor
    window: int
    max_draft: int
    io_dtype: torch.dtype
    read_copy: torch.Tensor | None = None
    read_scale: torch.Tensor | None = None
    buf_beta: torch.Tensor | None = None
    buf_t: torch.Tensor | None = None
    arrivals: torch.Tensor | None = None
    last_draft: int = 0
    work: torch.Tensor | None = None
    checkpoint_scale: torch.Tensor | None = None
    rounding: R.StateRounding | None = None

    def __post_init__(self):
        if self.work is None:
            self.work = flush_list(self.nslots, self.HV, self.device)

    @classmethod
    def create(
        cls,
        nslots: int,
        H: int,
        HV: int,
        K: int,
        V: int,
        window: int,
        *,
        state_dtype,
        read_dtype=None,
        io_dtype,
        max_draft: int = 0,
        buffer_dtype="fp32",
        rounding="nearest",
        seed: int = 0,
        device,
    ) -> "ReplayCache":
        """An empty cache (zero checkpoints, empty buffers) for nslots sequences.

        H key heads, HV value heads (a multiple of H), K, V <= 256; window W in [1, 64]: a slot
        flushes on the step that brings its buffer to W entries. state_dtype: fp32, bf16, fp16, or 8-bit fp8
        (e4m3, sm_89 and newer) or int8 with an fp32 scale per (slot, value head, v) row over K (a torch dtype or a
        name such as "fp32"); rounding: "nearest" or "stochastic" (a 16-bit or 8-bit checkpoint: every store rounds
        stochastically, keyed by `seed`, slot, value head, element and the slot's store count, so a run is
        reproducible); read_dtype: None, or a bf16, fp16 or fp8 (e4m3, per-row scales) copy narrower than a
        16-bit or fp32 checkpoint that non-flush steps read instead of it; io_dtype: the dtype
        of q, k, v and the outputs; max_draft: the most drafts one `verify` takes, in [0, 8];
        buffer_dtype: the buffered updates' and keys' dtype: fp32 (the default), or a 2-byte state's own, which
        halves the buffers' memory and rounds each entry once, as the state is rounded at every flush (an fp32
        state's checkpoint needs fp32 entries). On an H200 the 2-byte buffers made a bf16-state step slower, not
        faster (benchmarks/notes/run-61.md).
        """
        for name, value in {"nslots": nslots, "H": H, "HV": HV, "K": K, "V": V}.items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        if not isinstance(window, int) or not 1 <= window <= 64:
            raise ValueError(f"window must be an integer in [1, 64]; got {window!r}")
        if not isinstance(max_draft, int) or not 0 <= max_draft <= 8:
            raise ValueError(f"max_draft must be an integer in [0, 8]; got {max_draft!r}")
        if HV % H:
            raise ValueError(f"HV={HV} must be a multiple of H={H}")
        if K > 256 or V > 256:
            raise ValueError(f"K and V must be at most 256; got K={K}, V={V}")
        state_dtype = resolve_dtype(state_dtype, "state_dtype", STATE_DTYPES)
        io_dtype = resolve_dtype(io_dtype, "io_dtype", IO_DTYPES)
        rounding = resolve_rounding(rounding)
        if rounding == "stochastic" and state_dtype == torch.float32:
            raise ValueError("rounding 'stochastic' applies to a 16-bit or 8-bit checkpoint; an fp32 checkpoint is "
                             "stored exactly: take rounding='nearest' or state_dtype='bf16'")
        check_state_dtype(state_dtype, torch.device(device))
        read_copy = read_scale = None
        if read_dtype is not None:
            read_dtype = resolve_dtype(read_dtype, "read_dtype", READ_DTYPES)
            if state_dtype in EIGHT_BIT:
                raise ValueError(f"an {state_dtype} checkpoint takes no read copy (none is narrower): pass "
                                 "read_dtype=None")
            if read_dtype.itemsize >= state_dtype.itemsize:
                raise ValueError(f"read_dtype {read_dtype} must be narrower than state_dtype {state_dtype}")
            families.check_read_dtype(read_dtype, torch.device(device))
            read_copy = torch.zeros(nslots, HV, V, K, dtype=read_dtype, device=device)
            if read_dtype == torch.float8_e4m3fn:
                read_scale = torch.ones(nslots, HV, V, dtype=torch.float32, device=device)
        buffer_dtype = resolve_dtype(buffer_dtype or torch.float32, "buffer_dtype", BUFFER_DTYPES)
        if buffer_dtype not in (torch.float32, state_dtype):
            raise ValueError(f"buffer_dtype must be fp32 or the state dtype {state_dtype}; got {buffer_dtype}")
        C = window + max_draft
        return cls(
            checkpoint=torch.zeros(nslots, HV, V, K, dtype=state_dtype, device=device),
            buf_u=torch.zeros(nslots, C, HV, V, dtype=buffer_dtype, device=device),
            buf_k=torch.zeros(nslots, C, H, K, dtype=buffer_dtype, device=device),
            buf_g=torch.zeros(nslots, C, HV, dtype=torch.float32, device=device),
            fill=torch.zeros(nslots, HV, dtype=torch.int32, device=device),
            arrive=torch.zeros(nslots, HV, ARRIVE_LANES, dtype=torch.int32, device=device),
            window=window,
            max_draft=max_draft,
            io_dtype=io_dtype,
            read_copy=read_copy,
            read_scale=read_scale,
            buf_beta=None if read_copy is None else torch.zeros(nslots, C, HV, dtype=torch.float32, device=device),
            buf_t=None if read_copy is None else torch.zeros(nslots, C, HV, C, dtype=torch.float32, device=device),
            arrivals=torch.zeros(nslots, H, dtype=torch.int32, device=device) if max_draft else None,
            checkpoint_scale=(torch.zeros(nslots, HV, V, dtype=torch.float32, device=device)
                              if state_dtype in EIGHT_BIT else None),
            rounding=R.StateRounding.create(nslots, seed, device=device) if rounding == "stochastic" else None,
        )

    @property
    def nslots(self) -> int:
        return self.checkpoint.shape[0]

    @property
    def H(self) -> int:
        return self.buf_k.shape[2]

    @property
    def HV(self) -> int:
        return self.checkpoint.shape[1]

    @property
    def K(self) -> int:
        return self.checkpoint.shape[3]

    @property
    def V(self) -> int:
        return self.checkpoint.shape[2]

    @property
    def capacity(self) -> int:
        return self.buf_u.shape[1]

    @property
    def state_dtype(self) -> torch.dtype:
        return self.checkpoint.dtype

    @property
    def buffer_dtype(self) -> torch.dtype:
        return self.buf_u.dtype

    @property
    def read_dtype(self) -> torch.dtype | None:
        return None if self.read_copy is None else self.read_copy.dtype

    @property
    def device(self) -> torch.device:
        return self.checkpoint.device

    def tensors(self) -> dict[str, torch.Tensor]:
        """The per-slot tensors (every one but `work`), by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "work" and isinstance(getattr(self, f.name), torch.Tensor)}

    def _index(self, slots, what: str) -> torch.Tensor:
        if slots is None:
            return torch.arange(self.nslots, device=self.device)
        if isinstance(slots, (list, tuple, range)):
            slots = torch.tensor(list(slots), dtype=torch.int64, device=self.device)
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{what} must be a 1-D int32 or int64 tensor of slot indices")
        slots = slots.to(device=self.device, dtype=torch.int64)
        if host_checks(True):
            bad = [s for s in slots.tolist() if not 0 <= s < self.nslots]
            if bad:
                raise ValueError(f"{what} must be in [0, {self.nslots}); got {bad[0]}")
        return slots

    def checkpoint_values(self, slots) -> torch.Tensor:
        """The fp32 values of the checkpoints of `slots` (an index tensor): an 8-bit one's rows times their scales."""
        if self.checkpoint_scale is None:
            return self.checkpoint[slots].float()
        return R.dequantized_rows(self.checkpoint[slots], self.checkpoint_scale[slots])

    def load(self, state: torch.Tensor, slots: torch.Tensor | None = None) -> None:
        """Empty `slots` (default: all) and set their checkpoints (and read copies) from full states (n, HV, V, K),
        stored as a flush stores them (rounded by the cache's rounding; 8-bit rows over their scales)."""
        idx = self._index(slots, "slots")
        shape = (idx.shape[0], self.HV, self.V, self.K)
        if not isinstance(state, torch.Tensor) or tuple(state.shape) != shape:
            got = tuple(state.shape) if isinstance(state, torch.Tensor) else type(state).__name__
            raise ValueError(f"state must have shape {shape} (len(slots), HV, V, K); got {got}")
        if not state.is_floating_point():
            raise ValueError(f"state must be a floating-point tensor; got {state.dtype}")
        self.reset(idx)
        values, scales = stored_state(state.to(device=self.device, dtype=torch.float32), self.state_dtype,
                                      draw_state_bits(self.rounding, idx, shape))
        raw(self.checkpoint)[idx] = raw(values)
        if scales is not None:
            self.checkpoint_scale[idx] = scales
        if self.rounding is not None:
            self.rounding.advance(idx, idx.shape[0])
        if self.read_copy is not None:
            copy, scale = quantize_read(self.checkpoint[idx].float(), self.read_copy.dtype)
            raw(self.read_copy)[idx] = raw(copy)
            if scale is not None:
                self.read_scale[idx] = scale

    def reset(self, slots: torch.Tensor | None = None) -> None:
        """Empty `slots` (default: all) for new requests: zero checkpoints (and scales), read copies, buffers, fills
        and rounding store counts."""
        idx = self._index(slots, "slots")
        for name, value in self.tensors().items():
            raw(value).index_fill_(0, idx, 0)
            if name == "read_scale":
                value.index_fill_(0, idx, 1.0)
        if self.rounding is not None:
            self.rounding.reset(idx)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Move requests from slots `src` to slots `dst` (same length, disjoint) and empty `src`."""
        s, d = self._index(src, "src"), self._index(dst, "dst")
        if s.shape != d.shape:
            raise ValueError(f"src and dst must have the same length; got {s.shape[0]} and {d.shape[0]}")
        if host_checks(True) and set(s.tolist()) & set(d.tolist()):
            raise ValueError("src and dst must not share a slot")
        for value in self.tensors().values():
            raw(value).index_copy_(0, d, raw(value).index_select(0, s))
        if self.rounding is not None:
            self.rounding.step.index_copy_(0, d, self.rounding.step.index_select(0, s))
        self.reset(s)

    def clone(self) -> "ReplayCache":
        return replace(self, **{name: value.clone() for name, value in self.tensors().items()}, work=self.work.clone(),
                       rounding=None if self.rounding is None else self.rounding.clone())
