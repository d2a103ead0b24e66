"""One adapter per SSM op (Mamba-2, Gated DeltaNet): its shape and dimension names, its state, input and per-step
byte sizes, its kernels and the arguments they take. Callers ask `of(shape)` or `named(op)` instead of branching on
the op's name. No torch at import."""

from __future__ import annotations

import importlib
from typing import Any, Callable

from replayssm_cli.model.shapes import GDNShape, Mamba2Shape, SSMShape

_F32 = 4


class Mamba2Flops:
    """FLOPs per batch row of the Mamba-2 kernels; the terms are listed in cost.step_cost's docstring."""

    def __init__(self, shape: SSMShape, has_z: bool):
        self.H, self.P, self.N = shape.H, shape.P, shape.N
        self.gate = 5 if has_z else 0
        self.row_dequant = self.H * self.P
        self.tile_dequant = self.H * self.P * self.N
        # Quantising a stored 8-bit state: a division per element and one per row (its scale).
        self.quant = self.H * (self.P * self.N + self.P)

    def conventional(self, T: int) -> float:
        H, P, N = self.H, self.P, self.N
        return T * H * (6 + P * (3 + self.gate) + 5 * P * N)

    def verify(self, f: float, T: int) -> float:
        H, P, N = self.H, self.P, self.N
        terms = T * f + T * (T + 1) / 2
        return H * (7 * T + 2 * P * N * T + terms * (2 * N + 2 * P + 4) + T * P * (4 + self.gate))

    def flush(self, f: float, quantise: bool) -> float:
        H, P, N = self.H, self.P, self.N
        quant = P * N + P if quantise else 0
        return H * (7 + (f + 1) * (3 + P) + P * N * (3 + 2 * (f + 1)) + P * (2 + self.gate) + quant)

    def fold(self, F: float, quantise: bool) -> float:
        H, P, N = self.H, self.P, self.N
        quant = P * N + P if quantise else 0
        return H * (1 + F * (3 + P) + P * N * (1 + 2 * F) + quant)


class GDNFlops:
    """FLOPs per batch row of the Gated DeltaNet kernels; the terms are listed in cost.step_cost's docstring."""

    def __init__(self, shape: SSMShape):
        self.HV, self.K, self.V = shape.HV, shape.K, shape.V
        self.row_dequant = self.HV * 2 * self.V
        self.tile_dequant = self.HV * self.V * self.K
        self.quant = self.HV * (self.V * self.K + self.V)

    def conventional(self, T: int) -> float:
        HV, K, V = self.HV, self.K, self.V
        return T * HV * (1 + K + 7 * V * K + 2 * V)

    def verify(self, f: float, T: int) -> float:
        HV, K, V = self.HV, self.K, self.V
        terms = T * f + T * (T - 1) / 2
        return HV * (T * (2 + 3 * K + 8 * V + 4 * V * K) + terms * (4 * K + 4 * V + 4))

    def correction(self, f: float, fp8: bool) -> float:
        """A split flush's correction of f buffered updates (`_Sizes.flush_copy`): per head the keys y_j (a [f, f] x
        [f, K] product, scaled) and per element checkpoint - copy (after dequantising an fp8 copy) and its product
        with them, added to the updates."""
        HV, K, V = self.HV, self.K, self.V
        return HV * (2 * f * f * K + f * K + V * K * (1 + 2 * f + (1 if fp8 else 0)) + f * V)

    def flush(self, f: float, quantise: bool) -> float:
        HV, K, V = self.HV, self.K, self.V
        quant = V * K + V if quantise else 0
        return self.verify(f, 1) + HV * (V * K * (1 + 2 * (f + 1)) + (f + 1) * V + quant)

    def fold(self, F: float, quantise: bool) -> float:
        HV, K, V = self.HV, self.K, self.V
        quant = V * K + V if quantise else 0
        return HV * (1 + F * (2 + V) + V * K * (1 + 2 * F) + quant)


class Mamba2:
    """Mamba-2: state (H, P, N) per sequence; inputs x, dt, B, C (and z); parameters A, D, dt_bias."""

    name = "mamba2"
    title = "Mamba-2"
    shape_type = Mamba2Shape
    dims = ("H", "P", "N", "G")
    # -A drawn over this range where a preset gives none (as Mamba-2 initialises A_log).
    a_log_range = (1.0, 16.0)
    a_label = "-A"
    has_D = True
    # The input whose first axis counts tokens, and the one whose second axis counts a layer's state heads.
    token_input = "x"
    head_input = "x"
    # Whether a split-precision flush reads the read copy too, and buffers a correction per entry (GDN does).
    split_flush_reads_copy = False
    # in_proj's outputs start with z (Mamba-2) or with the conv's channels (GDN); the block family a preset takes unnamed.
    z_first = True
    family = None
    # Arrival counters per (slot, head) of the programs that share a head.
    arrive_lanes = 1
    # The dtypes a ReplayCache may buffer its entries in (`buffer_dtype`): none, Mamba-2 buffers its inputs as given.
    buffer_dtypes: tuple[str, ...] = ()
    # Whether a stochastically rounded store hashes pairs of neighbours (kernels/rounding.py `paired_bits`) or each
    # element (`element_bits`).
    paired_bits = True

    # A preset TOML's [ssm] keys, in the order of `dims`.
    toml_keys = ("heads", "head_dim", "state_dim", "groups")

    def shape(self, **dims: int) -> Mamba2Shape:
        return Mamba2Shape(**{k: int(dims[k]) for k in self.dims})

    def tp_split(self, full: Mamba2Shape, tp: int) -> tuple[list[str], Mamba2Shape | None]:
        """The shape on one of `tp` GPUs, or the dimensions tp does not divide. Groups split like heads; a single
        group is replicated on every GPU, as vLLM does."""
        bad = [f"{n}={v}" for n, v in (("H", full.H), ("G", full.G)) if v % tp and not (n == "G" and v == 1)]
        return bad, None if bad else Mamba2Shape(H=full.H // tp, P=full.P, N=full.N, G=max(full.G // tp, 1))

    def head_mismatch(self, s: Mamba2Shape) -> str | None:
        """Why the heads do not fit together, or None."""
        return f"heads H={s.H} are not a multiple of groups G={s.G}" if s.H % s.G else None

    def state_heads(self, s: Mamba2Shape) -> int:
        """The heads a decode kernel's grid spans per sequence."""
        return s.H

    def rounding_problem(self, s: Mamba2Shape) -> str | None:
        """Why the kernels cannot round this shape's state stochastically (one sentence), or None: a store's
        neighbours share a hash (`paired_bits`), so a state row (N) must have an even length."""
        if s.N % 2:
            return (f"stochastic rounding pairs a state row's neighbours: the rows of N = {s.N} have an odd length "
                    "(the kernels take an even N)")
        return None

    def head_width(self, s: Mamba2Shape) -> int:
        """Output features per head."""
        return s.P

    def state_shape(self, s: Mamba2Shape) -> tuple[int, int, int]:
        """One sequence's state, as the kernels lay it out."""
        return (s.H, s.P, s.N)

    def cache_dims(self, s: Mamba2Shape) -> tuple[int, int, int, int]:
        """The dimensions `ReplayCache.create` takes after nslots."""
        return (s.H, s.P, s.N, s.G)

    def input_elems(self, s: Mamba2Shape) -> int:
        """Elements of one token's inputs and output (x, z, dt, B, C, y) for one sequence."""
        return 2 * s.H * s.P + s.H + 2 * s.G * s.N

    def quality_elems_per_head(self, s: Mamba2Shape) -> int:
        """Elements of one token's inputs per head in the quality harness (x, B, C, dt)."""
        return s.P + 2 * s.N + 1

    def step_sizes(self, s: Mamba2Shape, io: int, has_z: bool, buffer: int = _F32) -> dict[str, int]:
        """Bytes per sequence of one step's traffic, by part (io: the input and output itemsize; buffer: the itemsize of
        the buffered elements that take `buffer_dtypes`): state rows and heads counted, inputs, outputs, parameters,
        one buffer entry, a draft's extra B."""
        H, P, N, G = s.H, s.P, s.N, s.G
        return {
            "rows": H * P, "heads": H,
            "inputs": (H * P * (2 if has_z else 1) + H + 2 * G * N) * io,
            "outputs": H * P * io,
            "params": 3 * H * _F32,
            "entry": (H * P + G * N) * io + 2 * H * _F32,
            "draft_b": G * N * io,
        }

    def mixer_sizes(self, s: Mamba2Shape) -> dict[str, int]:
        """The mixer around the kernel: inner width, conv channels (x, B, C), in_proj outputs (z, xBC, dt), gated-norm group."""
        inner, bc = s.H * s.P, s.G * s.N
        return {"inner": inner, "conv_dim": inner + 2 * bc, "in_proj": 2 * inner + 2 * bc + s.H, "norm_group": inner // s.G}

    def verify_arrivals(self, s: Mamba2Shape) -> int:
        """Arrival counters per sequence that `verify` keeps under drafts."""
        return 0

    def flops(self, s: Mamba2Shape, has_z: bool) -> Mamba2Flops:
        return Mamba2Flops(s, has_z)

    def kernels(self) -> Any:
        """replayssm_kernels.mamba2 (imports torch and triton)."""
        return importlib.import_module("replayssm_kernels.mamba2")

    def kernel_args(self, params: dict[str, Any], inp: dict[str, Any], slots: Any,
                    store: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        """The positional and keyword arguments of decode, replay, verify and their references for one step; `store`
        (a conventional step's state_scale and rounding: how its state is stored) is passed through."""
        args = (inp["x"], inp["dt"], params["A"], inp["B"], inp["C"])
        return args, {"D": params["D"], "z": inp["z"], "dt_bias": params["dt_bias"], "dt_softplus": params["dt_softplus"],
                      "slots": slots, **(store or {})}

    def draw(self, s: Mamba2Shape, randn: Callable[..., Any], lead: tuple[int, ...], neg_a: Any, dt_bias: Any, *,
             dt_softplus: bool, has_z: bool, has_D: bool, io: Any, sets: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A layer's parameters and `sets` input sets of shape lead + (...), drawn through `randn(*size, scale=)`."""
        import torch

        params = {"A": -neg_a, "dt_bias": dt_bias, "dt_softplus": dt_softplus}
        params["D"] = 1.0 + randn(s.H, scale=0.1) if has_D else None
        inputs = []
        for _ in range(sets):
            raw = randn(*lead, s.H, scale=0.5)
            if not dt_softplus:
                # Without softplus in the kernel, dt arrives already positive, as in the models that do that outside.
                raw = torch.nn.functional.softplus(raw + dt_bias)
            inputs.append({
                "x": randn(*lead, s.H, s.P).to(io),
                "dt": raw.to(io),
                "B": randn(*lead, s.G, s.N).to(io),
                "C": randn(*lead, s.G, s.N).to(io),
                "z": randn(*lead, s.H, s.P).to(io) if has_z else None,
            })
        return params, inputs

    # The mixer's output norm in the model: "group", an RMS norm over groups of the z-gated output (Mamba-2's gated
    # norm), or "head", an RMS norm over each head's output, then the gate (GDN).
    output_norm = "group"

    def tp_norm_spans_ranks(self, full: Mamba2Shape, has_z: bool, tp: int) -> bool:
        """Whether the gated norm's one group spans the ranks: one Mamba-2 group split over them, whose sum of squares
        vLLM all-reduces."""
        return tp > 1 and not has_z and full.G == 1

    def tp_segments(self, s: Mamba2Shape, tp: int) -> dict[str, list[tuple[int, Any]]]:
        """The segments (full size, rule) of the mixer's in_proj outputs, conv channels, per-head vectors and inner
        features over tp ranks (replayssm_cli.measure.tensor_parallel's rules)."""
        inner, bc = s.H * s.P, s.G * s.N
        # Groups split like heads; a single group goes whole to every rank (presets.with_tp refuses other splits).
        group = "split" if s.G % tp == 0 else "whole"
        conv = [(inner, "split"), (bc, group), (bc, group)]
        proj = ([(inner, "split")] + conv if self.z_first else conv + [(inner, "split")]) + [(s.H, "split")]
        return {"in_proj": proj, "conv": conv, "heads": [(s.H, "split")], "inner": [(inner, "split")]}

    def reference_mixer(self, s: Mamba2Shape, state: Any, xbc: Any, rest: Any, z: Any, w: dict[str, Any], *,
                        has_z: bool, dt_softplus: bool) -> Any:
        """One decode step of the plain-PyTorch reference from the conv's output `xbc` and in_proj's `rest` (dt):
        the (batch, inner) output before the norm, the state updated in place."""
        import torch

        from replayssm_kernels.mamba2.reference import decode_ref

        batch, inner, bc = xbc.shape[0], s.H * s.P, s.G * s.N
        x, B, C = xbc[:, :inner], xbc[:, inner:inner + bc], xbc[:, inner + bc:]
        return decode_ref(state, x.reshape(batch, s.H, s.P), rest, -torch.exp(w["A_log"]), B.reshape(batch, s.G, s.N),
                          C.reshape(batch, s.G, s.N), D=w["D"], z=z.reshape(batch, s.H, s.P) if has_z else None,
                          dt_bias=w["dt_bias"], dt_softplus=dt_softplus).reshape(batch, inner)


class GDN:
    """Gated DeltaNet: state (HV, V, K) per sequence; inputs q, k (H key heads), v, g, beta (HV value heads)."""

    name = "gdn"
    title = "Gated DeltaNet"
    shape_type = GDNShape
    dims = ("H", "HV", "K", "V")
    # exp(A_log) drawn over this range where a preset gives none.
    a_log_range = (0.0, 16.0)
    a_label = "exp(A_log)"
    has_D = False
    token_input = "q"
    head_input = "v"
    split_flush_reads_copy = True
    z_first = False
    family = "qwen3-next"
    # One per lane of a warp, for the replay's LANE_COUNT (kernels/gdn/cache.py ARRIVE_LANES).
    arrive_lanes = 32
    # u and k: fp32 (the cache's default) or a 2-byte state's own dtype (kernels/gdn/cache.py BUFFER_DTYPES).
    buffer_dtypes = ("fp32", "bf16", "fp16")
    paired_bits = False

    toml_keys = ("key_heads", "value_heads", "key_dim", "value_dim")

    def shape(self, **dims: int) -> GDNShape:
        return GDNShape(**{k: int(dims[k]) for k in self.dims})

    def tp_split(self, full: GDNShape, tp: int) -> tuple[list[str], GDNShape | None]:
        bad = [f"{n}={v}" for n, v in (("H", full.H), ("HV", full.HV)) if v % tp]
        return bad, None if bad else GDNShape(H=full.H // tp, HV=full.HV // tp, K=full.K, V=full.V)

    def head_mismatch(self, s: GDNShape) -> str | None:
        return f"value heads HV={s.HV} are not a multiple of key heads H={s.H}" if s.HV % s.H else None

    def state_heads(self, s: GDNShape) -> int:
        return s.HV

    def rounding_problem(self, s: GDNShape) -> str | None:
        """None: GDN's stores hash each element, so any shape rounds stochastically."""
        return None

    def head_width(self, s: GDNShape) -> int:
        return s.V

    def state_shape(self, s: GDNShape) -> tuple[int, int, int]:
        return (s.HV, s.V, s.K)

    def cache_dims(self, s: GDNShape) -> tuple[int, int, int, int]:
        return (s.H, s.HV, s.K, s.V)

    def input_elems(self, s: GDNShape) -> int:
        """Elements of one token's inputs and output (q, k, v, g, beta, o) for one sequence."""
        return 2 * s.H * s.K + s.HV * s.V + 2 * s.HV

    def quality_elems_per_head(self, s: GDNShape) -> int:
        """Elements of one token's inputs per head in the quality harness (q, k, v, g, beta)."""
        return 2 * s.K + s.V + 2

    def step_sizes(self, s: GDNShape, io: int, has_z: bool, buffer: int = _F32) -> dict[str, int]:
        H, HV, K, V = s.H, s.HV, s.K, s.V
        return {
            "rows": HV * V, "heads": HV,
            "inputs": (2 * H * K + HV * V + 2 * HV) * io,
            "outputs": HV * V * io,
            "params": 0,
            # u and k in the cache's buffer dtype, G in fp32
            "entry": (HV * V + H * K) * buffer + HV * _F32,
            "draft_b": 0,
        }

    def mixer_sizes(self, s: GDNShape) -> dict[str, int]:
        """The mixer around the kernel: inner width, conv channels (q, k, v), in_proj outputs (qkv, z, a, b), gated-norm group."""
        inner = s.HV * s.V
        conv_dim = 2 * s.H * s.K + inner
        return {"inner": inner, "conv_dim": conv_dim, "in_proj": conv_dim + inner + 2 * s.HV, "norm_group": s.V}

    def verify_arrivals(self, s: GDNShape) -> int:
        """One per key head."""
        return s.H

    def flops(self, s: GDNShape, has_z: bool) -> GDNFlops:
        return GDNFlops(s)

    def kernels(self) -> Any:
        """replayssm_kernels.gdn (imports torch and triton)."""
        return importlib.import_module("replayssm_kernels.gdn")

    def kernel_args(self, params: dict[str, Any], inp: dict[str, Any], slots: Any,
                    store: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any]]:
        # As Qwen3.5 runs it: the kernel L2-normalises q and k (unit-norm keys), q scaled by K^-1/2.
        return (inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"]), {"use_qk_l2norm_in_kernel": True, "slots": slots,
                                                                       **(store or {})}

    def draw(self, s: GDNShape, randn: Callable[..., Any], lead: tuple[int, ...], neg_a: Any, dt_bias: Any, *,
             dt_softplus: bool, has_z: bool, has_D: bool, io: Any, sets: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        import torch

        inputs = []
        for _ in range(sets):
            delta = torch.nn.functional.softplus(randn(*lead, s.HV, scale=0.5) + dt_bias)
            inputs.append({
                "q": randn(*lead, s.H, s.K).to(io),
                "k": randn(*lead, s.H, s.K).to(io),
                "v": randn(*lead, s.HV, s.V).to(io),
                "g": (-neg_a * delta).to(io),
                "beta": torch.sigmoid(randn(*lead, s.HV)).to(io),
            })
        return {}, inputs

    output_norm = "head"

    def tp_norm_spans_ranks(self, full: GDNShape, has_z: bool, tp: int) -> bool:
        """GDN's norm is per head, and heads stay whole on a rank."""
        return False

    def tp_segments(self, s: GDNShape, tp: int) -> dict[str, list[tuple[int, Any]]]:
        qk, inner = s.H * s.K, s.HV * s.V
        conv = [(qk, "split"), (qk, "split"), (inner, "split")]
        return {"in_proj": conv + [(inner, "split"), (s.HV, "split"), (s.HV, "split")], "conv": conv,
                "heads": [(s.HV, "split")], "inner": [(inner, "split")]}

    def reference_mixer(self, s: GDNShape, state: Any, xbc: Any, rest: Any, z: Any, w: dict[str, Any], *,
                        has_z: bool, dt_softplus: bool) -> Any:
        """One decode step of the plain-PyTorch reference from the conv's output (q, k, v) and in_proj's `rest`
        (a, b): the (batch, inner) output before the norm, the state updated in place."""
        import torch
        import torch.nn.functional as F

        from replayssm_kernels.gdn.reference import decode_ref

        batch, qk = xbc.shape[0], s.H * s.K
        q, k, v = xbc[:, :qk], xbc[:, qk:2 * qk], xbc[:, 2 * qk:]
        a, b = rest[:, :s.HV], rest[:, s.HV:]
        g = -torch.exp(w["A_log"]) * F.softplus(a + w["dt_bias"])
        o = decode_ref(state, q.reshape(batch, s.H, s.K), k.reshape(batch, s.H, s.K), v.reshape(batch, s.HV, s.V), g,
                       torch.sigmoid(b), use_qk_l2norm_in_kernel=True)
        return o.reshape(batch, s.HV * s.V)


MAMBA2 = Mamba2()
GDN_OP = GDN()
OPS = {MAMBA2.name: MAMBA2, GDN_OP.name: GDN_OP}
Op = Mamba2 | GDN


def named(op: str) -> Op:
    """The adapter of an op name ("mamba2" or "gdn"); ValueError naming the choices otherwise."""
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}") from None


def of(shape: SSMShape | Any) -> Op:
    """The adapter of a shape (anything with an `op` name: a shape, a preset's kind via `named`)."""
    return named(getattr(shape, "op", None))
