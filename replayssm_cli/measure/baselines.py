"""Outside decode kernels (FlashInfer, mamba_ssm, flash-linear-attention, vLLM) run through the profiler's loop, inputs and check."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from replayssm_cli.model.dtypes import EIGHT_BIT

PREFIX = "baseline:"
ALL = "all"
# Path to mamba_ssm's ops/triton/selective_state_update.py, for machines where mamba_ssm's CUDA build is impossible.
MAMBA_SSM_TRITON_ENV = "REPLAYSSM_MAMBA_SSM_TRITON"
MAMBA_SSM_SOFTPLUS = "mamba_ssm.ops.triton.softplus"
FLASHINFER_MAX_WINDOW = 16


class Baseline:
    """One outside kernel: the op and our variant it competes with, whether it imports here, and how it runs.

    `make` builds the kernel's tensors in its own layout from a bench.Case layer, once and outside the
    timed path; `load` sets them from the layer's initial state (and, for a ReplaySSM kernel, staggers
    the rows as the Case does); `step` runs one decode step and returns the output in our layout
    (batch, heads, dim); `state` gives the full state of every slot in our layout, which the Case
    checks against our plain-PyTorch reference after the same steps on the same inputs.
    """

    name = ""
    op = ""
    variant = "conventional"
    kernel = ""
    install = ""
    note = ""

    def load_module(self) -> Any:
        raise NotImplementedError

    def available(self) -> tuple[bool, str]:
        """(True, what runs) when the kernel imports here; else (False, one line naming what to install)."""
        try:
            self.load_module()
        except Exception as exc:
            return False, f"not importable ({_first_line(exc)}); {self.install}"
        return True, self.kernel

    def unsupported(self, *, window: int | None, state_dtype: str, io_dtype: str, shape: Any) -> str | None:
        """Why this kernel cannot run the configuration, or None."""
        return None

    def unstored(self, state_dtype: str, rounding: str) -> str | None:
        """Why this kernel cannot store a state of this dtype and rounding, or None: outside kernels here take fp32 and
        16-bit states rounded to nearest unless they say otherwise."""
        if state_dtype in EIGHT_BIT:
            return f"{self.kernel} is run here with fp32 and 16-bit states only"
        if rounding == "stochastic":
            return f"{self.kernel} is run here rounding to nearest only"
        return None

    def settings(self, case: Any) -> list[dict[str, Any]]:
        """The launch settings to try, best kept; [{}] for a kernel with none."""
        return [{}]

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        raise NotImplementedError

    def load(self, case: Any, layer: Any, handle: Any, *, fills: Any) -> None:
        raise NotImplementedError

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        raise NotImplementedError

    def state(self, case: Any, layer: Any, handle: Any, done: int) -> Any:
        raise NotImplementedError


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def settings_label(settings: dict[str, Any]) -> str:
    """Launch settings as one short word for tables and results ("algorithm=monolith"; "default" for none)."""
    return ",".join(f"{k}={v}" for k, v in settings.items()) or "default"


@functools.cache
def _import(name: str) -> Any:
    return importlib.import_module(name)


def _nan_like(t: Any) -> Any:
    import torch

    return torch.full_like(t, float("nan"))


def _tied(t: Any, *shape: int) -> Any:
    """A per-head (H,) tensor as the (H, ...) view with zero inner strides that the serving kernels take."""
    return t.view(t.shape[0], *([1] * len(shape))).expand(t.shape[0], *shape)


def _state_by_slot(rows: Any, slots: Any, nslots: int) -> Any:
    """Per-row states scattered to their slots (a fresh tensor, for the check only)."""
    import torch

    out = torch.full((nslots, *rows.shape[1:]), float("nan"), dtype=rows.dtype, device=rows.device)
    out[slots.long()] = rows
    return out


class _Mamba2Conventional(Baseline):
    """A conventional Mamba-2 step over a (nslots, H, P, N) state pool, the layout of ours: A, D, dt_bias and dt tied over P."""

    op = "mamba2"
    variant = "conventional"
    # FlashInfer's kernel wants D and dt_bias in dt's dtype: dt is then converted once per input set (exact for bf16).
    DT_FP32 = False
    NEEDS_D = False
    PREALLOCATED_OUT = False

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        import torch

        s = case.shape
        p = layer.params
        D = p["D"] if p["D"] is not None or not self.NEEDS_D else torch.zeros_like(p["A"])
        h = SimpleNamespace(
            settings=settings,
            state=layer.state0.clone(),
            A=_tied(p["A"], s.P, s.N),
            D=None if D is None else _tied(D, s.P),
            dt_bias=None if p["dt_bias"] is None else _tied(p["dt_bias"], s.P),
            dt_softplus=p["dt_softplus"],
            inputs=[],
            out=None,
        )
        for inp in layer.inputs:
            dt = inp["dt"].float() if self.DT_FP32 else inp["dt"]
            h.inputs.append({**inp, "dt": dt[..., None].expand(*dt.shape, s.P)})
        if self.PREALLOCATED_OUT:
            h.out = _nan_like(layer.inputs[0]["x"])
        return h

    def load(self, case: Any, layer: Any, handle: Any, *, fills: Any) -> None:
        handle.state.copy_(layer.state0)

    def state(self, case: Any, layer: Any, handle: Any, done: int) -> Any:
        return handle.state


class FlashInferSSU(_Mamba2Conventional):
    """FlashInfer's CUDA selective_state_update, tried with each of its algorithms."""

    name = "flashinfer-ssu"
    kernel = "flashinfer.mamba.selective_state_update"
    install = "pip install flashinfer-python apache-tvm-ffi (its kernels compile with this machine's nvcc at first use)"
    note = "FlashInfer's conventional decode (CUDA); dt given in fp32 to match D and dt_bias, as its dtype check asks"
    DT_FP32 = True
    NEEDS_D = True
    PREALLOCATED_OUT = True
    # One JIT module per (dtypes, P, N) holds all three (the algorithm is a runtime int), so trying each costs no
    # compile; its "auto" picks simple below 2 x SMs (batch x H) blocks on sm90, else vertical (horizontal: sm100+).
    ALGORITHMS = ("simple", "vertical", "horizontal")

    def load_module(self) -> Any:
        mod = _import("flashinfer.mamba")
        if not hasattr(mod, "selective_state_update"):
            raise ImportError("flashinfer.mamba has no selective_state_update")
        return mod

    def unsupported(self, *, window: int | None, state_dtype: str, io_dtype: str, shape: Any) -> str | None:
        # Its sm90+ module always builds the horizontal kernel, which has (P / 64) x 4 consumer warps: none below 64.
        if getattr(shape, "P", 64) < 64:
            return "FlashInfer's sm90 selective_state_update does not compile for a head dim P under 64"
        return None

    def settings(self, case: Any) -> list[dict[str, Any]]:
        import torch

        # Its producer-consumer algorithms are built for sm90 and newer; its own "auto" leaves horizontal to sm100+.
        major = torch.cuda.get_device_capability(case.device)[0] if case.device.type == "cuda" else 9
        if major < 9:
            return [{"algorithm": "simple"}]
        return [{"algorithm": a} for a in (self.ALGORITHMS if major >= 10 else self.ALGORITHMS[:2])]

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        _compile_note(self.kernel)
        return super().make(case, layer, settings)

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        inp = handle.inputs[i % len(handle.inputs)]
        self.load_module().selective_state_update(
            handle.state, inp["x"], inp["dt"], handle.A, inp["B"], inp["C"], handle.D, z=inp["z"],
            dt_bias=handle.dt_bias, dt_softplus=handle.dt_softplus, state_batch_indices=layer.slots,
            pad_slot_id=-1, out=handle.out, algorithm=handle.settings["algorithm"],
        )
        return handle.out


class MambaSSM(_Mamba2Conventional):
    name = "mamba-ssm"
    kernel = "mamba_ssm.ops.triton.selective_state_update.selective_state_update"
    install = (
        f"pip install mamba-ssm, or set {MAMBA_SSM_TRITON_ENV} to mamba_ssm/ops/triton/selective_state_update.py of its "
        "source (softplus.py beside it; needs einops)"
    )
    note = "mamba_ssm's Triton selective_state_update; its wrapper allocates the output each call"

    def load_module(self) -> Any:
        return _load_mamba_ssm_triton(os.environ.get(MAMBA_SSM_TRITON_ENV) or None)

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        inp = handle.inputs[i % len(handle.inputs)]
        return self.load_module().selective_state_update(
            handle.state, inp["x"], inp["dt"], handle.A, inp["B"], inp["C"], D=handle.D, z=inp["z"],
            dt_bias=handle.dt_bias, dt_softplus=handle.dt_softplus, state_batch_indices=layer.slots,
        )


class VllmSSU(_Mamba2Conventional):
    name = "vllm-ssu"
    kernel = "vllm.model_executor.layers.mamba.ops.mamba_ssm.selective_state_update"
    install = "pip install vllm"
    note = "vLLM's Triton selective_state_update"
    PREALLOCATED_OUT = True

    def load_module(self) -> Any:
        return _import("vllm.model_executor.layers.mamba.ops.mamba_ssm")

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        inp = handle.inputs[i % len(handle.inputs)]
        self.load_module().selective_state_update(
            handle.state, inp["x"], inp["dt"], handle.A, inp["B"], inp["C"], D=handle.D, z=inp["z"],
            dt_bias=handle.dt_bias, dt_softplus=handle.dt_softplus, state_batch_indices=layer.slots,
            pad_slot_id=-1, out=handle.out,
        )
        return handle.out


class FlashInferCheckpointing(Baseline):
    """FlashInfer's ReplaySSM kernel: a checkpoint plus rings of x, B and processed dt, whose bookkeeping the host owns.

    With one token per step and ring length W + 1, a row at pnat buffered tokens appends its token at
    ring_start + pnat; when pnat + 1 > W it first folds the pnat tokens into the checkpoint (a flush)
    and the host then moves ring_start past them and sets pnat to 1. That bookkeeping is worked out
    on the host for every step ahead of the run (a table per layer) and is not timed.

    One JIT module per (dtypes, P, N, W, H/G, G) holds the monolith, the two-kernel split and every
    autotuner tactic, so the settings below cost one compile per preset and window, not one each.
    """

    name = "flashinfer-checkpointing"
    op = "mamba2"
    variant = "replay"
    kernel = "flashinfer.mamba.checkpointing_ssu"
    install = "pip install 'flashinfer-python>=0.7.2' apache-tvm-ffi (its kernels compile with this machine's nvcc at first use)"
    note = (
        "FlashInfer's ReplaySSM (CUDA), window W, ring W+1; ring_start and prev_num_accepted_tokens, which it leaves "
        "to the host, are precomputed for every step and not timed; graph replays repeat the same ring positions"
    )

    def load_module(self) -> Any:
        mod = _import("flashinfer.mamba")
        if not hasattr(mod, "checkpointing_ssu"):
            raise ImportError("flashinfer.mamba has no checkpointing_ssu (FlashInfer 0.7.2 or later has it)")
        return mod

    def unstored(self, state_dtype: str, rounding: str) -> str | None:
        # Its Philox path is taken for an fp16 state only (kernel_checkpointing_ssu.cuh: kPhiloxF16); a bf16 state given
        # a seed would round to nearest, so it is not run as stochastic rounding.
        if rounding == "stochastic" and state_dtype == "bf16":
            return "checkpointing_ssu rounds stochastically into fp16 and 8-bit states only, not bf16"
        return None

    def unsupported(self, *, window: int | None, state_dtype: str, io_dtype: str, shape: Any) -> str | None:
        if not window or window > FLASHINFER_MAX_WINDOW:
            return f"checkpointing_ssu takes windows of 1 to {FLASHINFER_MAX_WINDOW}"
        if io_dtype not in ("bf16", "fp16"):
            # Its kernels static_assert a 2-byte input type: fp32 io fails at compile time, after minutes of nvcc.
            return "checkpointing_ssu takes bf16 or fp16 inputs only (its MMA kernels need a 2-byte input type)"
        if getattr(shape, "P", 64) < 64:
            # The module always instantiates the d_split=2 kernel, which static_asserts P / 2 >= 32.
            return "checkpointing_ssu does not compile for a head dim P under 64"
        return None

    def settings(self, case: Any) -> list[dict[str, Any]]:
        # An 8-bit state runs its monolithic kernel only (the two-kernel split and the autotuner's other tactics take
        # 16-bit and fp32 states).
        if case.eight_bit:
            return [{"algorithm": "monolith"}]
        return [{"algorithm": "monolith"}, {"algorithm": "two-kernel"}, {"algorithm": "auto", "autotune": True}]

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        import torch

        _compile_note(self.kernel)
        mod = self.load_module()
        s, W, b, dev = case.shape, case.window, case.batch, case.device
        p = layer.params
        io = layer.inputs[0]["x"].dtype
        ring = W + 1
        nslots = layer.state0.shape[0]
        h = SimpleNamespace(
            settings=settings,
            ring=ring,
            state=layer.state0.clone(),
            # an 8-bit state's decode scales per (slot, head, p), as ours; the Philox seed where rounding stochastically
            state_scale=None if layer.scale0 is None else layer.scale0.clone(),
            rand_seed=torch.tensor([case.spec.get("seed") or 0], dtype=torch.int64, device=dev) if case.rounding == "stochastic" else None,
            x_cache=torch.zeros((nslots, s.H, ring, s.P), dtype=io, device=dev),
            B_cache=torch.zeros((nslots, s.G, ring, s.N), dtype=io, device=dev),
            dt_cache=torch.zeros((nslots, s.H, ring), dtype=torch.float32, device=dev),
            A=_tied(p["A"], s.P, s.N),
            D=None if p["D"] is None else _tied(p["D"], s.P),
            dt_bias=None if p["dt_bias"] is None else _tied(p["dt_bias"], s.P),
            dt_softplus=p["dt_softplus"],
            out=torch.full((b, 1, s.H, s.P), float("nan"), dtype=io, device=dev),
            inputs=[],
            ring_start=None,
            pnat=None,
            scratch={},
        )
        for inp in layer.inputs:
            dt = inp["dt"][:, None, :, None].expand(b, 1, s.H, s.P)
            z = None if inp["z"] is None else inp["z"][:, None]
            h.inputs.append({"x": inp["x"][:, None], "dt": dt, "B": inp["B"][:, None], "C": inp["C"][:, None], "z": z})
        if settings["algorithm"] != "monolith":
            cb_scaled, cum, cb_old = mod.allocate_checkpointing_ssu_scratch(b, s.H, 1, W, io, dev)
            h.scratch = {"cb_scaled": cb_scaled, "cumAdt_vec": cum, "cb_old": cb_old}
        if settings.get("autotune"):
            self._tune(case, layer, h)
        return h

    def _call(self, layer: Any, h: Any, inp: dict, ring_start: Any, pnat: Any, *, slots: Any, algorithm: str, scratch: dict) -> None:
        self.load_module().checkpointing_ssu(
            h.state, h.x_cache, h.B_cache, h.dt_cache, ring_start, pnat, inp["x"], inp["dt"], h.A, inp["B"], inp["C"],
            h.out, D=h.D, z=inp["z"], dt_bias=h.dt_bias, dt_softplus=h.dt_softplus, state_batch_indices=slots,
            pad_slot_id=-1, algorithm=algorithm, state_scale=h.state_scale, rand_seed=h.rand_seed, **scratch,
        )

    def _tune(self, case: Any, layer: Any, h: Any) -> None:
        """FlashInfer's autotuner on this batch: one call with empty rings (it writes no state), before the rows are placed."""
        import torch

        from flashinfer.autotuner import autotune

        zeros = torch.zeros(layer.state0.shape[0], dtype=torch.int32, device=case.device)
        with autotune(True, tuning_buckets=(case.batch,)):
            self._call(layer, h, h.inputs[0], zeros, zeros.clone(), slots=layer.slots.clone(), algorithm="auto", scratch=h.scratch)

    def load(self, case: Any, layer: Any, handle: Any, *, fills: Any) -> None:
        import torch

        h = handle
        h.state.copy_(layer.state0)
        if h.state_scale is not None:
            h.state_scale.copy_(layer.scale0)
        nslots = h.state.shape[0]
        zeros = torch.zeros(nslots, dtype=torch.int32, device=case.device)
        for k in range(int(fills.max().item())):
            # Rows short of their fill take this step; the others are padding (slot -1) and left alone.
            slots = torch.where(fills > k, layer.slots, torch.full_like(layer.slots, -1))
            pnat = torch.full_like(zeros, k)
            self._call(layer, h, h.inputs[k % len(h.inputs)], zeros, pnat, slots=slots, algorithm="monolith", scratch={})
        start = torch.zeros(nslots, dtype=torch.int64)
        count = torch.zeros(nslots, dtype=torch.int64)
        count[layer.slots.long().cpu()] = fills.cpu().long()
        h.ring_start, h.pnat = _ring_schedule(start, count, case.window, h.ring, case.device)

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        h = handle
        k = _schedule_row(i, h.ring_start.shape[0])
        algorithm = h.settings["algorithm"]
        if h.settings.get("autotune"):
            from flashinfer.autotuner import autotune

            # The same bucket as the tuning call, so the cached tactic is found.
            with autotune(False, tuning_buckets=(case.batch,)):
                self._call(layer, h, h.inputs[i % len(h.inputs)], h.ring_start[k], h.pnat[k], slots=layer.slots,
                           algorithm=algorithm, scratch=h.scratch)
        else:
            self._call(layer, h, h.inputs[i % len(h.inputs)], h.ring_start[k], h.pnat[k], slots=layer.slots,
                       algorithm=algorithm, scratch=h.scratch)
        return h.out[:, 0]

    def state(self, case: Any, layer: Any, handle: Any, done: int) -> Any:
        """Every slot's checkpoint with its live ring entries folded in, in fp32 (the check's starting and final states)."""
        import torch

        h = handle
        k = _schedule_row(done, h.ring_start.shape[0])
        start, count = h.ring_start[k].long(), h.pnat[k].long()
        A = layer.params["A"].float()
        S = h.state.float() * h.state_scale[..., None] if h.state_scale is not None else h.state.float().clone()
        idx = torch.arange(S.shape[0], device=S.device)
        heads_per_group = S.shape[1] // h.B_cache.shape[1]
        for j in range(int(count.max().item()) if count.numel() else 0):
            pos = (start + j) % h.ring
            x = h.x_cache[idx, :, pos].float()
            B = h.B_cache[idx, :, pos].float().repeat_interleave(heads_per_group, dim=1)
            d = h.dt_cache[idx, :, pos]
            nxt = torch.exp(A * d)[..., None, None] * S + (d[..., None] * x)[..., None] * B[:, :, None, :]
            S = torch.where((j < count)[:, None, None, None], nxt, S)
        return S


def _ring_schedule(start: Any, count: Any, window: int, ring: int, device: Any) -> tuple[Any, Any]:
    """ring_start and prev_num_accepted_tokens of every slot before each of steps 0 .. W·(W+1), one token a step.

    A row placed empty (pnat 0) is never empty again, so only from step 1 on does the schedule repeat,
    with period W·(W+1) (each flush moves ring_start W rows on a ring of W + 1): `_schedule_row` maps a
    step to its row of the table.
    """
    import torch

    period = window * ring
    starts, counts = [], []
    start, count = start.clone(), count.clone()
    for _ in range(period + 1):
        starts.append(start.clone())
        counts.append(count.clone())
        flush = count + 1 > window
        start = torch.where(flush, (start + count) % ring, start)
        count = torch.where(flush, torch.ones_like(count), count + 1)
    as_int = dict(dtype=torch.int32, device=device)
    return torch.stack(starts).to(**as_int).contiguous(), torch.stack(counts).to(**as_int).contiguous()


def _schedule_row(step: int, rows: int) -> int:
    """This step's row in a `_ring_schedule` table of `rows` rows (steps 0 .. period; from step 1 on it repeats every period)."""
    return step if step < rows else 1 + (step - 1) % (rows - 1)


class _GDNConventional(Baseline):
    op = "gdn"
    variant = "conventional"

    def _qkv(self, layer: Any) -> list[dict]:
        return [{k: inp[k][:, None] for k in ("q", "k", "v", "g", "beta")} for inp in layer.inputs]


class FLA(_GDNConventional):
    """flash-linear-attention's fused recurrent Gated DeltaNet: dense per-row states in, a new fp32 final state out."""

    name = "fla"
    kernel = "fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule"
    install = "pip install fla-core einops (pure Python)"
    note = (
        "fla's fused_recurrent_gated_delta_rule: states by row (gathered once from the pool), each step returns a "
        "new fp32 final state that the next step reads, with no slot indirection"
    )

    def load_module(self) -> Any:
        return _import("fla.ops.gated_delta_rule")

    def unsupported(self, *, window: int | None, state_dtype: str, io_dtype: str, shape: Any) -> str | None:
        if state_dtype != "fp32":
            return "fla's fused_recurrent_gated_delta_rule keeps its state in fp32"
        return None

    def settings(self, case: Any) -> list[dict[str, Any]]:
        params = inspect.signature(self.load_module().fused_recurrent_gated_delta_rule).parameters
        if "state_v_first" in params:
            return [{"state_v_first": False}, {"state_v_first": True}]
        return [{}]

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        return SimpleNamespace(settings=settings, inputs=self._qkv(layer), h=None)

    def _v_first(self, handle: Any) -> bool:
        return bool(handle.settings.get("state_v_first"))

    def load(self, case: Any, layer: Any, handle: Any, *, fills: Any) -> None:
        rows = layer.state0[layer.slots.long()].float()
        handle.h = rows.contiguous() if self._v_first(handle) else rows.transpose(-1, -2).contiguous()

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        inp = handle.inputs[i % len(handle.inputs)]
        o, handle.h = self.load_module().fused_recurrent_gated_delta_rule(
            inp["q"], inp["k"], inp["v"], g=inp["g"], beta=inp["beta"], initial_state=handle.h,
            output_final_state=True, use_qk_l2norm_in_kernel=True, **handle.settings,
        )
        return o[:, 0]

    def state(self, case: Any, layer: Any, handle: Any, done: int) -> Any:
        rows = handle.h if self._v_first(handle) else handle.h.transpose(-1, -2)
        return _state_by_slot(rows, layer.slots, layer.state0.shape[0])


class VllmGDN(_GDNConventional):
    name = "vllm-gdn"
    kernel = "vllm.model_executor.layers.fla.ops.fused_recurrent.fused_recurrent_gated_delta_rule"
    install = "pip install vllm"
    note = "vLLM's Triton fused_recurrent_gated_delta_rule on its (nslots, HV, K, V) pool, updated in place through the slots"

    def load_module(self) -> Any:
        return _import("vllm.model_executor.layers.fla.ops.fused_recurrent")

    def make(self, case: Any, layer: Any, settings: dict[str, Any]) -> Any:
        return SimpleNamespace(settings=settings, inputs=self._qkv(layer), state=layer.state0.transpose(-1, -2).contiguous())

    def load(self, case: Any, layer: Any, handle: Any, *, fills: Any) -> None:
        handle.state.copy_(layer.state0.transpose(-1, -2))

    def step(self, case: Any, layer: Any, handle: Any, i: int) -> Any:
        inp = handle.inputs[i % len(handle.inputs)]
        o, _ = self.load_module().fused_recurrent_gated_delta_rule(
            q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], initial_state=handle.state,
            inplace_final_state=True, ssm_state_indices=layer.slots, use_qk_l2norm_in_kernel=True,
        )
        return o[:, 0]

    def state(self, case: Any, layer: Any, handle: Any, done: int) -> Any:
        return handle.state.transpose(-1, -2)


def _load_mamba_ssm_triton(path: str | None) -> Any:
    """mamba_ssm's Triton selective_state_update: from the file at `path`, or from an installed mamba_ssm."""
    if path is None:
        return _import("mamba_ssm.ops.triton.selective_state_update")
    return _load_file(str(Path(path).expanduser().resolve()))


@functools.cache
def _load_file(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{MAMBA_SSM_TRITON_ENV}={path} is not a file")
    try:
        importlib.import_module(MAMBA_SSM_SOFTPLUS)
    except ImportError:
        # The file imports mamba_ssm's softplus; without mamba_ssm, the softplus.py of the same source folder serves.
        beside = file.with_name("softplus.py")
        if not beside.is_file():
            raise ImportError(f"{file.name} imports {MAMBA_SSM_SOFTPLUS}: put mamba_ssm's softplus.py beside it") from None
        _exec_file(beside, MAMBA_SSM_SOFTPLUS)
    return _exec_file(file, "replayssm_mamba_ssm_selective_state_update")


def _exec_file(path: Path, name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


_COMPILE_NOTED: set[str] = set()


def _compile_note(kernel: str) -> None:
    if kernel in _COMPILE_NOTED:
        return
    _COMPILE_NOTED.add(kernel)
    from replayssm_cli.console import note

    note(f"{kernel}: FlashInfer compiles its kernels with nvcc at first use; the first configuration can take minutes")


REGISTRY: dict[str, Baseline] = {
    b.name: b for b in (FlashInferSSU(), FlashInferCheckpointing(), MambaSSM(), VllmSSU(), FLA(), VllmGDN())
}


def names() -> list[str]:
    """The registered baselines, in the order `all` runs them."""
    return list(REGISTRY)


def get(name: str) -> Baseline:
    """The adapter registered under `name` (ValueError naming the known ones otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"no baseline named {name!r}; known: {', '.join(REGISTRY)}") from None


def resolve(requested: tuple[str, ...] | list[str]) -> list[Baseline]:
    """The adapters named (ALL: every registered one), in registry order, each once."""
    wanted = set(REGISTRY) if ALL in requested else set(requested)
    return [b for name, b in REGISTRY.items() if name in wanted]


def register(baseline: Baseline) -> Callable[[], None]:
    """Add an adapter (a test's stand-in, or one outside this package); returns the function that removes it."""
    REGISTRY[baseline.name] = baseline
    return lambda: REGISTRY.pop(baseline.name, None)
