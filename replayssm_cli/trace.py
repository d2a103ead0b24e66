"""Recorded SSM traces: the per-step inputs of one SSM layer of a real model, as a NumPy .npz file."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayssm_cli.errors import UserError
from replayssm_cli.shapes import GDNShape, Mamba2Shape, SSMShape

FORMAT = "replayssm-trace"
VERSION = 1

# name -> (dimension letters, meaning); T counts every token of the sequence, prompt first.
ARRAYS: dict[str, dict[str, tuple[str, str]]] = {
    "mamba2": {
        "x": ("T H P", "SSM input x_t after the causal conv and activation"),
        "dt": ("T H", "raw dt_t before dt_bias and softplus"),
        "B": ("T G N", "B_t after the causal conv and activation"),
        "C": ("T G N", "C_t after the causal conv and activation"),
        "A": ("H", "A_h = -exp(A_log_h)"),
        "D": ("H", "skip weight D_h"),
        "dt_bias": ("H", "dt bias added before softplus"),
    },
    "gdn": {
        "q": ("T H K", "query after the causal conv, L2-normalised, not yet scaled"),
        "k": ("T H K", "key after the causal conv, L2-normalised"),
        "v": ("T HV V", "value after the causal conv"),
        "g": ("T HV", "log decay g_t <= 0 (alpha_t = exp(g_t))"),
        "beta": ("T HV", "write strength beta_t in (0, 1)"),
    },
}


@dataclass
class Trace:
    """One sequence through one SSM layer: `prompt_tokens` prefill tokens, then generated tokens."""

    op: str
    arrays: dict[str, Any]
    prompt_tokens: int
    model: str = ""
    layer: int = 0
    dt_softplus: bool = True
    scale: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.arrays["x" if self.op == "mamba2" else "q"].shape[0])

    @property
    def generated(self) -> int:
        return self.steps - self.prompt_tokens

    @property
    def shape(self) -> SSMShape:
        a = self.arrays
        if self.op == "mamba2":
            _, H, P = a["x"].shape
            return Mamba2Shape(H=H, P=P, N=a["B"].shape[2], G=a["B"].shape[1])
        return GDNShape(H=a["q"].shape[1], HV=a["v"].shape[1], K=a["q"].shape[2], V=a["v"].shape[2])

    def meta(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "op": self.op,
            "model": self.model,
            "layer": self.layer,
            "prompt_tokens": self.prompt_tokens,
            "steps": self.steps,
            "dt_softplus": self.dt_softplus,
            "scale": self.scale,
            **self.extra,
        }


def validate(trace: Trace) -> None:
    """Check names, ranks, dimensions and values of a trace; ValueError with a sentence on the first problem."""
    import numpy as np

    if trace.op not in ARRAYS:
        raise ValueError(f"trace op {trace.op!r} is not one of {', '.join(ARRAYS)}")
    spec = ARRAYS[trace.op]
    missing = [k for k in spec if k not in trace.arrays]
    if missing:
        raise ValueError(f"{trace.op} trace lacks array(s) {', '.join(missing)}")
    dims: dict[str, int] = {}
    for name, (letters, _) in spec.items():
        arr = trace.arrays[name]
        letters_ = letters.split()
        if arr.ndim != len(letters_):
            raise ValueError(f"trace array {name} has {arr.ndim} dimensions; expected {len(letters_)} ({letters})")
        for letter, size in zip(letters_, arr.shape):
            if dims.setdefault(letter, size) != size:
                raise ValueError(f"trace array {name} has {letter}={size} but another array has {letter}={dims[letter]}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"trace array {name} has dtype {arr.dtype}; expected floating point")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"trace array {name} holds NaN or infinite values")
    if trace.op == "mamba2":
        if dims["H"] % dims["G"]:
            raise ValueError(f"mamba2 trace has H={dims['H']} heads, not a multiple of G={dims['G']} groups")
        if np.any(trace.arrays["A"] >= 0):
            raise ValueError("mamba2 trace has A >= 0; A = -exp(A_log) must be negative")
    else:
        if dims["HV"] % dims["H"]:
            raise ValueError(f"gdn trace has HV={dims['HV']} value heads, not a multiple of H={dims['H']} key heads")
        if np.any(trace.arrays["g"] > 0):
            raise ValueError("gdn trace has g > 0; the log decay must be <= 0")
        beta = trace.arrays["beta"]
        if np.any(beta < 0) or np.any(beta > 1):
            raise ValueError("gdn trace has beta outside [0, 1]")
    if not 0 <= trace.prompt_tokens < dims["T"]:
        raise ValueError(f"trace has prompt_tokens={trace.prompt_tokens} but {dims['T']} steps: no generated token")


def write(path: str | Path, trace: Trace) -> Path:
    """Validate and save a trace as .npz: float32 arrays plus a JSON `meta` string."""
    import numpy as np

    validate(trace)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in trace.arrays.items() if k in ARRAYS[trace.op]}
    with open(p, "wb") as fh:
        np.savez_compressed(fh, meta=np.array(json.dumps(trace.meta())), **arrays)
    return p


def read(path: str | Path) -> Trace:
    """Load and validate a trace file; anything wrong with it is a UserError naming the file."""
    import numpy as np

    p = Path(path)
    if not p.is_file():
        raise UserError(f"trace file {p} does not exist", "record one with benchmarks/record_trace.py")
    try:
        with np.load(p, allow_pickle=False) as data:
            files = dict(data.items())
    except (OSError, ValueError) as exc:
        raise UserError(f"trace file {p} is not a readable .npz file ({exc})", "record one with benchmarks/record_trace.py") from None
    if "meta" not in files:
        raise UserError(f"trace file {p} has no meta entry", "record one with benchmarks/record_trace.py")
    try:
        meta = json.loads(str(files.pop("meta")))
    except json.JSONDecodeError:
        raise UserError(f"trace file {p} has a meta entry that is not JSON", "record it again") from None
    if meta.get("format") != FORMAT:
        raise UserError(f"trace file {p} is not a {FORMAT} file", "record one with benchmarks/record_trace.py")
    if meta.get("version") != VERSION:
        raise UserError(f"trace file {p} has version {meta.get('version')!r}; this replayssm reads version {VERSION}", "record it again")
    known = {"format", "version", "op", "model", "layer", "prompt_tokens", "steps", "dt_softplus", "scale"}
    trace = Trace(
        op=str(meta.get("op")),
        arrays={k: v.astype(np.float32, copy=False) for k, v in files.items()},
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        model=str(meta.get("model", "")),
        layer=int(meta.get("layer", 0)),
        dt_softplus=bool(meta.get("dt_softplus", True)),
        scale=meta.get("scale"),
        extra={k: v for k, v in meta.items() if k not in known},
    )
    try:
        validate(trace)
    except ValueError as exc:
        raise UserError(f"trace file {p} is malformed: {exc}", "record it again") from None
    if meta.get("steps") not in (None, trace.steps):
        raise UserError(f"trace file {p} says {meta['steps']} steps but holds {trace.steps}", "record it again")
    return trace
