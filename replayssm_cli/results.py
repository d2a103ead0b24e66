"""The results file: a versioned JSON document (environment, spec, rows), rewritten atomically as rows finish."""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from replayssm_cli.errors import UserError

SCHEMA_VERSION = 1
KIND = "replayssm-results"

# Every kernel row carries these keys (a value may be None where it does not apply).
ROW_FIELDS: dict[str, str] = {
    "kind": "'kernel' (one SSM layer's decode kernel) or 'e2e' (a whole model decode step)",
    "op": "'mamba2' or 'gdn'",
    "preset": "model preset name",
    "variant": "conventional | replay | split | spec-conventional | spec-replay | baseline:<name>",
    "phase": "avg (whole-window average) | nonflush | flush",
    "batch": "sequences decoded per step",
    "window": "ReplaySSM window W (None for conventional)",
    "state_dtype": "dtype of the stored state or checkpoint",
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
    "us_p50": "50th percentile of per-step samples",
    "us_p95": "95th percentile of per-step samples",
    "us_p99": "99th percentile of per-step samples",
    "spread": "(p75 - p25) / median of the samples",
    "tokens_per_step": "tokens committed per step (1, or accepted + 1 with drafts)",
    "us_per_token": "us / tokens_per_step",
    "us_model_step": "us times the preset's SSM layer count (all SSM layers of one model step)",
    "bytes_read": "modelled DRAM bytes read per step per layer",
    "bytes_written": "modelled DRAM bytes written per step per layer",
    "flops": "modelled FLOPs per step per layer",
    "intensity": "flops / (bytes_read + bytes_written)",
    "gbs": "achieved bandwidth, GB/s (modelled bytes over measured or predicted time)",
    "pct_copy_bw": "gbs as a percentage of the ceiling used (measured copy bandwidth where known)",
    "flops_per_s": "achieved FLOP/s",
    "speedup": "conventional us_per_token over this row's, same preset/batch/dtypes (None for conventional)",
    "speedup_lo": "pessimistic speedup from the samples' p75 and the conventional p25",
    "speedup_hi": "optimistic speedup from the samples' p25 and the conventional p75",
    "mem_per_seq": "bytes per sequence per layer: checkpoint or state, read copy, buffers, snapshots",
    "seqs_fit": "sequences whose per-layer state of every SSM layer fits in the GPU's free memory",
    "check_max_err": "max relative error against the reference before timing (None when predicted)",
}

REQUIRED = ("kind", "op", "preset", "variant", "phase", "batch", "source", "status")


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


def validate_row(row: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED if row.get(k) is None]
    if missing:
        raise ValueError(f"results row lacks {', '.join(missing)}: {row}")
    unknown = [k for k in row if k not in ROW_FIELDS and not k.startswith("x_")]
    if unknown:
        raise ValueError(f"results row has unknown fields {', '.join(unknown)} (extra fields start with 'x_')")


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write JSON through a temporary file and a rename, so the file on disk is always whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(_finite(doc), fh, indent=1, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class ResultsWriter:
    """Keeps a results file current: every added row or skip rewrites it whole, marked incomplete until closed."""

    def __init__(self, path: Path, environment: dict[str, Any], spec: dict[str, Any]):
        self.results = Results(
            path=Path(path),
            environment=environment,
            spec=spec,
            rows=[],
            skipped=[],
            complete=False,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        )
        self._flush()

    @property
    def rows(self) -> list[dict[str, Any]]:
        return self.results.rows

    def add(self, row: dict[str, Any]) -> None:
        validate_row(row)
        self.results.rows.append(row)
        self._flush()

    def skip(self, what: str, why: str) -> None:
        self.results.skipped.append({"what": what, "why": why})
        self._flush()

    def close(self, complete: bool = True) -> Results:
        self.results.complete = complete
        self._flush()
        return self.results

    def _flush(self) -> None:
        write_atomic(self.results.path, self.results.to_dict())


def load(path: str | Path) -> Results:
    """Load and check a results file; a missing, corrupt, truncated or foreign file is a UserError."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"results file {p} does not exist", "pass a file written by `replayssm profile`")
    try:
        doc = json.loads(p.read_text())
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
    if version != SCHEMA_VERSION:
        raise UserError(
            f"{where} has schema_version {version!r}; this replayssm reads version {SCHEMA_VERSION}",
            "re-run `replayssm profile` with this version",
        )
    rows = doc.get("rows")
    if not isinstance(rows, list) or not isinstance(doc.get("environment"), dict):
        raise UserError(f"{where} lacks its rows or environment", "re-run `replayssm profile`")
    for i, row in enumerate(rows):
        try:
            validate_row(row)
        except ValueError as exc:
            raise UserError(f"{where}: row {i} is malformed ({exc})", "re-run `replayssm profile`") from None
    return Results(
        path=path,
        environment=doc["environment"],
        spec=doc.get("spec", {}),
        rows=rows,
        skipped=doc.get("skipped", []),
        complete=bool(doc.get("complete", False)),
        created=doc.get("created", ""),
        schema_version=version,
    )


def newest(directory: str | Path = "runs") -> Path | None:
    """The newest results file under a directory, or None."""
    d = Path(directory)
    if not d.is_dir():
        return None
    files = sorted(d.glob("*.json"), key=lambda f: f.stat().st_mtime)
    return files[-1] if files else None


def reference_files() -> list[Path]:
    """The shipped reference profiles (profiles/reference/*.json)."""
    from importlib import resources

    root = resources.files("replayssm_profiles") / "reference"
    return sorted(Path(str(p)) for p in root.iterdir() if str(p).endswith(".json"))


# The fields that name a configuration (a row's measurement aside).
CONFIG_FIELDS = ("kind", "op", "preset", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "io_dtype",
                 "draft", "accepted", "tp", "flush", "source")


def reference_profiles(gpu_key: str = "h200", directory: str | Path | None = None) -> list[Results]:
    """The reference profiles measured on `gpu_key` (files named `<gpu_key>-*.json`), newest first: the shipped ones,
    or those in `directory`."""
    try:
        found = sorted(Path(directory).glob("*.json")) if directory is not None else reference_files()
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
    for row in (row for r in loaded for row in r.rows):
        key = tuple(row.get(f) for f in CONFIG_FIELDS)
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return Results(
        path=loaded[0].path.parent if loaded[0].path else None,
        environment=first.environment,
        spec=first.spec,
        rows=rows,
        skipped=[s for r in loaded for s in r.skipped],
        complete=all(r.complete for r in loaded),
        created=first.created,
    )


def rows_matching(rows: Iterable[dict[str, Any]], **where: Any) -> list[dict[str, Any]]:
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]
