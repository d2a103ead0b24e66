"""The results file: a versioned JSON document (environment, spec, rows), rewritten atomically as rows finish."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from replayssm_cli.errors import UserError

SCHEMA_VERSION = 2
KIND = "replayssm-results"
# Version 1 named a speculative step's speedup over plain decode `speedup` (x_spec_speedup: over snapshots) and had
# no speedup_over or mem_per_seq_model; `upgrade` turns such a document into the current version on load.
READABLE_VERSIONS = (1, SCHEMA_VERSION)
# Far above what a profile writes (10,000 rows with their samples are about 60 MB).
MAX_FILE_BYTES = 1 << 30

SPEEDUP_OVER = ("conventional", "snapshots", "fp32-conventional")

# Every kernel row carries these keys (a value may be None where it does not apply).
ROW_FIELDS: dict[str, str] = {
    "kind": "'kernel' (one SSM layer's decode kernel) or 'e2e' (a whole model decode step)",
    "op": "'mamba2' or 'gdn'",
    "preset": "model preset name",
    "variant": "conventional | replay | split | spec-conventional | spec-replay | baseline:<name>",
    "phase": "avg (whole-window average) | nonflush | flush",
    "batch": "sequences decoded per step",
    "window": "ReplaySSM window W (None for conventional)",
    "state_dtype": "dtype of the stored state or checkpoint (fp8 and int8: 8-bit rows, each with an fp32 scale)",
    "rounding": "how stored states are rounded: 'nearest' or 'stochastic' (rows written without it: nearest)",
    "read_dtype": "dtype of the low-precision read copy (None without split precision)",
    "io_dtype": "dtype of x, B, C, z, q, k, v and outputs",
    "draft": "speculative draft tokens per verify step T (0 for plain decode)",
    "accepted": "mean drafts accepted per verify step (None without drafts)",
    "tp": "tensor-parallel degree the heads were divided by",
    "layers": "SSM layers in the timed stack",
    "flush": "'staggered' or 'aligned'",
    "source": "'measured' or 'predicted'",
    "status": "'ok' or 'failed' (a failed kernel carries no time)",
    "us": "median time of one decode step of one layer, microseconds",
    "us_p50": "50th percentile of per-step samples, microseconds",
    "us_p95": "95th percentile of per-step samples, microseconds",
    "us_p99": "99th percentile of per-step samples, microseconds",
    "spread": "(p75 - p25) / median of the samples (a fraction)",
    "tokens_per_step": "tokens committed per step (1, or accepted + 1 with drafts)",
    "us_per_token": "us / tokens_per_step, microseconds",
    "us_model_step": "us times the preset's SSM layer count (all SSM layers of one model step), microseconds",
    "bytes_read": "modelled DRAM bytes read per step per layer",
    "bytes_written": "modelled DRAM bytes written per step per layer",
    "flops": "modelled FLOPs per step per layer",
    "int_ops": "modelled integer operations per step per layer of stochastic rounding's random draws (not in flops)",
    "intensity": "flops / (bytes_read + bytes_written), FLOP per byte",
    "gbs": "achieved bandwidth, GB/s (modelled bytes over measured or predicted time)",
    "pct_copy_bw": "gbs as a percentage of the ceiling used (measured copy bandwidth where known)",
    "flops_per_s": "achieved FLOP/s",
    "speedup": "us_per_token of the row named by speedup_over over this row's, same preset, batch and dtypes (None for a baseline row)",
    "speedup_over": "what speedup is over: 'conventional' (the conventional step at the same state precision), "
                    "'snapshots' (the snapshot-writing decode_multi, for spec-replay), 'fp32-conventional' (the fp32 "
                    "conventional step, for split precision) or None for a baseline row",
    "speedup_lo": "pessimistic speedup: this row's p75 against the baseline's p25",
    "speedup_hi": "optimistic speedup: this row's p25 against the baseline's p75",
    "speedup_vs_decode": "speculative rows: plain conventional decode's us_per_token over this row's (None otherwise)",
    "speedup_vs_fp32": "rows with a low-precision state or stochastic rounding: the fp32 conventional step's "
                       "us_per_token over this row's, where the run measured it (None otherwise)",
    "mem_per_seq": "bytes one sequence holds in one SSM layer: checkpoint or state, read copy, buffers, snapshots",
    "mem_per_seq_model": "mem_per_seq times the preset's SSM layer count: bytes one sequence holds in the whole model",
    "seqs_fit": "sequences whose per-layer state of every SSM layer fits in the GPU's free memory",
    "check_max_err": "max relative error against the reference before timing (None when predicted)",
}

_NUM = {"type": ["number", "null"], "minimum": 0}
_POS = {"type": ["number", "null"], "exclusiveMinimum": 0}
_INT = {"type": ["integer", "null"], "minimum": 0}
_DTYPES = ["fp32", "bf16", "fp16", "fp8", "int8"]
# The JSON Schema type of each row field (ROW_FIELDS gives its meaning).
ROW_TYPES: dict[str, dict[str, Any]] = {
    "kind": {"enum": ["kernel", "e2e"]},
    "op": {"enum": ["mamba2", "gdn"]},
    "preset": {"type": "string", "minLength": 1},
    "variant": {"type": "string", "pattern": "^(conventional|replay|split|spec-conventional|spec-replay|baseline:.+)$"},
    "phase": {"enum": ["avg", "nonflush", "flush"]},
    "batch": {"type": "integer", "minimum": 1},
    "window": {"type": ["integer", "null"], "minimum": 1},
    "state_dtype": {"enum": [*_DTYPES, None]},
    "rounding": {"enum": ["nearest", "stochastic", None]},
    "read_dtype": {"enum": [*_DTYPES, None]},
    "io_dtype": {"enum": [*_DTYPES, None]},
    "draft": _INT,
    "accepted": _NUM,
    "tp": {"type": ["integer", "null"], "minimum": 1},
    "layers": {"type": ["integer", "null"], "minimum": 1},
    "flush": {"enum": ["staggered", "aligned", None]},
    "source": {"enum": ["measured", "predicted"]},
    "status": {"enum": ["ok", "failed"]},
    **dict.fromkeys(("us", "us_p50", "us_p95", "us_p99", "us_per_token", "us_model_step"), _POS),
    "spread": _NUM,
    "tokens_per_step": _POS,
    **dict.fromkeys(("bytes_read", "bytes_written", "flops", "int_ops"), _INT),
    **dict.fromkeys(("intensity", "gbs", "pct_copy_bw", "flops_per_s", "check_max_err"), _NUM),
    **dict.fromkeys(("speedup", "speedup_lo", "speedup_hi", "speedup_vs_decode", "speedup_vs_fp32"), _POS),
    "speedup_over": {"enum": [*SPEEDUP_OVER, None]},
    **dict.fromkeys(("mem_per_seq", "mem_per_seq_model", "seqs_fit"), _INT),
}

_US = {"type": ["number", "null"], "minimum": 0}
_BYTES = {"type": ["integer", "null"], "minimum": 0}
# The extra fields `replayssm profile` writes, with their units (other x_ fields are free-form).
PROFILE_EXTRAS: dict[str, tuple[str, dict[str, Any]]] = {
    "x_us_p25": ("25th percentile of per-step samples, microseconds", _US),
    "x_us_p75": ("75th percentile of per-step samples, microseconds", _US),
    "x_samples_us": ("the per-step samples, microseconds", {"type": "array", "items": {"type": "number"}}),
    "x_steps": ("decode steps per timed CUDA-graph replay", {"type": "integer"}),
    "x_repeats": ("timed replays", {"type": "integer"}),
    "x_fill": ("buffer fill at which a nonflush or flush row was measured (None for avg)", {"type": ["integer", "null"]}),
    "x_flush_us": ("avg rows: the flush step's time, microseconds", _US),
    "x_nonflush_us": ("avg rows: the non-flush step's time, microseconds", _US),
    "x_flush_cost_us": ("avg rows: flush minus non-flush time, microseconds", {"type": ["number", "null"]}),
    "x_flush_share": ("avg rows: x_flush_cost_us / window / us, a fraction of the average step", {"type": ["number", "null"]}),
    "x_mem_state": ("mem_per_seq's part: state or full-precision checkpoint, bytes", _BYTES),
    "x_mem_read_copy": ("mem_per_seq's part: low-precision read copy with its scales, bytes", _BYTES),
    "x_mem_buffers": ("mem_per_seq's part: ReplaySSM input buffers, bytes", _BYTES),
    "x_mem_counters": ("mem_per_seq's part: fill and arrival counters, bytes", _BYTES),
    "x_mem_snapshots": ("mem_per_seq's part: spec-conventional's draft snapshots, bytes", _BYTES),
    "x_stack_bytes": ("bytes of the timed stack's state pools (layers x batch), bytes", _BYTES),
    "x_tolerance": ("the relative error the check against the reference allowed", {"type": ["number", "null"]}),
    "x_accepted_drawn": ("speculative rows: mean drafts accepted in the timed steps' drawn acceptances", {"type": ["number", "null"]}),
    "x_competes": ("baseline rows: our variant the outside kernel competes with", {"type": "string"}),
    "x_vs_ours": ("baseline rows: its us_per_token over our kernel's (above 1, ours is faster)", {"type": ["number", "null"]}),
    "x_ours_us": ("baseline rows: our kernel's us_per_token, microseconds", _US),
    "x_origin": ("rows of a merged reference: the file, GPU, date and commit the row was measured at", {"type": "object"}),
}

# Structured extra fields every reader may rely on (other x_ fields are free-form).
EXTRA_TYPES: dict[str, dict[str, Any]] = {
    **{k: {"description": d, **t} for k, (d, t) in PROFILE_EXTRAS.items()},
    "x_prediction": {
        "description": "how a predicted row was predicted: method ('calibrated': the cost model's bytes and FLOPs over the "
                       "ceilings times an efficiency fitted to measured profiles; 'roofline': over the ceilings alone), the "
                       "GPU the efficiencies were fitted on, and the fit's relative error (a fraction)",
        "type": "object",
        "required": ["method"],
        "properties": {
            "method": {"enum": ["calibrated", "roofline"]},
            "calibrated_on": {"type": ["string", "null"]},
            "fit_error": {"type": ["number", "null"], "minimum": 0},
        },
    },
    "x_reference": {
        "description": "the shipped measurement of the same configuration beside a predicted row: its us, speedup "
                       "and the file, GPU, date and commit it was measured at",
        "type": "object",
        "required": ["us", "file"],
        "properties": {
            "us": _POS, "speedup": _POS, "file": {"type": "string"}, "gpu": {"type": ["string", "null"]},
            "date": {"type": ["string", "null"]}, "commit": {"type": ["string", "null"]},
        },
    },
}

REQUIRED = ("kind", "op", "preset", "variant", "phase", "batch", "source", "status")

SCHEMA_ID = "https://github.com/replayssm/replayssm/profiles/schema/results.schema.json"


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a results file of SCHEMA_VERSION; profiles/schema/results.schema.json is
    this, written by `python -m replayssm_cli.report.results --schema`."""
    row_props = {k: {"description": ROW_FIELDS[k], **ROW_TYPES[k]} for k in ROW_FIELDS}
    row_props.update(EXTRA_TYPES)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": f"replayssm results file, schema version {SCHEMA_VERSION}",
        "description": "Written by `replayssm profile` and `replayssm e2e`: the environment it ran in, what was run "
                       "(spec), one row per measured or predicted configuration, and what was not run (skipped). "
                       "Times are microseconds, bytes are bytes, bandwidth GB/s. Load the rows with pandas: "
                       "pd.json_normalize(json.load(open(path)), 'rows'). Files of schema version 1 are upgraded "
                       "on load by replayssm_cli.report.results.upgrade.",
        "type": "object",
        "required": ["kind", "schema_version", "environment", "rows"],
        "properties": {
            "kind": {"const": KIND},
            "schema_version": {"const": SCHEMA_VERSION},
            "created": {"type": "string", "description": "when the run started, ISO 8601 UTC"},
            "complete": {"type": "boolean", "description": "false while the run is going and when it was cut short"},
            "environment": {
                "type": "object",
                "description": "GPU (name, driver, key, ...), software versions (replayssm, torch, triton, cuda), git "
                               "commit, the ceilings used (GB/s, TFLOP/s) and the clocks sampled during the run",
                "properties": {"gpu": {"type": "object"}, "ceilings": {"type": ["object", "null"]},
                               "commit": {"type": ["string", "null"]}},
            },
            "spec": {"type": "object", "description": "what was run: the grid's axes and the timing settings"},
            "rows": {"type": "array", "items": {"$ref": "#/$defs/row"}},
            "skipped": {
                "type": "array",
                "description": "configurations not run, each with why",
                "items": {"type": "object", "required": ["what", "why"],
                          "properties": {"what": {"type": "string"}, "why": {"type": "string"}}},
            },
        },
        "$defs": {
            "row": {
                "type": "object",
                "description": "one configuration's figures; extra fields start with x_",
                "required": list(REQUIRED),
                "properties": row_props,
                "patternProperties": {"^x_": {}},
                "additionalProperties": False,
            },
        },
    }


def schema_path() -> Path:
    """The shipped JSON Schema of the results file."""
    from importlib import resources

    return Path(str(resources.files("replayssm_profiles") / "schema" / "results.schema.json"))


def speedup_over_of(row: dict[str, Any]) -> str | None:
    """What a row's speedup is over, from its variant (for rows written without speedup_over)."""
    if row.get("speedup") is None:
        return None
    variant = row.get("variant") or ""
    if variant == "spec-replay":
        return "snapshots"
    if variant == "split" and row.get("state_dtype") == "fp32":
        return "fp32-conventional"
    return "conventional"


def rounding_of(row: dict[str, Any]) -> str:
    """How a row's stored states were rounded: its `rounding`, or nearest for a row written before the field."""
    return row.get("rounding") or "nearest"


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A results document of an older schema version as the current version (a new dict; rows copied).

    Version 1 -> 2: a speculative row's `speedup` (over plain decode) becomes `speedup_vs_decode`; spec-replay's
    x_spec_speedup (over snapshots) becomes `speedup`, spec-conventional (the snapshot baseline) gets none;
    `speedup_over` names each speedup's baseline; `mem_per_seq_model` is mem_per_seq times the preset's SSM layers
    (us_model_step / us).
    """
    if doc.get("schema_version") == SCHEMA_VERSION:
        return doc
    old_rows = doc.get("rows") if isinstance(doc.get("rows"), list) else []
    rows = []
    for old in old_rows:
        if not isinstance(old, dict):
            rows.append(old)
            continue
        r = dict(old)
        if r.get("variant") in ("spec-replay", "spec-conventional"):
            r["speedup_vs_decode"] = r.get("speedup")
            r["speedup"] = r.pop("x_spec_speedup", None)
            r["speedup_lo"] = r.pop("x_spec_speedup_lo", None)
            r["speedup_hi"] = r.pop("x_spec_speedup_hi", None)
            if r["variant"] == "spec-replay" and r["speedup"] is None:
                r["speedup"] = r["speedup_lo"] = r["speedup_hi"] = _over_snapshots(r, old_rows)
        r.setdefault("speedup_vs_decode", None)
        r["speedup_over"] = speedup_over_of(r)
        if "mem_per_seq_model" not in r:
            per_seq, us, model = r.get("mem_per_seq"), r.get("us"), r.get("us_model_step")
            layers = round(model / us) if isinstance(us, (int, float)) and isinstance(model, (int, float)) and us > 0 else None
            r["mem_per_seq_model"] = per_seq * layers if isinstance(per_seq, int) and layers else None
        if r.get("source") == "predicted" and "x_prediction" not in r:
            r["x_prediction"] = {"method": "roofline", "calibrated_on": None, "fit_error": None}
        rows.append(r)
    return {**doc, "schema_version": SCHEMA_VERSION, "rows": rows}


def _over_snapshots(row: dict[str, Any], rows: list[Any]) -> float | None:
    """A spec-replay row's speedup over its file's spec-conventional row of the same configuration, per token."""
    same = ("preset", "batch", "state_dtype", "io_dtype", "tp", "draft", "source")
    for r in rows:
        if (isinstance(r, dict) and r.get("variant") == "spec-conventional" and r.get("phase") == "avg"
                and r.get("status") == "ok" and all(r.get(k) == row.get(k) for k in same)):
            base, mine = r.get("us_per_token"), row.get("us_per_token")
            if isinstance(base, (int, float)) and isinstance(mine, (int, float)) and mine > 0:
                return base / mine
    return None


def schema_errors(doc: Any, limit: int = 5) -> list[str]:
    """Where a results document breaks the shipped JSON Schema (empty when it conforms), at most `limit` lines.

    Needs the jsonschema package (the test extra: pip install 'replayssm[test]')."""
    try:
        import jsonschema
    except ImportError:
        raise UserError("checking a results file against its schema needs the jsonschema package",
                        "pip install jsonschema") from None

    validator = jsonschema.Draft202012Validator(json.loads(schema_path().read_text()))
    errors = []
    for e in validator.iter_errors(doc):
        where = "/".join(str(p) for p in e.absolute_path) or "(document)"
        errors.append(f"{where}: {e.message}")
        if len(errors) >= limit:
            break
    return errors




@dataclass
class Results:
    """A loaded results file."""

    path: Path | None
    environment: dict[str, Any]
    spec: dict[str, Any]
    rows: list[dict[str, Any]]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = True
    created: str = ""
    schema_version: int = SCHEMA_VERSION

    def frame(self):
        """The rows as a pandas DataFrame (imports pandas)."""
        import pandas as pd

        return pd.DataFrame(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": self.schema_version,
            "created": self.created,
            "complete": self.complete,
            "environment": self.environment,
            "spec": self.spec,
            "rows": self.rows,
            "skipped": self.skipped,
        }


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def validate_row(row: Any) -> None:
    """ValueError (one line) for a row that breaks the schema: not an object, a required field missing, an unknown
    field, or a field of the wrong type or range (ROW_TYPES)."""
    if not isinstance(row, dict):
        raise ValueError(f"a results row is an object, not {type(row).__name__}")
    missing = [k for k in REQUIRED if row.get(k) is None]
    if missing:
        raise ValueError(f"results row lacks {', '.join(missing)}: {_short(row)}")
    unknown = [k for k in row if k not in ROW_FIELDS and not k.startswith("x_")]
    if unknown:
        raise ValueError(f"results row has unknown fields {', '.join(unknown)} (extra fields start with 'x_')")
    for key, value in row.items():
        check = _CHECKS.get(key)
        if check is not None and not check(value):
            raise ValueError(f"results row's {key} is {_short(value)}: {_breaks(value, ROW_TYPES[key])}")


_JSON_TYPES = {"null": type(None), "string": str, "integer": int, "number": (int, float), "boolean": bool,
               "object": dict, "array": list}


def _breaks(value: Any, rule: dict[str, Any]) -> str | None:
    """What of `rule` (the part of JSON Schema that ROW_TYPES uses) `value` breaks, or None."""
    if "enum" in rule and not any(value == v and type(value) is type(v) for v in rule["enum"]):
        return "must be one of " + ", ".join("null" if v is None else str(v) for v in rule["enum"])
    types = rule.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        ok = any(isinstance(value, _JSON_TYPES[n]) and not (isinstance(value, bool) and n in ("integer", "number"))
                 for n in names)
        if not ok:
            return "must be " + " or ".join(names)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in rule and value < rule["minimum"]:
            return f"must be at least {rule['minimum']}"
        if "exclusiveMinimum" in rule and value <= rule["exclusiveMinimum"]:
            return f"must be above {rule['exclusiveMinimum']}"
    if isinstance(value, str):
        if len(value) < rule.get("minLength", 0):
            return "must not be empty"
        if "pattern" in rule and not re.search(rule["pattern"], value):
            return f"must match {rule['pattern']}"
    return None


def _checker(rule: dict[str, Any]):
    """A fast yes/no test of `rule` (what `_breaks` explains): one call per field of every row loaded."""
    if "enum" in rule:
        allowed = frozenset(rule["enum"])
        # a str Enum member (the CLI's dtype options) counts as its value
        return lambda v: (None in allowed) if v is None else (isinstance(v, str) and getattr(v, "value", v) in allowed)
    names = [rule["type"]] if isinstance(rule["type"], str) else rule["type"]
    kinds = tuple(t for n in names if n != "null" for t in ((int, float) if n == "number" else (_JSON_TYPES[n],)))
    nullable = "null" in names
    lo, above = rule.get("minimum"), rule.get("exclusiveMinimum")
    pattern = re.compile(rule["pattern"]) if "pattern" in rule else None
    min_len = rule.get("minLength", 0)

    def check(v: Any) -> bool:
        if v is None:
            return nullable
        t = type(v)
        if t not in kinds and (isinstance(v, bool) or not isinstance(v, kinds)):
            return False
        if isinstance(v, float) and not math.isfinite(v):
            # written as null (_finite)
            return nullable
        if isinstance(v, (int, float)):
            return (lo is None or v >= lo) and (above is None or v > above)
        if isinstance(v, str):
            return len(v) >= min_len and (pattern is None or pattern.search(v) is not None)
        return True

    return check


_CHECKS = {key: _checker(rule) for key, rule in ROW_TYPES.items()}


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


TEMP_SUFFIX = ".tmp"
LOCK_SUFFIX = ".lock"


def is_results_name(path: Path) -> bool:
    """Whether a file name can be a results file: *.json, not hidden (temporary and lock files are hidden)."""
    return path.suffix == ".json" and not path.name.startswith(".")


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so the file on disk is always whole.

    The temporary file is hidden and does not end in .json (`.<name>.<pid>.tmp`), so no loader takes it for a
    results file if the process is killed mid-write; on any exception it is removed. The file gets the mode a new
    file would (the umask's), not mkstemp's 0600.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_finite(doc), fh, indent=1, default=str)
            fh.write("\n")
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_results_file(path: Path) -> bool:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and doc.get("kind") == KIND


def check_out_path(path: Path, option: str = "--out") -> None:
    """UserError (one line) for a results path that cannot be one: empty, a directory, or an existing file that is
    not a replayssm results file (which a run would overwrite)."""
    text = str(path)
    if not text.strip() or text == ".":
        raise UserError(f"{option} is empty", f"pass a file name, e.g. {option} runs/profile.json")
    if path.is_dir():
        raise UserError(f"{option} {path} is a directory", f"pass a file name inside it, e.g. {option} {path / 'profile.json'}")
    if path.exists() and not path.is_file():
        raise UserError(f"{option} {path} is not a regular file", "pass the name of a new file or of an earlier results file")
    if path.is_file() and not _is_results_file(path):
        raise UserError(f"{option} {path} exists and is not a replayssm results file: it would be overwritten",
                        "pass another file name")


class ResultsWriter:
    """Keeps a results file current: every added row rewrites it whole, marked incomplete until closed.

    One run owns the file: a hidden lock file beside it (`.<name>.lock`, holding the pid) makes a second run on
    the same path a UserError while the first lives; with `exclusive` the file must not exist yet (it is created
    with O_EXCL), so two runs can never share a generated name. An existing file that is not a replayssm results
    file is never overwritten. Skips are written with the next row or at close, so cutting a run short writes the
    file once.
    """

    def __init__(self, path: Path, environment: dict[str, Any], spec: dict[str, Any], *, exclusive: bool = False):
        self.results = Results(
            path=Path(path),
            environment=environment,
            spec=spec,
            rows=[],
            skipped=[],
            complete=False,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        path = self.results.path
        check_out_path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = self._take_lock(path)
        try:
            if exclusive:
                with open(path, "x") as fh:
                    json.dump(_finite(self.results.to_dict()), fh, indent=1, default=str)
            self.replaced = path.is_file() and not exclusive
            self._flush()
        except BaseException:
            self.release()
            raise

    @staticmethod
    def _take_lock(path: Path) -> Path:
        lock = path.with_name(f".{path.name}{LOCK_SUFFIX}")
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    pid = int(lock.read_text().strip() or 0)
                except (OSError, ValueError):
                    pid = 0
                if pid and pid != os.getpid() and _pid_alive(pid):
                    raise UserError(f"another replayssm run (pid {pid}) is writing {path}",
                                    "wait for it, or pass another --out") from None
                lock.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(str(os.getpid()))
            return lock
        raise UserError(f"cannot take the lock {lock} for {path}", "pass another --out")

    def release(self) -> None:
        """Give up the file (remove the lock): at close, or when the run ends without closing."""
        if self._lock is not None:
            self._lock.unlink(missing_ok=True)
            self._lock = None

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.results.rows

    def add(self, row: dict[str, Any]) -> None:
        if "speedup" in row and "speedup_over" not in row:
            row["speedup_over"] = speedup_over_of(row)
        validate_row(row)
        self.results.rows.append(row)
        self._flush()

    def skip(self, what: str, why: str) -> None:
        """Record a configuration not run; it reaches the file with the next row or at close."""
        self.results.skipped.append({"what": what, "why": why})

    def close(self, complete: bool = True) -> Results:
        self.results.complete = complete
        try:
            self._flush()
        finally:
            self.release()
        return self.results

    def _flush(self) -> None:
        write_atomic(self.results.path, self.results.to_dict())


def load(path: str | Path) -> Results:
    """Load and check a results file; a missing, corrupt, truncated or foreign file is a UserError."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"results file {p} does not exist", "pass a file written by `replayssm profile`")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UserError(f"results file {p} is {size / 2**30:.1f} GiB, over the {MAX_FILE_BYTES / 2**30:.0f} GiB a results "
                        "file can be", "pass a file written by `replayssm profile`")
    try:
        doc = json.loads(p.read_bytes())
    except RecursionError:
        raise UserError(f"results file {p} nests deeper than a results file does", "pass a file written by `replayssm profile`") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(
            f"results file {p} is not valid JSON ({exc.__class__.__name__} at {getattr(exc, 'pos', '?')}): corrupt or truncated",
            "re-run `replayssm profile` or pass another file",
        ) from None
    return from_dict(doc, p)


def from_dict(doc: Any, path: Path | None = None) -> Results:
    where = str(path) if path else "results"
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise UserError(f"{where} is not a replayssm results file (no kind '{KIND}')", "pass a file written by `replayssm profile`")
    version = doc.get("schema_version")
    if version not in READABLE_VERSIONS:
        raise UserError(
            f"{where} has schema_version {version!r}; this replayssm reads versions {', '.join(map(str, READABLE_VERSIONS))}",
            "re-run `replayssm profile` with this version",
        )
    doc = upgrade(doc)
    version = doc["schema_version"]
    rows = doc.get("rows")
    if not isinstance(rows, list) or not isinstance(doc.get("environment"), dict):
        raise UserError(f"{where} lacks its rows or environment", "re-run `replayssm profile`")
    env, spec, skipped = doc["environment"], doc.get("spec", {}), doc.get("skipped", [])
    if not isinstance(spec, dict) or not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
        raise UserError(f"{where}: spec is an object and skipped a list of objects", "re-run `replayssm profile`")
    for i, row in enumerate(rows):
        try:
            validate_row(row)
        except ValueError as exc:
            raise UserError(f"{where}: row {i} is malformed ({exc})", "re-run `replayssm profile`") from None
    return Results(
        path=path,
        environment=doc["environment"],
        spec=spec,
        rows=rows,
        skipped=skipped,
        complete=bool(doc.get("complete", False)),
        created=doc.get("created", ""),
        schema_version=version,
    )


def newest(directory: str | Path = "runs") -> Path | None:
    """The newest results file under a directory, or None."""
    d = Path(directory)
    if not d.is_dir():
        return None
    files = sorted((f for f in d.glob("*.json") if is_results_name(f) and f.is_file()), key=lambda f: f.stat().st_mtime)
    return files[-1] if files else None


def reference_files(folder: str = "") -> list[Path]:
    """The shipped reference profiles (profiles/reference/*.json), or those of one of its folders (`folder`)."""
    from importlib import resources

    root = resources.files("replayssm_profiles") / "reference"
    if folder:
        root = root / folder
    return sorted(Path(str(p)) for p in root.iterdir() if is_results_name(Path(str(p))))


def energy_reference_rows(gpu_key: str = "h200") -> list[dict[str, Any]]:
    """The rows with energy figures of the shipped energy profiles measured on `gpu_key`
    (profiles/reference/energy/<gpu_key>-*.json, apart from the reference so that their times do not replace its),
    each saying which file it came from (x_origin)."""
    try:
        files = [f for f in reference_files("energy") if f.name.startswith(f"{gpu_key}-")]
    except (FileNotFoundError, ModuleNotFoundError):
        return []
    rows: list[dict[str, Any]] = []
    for f in files:
        res = load(f)
        origin = origin_of(res)
        rows += [{**r, "x_origin": origin} for r in res.rows if r.get("x_energy")]
    return rows


# The fields that name a configuration (a row's measurement aside).
CONFIG_FIELDS = ("kind", "op", "preset", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "io_dtype",
                 "draft", "accepted", "tp", "flush", "source")


def reference_profiles(gpu_key: str = "h200", directory: str | Path | None = None) -> list[Results]:
    """The reference profiles measured on `gpu_key` (files named `<gpu_key>-*.json`), newest first: the shipped ones,
    or those in `directory`."""
    try:
        found = sorted(f for f in Path(directory).glob("*.json") if is_results_name(f)) if directory is not None else reference_files()
    except (FileNotFoundError, ModuleNotFoundError):
        return []
    files = [f for f in found if f.name.startswith(f"{gpu_key}-")]
    return sorted((load(f) for f in files), key=lambda r: r.created, reverse=True)


def load_reference(gpu_key: str = "h200") -> Results | None:
    """The shipped reference profiles measured on `gpu_key` merged into one, newest file first; a configuration
    measured in several files is kept from the newest. None when none ships."""
    loaded = reference_profiles(gpu_key)
    if not loaded:
        return None
    # The merged profile takes the environment of a file that recorded the measured ceilings.
    first = next((r for r in loaded if r.environment.get("ceilings")), loaded[0])
    rows, seen = [], set()
    for r in loaded:
        origin = origin_of(r)
        for row in r.rows:
            key = tuple(row.get(f) for f in CONFIG_FIELDS)
            if key not in seen:
                seen.add(key)
                rows.append({**row, "x_origin": origin})
    return Results(
        path=loaded[0].path.parent if loaded[0].path else None,
        environment=first.environment,
        spec=first.spec,
        rows=rows,
        skipped=[s for r in loaded for s in r.skipped],
        complete=all(r.complete for r in loaded),
        created=first.created,
    )


def origin_of(results: Results) -> dict[str, Any]:
    """Where a loaded file's rows were measured: its file name, GPU, date and commit (a row of a merged reference
    carries this as x_origin)."""
    env = results.environment or {}
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    return {
        "file": results.path.name if results.path else None,
        "gpu": gpu.get("name") or env.get("device_name"),
        "date": (results.created or "")[:10] or None,
        "commit": env.get("commit"),
    }


def rows_matching(rows: Iterable[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--schema"]:
        sys.exit("usage: python -m replayssm_cli.report.results --schema  (prints the results file's JSON Schema)")
    print(json.dumps(json_schema(), indent=1, ensure_ascii=False))


def default_out(gpu_key: str | None, directory: str | Path = "runs", kind: str = "") -> Path:
    """A results path unique to this run: local time to the millisecond and a random suffix, then the GPU key and the
    kind of run (runs/20261130-224658.123-k3f9-h200.json, ...-h200-e2e.json); the writer creates it exclusively."""
    import secrets

    now = datetime.now()
    stamp = now.strftime("%Y%m%d-%H%M%S") + f".{now.microsecond // 1000:03d}-{secrets.token_hex(2)}"
    return Path(directory) / f"{stamp}-{gpu_key or 'gpu'}{'-' + kind if kind else ''}.json"
