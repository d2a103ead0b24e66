"""The ReplaySSM cache of a Mamba-2 layer: checkpoint pool, optional read copy, input buffers and fill counters."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from replayssm_kernels import common, families, rounding as rnd
from replayssm_kernels.mamba2 import args
from replayssm_kernels.mamba2.reference import quantize_ref

ROUNDINGS = ("nearest", "stochastic")


@dataclass
class ReplayCache:
    """Per-slot ReplaySSM state of one Mamba-2 layer; every tensor is indexed by slot first.

    checkpoint (nslots, H, P, N) state dtype and, for an 8-bit (fp8 e4m3 or int8) checkpoint, checkpoint_scale
    (nslots, H, P) fp32, one scale per (slot, head, p) row over N; rounding, a `rounding.StateRounding` when every
    checkpoint store rounds stochastically (None: to nearest); read_copy (nslots, H, P, N) read dtype or None and,
    for fp8, read_scale (nslots, H, P) fp32; per buffered position j < capacity = window + max_draft: x_buf
    (nslots, H, CAP, P) and b_buf (nslots, G, CAP, N) in the io dtype, dt_buf (Δ after bias and softplus)
    and lam_buf (cumulative A·Δ since the checkpoint) (nslots, H, CAP) fp32; b_draft (nslots, G, max_draft, N)
    holds the drafts' B between `verify` and `accept`; fill (nslots, H) int32, equal across the heads of a slot;
    arrive (nslots, H) int32 counts the P-block programs of a step that are done with a (slot, head), zero between steps;
    last_draft is the T of the last `verify` (what `accept` may commit). work (8 + 4·nslots·H) int32, the one
    tensor that belongs to no slot, is the list a replay in two launches passes from its non-flush launch to its
    flushes' launch (a header of counters, zero between steps, then (row, head, fill, flag) per flushing
    head; mamba2.common).
    """

    checkpoint: torch.Tensor
    read_copy: torch.Tensor | None
    read_scale: torch.Tensor | None
    x_buf: torch.Tensor
    b_buf: torch.Tensor
    dt_buf: torch.Tensor
    lam_buf: torch.Tensor
    b_draft: torch.Tensor
    fill: torch.Tensor
    arrive: torch.Tensor
    window: int
    max_draft: int
    last_draft: int = 0
    work: torch.Tensor | None = None
    checkpoint_scale: torch.Tensor | None = None
    rounding: rnd.StateRounding | None = None

    def __post_init__(self):
        if self.work is None:
            self.work = common.flush_list(*self.fill.shape, self.fill.device)

    @classmethod
    def create(cls, nslots: int, H: int, P: int, N: int, G: int, window: int, *, state_dtype=torch.float32,
               read_dtype=None, io_dtype=torch.bfloat16, max_draft: int = 0, rounding: str = "nearest", seed: int = 0,
               device="cuda") -> "ReplayCache":
        """An empty cache (zero checkpoints, fill 0) for nslots slots.

        Args:
            nslots, H, P, N, G: slots, heads, head dim, state dim, groups (G divides H).
            window: W in [1, 64]: a slot flushes on the step that brings its buffer to W entries.
            state_dtype: checkpoint dtype, fp32, bf16, fp16, or 8-bit fp8 (e4m3, sm_89 and newer) or int8 rows with
                an fp32 scale each (a torch dtype or a name such as "fp32").
            read_dtype: None, or bf16, fp16 or fp8 for a split-precision read copy of an fp32 or 16-bit checkpoint.
            rounding: how every checkpoint store rounds: "nearest", or "stochastic" (16-bit and 8-bit checkpoints)
                by a Philox stream counted per slot and store, so a run is reproducible.
            seed: the stochastic rounding's seed, an integer in [0, 2^63).
            io_dtype: dtype of the buffered x and B, and the dtype `replay` and `verify` expect them in.
            max_draft: the most drafts one `verify` may carry, in [0, 8].
            device: where every tensor lives.
        """
        common.check_dims((nslots, H, P, N, G), "(nslots, H, P, N, G)")
        args.check_group(H, G, name="the cache")
        common.check_window(window)
        if not isinstance(max_draft, int) or not 0 <= max_draft <= 8:
            raise ValueError(f"max_draft must be an integer in [0, 8], got {max_draft!r}")
        state_dtype = common.as_dtype(state_dtype, "state_dtype", common.STATE_DTYPES)
        io_dtype = common.as_dtype(io_dtype, "io_dtype", common.FLOAT_DTYPES)
        read_dtype = None if read_dtype is None else common.as_dtype(read_dtype, "read_dtype", common.READ_DTYPES)
        eight_bit = state_dtype in rnd.EIGHT_BIT
        if eight_bit and read_dtype is not None:
            raise ValueError(f"an {common.dtype_name(state_dtype)} checkpoint takes no read copy (it is as narrow "
                             f"as one): pass read_dtype=None")
        if rounding not in ROUNDINGS:
            raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {rounding!r}")
        if rounding == "stochastic" and state_dtype == torch.float32:
            raise ValueError("stochastic rounding applies to a 16-bit or 8-bit checkpoint; an fp32 checkpoint is "
                             "stored exactly: pass rounding='nearest'")
        cap = window + max_draft
        dev = torch.device(device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        families.check_read_dtype(read_dtype, dev)
        families.check_state_dtype(state_dtype, dev)
        state_rounding = rnd.StateRounding.create(nslots, seed, device=dev) if rounding == "stochastic" else None

        def zeros(*shape, dtype):
            return torch.zeros(shape, dtype=dtype, device=dev)

        return cls(
            checkpoint=zeros(nslots, H, P, N, dtype=state_dtype),
            read_copy=None if read_dtype is None else zeros(nslots, H, P, N, dtype=read_dtype),
            read_scale=zeros(nslots, H, P, dtype=torch.float32) if read_dtype == torch.float8_e4m3fn else None,
            x_buf=zeros(nslots, H, cap, P, dtype=io_dtype),
            b_buf=zeros(nslots, G, cap, N, dtype=io_dtype),
            dt_buf=zeros(nslots, H, cap, dtype=torch.float32),
            lam_buf=zeros(nslots, H, cap, dtype=torch.float32),
            b_draft=zeros(nslots, G, max(max_draft, 1), N, dtype=io_dtype),
            fill=zeros(nslots, H, dtype=torch.int32),
            arrive=zeros(nslots, H, dtype=torch.int32),
            window=window,
            max_draft=max_draft,
            checkpoint_scale=zeros(nslots, H, P, dtype=torch.float32) if eight_bit else None,
            rounding=state_rounding,
        )

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """(nslots, H, P, N, G)."""
        nslots, H, P, N = self.checkpoint.shape
        return nslots, H, P, N, self.b_buf.shape[1]

    @property
    def capacity(self) -> int:
        return self.window + self.max_draft

    @property
    def device(self) -> torch.device:
        return self.checkpoint.device

    @property
    def state_dtype(self) -> torch.dtype:
        return self.checkpoint.dtype

    @property
    def read_dtype(self) -> torch.dtype | None:
        return None if self.read_copy is None else self.read_copy.dtype

    @property
    def io_dtype(self) -> torch.dtype:
        return self.x_buf.dtype

    @property
    def is_eight_bit(self) -> bool:
        return self.checkpoint_scale is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every per-slot tensor of the cache by field name (the read copy and scales only when present; not
        `work`, nor the rounding's step counts)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "work" and isinstance(getattr(self, f.name), torch.Tensor)}

    def _slot_tensors(self) -> list[torch.Tensor]:
        # what load, reset and move index by slot: the tensors and the rounding's step counts
        return [*self.tensors().values(), *([] if self.rounding is None else [self.rounding.step])]

    def nbytes(self) -> int:
        """Bytes the cache holds on its device."""
        return sum(t.numel() * t.element_size() for t in (*self._slot_tensors(), self.work))

    def clone(self) -> "ReplayCache":
        """A deep copy: every tensor (and the rounding's step counts) cloned."""
        return dataclasses.replace(self, **{name: t.clone() for name, t in self.tensors().items()},
                                   work=self.work.clone(),
                                   rounding=None if self.rounding is None else self.rounding.clone())

    def slot_index(self, slots, what: str = "slots") -> torch.Tensor:
        """Slots (None for all, a list, or a 1-D integer tensor) as a checked int64 index on the cache's device."""
        nslots = self.checkpoint.shape[0]
        if slots is None:
            return torch.arange(nslots, device=self.device)
        if isinstance(slots, (list, tuple, range)):
            slots = torch.tensor(list(slots), dtype=torch.int64, device=self.device)
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1:
            raise ValueError(f"{what} must be a 1-D tensor of slot indices")
        common.check_tensor(what, slots, tuple(slots.shape), "(n,)", common.INDEX_DTYPES, self.device)
        common.check_slots(slots, slots.shape[0], nslots, self.device, True, padding=False)
        return slots.long()

    def load(self, state: torch.Tensor, slots=None) -> None:
        """Set the checkpoints of `slots` (default: all) from full states (n, H, P, N), rounded to nearest (8-bit rows
        with their scales), and empty their buffers (their rounding step counts restart at zero)."""
        idx = self.slot_index(slots, "slots")
        _, H, P, N, _ = self.shape
        common.check_tensor("state", state, (idx.shape[0], H, P, N), "(len(slots), H, P, N)",
                          (*common.FLOAT_DTYPES, torch.float64), self.device, unit_stride=False)
        self.reset(idx)
        if self.is_eight_bit:
            # rounded to nearest: a host-side store outside the decode's stream of stores
            q, scale = rnd.quantized_rows_reference(state.float(), None, self.checkpoint.dtype)
            _raw(self.checkpoint).index_copy_(0, idx, _raw(q))
            self.checkpoint_scale.index_copy_(0, idx, scale)
        else:
            self.checkpoint.index_copy_(0, idx, state.to(self.checkpoint.dtype))
        if self.read_copy is not None:
            copy, scale = quantize_ref(state.float(), self.read_copy.dtype)
            _raw(self.read_copy).index_copy_(0, idx, _raw(copy))
            if scale is not None:
                self.read_scale.index_copy_(0, idx, scale)

    def reset(self, slots=None) -> None:
        """Empty `slots` for new requests: zero checkpoints (and scales), read copies, buffers, fills and rounding
        step counts."""
        idx = self.slot_index(slots, "slots")
        for t in self._slot_tensors():
            _raw(t).index_fill_(0, idx, 0)

    def move(self, src, dst) -> None:
        """Move requests from slots `src` to slots `dst` (same length, disjoint) and empty `src`."""
        s, d = self.slot_index(src, "src"), self.slot_index(dst, "dst")
        if s.shape != d.shape:
            raise ValueError(f"src and dst must have the same length, got {s.shape[0]} and {d.shape[0]}")
        if _overlap(s, d):
            raise ValueError("src and dst must not share a slot")
        for t in self._slot_tensors():
            _raw(t).index_copy_(0, d, _raw(t).index_select(0, s))
        self.reset(s)


def _raw(t: torch.Tensor) -> torch.Tensor:
    # torch has no index_fill_/index_copy_ for fp8; the bytes are what we move, and zero bytes are 0.0
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not common.host_checks(True):
        return False
    return bool(set(a.tolist()) & set(b.tolist()))
