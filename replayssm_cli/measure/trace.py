"""Recorded SSM traces: the per-step inputs of one SSM layer of a real model, as a NumPy .npz file."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replayssm_cli.errors import UserError, readable_path
from replayssm_cli.model import ops
from replayssm_cli.model.shapes import SSMShape

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
        return int(self.arrays[ops.named(self.op).token_input].shape[0])

    @property
    def generated(self) -> int:
        return self.steps - self.prompt_tokens

    @property
    def shape(self) -> SSMShape:
        dims = {letter: int(size) for name, (letters, _) in ARRAYS[self.op].items()
                for letter, size in zip(letters.split(), self.arrays[name].shape)}
        op = ops.named(self.op)
        return op.shape(**{k: dims[k] for k in op.dims})

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
            if size < 1:
                raise ValueError(f"trace array {name} has {letter}=0; every dimension needs at least one entry")
            if dims.setdefault(letter, size) != size:
                raise ValueError(f"trace array {name} has {letter}={size} but another array has {letter}={dims[letter]}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ValueError(f"trace array {name} has dtype {arr.dtype}; expected floating point")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"trace array {name} holds NaN or infinite values")
    VALUE_CHECKS[trace.op](dims, trace.arrays)
    if not 0 <= trace.prompt_tokens < dims["T"]:
        raise ValueError(f"trace has prompt_tokens={trace.prompt_tokens} but {dims['T']} steps: no generated token")


def _check_mamba2(dims: dict[str, int], arrays: dict[str, Any]) -> None:
    import numpy as np

    if dims["H"] % dims["G"]:
        raise ValueError(f"mamba2 trace has H={dims['H']} heads, not a multiple of G={dims['G']} groups")
    if np.any(arrays["A"] >= 0):
        raise ValueError("mamba2 trace has A >= 0; A = -exp(A_log) must be negative")


def _check_gdn(dims: dict[str, int], arrays: dict[str, Any]) -> None:
    import numpy as np

    if dims["HV"] % dims["H"]:
        raise ValueError(f"gdn trace has HV={dims['HV']} value heads, not a multiple of H={dims['H']} key heads")
    if np.any(arrays["g"] > 0):
        raise ValueError("gdn trace has g > 0; the log decay must be <= 0")
    beta = arrays["beta"]
    if np.any(beta < 0) or np.any(beta > 1):
        raise ValueError("gdn trace has beta outside [0, 1]")


# Each op's checks of how its dimensions fit together and of its values' ranges.
VALUE_CHECKS = {"mamba2": _check_mamba2, "gdn": _check_gdn}


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
    """Load and validate a trace file; anything wrong with it is a UserError naming the file. Never unpickles."""
    import zipfile

    import numpy as np

    p = readable_path(Path(path).expanduser(), "trace file")
    hint = "record one with benchmarks/record_trace.py"
    if not zipfile.is_zipfile(p):
        with open(p, "rb") as fh:
            head = fh.read(6)
        what = "a single .npy array" if head == b"\x93NUMPY" else "a pickle" if head[:1] == b"\x80" else "not a .npz archive"
        raise UserError(f"trace file {p} is {what}; a trace is a .npz archive of arrays plus a meta entry", hint)
    try:
        with np.load(p, allow_pickle=False) as data:
            files = {name: data[name] for name in data.files}
    except ValueError as exc:
        why = "holds pickled (object) arrays, which replayssm never loads" if "pickle" in str(exc) else f"has an unreadable array ({exc})"
        raise UserError(f"trace file {p} {why}", hint) from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UserError(f"trace file {p} is a damaged .npz archive ({exc})", hint) from None
    if "meta" not in files:
        raise UserError(f"trace file {p} has no meta entry", hint)
    meta_array = files.pop("meta")
    if meta_array.dtype.kind != "U" or meta_array.ndim != 0:
        raise UserError(f"trace file {p} has a meta entry that is not a JSON string", "record it again")
    try:
        meta = json.loads(str(meta_array))
    except (json.JSONDecodeError, RecursionError):
        raise UserError(f"trace file {p} has a meta entry that is not JSON", "record it again") from None
    if not isinstance(meta, dict):
        raise UserError(f"trace file {p} has a meta entry that is not a JSON object", "record it again")
    if meta.get("format") != FORMAT:
        raise UserError(f"trace file {p} is not a {FORMAT} file", hint)
    if meta.get("version") != VERSION:
        raise UserError(f"trace file {p} has version {meta.get('version')!r}; this replayssm reads version {VERSION}", "record it again")
    try:
        fields = {
            "op": _meta(meta, "op", str, ""), "prompt_tokens": _meta(meta, "prompt_tokens", int, 0), "model": _meta(meta, "model", str, ""),
            "layer": _meta(meta, "layer", int, 0), "dt_softplus": _meta(meta, "dt_softplus", bool, True), "scale": _meta(meta, "scale", float, None),
        }
        for name, arr in files.items():
            if not np.issubdtype(arr.dtype, np.floating):
                raise ValueError(f"array {name} has dtype {arr.dtype}; expected floating point")
    except ValueError as exc:
        raise UserError(f"trace file {p} is malformed: {exc}", "record it again") from None
    known = {"format", "version", "op", "model", "layer", "prompt_tokens", "steps", "dt_softplus", "scale"}
    trace = Trace(
        arrays={k: v.astype(np.float32, copy=False) for k, v in files.items()},
        extra={k: v for k, v in meta.items() if k not in known},
        **fields,
    )
    try:
        validate(trace)
    except ValueError as exc:
        raise UserError(f"trace file {p} is malformed: {exc}", "record it again") from None
    if meta.get("steps") not in (None, trace.steps):
        raise UserError(f"trace file {p} says {meta['steps']!r} steps but holds {trace.steps}", "record it again")
    return trace


def _meta(meta: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    """meta[key] of the JSON type `kind` (an int is a float too; a bool is neither), or `default` when absent."""
    value = meta.get(key, default)
    if value is None:
        return value
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, kind) and not isinstance(value, bool) or (kind is float and isinstance(value, int) and not isinstance(value, bool)))
    if not ok or (kind is int and value < 0) or (kind is float and not math.isfinite(value)):
        raise ValueError(f"meta {key} is {value!r:.60}; expected {'a non-negative integer' if kind is int else 'a finite number' if kind is float else kind.__name__}")
    return float(value) if kind is float else value
