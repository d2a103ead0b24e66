"""The instrumented loop: one configuration as a stack of SSM layers, checked against the references, timed in a CUDA graph."""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from replayssm_cli.measure.timing import graph_samples
from replayssm_cli.model import ops
from replayssm_cli.model.dtypes import EIGHT_BIT, torch_dtype

# Max relative error (max |kernel - reference| / max |reference|) allowed, keyed by the least precise dtype in play.
TOLERANCE = {"fp32": 2e-3, "fp16": 1e-2, "bf16": 3e-2, "int8": 8e-2, "fp8": 8e-2}
PRECISION_ORDER = ("fp32", "fp16", "bf16", "int8", "fp8")
# The stack's state must exceed this many L2 sizes so that batch 1 is served from DRAM, not L2.
L2_MULTIPLE = 4
# Distinct input sets per layer, cycled over the steps.
INPUT_SETS = 2
# Pre-drawn acceptance rows per layer for speculative cases, cycled over the steps.
ACCEPT_ROWS = 64
# Share of the free memory the stack may take; the rest covers the check's reference copies and the allocator.
MEMORY_SHARE = 0.8
# A check before timing allocates about this many extra layers (the reference mirror and its temporaries).
CHECK_LAYERS = 3
# The check runs the references on this many rows, spread over the batch and so over its fills: rows are independent,
# and the kernels still run every row, so the launch row the batch selects is the one checked (the references cost
# as much as the whole batch's steps otherwise: seconds per configuration at batch 256 and W = 64).
CHECK_ROWS = 8
# Mamba-2's dt initialisation range (mamba_ssm's dt_min, dt_max): dt_bias is softplus⁻¹ of a draw from it.
DT_RANGE = (1e-3, 1e-1)
DEFAULT_A_RANGE = (1.0, 16.0)
SPEC_VARIANTS = ("spec-conventional", "spec-replay")
CACHE_VARIANTS = ("replay", "split", "spec-replay")
BASELINE_PREFIX = "baseline:"


def kernels(op: str):
    """The kernel package of an op; looked up at call time so a test can substitute a kernel."""
    return ops.named(op).kernels()


def tolerance(*dtypes: str | None) -> float:
    worst = max((PRECISION_ORDER.index(d) for d in dtypes if d), default=0)
    return TOLERANCE[PRECISION_ORDER[worst]]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| in fp32; NaN or inf anywhere in got is an infinite error."""
    g, w = got.detach().float(), want.detach().float()
    if g.shape != w.shape:
        raise ValueError(f"kernel output has shape {tuple(g.shape)}, the reference {tuple(w.shape)}")
    if not torch.isfinite(g).all():
        return math.inf
    scale = w.abs().max().item()
    return (g - w).abs().max().item() / (scale if scale > 0 else 1.0)


def _inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def _log_uniform(n: int, lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, generator=gen, dtype=torch.float64, device=gen.device)
    return torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))).float()


@dataclass
class _Layer:
    params: dict[str, Any]
    inputs: list[dict[str, torch.Tensor]]
    slots: torch.Tensor
    state0: torch.Tensor
    # An 8-bit state's row scales (state0's and the live state's); a conventional step's stochastic rounding.
    scale0: torch.Tensor | None = None
    state_scale: torch.Tensor | None = None
    rounding: Any = None
    state: torch.Tensor | None = None
    snapshots: torch.Tensor | None = None
    cache: Any = None
    accept: torch.Tensor | None = None
    handle: Any = None


class Case:
    """One configuration: L SSM layers, each with its own state pool or ReplaySSM cache and its own inputs.

    `step()` runs one decode step over all L layers (capturable in a CUDA graph: no host sync);
    `check()` runs layer 0 against the reference for a whole number of windows and returns the max
    relative error; `close()` frees the device memory. A "baseline:<name>" variant runs that outside
    kernel (replayssm_cli.measure.baselines) on the same inputs, layers and check as the variant it competes with.
    """

    def __init__(self, spec: dict[str, Any], device: torch.device | str):
        self.spec = dict(spec)
        self.device = torch.device(device)
        self.variant = spec["variant"]
        self.baseline = None
        if self.variant.startswith(BASELINE_PREFIX):
            from replayssm_cli.measure import baselines

            self.baseline = baselines.get(self.variant[len(BASELINE_PREFIX):])
        # The variant whose layout, memory and check this case follows (a baseline's competitor).
        self.kernel_variant = self.baseline.variant if self.baseline is not None else self.variant
        self.settings: dict[str, Any] | None = None
        # The fills a ReplaySSM baseline's rows were placed at (the check starts our reference there too).
        self._placed: torch.Tensor | None = None
        self.batch = int(spec["batch"])
        if self.batch < 1:
            raise ValueError(f"batch must be positive, got {self.batch}")
        self.window = int(spec["window"]) if spec.get("window") else None
        if self.kernel_variant in CACHE_VARIANTS and not self.window:
            raise ValueError(f"variant {self.variant!r} needs a window")
        self.state_dtype = spec.get("state_dtype") or "fp32"
        self.read_dtype = spec.get("read_dtype") if self.variant == "split" else None
        if self.variant == "split" and not self.read_dtype:
            raise ValueError("variant 'split' needs a read_dtype")
        self.io_dtype = spec.get("io_dtype") or "bf16"
        self.rounding = spec.get("rounding") or "nearest"
        self.eight_bit = self.state_dtype in EIGHT_BIT
        self.draft = int(spec.get("draft") or 0)
        if (self.variant in SPEC_VARIANTS) != (self.draft > 0):
            raise ValueError(f"variant {self.variant!r} and draft {self.draft} do not go together")
        self.flush = spec.get("flush") or "staggered"
        self.phase = spec.get("phase") or "avg"
        self.accept_probs = list(spec.get("accept") or ([0.0] * self.draft + [1.0] if self.draft else []))
        self._resolve_model(spec)
        self.layers = self._layer_count(spec)
        # Drawn on the device: a batch-256 state is a GiB, too slow to draw on the host and copy.
        self._gen = torch.Generator(device=self.device).manual_seed(int(spec.get("seed") or 0))
        self._i = 0
        self._layers: list[_Layer] = [self._build_layer() for _ in range(self.layers)]
        if self.baseline is not None:
            self.use_settings(self.baseline.settings(self)[0])
        else:
            self.position()

    def _resolve_model(self, spec: dict[str, Any]) -> None:
        if spec.get("shape"):
            s = dict(spec["shape"])
            op = s.pop("op", None) or spec.get("op")
            self.shape = ops.named(op).shape_type(**s)
            self.ssm_layers = int(spec.get("ssm_layers") or 1)
            self.dt_softplus = bool(spec.get("dt_softplus", True))
            self.has_z = bool(spec.get("has_z", True))
            self.has_D = bool(spec.get("has_D", True))
            self.a_range = tuple(spec.get("a_log_range") or DEFAULT_A_RANGE)
        else:
            from replayssm_cli.model import presets

            p = presets.resolve(spec["preset"], int(spec.get("tp") or 1))
            self.shape = p.shape
            self.ssm_layers = p.ssm_layers
            self.dt_softplus = bool(getattr(p, "dt_softplus", True))
            self.has_z = bool(getattr(p, "has_z", True))
            self.has_D = bool(getattr(p, "has_D", True))
            self.a_range = tuple(getattr(p, "a_log_range", None) or DEFAULT_A_RANGE)
        self.op = self.shape.op
        self.adapter = ops.of(self.shape)

    def _touched_per_layer(self) -> int:
        """Bytes one layer's kernels keep for the whole batch (state or checkpoint, read copy, buffers, snapshots)."""
        from replayssm_cli.model import cost

        mem = cost.memory_per_seq(
            self.shape, self.kernel_variant, window=self.window, state_dtype=self.state_dtype,
            read_dtype=self.read_dtype, io_dtype=self.io_dtype, draft=self.draft, rounding=self.rounding,
        )
        return int(mem["total"]) * self.batch

    def _bytes_per_layer(self) -> int:
        """What one layer allocates: the kernels' data, the initial state kept to load again, the input sets."""
        from replayssm_cli.model.shapes import state_bytes

        io = self._input_elems() * max(1, self.draft) * torch_dtype(self.io_dtype).itemsize * INPUT_SETS * 2
        initial = state_bytes(self.shape, self.state_dtype)
        return self._touched_per_layer() + (initial + io) * self.batch

    def _input_elems(self) -> int:
        return self.adapter.input_elems(self.shape)

    def _layer_count(self, spec: dict[str, Any]) -> int:
        per_layer = self._bytes_per_layer()
        count = self.ssm_layers
        if spec.get("layers"):
            count = min(count, int(spec["layers"]))
        l2 = spec.get("l2_bytes")
        if l2 is None and self.device.type == "cuda":
            l2 = getattr(torch.cuda.get_device_properties(self.device), "L2_cache_size", 0)
        if l2:
            count = min(count, L2_MULTIPLE * int(l2) // self._touched_per_layer() + 1)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            fit = int(free * MEMORY_SHARE) // per_layer - CHECK_LAYERS
            if fit < 1:
                raise torch.cuda.OutOfMemoryError(
                    f"{per_layer / 2**30:.2f} GiB per layer (and {CHECK_LAYERS} more for the check) do not fit in {free / 2**30:.1f} GiB free"
                )
            count = min(count, fit)
        return max(1, count)

    def _randn(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, generator=self._gen, device=self.device) * scale

    def _build_layer(self) -> _Layer:
        b, dev = self.batch, self.device
        io = torch_dtype(self.io_dtype)
        s = self.shape
        lead = (b, self.draft) if self.draft else (b,)
        op = self.adapter
        heads = op.state_heads(s)
        # -A is drawn uniformly over the preset's range, as both Mamba-2 and GDN initialise it.
        lo, hi = self.a_range
        neg_a = (lo + (hi - lo) * torch.rand(heads, generator=self._gen, dtype=torch.float64, device=self._gen.device)).float()
        dt_bias = _inv_softplus(_log_uniform(heads, *DT_RANGE, self._gen))
        params, inputs = op.draw(s, self._randn, lead, neg_a, dt_bias, dt_softplus=self.dt_softplus, has_z=self.has_z,
                                 has_D=self.has_D, io=io, sets=INPUT_SETS)
        state_shape = (b, *op.state_shape(s))
        slots = torch.randperm(b, generator=self._gen, device=dev).to(torch.int32)
        state0, scale0 = self._initial_state(state_shape)
        layer = _Layer(params=params, inputs=inputs, slots=slots, state0=state0, scale0=scale0)
        K = kernels(self.op)
        if self.variant in CACHE_VARIANTS:
            layer.cache = K.ReplayCache.create(
                b, *op.cache_dims(s), self.window, state_dtype=torch_dtype(self.state_dtype),
                read_dtype=torch_dtype(self.read_dtype) if self.read_dtype else None,
                io_dtype=io, max_draft=self.draft, device=dev, **self._cache_rounding(),
            )
        elif self.baseline is None:
            layer.state = state0.clone()
            layer.state_scale = None if scale0 is None else scale0.clone()
            if self.rounding == "stochastic":
                from replayssm_kernels.rounding import StateRounding

                layer.rounding = StateRounding.create(b, self._seed(), device=dev)
            if self.variant == "spec-conventional":
                layer.snapshots = torch.empty((b, self.draft, *state_shape[1:]), dtype=state0.dtype, device=dev)
        if self.draft:
            probs = torch.tensor(self.accept_probs, dtype=torch.float64, device=dev)
            draws = torch.multinomial(probs.expand(ACCEPT_ROWS * b, -1), 1, replacement=True, generator=self._gen)
            layer.accept = draws.view(ACCEPT_ROWS, b).to(torch.int32)
        return layer

    def _seed(self) -> int:
        return int(self.spec.get("seed") or 0)

    def _initial_state(self, state_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every slot's starting state in the state dtype, and for an 8-bit state its row scales (rows over the last axis,
        quantised to nearest as the kernels store them)."""
        full = self._randn(*state_shape, scale=0.5)
        if not self.eight_bit:
            return full.to(torch_dtype(self.state_dtype)), None
        from replayssm_kernels.rounding import quantized_rows_reference

        return quantized_rows_reference(full, None, torch_dtype(self.state_dtype))

    def full_state0(self, layer: _Layer) -> torch.Tensor:
        """A layer's starting states as full values (an 8-bit state dequantised): what a cache or an outside kernel loads."""
        if layer.scale0 is None:
            return layer.state0
        return layer.state0.float() * layer.scale0[..., None]

    def _cache_rounding(self) -> dict[str, Any]:
        """ReplayCache.create's rounding arguments: none when rounding to nearest (the kernels' default)."""
        return {"rounding": "stochastic", "seed": self._seed()} if self.rounding == "stochastic" else {}

    def _store(self, state_scale: Any, rounding: Any) -> dict[str, Any]:
        """The keyword arguments of a conventional step that says how its state is stored."""
        store = {}
        if state_scale is not None:
            store["state_scale"] = state_scale
        if rounding is not None:
            store["rounding"] = rounding
        return store

    def _args(self, layer: _Layer, i: int, store: dict[str, Any] | None = None,
              rows: torch.Tensor | None = None) -> tuple[tuple, dict[str, Any]]:
        inputs, slots = layer.inputs[i % INPUT_SETS], layer.slots
        if rows is not None:
            inputs = {k: None if v is None else v[rows] for k, v in inputs.items()}
            slots = slots[rows]
        return self.adapter.kernel_args(layer.params, inputs, slots, store=store)

    def check_rows(self, layer: _Layer) -> torch.Tensor | None:
        """The rows the check's references run on (CHECK_ROWS of them, evenly spread), or None for all."""
        batch = layer.slots.shape[0]
        if batch <= CHECK_ROWS:
            return None
        return torch.linspace(0, batch - 1, CHECK_ROWS, device=layer.slots.device).round().long().unique()

    def _run(self, layer: _Layer, i: int, K: Any = None, *, ref: bool = False, target: Any = None,
             rows: torch.Tensor | None = None) -> torch.Tensor:
        """One step of one layer through the kernels (or the references on `target`, for `rows` of the batch: None for
        all); returns the outputs."""
        if self.baseline is not None and not ref:
            return self.baseline.step(self, layer, layer.handle, i)
        K = K or kernels(self.op)
        sfx = "_ref" if ref else ""
        if self.variant in ("conventional", "spec-conventional"):
            # a conventional target is (state, snapshots, scales, rounding), the kernels' copies
            state, snaps, scale, rounding = target if ref else (layer.state, layer.snapshots, layer.state_scale, layer.rounding)
            args, kwargs = self._args(layer, i, self._store(scale, rounding), rows if ref else None)
            if self.variant == "conventional":
                return getattr(K, "decode" + sfx)(state, *args, **kwargs)
            return getattr(K, "decode_multi" + sfx)(state, snaps, *args, **kwargs)
        args, kwargs = self._args(layer, i, rows=rows if ref else None)
        if self.variant in ("replay", "split"):
            return getattr(K, "replay" + sfx)(target if ref else layer.cache, *args, **kwargs)
        cache = target if ref else layer.cache
        y = getattr(K, "verify" + sfx)(cache, *args, **kwargs)
        accept, slots = layer.accept[i % ACCEPT_ROWS], layer.slots
        if ref and rows is not None:
            accept, slots = accept[rows], slots[rows]
        getattr(K, "accept" + sfx)(cache, accept, slots=slots)
        return y

    def step(self) -> None:
        """One decode step over every layer of the stack (verify + accept for speculative ReplaySSM)."""
        K = kernels(self.op)
        for layer in self._layers:
            self._run(layer, self._i, K)
        self._i += 1

    def rewind(self) -> None:
        """Restart the input and acceptance cycle (before a capture, so graph replays repeat the same steps)."""
        self._i = 0

    def accepted(self, steps: int) -> float | None:
        """Mean drafts accepted per step over the first `steps` steps of the cycle, all layers and rows."""
        if not self.draft:
            return None
        rows = [layer.accept[[i % ACCEPT_ROWS for i in range(steps)]] for layer in self._layers]
        return torch.cat(rows).double().mean().item()

    def use_settings(self, settings: dict[str, Any]) -> None:
        """Rebuild a baseline's tensors under these launch settings on every layer, and place its rows."""
        if self.baseline is None:
            raise ValueError(f"variant {self.variant!r} is ours: it has no baseline settings")
        for layer in self._layers:
            layer.handle = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.settings = dict(settings)
        for layer in self._layers:
            layer.handle = self.baseline.make(self, layer, self.settings)
        self.position()

    def fills(self, flush: str, fill: int | None) -> torch.Tensor:
        """Each row's starting fill: r mod W when staggered, else `fill` (0 when aligned) for every row."""
        if flush == "staggered" and fill is None:
            return torch.arange(self.batch, device=self.device) % self.window
        return torch.full((self.batch,), fill or 0, device=self.device)

    def position(self, flush: str | None = None, fill: int | None = None) -> None:
        """Load every layer's initial state and set the fills: staggered (row r at r mod W), aligned at 0, or all at `fill`."""
        flush = flush or self.flush
        if fill is None and self.phase in ("nonflush", "flush") and self.window:
            from replayssm_cli.measure.grid import nonflush_fill

            fill = self.window - 1 if self.phase == "flush" else nonflush_fill(self.window)
        if self.baseline is not None:
            self._placed = self.fills(flush, fill) if self.kernel_variant in CACHE_VARIANTS else None
            for layer in self._layers:
                self.baseline.load(self, layer, layer.handle, fills=self._placed)
            self.rewind()
            return
        K = kernels(self.op)
        for layer in self._layers:
            if layer.cache is None:
                layer.state.copy_(layer.state0)
                if layer.state_scale is not None:
                    layer.state_scale.copy_(layer.scale0)
                if layer.rounding is not None:
                    layer.rounding.reset()
                continue
            layer.cache.load(self.full_state0(layer), layer.slots)
            target = self.fills(flush, fill)
            for k in range(int(target.max().item())):
                # Padding rows (slot -1) are skipped: only rows still short of their fill take this step.
                slots = torch.where(target > k, layer.slots, torch.full_like(layer.slots, -1))
                args, kwargs = self._args(layer, k)
                kwargs["slots"] = slots
                if self.draft:
                    K.verify(layer.cache, *args, **kwargs)
                    K.accept(layer.cache, (target > k).to(torch.int32), slots=slots)
                else:
                    K.replay(layer.cache, *args, **kwargs)
        self.rewind()

    def check_steps(self) -> int:
        """Steps the check runs: a whole number of windows (every row flushes once) so the fills come back to their phase."""
        if self.window and self.kernel_variant in CACHE_VARIANTS:
            return self.window if self.window > 1 else 2
        return 2

    def check(self, *, references: bool = True) -> float:
        """Run layer 0 through the kernels and, on copies, through the references (on check_rows of the batch); the max
        relative error of outputs and state over those rows. Without `references`, only the kernels' launches (for a
        compile) and 0.0."""
        K = kernels(self.op)
        layer = self._layers[0]
        if self.baseline is not None:
            return self._check_baseline(K, layer)
        if not references:
            rows = self.check_rows(layer)
            for i in range(self.check_steps()):
                self._run(layer, i, K)
            if layer.cache is not None:
                K.materialize(layer.cache, layer.slots if rows is None else layer.slots[rows])
            self.rewind()
            return 0.0
        if layer.cache is not None:
            target: Any = copy.deepcopy(layer.cache)
        else:
            target = tuple(None if t is None else t.clone() for t in (layer.state, layer.snapshots, layer.state_scale, layer.rounding))
        worst = 0.0
        rows = self.check_rows(layer)
        for i in range(self.check_steps()):
            want = self._run(layer, i, K, ref=True, target=target, rows=rows)
            got = self._run(layer, i, K)
            worst = max(worst, rel_err(got if rows is None else got[rows], want))
        slots = layer.slots if rows is None else layer.slots[rows]
        if layer.cache is not None:
            worst = max(worst, rel_err(K.materialize(layer.cache, slots), K.materialize_ref(target, slots)))
        elif layer.snapshots is not None:
            worst = max(worst, rel_err(layer.snapshots[slots.long()], target[1][slots.long()]))
        else:
            # only the checked slots dequantised, not the whole pool
            worst = max(worst, rel_err(_values(layer.state, layer.state_scale, slots), _values(target[0], target[2], slots)))
        del target
        self.rewind()
        return worst

    def _check_baseline(self, K: Any, layer: _Layer) -> float:
        """A baseline against our conventional reference: its full states where ours start, then the same steps on the same inputs."""
        a = self.baseline
        target = a.state(self, layer, layer.handle, 0).clone()
        start = self.full_state0(layer).to(target.dtype, copy=True)
        fills = self._placed
        for k in range(int(fills.max().item()) if fills is not None else 0):
            # The rows a ReplaySSM kernel was placed at fill f took the first f steps; the others were padding.
            args, kwargs = self._args(layer, k)
            kwargs["slots"] = torch.where(fills > k, layer.slots, torch.full_like(layer.slots, -1))
            K.decode_ref(start, *args, **kwargs)
        worst = rel_err(target, start)
        del start
        steps = self.check_steps()
        for i in range(steps):
            args, kwargs = self._args(layer, i)
            want = K.decode_ref(target, *args, **kwargs)
            worst = max(worst, rel_err(a.step(self, layer, layer.handle, i), want))
        worst = max(worst, rel_err(a.state(self, layer, layer.handle, steps), target))
        del target
        self.rewind()
        return worst

    def tolerance(self) -> float:
        return tolerance(self.state_dtype, self.read_dtype, self.io_dtype)

    @property
    def stack_bytes(self) -> int:
        """Bytes the kernels keep over the whole stack: what must exceed the L2 for the timing to be honest."""
        return self.layers * self._touched_per_layer()

    def close(self) -> None:
        self._layers.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _values(state: torch.Tensor, scale: torch.Tensor | None, slots: torch.Tensor) -> torch.Tensor:
    """The values of a state pool's `slots`: an 8-bit state's rows times their scales."""
    index = slots.long()
    return state[index].float() if scale is None else state[index].float() * scale[index][..., None]


def make_case(spec: dict[str, Any], device: torch.device | str) -> Case:
    """Build one configuration on `device`.

    spec: "variant" (conventional | replay | split | spec-conventional | spec-replay), "batch",
    "window", "state_dtype" (fp32, bf16, fp16, or 8-bit fp8 / int8 with row scales), "read_dtype", "io_dtype",
    "rounding" (nearest | stochastic: how every stored 16-bit or 8-bit state rounds), "draft", "accept" (probabilities of accepting
    0..draft drafts), "flush" (staggered | aligned), "phase" (avg, or nonflush | flush to set every
    row at that fill), "layers" (a cap), "seed", and either "preset" (+ "tp") or "shape" (a dict
    with "op" and H, P, N, G or H, HV, K, V; then "ssm_layers", "has_z", "has_D", "dt_softplus",
    "a_log_range" optionally). "l2_bytes" overrides the device's L2 size used to choose the layer count.
    """
    return Case(spec, device)


def time_graph(case: Case, *, steps: int, repeats: int, on_graph: Callable[[Callable[[], None]], None] | None = None) -> list[float]:
    """Per-step samples in µs per layer: `steps` steps of every layer captured in one CUDA graph, replayed `repeats` times;
    then `on_graph` (energy.GraphMeter), given the graph's replay."""

    def steps_of_every_layer() -> None:
        for _ in range(steps):
            case.step()

    samples = graph_samples(steps_of_every_layer, replays=repeats, before_capture=case.rewind, on_graph=on_graph)
    return [s / (steps * case.layers) for s in samples]


def time_phases(case: Case, *, cycles: int) -> dict[int, list[float]]:
    """Per-fill samples (µs per layer) with every row aligned: one step of every layer in a graph, replayed fill by fill."""
    W = case.window
    case.position(flush="aligned", fill=0)

    def every_fill() -> None:
        for _ in range(W):
            case.step()
            case.rewind()

    samples = graph_samples(case.step, replays=cycles * W, warmup=W, eager=every_fill)
    case.rewind()
    by_fill: dict[int, list[float]] = {f: [] for f in range(W)}
    for j, s in enumerate(samples):
        by_fill[j % W].append(s / case.layers)
    return by_fill


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


def _alone(context: dict[str, Any]):
    """What a timed section runs inside: context["alone"]() (the GPU to this process alone, e.g. no pre-compile worker
    on it), else nothing."""
    alone = context.get("alone")
    return alone() if alone is not None else contextlib.nullcontext()


def run_point(point: Any, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Build, check and time one grid point on CUDA; the measurements (one per phase) `profile.measured_rows` takes.

    A kernel that raises while the case is built or checked, or whose check fails, gives one failed
    measurement and is not timed. An out-of-memory error propagates (the grid skips the point); the
    case is freed either way.
    """
    from replayssm_cli.measure.energy import GraphMeter
    from replayssm_cli.model.gpus import ClockSampler
    from replayssm_cli.measure.grid import nonflush_fill, point_phases

    device = torch.device(context.get("device", "cuda"))
    spec = point.case_spec(seed=int(context.get("seed", 0)))
    if context.get("l2_bytes") is not None:
        spec["l2_bytes"] = context["l2_bytes"]
    case = None
    try:
        try:
            case = make_case(spec, device)
            if case.baseline is not None:
                return _run_baseline(case, context)
            worst = case.check()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:
            return [{"phase": "avg", "ok": False, "layers": case.layers if case else None, "check_max_err": None,
                     "tolerance": case.tolerance() if case else None, "error": _first_line(exc)}]
        tol = case.tolerance()
        if not worst <= tol:
            return [{"phase": "avg", "ok": False, "layers": case.layers, "check_max_err": worst, "tolerance": tol,
                     "error": f"max relative error {worst:.2e} over the tolerance {tol:.0e}"}]
        window = case.window or 16
        steps = window * int(context.get("windows_per_graph", 2))
        repeats = int(context.get("repeats", 30))
        meter = GraphMeter.of(context.get("energy"), steps * case.layers)
        with _alone(context), ClockSampler(required=False) as clocks:
            samples = time_graph(case, steps=steps, repeats=repeats, on_graph=meter)
        accepted = case.accepted(steps)
        energy = meter.fields(model_layers=case.ssm_layers, tokens_per_step=case.batch * (1 + (accepted or 0))) if meter else None
        common = {"ok": True, "layers": case.layers, "check_max_err": worst, "tolerance": tol, "stack_bytes": case.stack_bytes}
        out = [{"phase": "avg", "samples_us": samples, "accepted": accepted, "steps": steps,
                "repeats": repeats, "clocks": clocks.summary(), "energy": energy, **common}]
        phases = point_phases(point)
        if len(phases) > 1:
            with _alone(context):
                by_fill = time_phases(case, cycles=max(5, repeats // 2))
            medians = [sorted(v)[len(v) // 2] for _, v in sorted(by_fill.items())]
            if "nonflush" in phases:
                out.append({"phase": "nonflush", "samples_us": by_fill[nonflush_fill(window)], "steps": 1,
                            "repeats": len(by_fill[0]), "note": f"all rows at fill {nonflush_fill(window)}", **common})
            out.append({"phase": "flush", "samples_us": by_fill[window - 1], "steps": 1, "repeats": len(by_fill[0]),
                        "note": f"all rows flush; median µs by fill {[round(m, 3) for m in medians]}", **common})
        return out
    finally:
        if case is not None:
            case.close()


def compile_point(point: Any, context: dict[str, Any]) -> None:
    """Launch, untimed, every kernel `run_point` launches for a grid point, so that Triton compiles each (and caches it
    on disk) at the arguments the timed run passes: the case built from the same spec and seed, positioned, the check's
    kernel launches (both input sets, its materialize; not its references) and one step. One layer: the stack's layers
    share their shapes. A CUDA graph captures the same launches, so none is needed. Returns with the GPU idle and the
    case's memory given back; errors propagate."""
    device = torch.device(context.get("device", "cuda"))
    case = make_case({**point.case_spec(seed=int(context.get("seed", 0))), "layers": 1}, device)
    try:
        case.check(references=False)
        case.step()
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        case.close()


def _run_baseline(case: Case, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of a baseline's launch settings checked and timed like our kernels; the fastest that passes is the measurement.

    Every setting tried is listed (its median µs, or why it failed); a setting that raises or fails its
    check is not timed, and when none passes the measurement is a failed one.
    """
    from replayssm_cli.measure.baselines import settings_label
    from replayssm_cli.model.gpus import ClockSampler

    tol = case.tolerance()
    steps = (case.window or 16) * int(context.get("windows_per_graph", 2))
    repeats = int(context.get("repeats", 30))
    tried: list[dict[str, Any]] = []
    best: tuple[float, dict[str, Any], float, list[float]] | None = None
    with ClockSampler(required=False) as clocks:
        for n, settings in enumerate(case.baseline.settings(case)):
            entry: dict[str, Any] = {"settings": settings_label(settings)}
            tried.append(entry)
            try:
                # The case comes placed under the first settings; later ones rebuild the baseline's tensors.
                if n > 0 or settings != case.settings:
                    case.use_settings(settings)
                worst = case.check()
                entry["check_max_err"] = worst
                if not worst <= tol:
                    entry["error"] = f"max relative error {worst:.2e} over the tolerance {tol:.0e}"
                    continue
                with _alone(context):
                    samples = time_graph(case, steps=steps, repeats=repeats)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as exc:
                entry["error"] = _first_line(exc)
                continue
            entry["us"] = sorted(samples)[len(samples) // 2]
            if best is None or entry["us"] < best[0]:
                best = (entry["us"], settings, worst, samples)
    common = {"layers": case.layers, "tolerance": tol, "settings_tried": tried, "kernel": case.baseline.kernel,
              "note": case.baseline.note}
    if best is None:
        errs = [t.get("check_max_err") for t in tried if t.get("check_max_err") is not None]
        why = "; ".join(f"{t['settings']}: {t['error']}" for t in tried)
        return [{"phase": "avg", "ok": False, "check_max_err": min(errs) if errs else None, "error": why, **common}]
    _, settings, worst, samples = best
    return [{"phase": "avg", "ok": True, "samples_us": samples, "accepted": None, "steps": steps, "repeats": repeats,
             "clocks": clocks.summary(), "check_max_err": worst, "stack_bytes": case.stack_bytes, "settings": settings,
             **common}]
