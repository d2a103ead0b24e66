"""Long-decode output error of every state precision against an fp64 reference, by generation length."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from replayssm_cli.errors import UserError
from replayssm_cli.model import ops
from replayssm_cli.model.shapes import SSMShape

# (label, first generated token, last generated token or None), 1-based.
BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1-128", 1, 128),
    ("129-1k", 129, 1024),
    ("1k-4k", 1025, 4096),
    ("4k+", 4097, None),
)
DEFAULT_STEPS = 4096
# A prompt long enough that the slowest heads start decode near their steady state.
DEFAULT_PROMPT = 1024
DEFAULT_HEADS = 4
IO_DTYPE = "bf16"
FP8_MAX = 448.0
INT8_MAX = 127.0
# Trained Mamba-2 and GDN layers keep softplus(dt + dt_bias) in the initialisation range [1e-3, 1e-1].
DT_RANGE = (1e-3, 1e-1)
DT_NOISE = 0.5
# exp(A_log) of GDN starts at U(0, 16); a head with A -> 0 never decays, so the draw starts here.
MIN_A = 0.01

VARIANTS = ("conventional", "replay", "split")
STATE_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
# Stochastic rounding's bits in the harness come from torch's generator, one stream per config from this seed: the
# kernels' Philox stream is reproduced by their own tests; here what matters is its statistics over a long decode.
ROUNDING_SEED = 0


@dataclass(frozen=True)
class Config:
    """How one run stores and reads state: conventional, replay (checkpoint in state_dtype) or split; each stored
    16-bit or 8-bit state rounded to nearest or stochastically."""

    variant: str
    state_dtype: str = "fp32"
    window: int | None = None
    read_dtype: str | None = None
    rounding: str = "nearest"

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"quality variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"state dtype must be one of {', '.join(STATE_DTYPES)}, got {self.state_dtype!r}")
        if self.rounding not in ("nearest", "stochastic"):
            raise ValueError(f"rounding must be nearest or stochastic, got {self.rounding!r}")
        if self.rounding == "stochastic" and self.state_dtype == "fp32":
            raise ValueError("stochastic rounding applies to a 16-bit or 8-bit state; an fp32 state is stored exactly")
        if self.variant == "conventional":
            if self.window is not None or self.read_dtype is not None:
                raise ValueError("a conventional config takes no window and no read dtype")
            return
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"a {self.variant} config needs a window of at least 1, got {self.window!r}")
        if self.variant == "split":
            if self.state_dtype != "fp32" or self.read_dtype not in ("bf16", "fp16", "fp8"):
                raise ValueError("a split config needs an fp32 checkpoint and a bf16, fp16 or fp8 read copy")
        elif self.read_dtype is not None:
            raise ValueError("a replay config takes no read dtype (that is the split variant)")

    def label(self) -> str:
        sr = " SR" if self.rounding == "stochastic" else ""
        if self.variant == "conventional":
            return f"conventional {self.state_dtype}{sr}"
        if self.variant == "replay":
            return f"replay W{self.window} {self.state_dtype}{sr}"
        return f"split W{self.window} fp32+{self.read_dtype}"

    def key(self) -> tuple[str, str, int | None, str | None, str]:
        return (self.variant, self.state_dtype, self.window, self.read_dtype, self.rounding)


def configs_for(windows: Sequence[int], state_dtypes: Sequence[str], read_dtypes: Sequence[str],
                roundings: Sequence[str] = ("nearest",)) -> list[Config]:
    """Every conventional, replay and split config over these windows and dtypes, each 16-bit or 8-bit state at each
    rounding."""
    stored = [(s, r) for s in state_dtypes for r in roundings if s != "fp32" or r == "nearest"]
    out = [Config("conventional", s, rounding=r) for s, r in stored]
    out += [Config("replay", s, w, rounding=r) for w in windows for s, r in stored]
    out += [Config("split", "fp32", w, r) for w in windows for r in read_dtypes]
    return out


@dataclass
class Inputs:
    """Per-step inputs of `heads` heads of one layer (prompt first), as float32 values the kernels receive.

    Mamba-2: x (T, H, P), dt (T, H) raw, B and C (T, H, N) (each head's group row), A, D, dt_bias (H,).
    GDN: q and k (T, H, K) L2-normalised (each value head's key head), v (T, H, V), g and beta (T, H).
    """

    op: str
    tensors: dict[str, Any]
    prompt: int
    source: str
    dt_softplus: bool = True
    scale: float = 1.0

    @property
    def steps(self) -> int:
        return int(self.tensors[ops.named(self.op).token_input].shape[0])

    @property
    def generated(self) -> int:
        return self.steps - self.prompt

    @property
    def heads(self) -> int:
        return int(self.tensors[ops.named(self.op).head_input].shape[1])

    def dims(self) -> dict[str, int]:
        return {"H": self.heads, **_harness(self.op).dims(self.tensors)}


def bytes_per_token(shape: SSMShape, heads: int, configs: int, windows: int = 0) -> int:
    """Memory a quality run holds per token (prompt or generated): the inputs of `heads` heads in fp32 and their
    fp32 and fp64 working copies, each config's squared error, the fp64 outputs and each window's buffer terms."""
    per_head = ops.of(shape).quality_elems_per_head(shape)
    out = getattr(shape, _harness(shape.op).out_key)
    return 3 * 8 * heads * per_head + 8 * (configs + 1) + heads * out * (8 + 4 * windows)


def memory_here() -> int | None:
    """Bytes of physical memory on this machine, where the OS says."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def check_size(p, trace, cands, steps: int, heads: int) -> None:
    """Refuse, before any work, a quality run of preset `p` (or of a recorded trace) for the candidates' stored
    precisions with more heads than a layer has or more tokens than fit in memory."""
    shape = trace.shape if trace is not None else p.shape
    layer_heads = ops.of(shape).state_heads(shape)
    if heads > layer_heads:
        where = "the trace's layer" if trace is not None else f"a layer of {p.name}" + (f" at tp {p.tp}" if p.tp != 1 else "")
        raise UserError(f"--heads {heads} is more than the {layer_heads} heads of {where}", f"pass --heads 1 to {layer_heads}")
    configs = {c.quality_key() for c in cands}
    per_token = bytes_per_token(shape, heads, len(configs), len({k[2] for k in configs if k[2] is not None}))
    have = memory_here()
    tokens = DEFAULT_PROMPT + steps
    if have and tokens * per_token > have // 2:
        fit = max(have // 2 // per_token - DEFAULT_PROMPT, 0)
        raise UserError(
            f"--steps {steps:,} needs about {tokens * per_token / 2**30:,.0f} GiB for the quality run, over half of the "
            f"{have / 2**30:.0f} GiB here",
            f"at most --steps {fit:,} fit with --heads {heads} (the default 4,096 is what the error buckets need)",
        )


def _check_run(steps: int, prompt: int, heads: int) -> None:
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if prompt < 0:
        raise ValueError(f"prompt must be 0 or more, got {prompt}")
    if heads < 1:
        raise ValueError(f"heads must be at least 1, got {heads}")


def synthetic_inputs(
    shape: SSMShape,
    *,
    a_range: tuple[float, float] = (1.0, 16.0),
    dt_softplus: bool = True,
    steps: int = DEFAULT_STEPS,
    prompt: int = DEFAULT_PROMPT,
    heads: int = DEFAULT_HEADS,
    seed: int = 0,
    io_dtype: str = IO_DTYPE,
) -> Inputs:
    """Inputs drawn like a real model's for `heads` heads of one layer of `shape`, `prompt` + `steps` tokens.

    Decay rates -A = exp(A_log) are spread geometrically over `a_range` (the preset's A range) and paired
    with softplus(dt_bias) spread over [1e-3, 1e-1], slowest with slowest, so the subset holds both the
    heads that forget within a token and those that remember thousands of tokens; dt_t ~ N(0, 0.5^2)
    around the bias. Mamba-2: x, B, C ~ N(0, 1), D = 1, all heads in one group (sharing B and C).
    GDN: one key head for the value heads, q and k unit-norm, v ~ N(0, 1), beta = sigmoid(N(0, 1)),
    g = -A softplus(a_t + dt_bias). Activations are rounded to `io_dtype` as they would arrive.
    """
    import torch

    from replayssm_cli.model.dtypes import torch_dtype

    _check_run(steps, prompt, heads)
    lo, hi = float(a_range[0]), float(a_range[1])
    if not 0 <= lo <= hi or hi <= 0:
        raise ValueError(f"A range must satisfy 0 <= low <= high and high > 0, got {a_range}")
    gen = torch.Generator().manual_seed(seed)
    T = prompt + steps
    io = torch_dtype(io_dtype)

    def normal(*size):
        return torch.randn(*size, generator=gen, dtype=torch.float32).to(io).float()

    a = torch.exp(torch.linspace(math.log(max(lo, MIN_A)), math.log(max(hi, MIN_A)), heads, dtype=torch.float64))
    dt_target = torch.exp(torch.linspace(math.log(DT_RANGE[0]), math.log(DT_RANGE[1]), heads, dtype=torch.float64))
    dt_bias = (dt_target + torch.log(-torch.expm1(-dt_target))).float()
    try:
        draw = _harness(shape.op).synthetic
    except ValueError:
        raise ValueError(f"shape must be a Mamba2Shape or a GDNShape, got {shape!r}") from None
    return draw(shape, T, heads, normal, gen, a, dt_target, dt_bias, io, dt_softplus=dt_softplus, prompt=prompt, seed=seed)


def _mamba2_synthetic(shape, T, heads, normal, gen, a, dt_target, dt_bias, io, *, dt_softplus, prompt, seed) -> Inputs:
    import torch

    P, N = shape.P, shape.N
    if dt_softplus:
        dt = (DT_NOISE * torch.randn(T, heads, generator=gen)).to(io).float()
    else:
        dt = (dt_target.float() * torch.exp(DT_NOISE * torch.randn(T, heads, generator=gen))).to(io).float()
        dt_bias = torch.zeros(heads)
    B, C = normal(T, 1, N), normal(T, 1, N)
    tensors = {
        "x": normal(T, heads, P),
        "dt": dt,
        "B": B.expand(T, heads, N).contiguous(),
        "C": C.expand(T, heads, N).contiguous(),
        "A": -a.float(),
        "D": torch.ones(heads),
        "dt_bias": dt_bias,
    }
    return Inputs("mamba2", tensors, prompt, f"synthetic (seed {seed})", dt_softplus)


def _gdn_synthetic(shape, T, heads, normal, gen, a, dt_target, dt_bias, io, *, dt_softplus, prompt, seed) -> Inputs:
    import torch

    K, V = shape.K, shape.V
    q, k = _l2norm(normal(T, 1, K)), _l2norm(normal(T, 1, K))
    a_in = normal(T, heads)
    g = -a.float() * torch.nn.functional.softplus(a_in + dt_bias)
    tensors = {
        "q": q.expand(T, heads, K).contiguous(),
        "k": k.expand(T, heads, K).contiguous(),
        "v": normal(T, heads, V),
        "g": g,
        "beta": torch.sigmoid(normal(T, heads)),
    }
    return Inputs("gdn", tensors, prompt, f"synthetic (seed {seed})", True, K**-0.5)


def _l2norm(x):
    import torch

    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def trace_inputs(trace, *, heads: int = DEFAULT_HEADS, steps: int | None = None) -> Inputs:
    """Inputs from a recorded trace (replayssm_cli.measure.trace.Trace): its first `heads` heads, `steps` generated tokens."""
    import torch

    _check_run(steps if steps is not None else 1, trace.prompt_tokens, heads)
    end = trace.steps if steps is None else min(trace.steps, trace.prompt_tokens + steps)
    a = {k: torch.from_numpy(v) for k, v in trace.arrays.items()}
    inputs = _harness(trace.op).from_trace(trace, a, end, heads)
    inputs.tensors = {k: v.float().contiguous() for k, v in inputs.tensors.items()}
    return inputs


def _mamba2_from_trace(trace, a, end: int, heads: int) -> Inputs:
    import torch

    shape = trace.shape
    n = min(heads, shape.H)
    group = torch.arange(n) // (shape.H // shape.G)
    tensors = {
        "x": a["x"][:end, :n],
        "dt": a["dt"][:end, :n],
        "B": a["B"][:end, group],
        "C": a["C"][:end, group],
        "A": a["A"][:n],
        "D": a["D"][:n],
        "dt_bias": a["dt_bias"][:n],
    }
    return Inputs("mamba2", tensors, trace.prompt_tokens, f"trace {trace.model or 'unnamed'} layer {trace.layer}", trace.dt_softplus)


def _gdn_from_trace(trace, a, end: int, heads: int) -> Inputs:
    import torch

    shape = trace.shape
    n = min(heads, shape.HV)
    key_head = torch.arange(n) // (shape.HV // shape.H)
    tensors = {
        "q": _l2norm(a["q"][:end, key_head]),
        "k": _l2norm(a["k"][:end, key_head]),
        "v": a["v"][:end, :n],
        "g": a["g"][:end, :n],
        "beta": a["beta"][:end, :n],
    }
    scale = trace.scale if trace.scale is not None else shape.K**-0.5
    return Inputs("gdn", tensors, trace.prompt_tokens, f"trace {trace.model or 'unnamed'} layer {trace.layer}", True, scale)


@dataclass
class ConfigErrors:
    """One config's relative output error per generation-length bucket.

    `buckets`: sqrt(sum |y - y64|^2 / sum |y64|^2) over the bucket's tokens; `worst`: the largest
    per-token |y - y64| / |y64|; `kernel`: the same as `buckets` from the GPU kernels, when they ran.
    """

    config: Config
    buckets: dict[str, float]
    worst: dict[str, float]
    kernel: dict[str, float] | None = None

    @property
    def longest_bucket(self) -> str:
        return list(self.buckets)[-1]

    @property
    def longest(self) -> float:
        """Error in the longest bucket, the larger of reference and kernel where both ran."""
        label = self.longest_bucket
        values = [self.buckets[label]]
        if self.kernel and label in self.kernel:
            values.append(self.kernel[label])
        return max(values)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "config": c.label(),
            "variant": c.variant,
            "state_dtype": c.state_dtype,
            "window": c.window,
            "read_dtype": c.read_dtype,
            "rounding": c.rounding,
            "buckets": self.buckets,
            "worst_token": self.worst,
            "kernel": self.kernel,
            "longest": self.longest,
        }


@dataclass
class Report:
    """The quality run: what was run, on which inputs, and each config's errors."""

    op: str
    dims: dict[str, int]
    prompt: int
    steps: int
    source: str
    errors: list[ConfigErrors] = field(default_factory=list)
    kernel_device: str | None = None
    outputs: dict[Config, Any] | None = None

    def get(self, config: Config) -> ConfigErrors | None:
        for e in self.errors:
            if e.config == config:
                return e
        return None

    def error_of(self, key: tuple) -> float | None:
        """The longest-bucket error of the config with this key (Config.key()), or None."""
        for e in self.errors:
            if e.config.key() == tuple(key):
                return e.longest
        return None

    @property
    def bucket_labels(self) -> list[str]:
        return list(self.errors[0].buckets) if self.errors else []

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "dims": self.dims,
            "prompt_tokens": self.prompt,
            "generated_tokens": self.steps,
            "source": self.source,
            "kernel_device": self.kernel_device,
            "metric": "relative L2 error of the layer output against fp64, per generation-length bucket",
            "configs": [e.to_dict() for e in self.errors],
        }


def _bucket_slices(steps: int) -> list[tuple[str, int, int]]:
    out = []
    for label, first, last in BUCKETS:
        if first > steps:
            break
        out.append((label, first - 1, steps if last is None else min(last, steps)))
    return out


def _summarise(err2, ref2) -> tuple[dict[str, float], dict[str, float]]:
    buckets, worst = {}, {}
    for label, a, b in _bucket_slices(len(ref2)):
        e, r = err2[a:b], ref2[a:b]
        buckets[label] = float(math.sqrt(e.sum() / max(r.sum(), 1e-300)))
        worst[label] = float((e / r.clamp_min(1e-300)).sqrt().max())
    return buckets, worst


def _stored(S, dtype: str):
    """S (fp32) as a state stored in `dtype` (fp32, bf16 or fp16) to nearest, read back as fp32."""
    import torch

    if dtype == "fp32":
        return S.clone()
    return S.to({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]).float()


class _Rounder:
    """How each config stores a state: its dtype and rounding (the kernels' references: rounded_reference and
    quantized_rows_reference over each row, the last axis), stochastic bits from one generator per config."""

    def __init__(self, configs: Sequence[Config]):
        import torch

        self.gens = {c: torch.Generator().manual_seed(ROUNDING_SEED + i) for i, c in enumerate(configs)
                     if c.rounding == "stochastic"}

    def stored(self, S, c: Config):
        """S (fp32) as config c stores its state, read back as fp32."""
        if c.rounding == "nearest":
            return _read_copy(S, c.state_dtype) if c.state_dtype in ("fp8", "int8") else _stored(S, c.state_dtype)
        import torch

        from replayssm_cli.model.dtypes import EIGHT_BIT, torch_dtype
        from replayssm_kernels import rounding

        bits = None
        if c.rounding == "stochastic":
            bits = torch.randint(0, 2**16, S.shape, generator=self.gens[c], dtype=torch.int64)
        dtype = torch_dtype(c.state_dtype)
        if c.state_dtype in EIGHT_BIT:
            return rounding.dequantized_rows(*rounding.quantized_rows_reference(S, bits, dtype))
        return rounding.rounded_reference(S, bits, dtype)

    def store_(self, S, c: Config) -> None:
        """Round S (fp32, a view of a larger state is fine) in place as config c stores it."""
        if c.state_dtype == "fp32":
            return
        if c.rounding == "nearest" and c.state_dtype in ("bf16", "fp16"):
            from replayssm_cli.model.dtypes import torch_dtype

            S.copy_(S.to(torch_dtype(c.state_dtype)))
        else:
            S.copy_(self.stored(S, c))

    def each(self, S, configs: list[Config]):
        """Round slice i of S in place as configs[i] stores it; returns S."""
        for i, c in enumerate(configs):
            self.store_(S[i], c)
        return S


def _read_copy(S, dtype: str | None):
    """The read copy of checkpoint S as the split kernel sees it: bf16/fp16, or fp8 e4m3 with a scale per row; and an
    8-bit checkpoint (fp8, or int8 rounded half away from zero) as stored to nearest, each row over its scale."""
    import torch

    if dtype is None:
        return S.clone()
    if dtype in ("fp8", "int8"):
        qmax = FP8_MAX if dtype == "fp8" else INT8_MAX
        scale = S.abs().amax(-1, keepdim=True).clamp_min(1e-30) / qmax
        q = S / scale
        if dtype == "fp8":
            return _fp8_nearest(q) * scale
        return torch.copysign(torch.floor(q.abs() + 0.5).clamp_max(qmax), q) * scale
    return _stored(S, dtype)


def _fp8_nearest(q):
    """fp32 values |q| <= 448 rounded to the nearest fp8 e4m3 value (ties to even), as fp32: equal to
    q.to(torch.float8_e4m3fn).float() and several times faster on the CPU.

    Adding and subtracting M = ±2^(e+20), e the exponent of q (at least -6, fp8's smallest normal), leaves q rounded
    by the fp32 adder to a multiple of 2^(e-3): three mantissa bits, or fp8's subnormal step 2^-9 below 2^-6.
    """
    import torch

    raw = q.view(torch.int32)
    magic = (((raw & 0x7F800000).clamp_min(121 << 23) + (20 << 23)) | (raw & -0x80000000)).view(torch.float32)
    return (q + magic) - magic


class _Windows:
    """Fill counters and cumulative log decays Λ of each distinct window, kept in ring-slot order.

    Generated token g sits in slot g % Wmax; every per-entry tensor here is indexed by slot, so the
    per-config buffers are used in place, never gathered.
    """

    def __init__(self, windows: list[int], heads: int):
        import torch

        self.sizes = torch.tensor(windows)
        self.wmax = max(windows)
        self.fill = torch.zeros(len(windows), dtype=torch.long)
        self.lam = torch.zeros(len(windows), heads)
        self.ring = torch.zeros(len(windows), self.wmax, heads)
        self.slots = torch.arange(self.wmax)

    def age(self, g: int):
        """How many tokens before g each slot's entry was appended: (Wmax,)."""
        return (g - self.slots) % self.wmax

    def token(self, g: int, first: int):
        """The input index of each slot's entry (entries older than the decode clamp to `first`)."""
        return (first + g - self.age(g)).clamp_min(first)

    def append(self, g: int, log_decay) -> None:
        self.fill += 1
        self.lam += log_decay
        self.ring[:, g % self.wmax] = self.lam

    def weights(self, g: int, *, before: bool = False):
        """exp(Λ_now - Λ_j) per slot j, zero outside each window's buffer: (nW, Wmax, H).

        With `before`, as seen just before token g is appended: from Λ_{g-1}, over the entries before g.
        """
        import torch

        age = self.age(g)
        lam = self.lam
        if before:
            valid = (age[None, :] >= 1) & (age[None, :] <= self.fill[:, None])
        else:
            valid = age[None, :] < self.fill[:, None]
        diff = torch.where(valid[:, :, None], lam[:, None, :] - self.ring, -math.inf)
        return torch.exp(diff)

    def flushing(self) -> list[int]:
        return (self.fill == self.sizes).nonzero().flatten().tolist()

    def reset(self, i: int) -> None:
        self.fill[i] = 0
        self.lam[i] = 0


@contextmanager
def _one_thread():
    """Run the step loop on one CPU thread: its tensors are small, and idle threads spin on a busy machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _mv(S, *vectors):
    """S (..., H, R, C) times per-head vectors (H, C): (..., H, R), or (..., H, R, m) for m vectors."""
    import torch

    # A broadcast multiply and sum runs these many small products several times faster than a batched matmul.
    if len(vectors) == 1:
        return (S * vectors[0][:, None, :]).sum(-1)
    return torch.stack([(S * v[:, None, :]).sum(-1) for v in vectors], -1)


def run(
    inputs: Inputs,
    configs: Sequence[Config],
    *,
    on_step: Callable[[int], None] | None = None,
    keep_outputs: bool = False,
) -> Report:
    """Run every config over the inputs' generated tokens and measure its output error against fp64.

    The prompt tokens run once in fp64 (standing in for prefill, which writes the state once); each
    config then starts from that state stored in its own precision and decodes every generated token
    with the semantics of the kernels: conventional rounds the state on every store; replay rounds the
    checkpoint at each flush and computes outputs from checkpoint plus buffer in fp32; split keeps an
    fp32 checkpoint and reads a bf16/fp16/fp8 copy of it on non-flush steps (GDN's flush first corrects
    the buffered updates to what the full checkpoint gives, as the kernels do). Errors are taken on the
    fp32 layer output (before the cast to the io dtype, which every variant shares). With keep_outputs,
    report.outputs maps each config to its outputs (G, H, P) or (G, HV, V).
    """
    import torch

    configs = list(configs)
    if not configs:
        raise ValueError("no quality configs to run")
    if len(set(configs)) != len(configs):
        raise ValueError("quality configs must be distinct")
    if inputs.generated < 1:
        raise ValueError("the inputs hold no generated token after the prompt")
    report = Report(inputs.op, inputs.dims(), inputs.prompt, inputs.generated, inputs.source)
    with torch.no_grad(), _one_thread():
        err2, ref2, ys = _harness(inputs.op).run(inputs, configs, on_step, keep_outputs)
        for i, c in enumerate(configs):
            buckets, worst = _summarise(err2[i], ref2)
            report.errors.append(ConfigErrors(c, buckets, worst))
    if keep_outputs:
        report.outputs = {c: ys[i] for i, c in enumerate(configs)}
    return report


def _out_dims(inputs: Inputs) -> tuple[int, int]:
    d = inputs.dims()
    return (d["H"], d[_harness(inputs.op).out_key])


def _split_configs(configs: list[Config]):
    conv = [c for c in configs if c.variant == "conventional"]
    rep = [c for c in configs if c.variant != "conventional"]
    windows = sorted({c.window for c in rep})
    return conv, rep, windows


def _start_states(S64, configs: list[Config], heads: int, rnd: _Rounder):
    """Each config's state after the prompt as it stores it: the conventional configs' states stacked, the replay
    configs' checkpoints and read copies, their windows' buffers and each config's window index; with the configs
    split (conv, rep, windows) and in the order the errors come out."""
    import torch

    conv, rep, windows = _split_configs(configs)
    Sc = torch.stack([rnd.stored(S64.float(), c) for c in conv]) if conv else None
    S0 = [rnd.stored(S64.float(), c) for c in rep]
    Rd = torch.stack([_read_copy(s, c.read_dtype) for s, c in zip(S0, rep)]) if rep else None
    win = _Windows(windows, heads) if rep else None
    cfg_w = torch.tensor([windows.index(c.window) for c in rep], dtype=torch.long)
    return conv, rep, windows, conv + rep, Sc, S0, Rd, win, cfg_w


def _mamba2_params(inputs: Inputs, dtype):
    import torch.nn.functional as F

    t = {k: v.to(dtype) for k, v in inputs.tensors.items()}
    delta = F.softplus(t["dt"] + t["dt_bias"]) if inputs.dt_softplus else t["dt"]
    return t["x"], t["B"], t["C"], t["D"], delta, t["A"] * delta


def _mamba2_update(S, log_a, delta, x, B):
    import torch

    return torch.exp(log_a)[:, None, None] * S + (delta[:, None] * x)[:, :, None] * B[:, None, :]


def _record_step(y, y64, g: int, err2, kept, on_step) -> None:
    """Step g's squared error of every config's outputs `y` against the fp64 outputs, the outputs themselves when
    kept, and the progress callback."""
    err2[:, g] = ((y - y64) ** 2).sum((1, 2))
    if kept is not None:
        kept[:, g] = y
    if on_step is not None:
        on_step(g + 1)


def _run_mamba2(inputs: Inputs, configs: list[Config], on_step, keep: bool):
    """The fp64 run first, then token by token the conventional configs; the configs of each window advance a
    window at a time (the outputs between flushes are one matrix product, the flush one state update)."""
    import torch

    x, B, C, D, delta, log_a = _mamba2_params(inputs, torch.float32)
    H = x.shape[1]
    S64 = _prompt_state(inputs)
    rnd = _Rounder(configs)
    conv, rep, windows, order, Sc, S0, _, _, cfg_w = _start_states(S64, configs, H, rnd)
    y64, ref2 = _mamba2_reference_run(inputs, S64)

    G, p0 = inputs.generated, inputs.prompt
    err2 = torch.zeros(len(order), G, dtype=torch.float64)
    kept = torch.empty(len(order), G, *_out_dims(inputs)) if keep else None
    gen = {"x": x[p0:], "B": B[p0:], "C": C[p0:], "delta": delta[p0:], "log_a": log_a[p0:],
           "skip": D[:, None] * x[p0:], "y64": y64}
    groups = [_Mamba2Window(size, max(windows), [(rep[i], S0[i], len(conv) + i) for i in range(len(rep)) if cfg_w[i] == w],
                            gen, rnd) for w, size in enumerate(windows)]
    decay, dx = torch.exp(gen["log_a"]), gen["delta"][:, :, None] * gen["x"]
    for g in range(G):
        if conv:
            Sc.mul_(decay[g][:, None, None]).add_(dx[g][:, :, None] * gen["B"][g][:, None, :])
            y = _mv(Sc, gen["C"][g]) + gen["skip"][g]
            err2[: len(conv), g] = ((y.double() - y64[g]) ** 2).sum((1, 2))
            if kept is not None:
                kept[: len(conv), g] = y
            rnd.each(Sc, conv)
        for grp in groups:
            if g - grp.start + 1 == grp.size or g == G - 1:
                grp.advance(g, err2, kept)
        if on_step is not None:
            on_step(g + 1)
    return _reorder(err2, order, configs), ref2, _reorder(kept, order, configs) if keep else None


def _mamba2_reference_run(inputs: Inputs, S64):
    """The fp64 outputs of the generated tokens (G, H, P) from the prompt state and their squared norms (G,)."""
    import torch

    x, B, C, D, delta, log_a = _mamba2_params(inputs, torch.float64)
    p0 = inputs.prompt
    x, B, C, delta, log_a = x[p0:], B[p0:], C[p0:], delta[p0:], log_a[p0:]
    decay, dx, skip = torch.exp(log_a), delta[:, :, None] * x, D[:, None] * x
    y64 = torch.empty_like(x)
    S64 = S64.clone()
    for g in range(inputs.generated):
        S64.mul_(decay[g][:, None, None]).add_(dx[g][:, :, None] * B[g][:, None, :])
        torch.add(_mv(S64, C[g]), skip[g], out=y64[g])
    return y64, (y64 * y64).sum((1, 2))


class _Mamba2Window:
    """The replay and split configs of one window, stepped a window at a time.

    Holds their checkpoints S (H, m, P, N) (replay configs first) and the split configs' read copies (H, m', P, N);
    the window's cumulative log decay Λ at every generated token (G, H); and the buffer's part of every output
    (H, P, G), the same for all configs of the window: entry k adds exp(Λ_i - Λ_k) Δ_k (B_k · C_i) x_k to token
    i's output (docs/design.md §2). Between flushes a config's output is exp(Λ_i) R C_i plus that part; a flush
    folds the buffer into each checkpoint (its ring slots in the kernels' order, token g in slot g % wmax) and
    stores it as the config does.
    """

    def __init__(self, size: int, wmax: int, members: list, gen: dict[str, Any], rnd: _Rounder):
        import torch

        members = sorted(members, key=lambda m: m[0].read_dtype is not None)
        self.size, self.wmax, self.gen, self.rnd, self.start = size, wmax, gen, rnd, 0
        self.configs = [c for c, _, _ in members]
        self.rows = [r for _, _, r in members]
        self.replays = sum(c.read_dtype is None for c in self.configs)
        self.S = torch.stack([s for _, s, _ in members], 1)
        self.reads = torch.stack([_read_copy(s, c.read_dtype) for c, s, _ in members[self.replays:]], 1) \
            if self.replays < len(members) else None
        self.lam, buf = self._buffer_terms(gen)
        self.base = buf + gen["skip"].permute(1, 2, 0)
        self.y64 = gen["y64"].permute(1, 2, 0)

    def _buffer_terms(self, gen: dict[str, Any]):
        import torch

        G, H = gen["log_a"].shape
        w, chunks = self.size, -(-G // self.size)

        def by_window(t):
            padded = torch.zeros(chunks * w, *t.shape[1:], dtype=t.dtype)
            padded[:G] = t
            return padded.view(chunks, w, *t.shape[1:])

        log_a, x, B, C, delta = (by_window(gen[k]) for k in ("log_a", "x", "B", "C", "delta"))
        lam = torch.empty_like(log_a)
        acc = torch.zeros(chunks, H)
        # Added token by token in fp32 from 0 at each flush, as the kernels accumulate Λ.
        for j in range(w):
            acc = acc + log_a[:, j]
            lam[:, j] = acc
        lam_h = lam.transpose(1, 2)
        causal = torch.ones(w, w, dtype=torch.bool).tril()
        decay = torch.exp(torch.where(causal, lam_h[..., :, None] - lam_h[..., None, :], -math.inf))
        coef = decay * torch.einsum("cihn,ckhn->chik", C, B) * delta.transpose(1, 2)[:, :, None, :]
        buf = torch.einsum("chik,ckhp->hpci", coef, x).reshape(H, x.shape[-1], chunks * w)[..., :G]
        return lam.view(-1, H)[:G], buf

    def advance(self, g: int, err2, kept) -> None:
        """Every token of the open window up to g: the outputs of its non-flush tokens, then, if the window is
        full at g, the flush token's output from the folded state and the stored checkpoints."""
        first, flush = self.start, g - self.start + 1 == self.size
        last = g if flush else g + 1
        if last > first:
            self._between(first, last, err2, kept)
        if flush:
            self._flush(g, err2, kept)
        self.start = g + 1

    def _outputs_error(self, y, first: int, last: int, err2, kept) -> None:
        """Record y (H, m, P, L), the outputs of tokens first..last-1."""
        d = y.double() - self.y64[:, None, :, first:last]
        err2[self.rows, first:last] = (d * d).sum((0, 2))
        if kept is not None:
            kept[self.rows, first:last] = y.permute(1, 3, 0, 2)

    def _between(self, first: int, last: int, err2, kept) -> None:
        import torch

        H, m, P, N = self.S.shape
        C = self.gen["C"][first:last].permute(1, 2, 0)
        parts = [torch.matmul(self.S[:, : self.replays].reshape(H, -1, N), C)] if self.replays else []
        if self.reads is not None:
            parts.append(torch.matmul(self.reads.reshape(H, -1, N), C))
        RC = torch.cat(parts, 1).view(H, m, P, last - first)
        lam = self.lam[first:last].T
        y = torch.exp(lam)[:, None, None, :] * RC + self.base[:, None, :, first:last]
        self._outputs_error(y, first, last, err2, kept)

    def _flush(self, g: int, err2, kept) -> None:
        import torch

        gen, age = self.gen, (g - torch.arange(self.wmax)) % self.wmax
        tok = (g - age).clamp_min(0)
        wts = torch.exp(torch.where((age < self.size)[:, None], self.lam[g][None] - self.lam[tok], -math.inf))
        fold = torch.einsum("jh,jhp,jhn->hpn", wts * gen["delta"][tok], gen["x"][tok], gen["B"][tok])
        S = self.S.mul_(torch.exp(self.lam[g])[:, None, None, None]).add_(fold[:, None])
        y = (S * gen["C"][g][:, None, None, :]).sum(-1) + gen["skip"][g][:, None]
        self._outputs_error(y[..., None], g, g + 1, err2, kept)
        for j, c in enumerate(self.configs):
            self.rnd.store_(S[:, j], c)
            if j >= self.replays:
                self.reads[:, j - self.replays] = _read_copy(S[:, j], c.read_dtype)


def _gdn_params(inputs: Inputs, dtype):
    t = {k: v.to(dtype) for k, v in inputs.tensors.items()}
    return t["q"] * inputs.scale, t["k"], t["v"], t["g"], t["beta"]


def _gdn_step(S, q, k, v, g, beta):
    """One conventional Gated DeltaNet step on S (..., H, V, K): (new state, output)."""
    import torch

    alpha = torch.exp(g)
    u = beta[:, None] * (v - alpha[:, None] * _mv(S, k))
    Snew = alpha[:, None, None] * S + u[..., :, None] * k[:, None, :]
    return Snew, _mv(Snew, q)


def _run_gdn(inputs: Inputs, configs: list[Config], on_step, keep: bool):
    import torch

    q, k, v, gl, beta = _gdn_params(inputs, torch.float32)
    q64, k64, v64, g64, beta64 = _gdn_params(inputs, torch.float64)
    H, V = v.shape[1], v.shape[2]
    S64 = _prompt_state(inputs)
    rnd = _Rounder(configs)
    conv, rep, windows, order, Sc, S0, Rd, win, cfg_w = _start_states(S64, configs, H, rnd)
    # The buffer caches the corrected update u_j, so each config keeps its own ring of them.
    u_ring = torch.zeros(len(rep), win.wmax if rep else 1, H, V)

    G = inputs.generated
    err2 = torch.zeros(len(order), G, dtype=torch.float64)
    ref2 = torch.zeros(G, dtype=torch.float64)
    kept = torch.empty(len(order), G, *_out_dims(inputs)) if keep else None
    for g in range(G):
        s = inputs.prompt + g
        S64, y64 = _gdn_step(S64, q64[s], k64[s], v64[s], g64[s], beta64[s])
        ref2[g] = (y64 * y64).sum()
        ys = []
        if conv:
            Snew, y = _gdn_step(Sc, q[s], k[s], v[s], gl[s], beta[s])
            ys.append(y)
            Sc = rnd.each(Snew, conv)
        if rep:
            alpha = torch.exp(gl[s])
            tok = win.token(g, inputs.prompt)
            kk = (k[tok] * k[s]).sum(-1)
            kq = (k[tok] * q[s]).sum(-1)
            w_prev, lam_prev = win.weights(g, before=True), win.lam.clone()
            Rkq = _mv(Rd, k[s], q[s])
            u = _gdn_u(Rkq[..., 0], lam_prev[cfg_w], w_prev[cfg_w], kk, u_ring, v[s], alpha, beta[s])
            u_ring[:, g % win.wmax] = u
            win.append(g, gl[s])
            w_now = win.weights(g)
            y_rep = torch.exp(win.lam[cfg_w])[:, :, None] * Rkq[..., 1] + torch.einsum(
                "cjh,cjhv->chv", w_now[cfg_w] * kq[None], u_ring
            )
            for w in win.flushing():
                members = [i for i in range(len(rep)) if cfg_w[i] == w]
                sel = torch.tensor(members)
                S0w = torch.stack([S0[i] for i in members])
                split = [j for j, i in enumerate(members) if rep[i].read_dtype is not None]
                if split:
                    fixed = _exact_updates(
                        S0w[split] - Rd[sel[split]], u_ring[sel[split]], win, w, g, k, beta, inputs.prompt
                    )
                    u_ring[sel[split]] = fixed
                # A flush step reads the full-precision checkpoint and exact updates, never the read copy.
                u_f = _gdn_u(
                    _mv(S0w, k[s]),
                    lam_prev[w].expand(len(members), H),
                    w_prev[w].expand(len(members), *w_prev.shape[1:]),
                    kk,
                    u_ring[sel],
                    v[s],
                    alpha,
                    beta[s],
                )
                u_ring[sel, g % win.wmax] = u_f
                fold = torch.einsum("jh,cjhv,jhk->chvk", w_now[w], u_ring[sel], k[tok])
                Snew = torch.exp(win.lam[w])[None, :, None, None] * S0w + fold
                y_rep[sel] = _mv(Snew, q[s])
                for j, i in enumerate(members):
                    S0[i] = rnd.stored(Snew[j], rep[i])
                    Rd[i] = _read_copy(S0[i], rep[i].read_dtype)
                win.reset(w)
            ys.append(y_rep)
        _record_step(torch.cat(ys).double(), y64, g, err2, kept, on_step)
    return _reorder(err2, order, configs), ref2, _reorder(kept, order, configs) if keep else None


def _exact_updates(D, entries, win: _Windows, w: int, g: int, k, beta, prompt: int):
    """The buffered updates u_j of split configs as the full checkpoint gives them (the kernels' flush).

    Non-flush steps computed u_j from the read copy; with D = checkpoint - copy carried through the
    entries (D_j = a_j D_{j-1} + d_j k_jᵀ), u_j + d_j with d_j = -beta_j a_j D_{j-1} k_j is the update of
    the full-precision recurrence. D (m, H, V, K) and entries (m, Wmax, H, V) in slot order; returns entries.
    """
    import torch

    entries = entries.clone()
    lam_prev = torch.zeros_like(win.lam[w])
    for age in range(int(win.fill[w]) - 1, 0, -1):
        slot = (g - age) % win.wmax
        t = prompt + g - age
        lam = win.ring[w, slot]
        a = torch.exp(lam - lam_prev)
        d = -beta[t][:, None] * a[:, None] * _mv(D, k[t])
        D = a[:, None, None] * D + d[..., :, None] * k[t][:, None, :]
        entries[:, slot] += d
        lam_prev = lam
    return entries


def _gdn_u(Rk, lam_prev, w_prev, kk, entries, v_t, alpha, beta_t):
    """u_t = beta (v - alpha S_{t-1} k_t), with S_{t-1} k_t = exp(Λ_{t-1}) R k_t plus the buffer's terms."""
    import torch

    Sk = torch.exp(lam_prev)[:, :, None] * Rk + torch.einsum("cjh,cjhv->chv", w_prev * kk[None], entries)
    return beta_t[:, None] * (v_t - alpha[:, None] * Sk)


def _reorder(err2, order: list[Config], configs: list[Config]):
    pos = {c: i for i, c in enumerate(order)}
    return err2[[pos[c] for c in configs]]


def _ops(op: str, backend: str):
    """(decode, replay, ReplayCache) of the kernels or of their plain-torch references."""
    import importlib

    if backend not in ("kernels", "reference"):
        raise ValueError(f"backend must be 'kernels' or 'reference', got {backend!r}")

    def find(name: str, module: str):
        package = importlib.import_module(f"replayssm_kernels.{op}")
        found = getattr(package, name, None)
        return found if found is not None else getattr(importlib.import_module(f"replayssm_kernels.{op}.{module}"), name)

    cache = find("ReplayCache", "cache")
    if backend == "kernels":
        return find("decode", "decode"), find("replay", "replay"), cache
    return find("decode_ref", "reference"), find("replay_ref", "reference"), cache


def _mamba2_step_call(t, inputs: Inputs, d: dict[str, int]):
    """The kernels' keyword arguments, ReplayCache dimensions and per-token arguments: every head its own group."""
    H = d["H"]

    def step_args(s):
        return (t["x"][s : s + 1], t["dt"][s : s + 1], t["A"], t["B"][s : s + 1], t["C"][s : s + 1])

    return dict(D=t["D"], dt_bias=t["dt_bias"], dt_softplus=inputs.dt_softplus), dict(H=H, P=d["P"], N=d["N"], G=H), step_args


def _gdn_step_call(t, inputs: Inputs, d: dict[str, int]):
    """The same for GDN: every value head its own key head."""
    H = d["H"]

    def step_args(s):
        return tuple(t[n][s : s + 1] for n in ("q", "k", "v", "g", "beta"))

    return dict(scale=inputs.scale), dict(H=H, HV=H, K=d["K"], V=d["V"]), step_args


def stepwise_outputs(inputs: Inputs, config: Config, *, backend: str = "kernels", device: str = "cuda"):
    """The fp32 outputs (G, H, P) or (G, HV, V) of one config, stepping the kernels (or references) token by token.

    One sequence; every head its own group (Mamba-2) or key head (GDN); io dtype fp32, so the output is
    compared before any cast; the state after the prompt comes from the fp64 run, stored as `run` stores it.
    """
    import torch

    from replayssm_cli.model.dtypes import torch_dtype

    decode, replay, ReplayCache = _ops(inputs.op, backend)
    dev = torch.device(device)
    t = {k: v.to(dev) for k, v in inputs.tensors.items()}
    d = inputs.dims()
    H = d["H"]
    kw, dims, step_args = _harness(inputs.op).step_call(t, inputs, d)

    with _one_thread():
        state = _prompt_state(inputs).float()
    G = inputs.generated
    ys = torch.full((G, H, d.get("P", d.get("V"))), float("nan"), dtype=torch.float32, device=dev)
    stochastic = config.rounding == "stochastic"
    with torch.no_grad(), _one_thread():
        if config.variant == "conventional":
            store: dict[str, Any] = {}
            if config.state_dtype in ("fp8", "int8"):
                from replayssm_kernels.rounding import quantized_rows_reference

                pool, scale = quantized_rows_reference(state.to(dev)[None], None, torch_dtype(config.state_dtype))
                store["state_scale"] = scale
            else:
                pool = state.to(torch_dtype(config.state_dtype)).to(dev)[None].contiguous()
            if stochastic:
                from replayssm_kernels.rounding import StateRounding

                store["rounding"] = StateRounding.create(1, ROUNDING_SEED, device=dev)
            for g in range(G):
                ys[g] = decode(pool, *step_args(inputs.prompt + g), **kw, **store)[0]
        else:
            cache = ReplayCache.create(
                1, *dims.values(), config.window,
                state_dtype=config.state_dtype, read_dtype=config.read_dtype, io_dtype="fp32", device=dev,
                **({"rounding": "stochastic", "seed": ROUNDING_SEED} if stochastic else {}),
            )
            cache.load(state.to(dev)[None].contiguous())
            for g in range(G):
                ys[g] = replay(cache, *step_args(inputs.prompt + g), **kw)[0]
    return ys.cpu()


def run_kernels(
    inputs: Inputs,
    configs: Sequence[Config],
    *,
    backend: str = "kernels",
    device: str = "cuda",
    on_config: Callable[[int], None] | None = None,
) -> dict[Config, dict[str, float]]:
    """Bucketed errors against fp64 of each config run token by token through the kernels (or references)."""
    with _one_thread():
        ref = _reference_outputs(inputs)
    ref2 = (ref**2).sum((1, 2))
    out: dict[Config, dict[str, float]] = {}
    for i, c in enumerate(configs):
        ys = stepwise_outputs(inputs, c, backend=backend, device=device).double()
        out[c] = _summarise(((ys - ref) ** 2).sum((1, 2)), ref2)[0]
        if on_config is not None:
            on_config(i + 1)
    return out


def _prompt_state(inputs: Inputs):
    """The fp64 state after the prompt tokens, (H, P, N) or (HV, V, K)."""
    return _harness(inputs.op).prompt_state(inputs)


def _mamba2_prompt_state(inputs: Inputs):
    import torch

    x, B, _, _, delta, log_a = _mamba2_params(inputs, torch.float64)
    S = torch.zeros(x.shape[1], x.shape[2], B.shape[2], dtype=torch.float64)
    for s in range(inputs.prompt):
        S = _mamba2_update(S, log_a[s], delta[s], x[s], B[s])
    return S


def _gdn_prompt_state(inputs: Inputs):
    import torch

    q, k, v, g, beta = _gdn_params(inputs, torch.float64)
    S = torch.zeros(v.shape[1], v.shape[2], k.shape[2], dtype=torch.float64)
    for s in range(inputs.prompt):
        S, _ = _gdn_step(S, q[s], k[s], v[s], g[s], beta[s])
    return S


def _reference_outputs(inputs: Inputs):
    """fp64 outputs of the generated tokens, (G, H, P) or (G, HV, V)."""
    return _harness(inputs.op).reference_outputs(inputs, _prompt_state(inputs))


def _mamba2_reference_outputs(inputs: Inputs, S):
    import torch

    G, p = inputs.generated, inputs.prompt
    x, B, C, D, delta, log_a = _mamba2_params(inputs, torch.float64)
    ys = torch.empty(G, x.shape[1], x.shape[2], dtype=torch.float64)
    for g in range(G):
        s = p + g
        S = _mamba2_update(S, log_a[s], delta[s], x[s], B[s])
        ys[g] = _mv(S, C[s]) + D[:, None] * x[s]
    return ys


def _gdn_reference_outputs(inputs: Inputs, S):
    import torch

    G, p = inputs.generated, inputs.prompt
    q, k, v, gl, beta = _gdn_params(inputs, torch.float64)
    ys = torch.empty(G, v.shape[1], v.shape[2], dtype=torch.float64)
    for g in range(G):
        s = p + g
        S, ys[g] = _gdn_step(S, q[s], k[s], v[s], gl[s], beta[s])
    return ys


@dataclass(frozen=True)
class _Harness:
    """One op's part of the harness: its dimensions from the tensors, drawn and recorded inputs, the fp64 run with
    every config, the kernels' calls, and the fp64 prompt state and outputs."""

    dims: Callable[[dict[str, Any]], dict[str, int]]
    synthetic: Callable[..., Inputs]
    from_trace: Callable[..., Inputs]
    run: Callable[..., Any]
    step_call: Callable[..., Any]
    prompt_state: Callable[[Inputs], Any]
    reference_outputs: Callable[[Inputs, Any], Any]
    out_key: str


_HARNESS = {
    "mamba2": _Harness(lambda t: {"P": int(t["x"].shape[2]), "N": int(t["B"].shape[2])}, _mamba2_synthetic,
                       _mamba2_from_trace, _run_mamba2, _mamba2_step_call, _mamba2_prompt_state, _mamba2_reference_outputs, "P"),
    "gdn": _Harness(lambda t: {"K": int(t["q"].shape[2]), "V": int(t["v"].shape[2])}, _gdn_synthetic, _gdn_from_trace,
                    _run_gdn, _gdn_step_call, _gdn_prompt_state, _gdn_reference_outputs, "V"),
}


def _harness(op: str) -> _Harness:
    try:
        return _HARNESS[op]
    except KeyError:
        raise ValueError(f"inputs op must be mamba2 or gdn, got {op!r}") from None


CACHE_ENV = "REPLAYSSM_CACHE_DIR"


def cache_dir() -> Path:
    """Where quality results are kept between runs: $REPLAYSSM_CACHE_DIR/quality, else the user's cache directory."""
    import os

    base = os.environ.get(CACHE_ENV)
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("replayssm")
    return Path(base) / "quality"


def inputs_key(inputs: Inputs, *extra: str) -> str:
    """A digest of everything a config's errors depend on: the inputs' values, the run's settings and this harness's code."""
    import hashlib

    h = hashlib.sha256()
    h.update(Path(__file__).read_bytes())
    h.update(repr((inputs.op, inputs.prompt, inputs.dt_softplus, inputs.scale, extra)).encode())
    for name in sorted(inputs.tensors):
        t = inputs.tensors[name].contiguous()
        h.update(name.encode() + repr((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:32]


def _read_entries(path: Path) -> dict[str, Any]:
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_entries(path: Path, entries: dict[str, Any]) -> None:
    """Replace the cache file whole (a temporary file renamed over it), so a reader never sees half of one."""
    import json
    import os
    import tempfile

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(entries, f)
        os.replace(tmp, path)
    except OSError:
        # A cache that cannot be written only costs the next run its time.
        return


def _valid_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and all(isinstance(entry.get(k), dict) for k in ("buckets", "worst"))
            and all(isinstance(v, float) for d in (entry["buckets"], entry["worst"]) for v in d.values()))


def _run_path(inputs: Inputs, key: str) -> Path:
    return cache_dir() / f"{inputs.op}-{key}.json"


def uncached(inputs: Inputs, configs: Sequence[Config], key: str) -> list[Config]:
    """The configs whose errors on these inputs are not on disk yet."""
    entries = _read_entries(_run_path(inputs, key))
    return [c for c in configs if not _valid_entry(entries.get(c.label()))]


def cached_run(inputs: Inputs, configs: Sequence[Config], *, on_step: Callable[[int], None] | None = None,
               key: str | None = None) -> tuple[Report, int]:
    """`run`, keeping each config's errors on disk under the inputs' digest: only the configs not kept before
    are run. Returns the report (configs in the order given) and how many configs came from the cache."""
    key = key or inputs_key(inputs)
    path = _run_path(inputs, key)
    entries = _read_entries(path)
    missing = [c for c in configs if not _valid_entry(entries.get(c.label()))]
    if missing:
        fresh = run(inputs, missing, on_step=on_step)
        for e in fresh.errors:
            entries[e.config.label()] = {"buckets": e.buckets, "worst": e.worst}
        _write_entries(path, entries)
    report = Report(inputs.op, inputs.dims(), inputs.prompt, inputs.generated, inputs.source)
    for c in configs:
        e = entries[c.label()]
        report.errors.append(ConfigErrors(c, dict(e["buckets"]), dict(e["worst"])))
    return report, len(configs) - len(missing)


def kernels_key(device: str) -> str:
    """A digest of what the kernels' errors depend on beyond the inputs: the kernels' code, torch, triton and the GPU."""
    import hashlib

    import torch
    import triton

    import replayssm_kernels

    h = hashlib.sha256(repr((torch.__version__, triton.__version__)).encode())
    if device.startswith("cuda") and torch.cuda.is_available():
        try:
            h.update(torch.cuda.get_device_name(torch.device(device)).encode())
        except (RuntimeError, AssertionError):
            h.update(device.encode())
    root = Path(replayssm_kernels.__file__).parent
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + f.read_bytes())
    return h.hexdigest()[:32]


def _kernel_entries(inputs: Inputs, configs: Sequence[Config], device: str, key: str | None):
    """The file of the kernels' errors on these inputs, its entries, and the errors of those of `configs` it holds."""
    key = f"{key or inputs_key(inputs)}-{kernels_key(device)}"
    path = cache_dir() / f"{inputs.op}-kernels-{key}.json"
    entries = _read_entries(path)
    good = {c: entries[c.label()] for c in configs
            if isinstance(entries.get(c.label()), dict) and all(isinstance(v, float) for v in entries[c.label()].values())}
    return path, entries, good


def kernels_uncached(inputs: Inputs, configs: Sequence[Config], *, device: str = "cuda", key: str | None = None) -> list[Config]:
    """The configs whose kernel errors `cached_kernels` would compute: none kept on disk for these inputs and kernels."""
    good = _kernel_entries(inputs, configs, device, key)[2]
    return [c for c in configs if c not in good]


def cached_kernels(inputs: Inputs, configs: Sequence[Config], *, device: str = "cuda", key: str | None = None,
                   on_config: Callable[[int], None] | None = None) -> tuple[dict[Config, dict[str, float]], int]:
    """`run_kernels`, keeping each config's bucketed errors on disk under the inputs' and the kernels' digests.
    Returns the errors by config and how many came from the cache."""
    path, entries, good = _kernel_entries(inputs, configs, device, key)
    missing = [c for c in configs if c not in good]
    if missing:
        done = len(good)
        fresh = run_kernels(inputs, missing, device=device,
                            on_config=None if on_config is None else (lambda n: on_config(done + n)))
        for c, buckets in fresh.items():
            entries[c.label()] = buckets
            good[c] = buckets
        _write_entries(path, entries)
    return {c: dict(good[c]) for c in configs}, len(configs) - len(missing)
