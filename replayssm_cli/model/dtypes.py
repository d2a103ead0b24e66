"""The dtype and variant names every command and results file uses, with their sizes; no torch at import."""

from __future__ import annotations

from enum import Enum


class StateDtype(str, Enum):
    """What a state or checkpoint is stored in: fp32, 16-bit, or 8-bit rows (fp8 e4m3, int8) each with an fp32 scale."""

    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"


class ReadDtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class Rounding(str, Enum):
    """How a stored state is rounded: to nearest, or stochastically (from a per-slot Philox stream)."""

    nearest = "nearest"
    stochastic = "stochastic"


class IODtype(str, Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Op(str, Enum):
    mamba2 = "mamba2"
    gdn = "gdn"


class Variant(str, Enum):
    """What a results row measured: the kernel family, independent of the op."""

    conventional = "conventional"
    replay = "replay"
    split = "split"
    spec_conventional = "spec-conventional"
    spec_replay = "spec-replay"


class Phase(str, Enum):
    """avg: the per-step figure averaged over whole windows; nonflush/flush: one kind of step alone."""

    avg = "avg"
    nonflush = "nonflush"
    flush = "flush"


ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int32": 4}
# State dtypes stored as rows of 8-bit values, each row with one fp32 scale.
EIGHT_BIT = ("fp8", "int8")


def itemsize(name: str | Enum | None) -> int:
    if name is None:
        return 0
    key = name.value if isinstance(name, Enum) else str(name)
    try:
        return ITEMSIZE[key]
    except KeyError:
        raise ValueError(f"unknown dtype {key!r}; expected one of {', '.join(ITEMSIZE)}") from None


def torch_dtype(name: str | Enum):
    """The torch dtype for one of our dtype names (imports torch)."""
    import torch

    key = name.value if isinstance(name, Enum) else str(name)
    table = {
        "fp32": torch.float32,
        "bf16": torch.bfloat16,
        "fp16": torch.float16,
        "fp8": torch.float8_e4m3fn,
        "int8": torch.int8,
    }
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"unknown dtype {key!r}; expected one of {', '.join(table)}") from None


# Our names and the engines' (vLLM's --mamba-ssm-cache-dtype and --kv-cache-dtype, Hugging Face's torch_dtype).
ALIASES = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "fp8_e4m3": "fp8", "float8_e4m3fn": "fp8", "e4m3": "fp8", "torch.float8_e4m3fn": "fp8",
    "int8": "int8", "torch.int8": "int8",
    "nvfp4": "nvfp4",
}
# Names the engines know that no kernel here takes, with why.
WHY_NOT = {
    "fp8_e5m2": "fp8 here is e4m3; e5m2 is not implemented",
    "float8_e5m2": "fp8 here is e4m3; e5m2 is not implemented",
    "fp64": "no kernel stores fp64 state", "float64": "no kernel stores fp64 state", "double": "no kernel stores fp64 state",
}


def engine_names(allowed: tuple[str, ...]) -> str:
    """The engines' spellings of `allowed`, for a hint."""
    spelled = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "fp8_e4m3", "int8": "int8"}
    return ", ".join(spelled[a] for a in allowed if a in spelled)


def canonical(name: str) -> str | None:
    """Our name for a dtype spelled our way or an engine's; None when it is neither."""
    return ALIASES.get(str(name).strip().lower())


def _value(name: str | Enum | None) -> str | None:
    return name.value if isinstance(name, Enum) else name


def precision_problem(state_dtype: str | Enum, read_dtype: str | Enum | None = None,
                      rounding: str | Enum | None = None) -> str | None:
    """Why a state dtype, read copy and rounding cannot go together (one sentence), or None when they can."""
    st, rd, ro = _value(state_dtype), _value(read_dtype), _value(rounding)
    if rd is not None and itemsize(rd) >= itemsize(st):
        return f"the read copy ({rd}) is not narrower than the checkpoint ({st}): a read copy is bf16 or fp16 over fp32, fp8 over 16 bits"
    if ro == Rounding.stochastic.value and st == StateDtype.fp32.value:
        return "stochastic rounding applies to a 16-bit or 8-bit state; an fp32 state is stored exactly"
    return None


def default_read_dtype(state_dtype: str | Enum) -> str | None:
    """The read copy a split-precision row takes unless told: bf16 over fp32, fp8 over 16 bits, none over 8 bits."""
    st = _value(state_dtype)
    return {"fp32": "bf16", "bf16": "fp8", "fp16": "fp8"}.get(st)


def precision_label(state_dtype: str | Enum | None, read_dtype: str | Enum | None = None, rounding: str | Enum | None = None,
                    *, arrow: str = "→") -> str:
    """A row's precision in a few characters: the state dtype, its read copy, and SR where it rounds stochastically
    ("fp32→bf16", "int8 SR")."""
    text = str(_value(state_dtype)) + (f"{arrow}{_value(read_dtype)}" if read_dtype else "")
    return text + (" SR" if _value(rounding) == Rounding.stochastic.value else "")
