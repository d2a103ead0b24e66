"""Model presets: SSM layer shapes, layer counts and state dtypes from profiles/models/*.toml or a Hugging Face config.json."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from replayssm_cli.model import ops
from replayssm_cli.model.dtypes import StateDtype, canonical
from replayssm_cli.errors import UserError, readable_path
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape, SSMShape, state_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

DEFAULT_PRESETS = ("nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b")

KINDS = tuple(ops.OPS)
STATE_DTYPES = tuple(d.value for d in StateDtype)
# Groups of figures whose source a preset file must name (a dotted key such as "ssm.groups" may refine one).
REQUIRED_SOURCES = ("ssm", "layers", "state_dtype", "a_log_range")
E2E_KEYS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_experts",
    "experts_per_token",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "moe_latent_size",
    "mlp_layers",
    "moe_layers",
    "mtp_layers",
    "vocab_size",
)
MAX_PRESET_BYTES = 1 << 20
# Upper bounds well above every model shipped or published, so that a typo cannot ask for petabytes.
MAX_DIM = 1 << 16
MAX_LAYERS = 1 << 12
MAX_E2E = 1 << 24
# One sequence's state in one layer: at most 2^31 elements (8 GiB at fp32), the kernels' int32 offsets.
MAX_STATE_ELEMS = 1 << 31


@dataclass(frozen=True)
class Preset:
    """One model's SSM layers as the kernels see them on one GPU (heads already divided by `tp`)."""

    name: str
    display: str
    kind: str
    ssm_layers: int
    attn_layers: int
    shape: SSMShape
    state_dtype: str
    tp: int = 1
    dt_softplus: bool = True
    has_D: bool = True
    has_z: bool = False
    a_log_range: tuple[float, float] | None = None
    e2e: dict[str, int] | None = None
    sources: dict[str, str] = field(default_factory=dict)
    estimated: tuple[str, ...] = ()
    estimated_reasons: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    hf_id: str | None = None
    origin: str = ""
    full_shape: SSMShape | None = None

    def state_bytes_per_layer(self, dtype: str | None = None) -> int:
        """Bytes of one sequence's recurrent state in one SSM layer on one GPU, at `dtype` (default: the shipped dtype)."""
        return state_bytes(self.shape, dtype or self.state_dtype)

    def state_bytes_per_sequence(self, dtype: str | None = None) -> int:
        """Bytes of one sequence's recurrent state over all SSM layers on one GPU."""
        return self.state_bytes_per_layer(dtype) * self.ssm_layers

    def label(self) -> str:
        return self.shape.label()

    def to_dict(self) -> dict[str, Any]:
        """Everything about the preset as plain JSON types, with state bytes at every state dtype."""
        return {
            "name": self.name,
            "display": self.display,
            "hf_id": self.hf_id,
            "kind": self.kind,
            "ssm_layers": self.ssm_layers,
            "attn_layers": self.attn_layers,
            "tp": self.tp,
            "shape": shape_dict(self.shape),
            "label": self.label(),
            "state_dtype": self.state_dtype,
            "dt_softplus": self.dt_softplus,
            "has_D": self.has_D,
            "has_z": self.has_z,
            "a_log_range": list(self.a_log_range) if self.a_log_range else None,
            "e2e": self.e2e,
            "state_bytes_per_layer": {d: self.state_bytes_per_layer(d) for d in STATE_DTYPES},
            "state_bytes_per_sequence": {d: self.state_bytes_per_sequence(d) for d in STATE_DTYPES},
            "sources": self.sources,
            "estimated": {k: self.estimated_reasons.get(k, "") for k in self.estimated},
            "notes": list(self.notes),
            "origin": self.origin,
        }


def shape_dict(shape: SSMShape) -> dict[str, int]:
    return {k: getattr(shape, k) for k in ops.of(shape).dims}


def _models_dir() -> Path:
    return Path(str(resources.files("replayssm_profiles") / "models"))


def _model_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_models_dir().glob("*.toml"))}


def preset_names() -> list[str]:
    return list(_model_files())


def list_presets() -> list[Preset]:
    """Every shipped preset at tp=1, sorted by name."""
    return [_load_shipped(name) for name in preset_names()]


def load_preset(name: str, tp: int = 1) -> Preset:
    """A shipped preset by name (case-insensitive; the display name works too), divided for `tp`.

    Raises UserError naming every valid preset when `name` is unknown, and when `tp` does not divide
    the preset's heads and groups.
    """
    key = _shipped_key(name)
    if key is None:
        shown = repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name):,} characters)"
        raise UserError(f"unknown preset {shown}; valid presets: {', '.join(_model_files())}", "or pass a preset file (.toml, config.json or its model directory)")
    return with_tp(_load_shipped(key), tp)


@lru_cache(maxsize=None)
def _load_shipped(stem: str) -> Preset:
    path = _model_files()[stem]
    return _from_toml(_read_toml(path), path)


def load_preset_file(path: str | Path, tp: int = 1) -> Preset:
    """A preset from our TOML format or from a Hugging Face config.json (or the model directory holding it), told
    apart by content, divided for `tp`. Anything wrong with the file is a UserError naming it and the field."""
    path = readable_path(Path(path).expanduser(), "preset file", model_dir=True)
    size = path.stat().st_size
    if size > MAX_PRESET_BYTES:
        raise UserError(f"preset file {path} is {size / 2**20:.1f} MiB; a preset or config.json is a few KiB", "pass the model's config.json")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        raise UserError(f"preset file {path} is a binary file, not TOML or JSON text", "pass a preset .toml or a Hugging Face config.json")
    try:
        data = json.loads(text)
        json_error = None
    except json.JSONDecodeError as exc:
        data, json_error = None, exc
    except RecursionError:
        raise UserError(f"preset file {path} nests too deeply to be a config.json") from None
    if data is not None:
        if not isinstance(data, dict):
            raise UserError(f"preset file {path} holds a JSON {_json_kind(data)}, not an object", "a Hugging Face config.json is one JSON object {...}")
        via = read_with_transformers(path)
        preset = _from_hf_config(via or data, path)
        if via is not None:
            preset = dataclasses.replace(preset, notes=preset.notes + ("config read through transformers' AutoConfig",))
        return with_tp(preset, tp)
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            raise UserError(f"preset file {path} is not valid JSON ({json_error})", "a Hugging Face config.json is one JSON object") from None
        raise UserError(f"preset file {path} is not valid TOML ({exc})", "see profiles/models/*.toml for the format") from None
    except RecursionError:
        raise UserError(f"preset file {path} nests too deeply to be a preset") from None
    return with_tp(_from_toml(table, path), tp)


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), type(value).__name__)


def resolve(name_or_path: str, tp: int = 1) -> Preset:
    """A shipped preset name, or a path to a preset .toml, a config.json or a model directory holding one."""
    text = str(name_or_path).strip()
    if not text:
        raise UserError("the preset name is empty", "pass a preset name (see `replayssm presets`) or a preset file")
    path = Path(text).expanduser()
    pathlike = "/" in text or text.startswith(("~", ".")) or path.suffix.lower() in (".toml", ".json")
    # os.path's tests answer False for a name too long for the file system instead of raising.
    exists = os.path.lexists(path)
    if pathlike or (exists and (os.path.isfile(path) or _shipped_key(text) is None)):
        return load_preset_file(path, tp)
    return load_preset(text, tp)


def _shipped_key(name: str) -> str | None:
    key = name.strip().lower()
    files = _model_files()
    if key in files:
        return key
    return {_load_shipped(n).display.lower(): n for n in files}.get(key)


def with_tp(preset: Preset, tp: int) -> Preset:
    """The preset as one GPU of `tp`-way tensor parallelism sees it: heads (and groups) divided by `tp`.

    Mamba-2 groups are split like heads; a single group (G = 1) is replicated on every GPU, as vLLM does.
    Raises UserError when `tp` does not divide the heads or groups.
    """
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UserError(f"--tp must be a positive integer, got {tp!r}")
    full = preset.full_shape or preset.shape
    bad, shape = ops.of(full).tp_split(full, tp)
    if bad:
        raise UserError(f"tp={tp} does not divide {preset.display}'s {' and '.join(bad)}", _tp_hint(full))
    return dataclasses.replace(preset, shape=shape, tp=tp, full_shape=full)


def valid_tp(shape: SSMShape) -> list[int]:
    """The tensor-parallel degrees up to 64 that divide the shape's heads and groups."""
    op = ops.of(shape)
    return [t for t in range(1, 65) if not op.tp_split(shape, t)[0]]


def _tp_hint(shape: SSMShape) -> str:
    return "valid --tp: " + ", ".join(str(t) for t in valid_tp(shape))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path} is not valid TOML ({exc})") from None


TOP_KEYS = ("name", "display", "hf_id", "kind", "layer_pattern", "ssm_layers", "attn_layers", "state_dtype",
            "ssm", "e2e", "sources", "estimated", "notes")
SSM_FLAGS = ("dt_softplus", "has_D", "has_z", "a_log_range")


def _from_toml(data: dict[str, Any], path: Path) -> Preset:
    where = str(path)
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise UserError(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; known: {', '.join(TOP_KEYS)}")
    ssm = data.get("ssm")
    if not isinstance(ssm, dict):
        raise UserError(f"{where}: missing the [ssm] table" if ssm is None else f"{where}: ssm must be a table [ssm], got {_toml_kind(ssm)}")
    kind = data.get("kind")
    if kind not in KINDS:
        raise UserError(f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}")
    op = ops.named(kind)
    keys = op.toml_keys
    missing = [f"ssm.{k}" for k in keys if k not in ssm] + [k for k in ("ssm_layers", "attn_layers", "state_dtype") if k not in data]
    if missing:
        raise UserError(f"{where}: missing {', '.join(missing)}")
    unknown = sorted(set(ssm) - set(keys) - set(SSM_FLAGS))
    if unknown:
        raise UserError(f"{where}: unknown [ssm] key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; a {kind} preset takes {', '.join((*keys, *SSM_FLAGS))}")
    dims = {k: _int(ssm[k], f"ssm.{k}", where, 1, MAX_DIM) for k in keys}
    shape = op.shape(**{d: dims[k] for d, k in zip(op.dims, keys)})
    a_range = ssm.get("a_log_range")
    if a_range is not None:
        if not (isinstance(a_range, list) and len(a_range) == 2 and all(_is_number(v) for v in a_range)):
            raise UserError(f"{where}: ssm.a_log_range must be a pair of finite numbers [low, high], got {a_range!r}")
        a_range = (float(a_range[0]), float(a_range[1]))
    e2e = _table(data, "e2e", where)
    if e2e is not None:
        unknown = sorted(set(e2e) - set(E2E_KEYS))
        if unknown:
            raise UserError(f"{where}: unknown [e2e] keys {', '.join(unknown)}; known: {', '.join(E2E_KEYS)}")
        e2e = {k: _int(v, f"e2e.{k}", where, 1, MAX_E2E) for k, v in e2e.items()}
    sources = _strings(data, "sources", where)
    estimated = _strings(data, "estimated", where)
    notes = _strings(data, "notes", where)
    layer_pattern = data.get("layer_pattern")
    if layer_pattern is not None and not isinstance(layer_pattern, str):
        raise UserError(f"{where}: layer_pattern must be a string of M, *, - and E, got {_toml_kind(layer_pattern)}")
    preset = Preset(
        name=_text(data, "name", where, path.stem).lower(),
        display=_text(data, "display", where, path.stem),
        kind=kind,
        ssm_layers=_int(data["ssm_layers"], "ssm_layers", where, 1, MAX_LAYERS),
        attn_layers=_int(data["attn_layers"], "attn_layers", where, 0, MAX_LAYERS),
        shape=shape,
        state_dtype=canonical(_text(data, "state_dtype", where, "")) or str(data["state_dtype"]),
        dt_softplus=_flag(ssm, "dt_softplus", True, where),
        has_D=_flag(ssm, "has_D", op.has_D, where),
        has_z=_flag(ssm, "has_z", False, where),
        a_log_range=a_range,
        e2e=e2e,
        sources=sources,
        estimated=tuple(estimated),
        estimated_reasons=estimated,
        notes=tuple(notes.values()),
        hf_id=_text(data, "hf_id", where, None),
        origin=where,
    )
    validate(preset, require_sources=True, layer_pattern=layer_pattern)
    return preset


def _toml_kind(value: Any) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise UserError(f"{where}: {key} must be a table [{key}], got {_toml_kind(value)} {value!r:.60}")
    return value


def _strings(data: dict[str, Any], key: str, where: str) -> dict[str, str]:
    table = _table(data, key, where) or {}
    bad = [k for k, v in table.items() if not isinstance(v, str)]
    if bad:
        raise UserError(f"{where}: {key}.{bad[0]} must be a string, got {_toml_kind(table[bad[0]])}")
    return {str(k): v for k, v in table.items()}


def _text(data: dict[str, Any], key: str, where: str, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}: {key} must be a non-empty string, got {_toml_kind(value)} {value!r:.60}")
    return value


def _flag(table: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise UserError(f"{where}: ssm.{key} must be true or false, got {value!r:.60}")
    return value


def _int(value: Any, what: str, where: str, lo: int = 1, hi: int = MAX_DIM) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        got = "'auto', which is resolved by the engine at load time, not here" if value == "auto" else f"{value!r:.60}"
        raise UserError(f"{where}: {what} must be an integer, got {got}")
    if not lo <= value <= hi:
        raise UserError(f"{where}: {what}={value} is out of range; it takes {lo} to {hi:,}")
    return value


def validate(preset: Preset, require_sources: bool = False, layer_pattern: str | None = None) -> None:
    """Check a preset's figures hang together; raises UserError naming the first problem and the file."""
    where = preset.origin or preset.name
    problems: list[str] = []
    dims = shape_dict(preset.full_shape or preset.shape)
    problems += [f"{k}={v} must be positive" for k, v in dims.items() if v <= 0]
    problems += [f"{k}={v:,} is beyond any model ({MAX_DIM:,} at most)" for k, v in dims.items() if v > MAX_DIM]
    if preset.ssm_layers <= 0:
        problems.append(f"ssm_layers={preset.ssm_layers} must be positive")
    if preset.attn_layers < 0:
        problems.append(f"attn_layers={preset.attn_layers} must not be negative")
    problems += [f"{k}={v:,} is beyond any model ({MAX_LAYERS:,} at most)" for k, v in (("ssm_layers", preset.ssm_layers), ("attn_layers", preset.attn_layers)) if v > MAX_LAYERS]
    if not problems and (preset.full_shape or preset.shape).state_elems > MAX_STATE_ELEMS:
        elems = (preset.full_shape or preset.shape).state_elems
        problems.append(f"one sequence's state in one layer would be {elems:,} elements ({elems * 4 / 2**30:,.0f} GiB at fp32); the kernels take at most {MAX_STATE_ELEMS:,}")
    if preset.state_dtype not in STATE_DTYPES:
        problems.append(f"state_dtype {preset.state_dtype!r} must be one of {', '.join(STATE_DTYPES)}")
    if not problems:
        full = preset.full_shape or preset.shape
        mismatch = ops.of(full).head_mismatch(full)
        if mismatch:
            problems.append(mismatch)
    if preset.a_log_range is not None:
        lo, hi = preset.a_log_range
        if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
            problems.append(f"a_log_range [{lo}, {hi}] must satisfy 0 <= low < high")
    if preset.e2e:
        problems += [f"e2e.{k}={v} must be positive" for k, v in preset.e2e.items() if v <= 0]
        problems += [f"e2e.{k}={v:,} is beyond any model ({MAX_E2E:,} at most)" for k, v in preset.e2e.items() if v > MAX_E2E]
    if layer_pattern is not None:
        counts = pattern_counts(layer_pattern)
        if (counts["ssm"], counts["attn"]) != (preset.ssm_layers, preset.attn_layers):
            problems.append(
                f"layer_pattern has {counts['ssm']} Mamba and {counts['attn']} attention layers, "
                f"but ssm_layers={preset.ssm_layers}, attn_layers={preset.attn_layers}"
            )
    if require_sources:
        groups = set(REQUIRED_SOURCES) | ({"e2e"} if preset.e2e else set())
        for group in sorted(groups):
            if group not in preset.sources and not any(k.startswith(group + ".") for k in preset.sources):
                problems.append(f"no source for {group!r} (add it under [sources], or under [estimated] with a reason)")
        problems += [f"estimated {k!r} has no reason" for k in preset.estimated if not preset.estimated_reasons.get(k)]
    if problems:
        raise UserError(f"preset {where}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))


def pattern_counts(pattern: str) -> dict[str, int]:
    """Layer counts from a Nemotron-H hybrid_override_pattern: M Mamba-2, * attention, - MLP, E MoE."""
    unknown = sorted(set(pattern) - set("M*-E"))
    if unknown:
        raise UserError(f"layer pattern has unknown symbols {''.join(unknown)!r}; expected M, *, - or E")
    return {"ssm": pattern.count("M"), "attn": pattern.count("*"), "mlp": pattern.count("-"), "moe": pattern.count("E")}


def _first(cfg: dict[str, Any], *keys: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _need(cfg: dict[str, Any], where: str, *keys: str, lo: int = 1, hi: int = MAX_DIM) -> int:
    """The first of `keys` the config sets, an integer in [lo, hi]."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None:
        raise UserError(f"{where}: config.json has none of {', '.join(keys)}")
    return _int(cfg[key], key, where, lo, hi)


def _opt(cfg: dict[str, Any], where: str, key: str, default: int, lo: int = 1, hi: int = MAX_DIM) -> int:
    """cfg[key], an integer in [lo, hi], or `default` where the config leaves it out (or null)."""
    return default if cfg.get(key) is None else _int(cfg[key], key, where, lo, hi)


def _names(cfg: dict[str, Any], key: str, where: str) -> list[str] | None:
    """A list of layer-type strings, or None where the config has none."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: {key} must be a list of strings, got {value!r:.60}")
    return value


def _heads(total: int, head_dim: int, where: str, what: str) -> int:
    if total % head_dim:
        raise UserError(f"{where}: {what} = {total} is not a multiple of the head dimension {head_dim}", "set num_heads in config.json")
    return total // head_dim


HF_MODEL_TYPES = ("mamba2", "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_moe", "falcon_h1", "granitemoehybrid")


def _from_hf_config(raw: dict[str, Any], path: Path) -> Preset:
    where = str(path)
    cfg = unwrap_config(raw)
    model_type = _model_type(raw, cfg)
    base_type = model_type.removesuffix("_text")
    cfg = _resolve_auto(cfg, base_type, where)
    if not model_type and "ssm_cfg" in cfg and "d_model" in cfg:
        base_type = "mamba_ssm"
    sources: dict[str, str] = {}
    estimated: dict[str, str] = {}
    notes: list[str] = []

    if base_type == "mamba2":
        hidden = _need(cfg, where, "hidden_size", hi=MAX_E2E)
        head_dim = _need(cfg, where, "head_dim")
        expand = _opt(cfg, where, "expand", 2, hi=64)
        if cfg.get("num_heads") is not None:
            heads = _need(cfg, where, "num_heads")
        else:
            heads = _heads(expand * hidden, head_dim, where, "expand x hidden_size")
        shape: SSMShape = Mamba2Shape(H=heads, P=head_dim, N=_need(cfg, where, "state_size"), G=_opt(cfg, where, "n_groups", 1))
        ssm_layers, attn_layers = _need(cfg, where, "num_hidden_layers", hi=MAX_LAYERS), 0
    elif base_type == "mamba_ssm":
        ssm_cfg = cfg.get("ssm_cfg") or {}
        if not isinstance(ssm_cfg, dict):
            raise UserError(f"{where}: ssm_cfg must be an object, got {ssm_cfg!r:.60}")
        hidden, head_dim = _need(cfg, where, "d_model", hi=MAX_E2E), _opt(ssm_cfg, where, "headdim", 64)
        heads = _heads(_opt(ssm_cfg, where, "expand", 2, hi=64) * hidden, head_dim, where, "expand x d_model")
        shape = Mamba2Shape(H=heads, P=head_dim, N=_opt(ssm_cfg, where, "d_state", 128), G=_opt(ssm_cfg, where, "ngroups", 1))
        n_layers = _need(cfg, where, "n_layer", hi=MAX_LAYERS)
        attn_idx = cfg.get("attn_layer_idx") or []
        if not isinstance(attn_idx, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers for i in attn_idx):
            raise UserError(f"{where}: attn_layer_idx must be a list of layer indices below n_layer={n_layers}, got {attn_idx!r:.60}")
        attn_layers = len(set(attn_idx))
        ssm_layers = n_layers - attn_layers
        cfg = {**cfg, "hidden_size": hidden}
        notes.append("mamba_ssm config: expand, headdim, d_state and ngroups default to Mamba2's 2, 64, 128 and 1 where ssm_cfg omits them")
    elif base_type == "nemotron_h":
        shape = Mamba2Shape(
            H=_need(cfg, where, "mamba_num_heads"),
            P=_need(cfg, where, "mamba_head_dim"),
            N=_need(cfg, where, "ssm_state_size"),
            G=_need(cfg, where, "n_groups", "mamba_n_groups"),
        )
        pattern = cfg.get("hybrid_override_pattern")
        if pattern is not None and not isinstance(pattern, str):
            raise UserError(f"{where}: hybrid_override_pattern must be a string of M, *, - and E, got {pattern!r:.60}")
        block_types = _names(cfg, "layers_block_type", where)
        if pattern:
            counts = pattern_counts(pattern)
        elif block_types is not None:
            types = block_types
            counts = {"ssm": types.count("mamba"), "attn": types.count("attention"), "mlp": types.count("mlp"), "moe": types.count("moe")}
        else:
            raise UserError(f"{where}: nemotron_h config.json has neither hybrid_override_pattern nor layers_block_type")
        ssm_layers, attn_layers = counts["ssm"], counts["attn"]
        cfg = {**cfg, "mlp_layers": counts["mlp"] or None, "moe_layers": counts["moe"] or None, "head_dim": _first(cfg, "head_dim", "attention_head_dim")}
    elif base_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe"):
        shape = GDNShape(
            H=_need(cfg, where, "linear_num_key_heads"),
            HV=_need(cfg, where, "linear_num_value_heads"),
            K=_need(cfg, where, "linear_key_head_dim"),
            V=_need(cfg, where, "linear_value_head_dim"),
        )
        n_layers = _need(cfg, where, "num_hidden_layers", hi=MAX_LAYERS)
        types = _names(cfg, "layer_types", where)
        if types is not None:
            ssm_layers, attn_layers = types.count("linear_attention"), types.count("full_attention")
        else:
            interval = _opt(cfg, where, "full_attention_interval", 4, hi=MAX_LAYERS)
            attn_layers = n_layers // interval
            ssm_layers = n_layers - attn_layers
        if cfg.get("num_experts"):
            mlp_only = cfg.get("mlp_only_layers") or []
            if not isinstance(mlp_only, list):
                raise UserError(f"{where}: mlp_only_layers must be a list of layer indices, got {mlp_only!r:.60}")
            cfg = {**cfg, "moe_layers": n_layers - len(mlp_only)}
    elif base_type in ("falcon_h1", "granitemoehybrid"):
        shape = Mamba2Shape(
            H=_need(cfg, where, "mamba_n_heads"),
            P=_need(cfg, where, "mamba_d_head"),
            N=_need(cfg, where, "mamba_d_state"),
            G=_opt(cfg, where, "mamba_n_groups", 1),
        )
        n_layers = _need(cfg, where, "num_hidden_layers", hi=MAX_LAYERS)
        if base_type == "falcon_h1":
            # Falcon-H1 runs attention and SSM side by side in every layer.
            ssm_layers, attn_layers = n_layers, n_layers
        else:
            types = _names(cfg, "layer_types", where) or []
            if not types:
                raise UserError(f"{where}: granitemoehybrid config.json has no layer_types")
            ssm_layers, attn_layers = types.count("mamba"), types.count("attention")
    else:
        got = f"model_type {model_type!r}" if model_type else "no model_type"
        raise UserError(f"{where}: {got}; supported config.json model types: {', '.join(HF_MODEL_TYPES)}", "or write a preset .toml (see profiles/models/)")

    cfg = {**cfg, **_derived_e2e(cfg, base_type, attn_layers)}
    state_dtype, why = _hf_state_dtype(raw, cfg, where, base_type)
    if why:
        estimated["state_dtype"] = why
    e2e_map = {
        "hidden_size": ("hidden_size",),
        "num_attention_heads": ("num_attention_heads",),
        "num_key_value_heads": ("num_key_value_heads",),
        "head_dim": ("head_dim",),
        "intermediate_size": ("intermediate_size",),
        "num_experts": ("num_experts", "n_routed_experts", "num_local_experts"),
        "experts_per_token": ("num_experts_per_tok",),
        "moe_intermediate_size": ("moe_intermediate_size",),
        "shared_expert_intermediate_size": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size", "shared_intermediate_size"),
        "moe_latent_size": ("moe_latent_size",),
        "mlp_layers": ("mlp_layers",),
        "moe_layers": ("moe_layers",),
        "vocab_size": ("vocab_size",),
    }
    e2e = {}
    for key, names in e2e_map.items():
        found = next((n for n in names if cfg.get(n) is not None), None)
        if found is not None and cfg[found] != 0:
            e2e[key] = _int(cfg[found], found, where, 1, MAX_E2E)
    for group in ("ssm", "layers", "state_dtype", "e2e"):
        sources[group] = where
    sources["a_log_range"] = "not in config.json; see [estimated]"
    op = ops.of(shape)
    kind, a_range = op.name, op.a_log_range
    estimated["a_log_range"] = "config.json does not give the decay; the initialisation range is used"
    name = (path.parent.name if path.name == "config.json" and path.parent.name else path.stem).lower()
    preset = Preset(
        name=name,
        display=path.parent.name if path.name == "config.json" and path.parent.name else path.stem,
        kind=kind,
        ssm_layers=ssm_layers,
        attn_layers=attn_layers,
        shape=shape,
        state_dtype=state_dtype,
        dt_softplus=True,
        has_D=op.has_D,
        has_z=False,
        a_log_range=a_range,
        e2e=e2e or None,
        sources=sources,
        estimated=tuple(estimated),
        estimated_reasons=estimated,
        notes=tuple(notes),
        hf_id=raw.get("_name_or_path") or None,
        origin=where,
    )
    validate(preset)
    return preset


def _hf_state_dtype(raw: dict[str, Any], cfg: dict[str, Any], where: str = "config.json", base_type: str = "") -> tuple[str, str | None]:
    """The SSM state dtype a config asks for, else its family's shipped choice, else the model dtype (vLLM's 'auto');
    the second item says why when inferred. A dtype named that no kernel stores (float64, int8, ...) is an error,
    not replaced by another."""
    explicit_key = next((k for k in ("mamba_ssm_cache_dtype", "mamba_ssm_dtype") if cfg.get(k) is not None), None)
    if explicit_key is not None and str(cfg[explicit_key]).lower() != "auto":
        return _state_dtype_of(cfg[explicit_key], explicit_key, where), None
    if base_type in FAMILY_STATE_DTYPES:
        return FAMILY_STATE_DTYPES[base_type]
    model_key = next((k for k in ("dtype", "torch_dtype") if cfg.get(k) is not None), None)
    model_dtype = cfg[model_key] if model_key else _first(raw, "dtype", "torch_dtype")
    if model_dtype is not None and str(model_dtype).lower() != "auto":
        name = _state_dtype_of(model_dtype, model_key or "torch_dtype", where)
        return name, "config.json sets no SSM state dtype; the model dtype is used, as vLLM's 'auto' does"
    return "bf16", "config.json sets neither an SSM state dtype nor a model dtype (or says 'auto'); bf16 assumed, as the engines load such checkpoints"


def _state_dtype_of(value: Any, key: str, where: str) -> str:
    name = canonical(value) if isinstance(value, str) else None
    if name not in STATE_DTYPES:
        raise UserError(f"{where}: {key} {value!r:.60} is not a state dtype the kernels store", f"they store {', '.join(STATE_DTYPES)} (float32, bfloat16, float16)")
    return name


# Wrappers under which Hugging Face configs keep the language model's figures (multimodal and speech models).
CONFIG_WRAPPERS = ("text_config", "llm_config", "language_config")
# The state dtype a family ships with when its config.json names none (older Nemotron-H files predate the field).
FAMILY_STATE_DTYPES = {
    "nemotron_h": ("fp32", "config.json sets no mamba_ssm_cache_dtype; float32 is the Nemotron-H family's shipped choice "
                   "(mamba_ssm_cache_dtype = \"float32\" in NVIDIA's nemotron_h configs)"),
}


def unwrap_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: the first wrapper (text_config, llm_config, language_config) over the outer keys."""
    for key in CONFIG_WRAPPERS:
        if isinstance(raw.get(key), dict):
            return {**{k: v for k, v in raw.items() if k not in CONFIG_WRAPPERS}, **raw[key]}
    return dict(raw)


def _model_type(raw: dict[str, Any], cfg: dict[str, Any]) -> str:
    """The language model's model_type: the wrapped one where the reader knows it (a multimodal wrapper names itself
    outside), else the outer one."""
    for value in (cfg.get("model_type"), raw.get("model_type")):
        if value and str(value).removesuffix("_text") in HF_MODEL_TYPES:
            return str(value)
    return str(raw.get("model_type") or cfg.get("model_type") or "")


def _resolve_auto(cfg: dict[str, Any], base_type: str, where: str) -> dict[str, Any]:
    """Hugging Face's "auto" values, derived as the model's config class derives them.

    Falcon-H1: mamba_d_ssm defaults to mamba_expand x hidden_size and mamba_d_head "auto" is
    mamba_d_ssm / mamba_n_heads. An "auto" this does not know how to derive is refused in one line.
    """
    out = dict(cfg)
    if base_type == "falcon_h1":
        d_ssm = out.get("mamba_d_ssm")
        expand = out.get("mamba_expand", 2)
        if d_ssm is None and isinstance(out.get("hidden_size"), int) and _is_number(expand) and expand > 0:
            d_ssm = int(expand * out["hidden_size"])
            out["mamba_d_ssm"] = d_ssm
        if out.get("mamba_d_head") == "auto":
            heads = out.get("mamba_n_heads")
            if not isinstance(d_ssm, int) or not isinstance(heads, int) or heads <= 0 or d_ssm % heads:
                raise UserError(f"{where}: mamba_d_head is \"auto\" but mamba_d_ssm={d_ssm!r} is not a multiple of mamba_n_heads={heads!r}")
            out["mamba_d_head"] = d_ssm // heads
    autos = sorted(k for k, v in out.items() if v == "auto" and k not in ("dtype", "torch_dtype", "mamba_ssm_cache_dtype"))
    read = {"mamba_d_head", "mamba_n_heads", "mamba_d_state", "mamba_n_groups", "head_dim", "hidden_size", "intermediate_size"}
    unknown = [k for k in autos if k in read]
    if unknown:
        raise UserError(f"{where}: {', '.join(unknown)} is \"auto\", which this reader cannot derive for model_type {base_type!r}",
                        "replace it with the number the model uses, or write a preset .toml")
    return out


def _derived_e2e(cfg: dict[str, Any], base_type: str, attn_layers: int) -> dict[str, Any]:
    """The [e2e] figures a config implies without naming them: MLP/MoE blocks per layer and the attention head size."""
    out: dict[str, Any] = {}
    n_layers = cfg.get("num_hidden_layers")
    heads, hidden = cfg.get("num_attention_heads"), cfg.get("hidden_size")
    if attn_layers and cfg.get("head_dim") is None and isinstance(heads, int) and isinstance(hidden, int) and heads > 0:
        out["head_dim"] = hidden // heads
    if not isinstance(n_layers, int):
        return out
    if base_type == "falcon_h1" and cfg.get("intermediate_size"):
        # Each Falcon-H1 layer runs attention and Mamba-2 side by side, then one MLP.
        out["mlp_layers"] = n_layers
    elif base_type == "granitemoehybrid":
        if cfg.get("num_local_experts"):
            # Granite's intermediate_size is each expert's; shared_intermediate_size the shared expert's.
            out.update(moe_layers=n_layers, moe_intermediate_size=cfg.get("intermediate_size"), intermediate_size=None)
        elif cfg.get("shared_intermediate_size") or cfg.get("intermediate_size"):
            out.update(mlp_layers=n_layers, intermediate_size=cfg.get("shared_intermediate_size") or cfg.get("intermediate_size"))
    elif base_type in ("qwen3_next", "qwen3_5", "qwen3_5_moe") and not cfg.get("num_experts") and cfg.get("intermediate_size"):
        out["mlp_layers"] = n_layers
    return out


def read_with_transformers(path: Path) -> dict[str, Any] | None:
    """The config through transformers' AutoConfig (its own defaults and derived values) where transformers is installed
    and knows the model type; None otherwise, and the file is read as JSON."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        return AutoConfig.from_pretrained(str(path.parent if path.name == "config.json" else path)).to_dict()
    except Exception:  # noqa: BLE001 - an unknown model type or a remote-code config: the JSON reader handles it
        return None
