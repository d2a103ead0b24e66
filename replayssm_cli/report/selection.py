"""A results file's rows, filtered as `profile` selects them, for a table, JSON or a spreadsheet (CSV)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Sequence

from replayssm_cli.errors import UserError
from replayssm_cli.report.results import Results

# The columns a spreadsheet gets first; every other field follows in the file's order.
CSV_FIRST = ("preset", "op", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "io_dtype", "draft",
             "source", "status", "us", "us_per_token", "speedup", "speedup_over", "speedup_lo", "speedup_hi", "gbs",
             "pct_copy_bw", "intensity")


def select(results: Results, *, presets: Sequence[str] = (), batches: Sequence[int] = (), variants: Sequence[str] = (),
           kinds: Sequence[str] = ("kernel",)) -> list[dict[str, Any]]:
    """The rows matching every filter given (an empty filter matches all); a filter that matches nothing is a
    UserError naming what the file holds."""
    rows = [r for r in results.rows if isinstance(r, dict) and r.get("kind", "kernel") in kinds]
    for name, wanted, key in (("--preset", presets, "preset"), ("--batch", batches, "batch"), ("--variant", variants, "variant")):
        if not wanted:
            continue
        values = {r.get(key) for r in rows if r.get(key) is not None}
        held = sorted(v for v in values if isinstance(v, (int, float))) + sorted(str(v) for v in values if not isinstance(v, (int, float)))
        missing = [w for w in wanted if w not in held]
        if len(missing) == len(wanted):
            where = results.path or "the results file"
            raise UserError(f"{name} {','.join(map(str, wanted))}: no row of {where} has it",
                            f"it holds {', '.join(map(str, held)) or 'none'}")
        rows = [r for r in rows if r.get(key) in wanted]
    return rows


def layers_of(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """SSM layers per preset, from rows that carry both a layer's and a model step's time."""
    found: dict[str, int] = {}
    for r in rows:
        us, model = r.get("us"), r.get("us_model_step")
        if isinstance(us, (int, float)) and isinstance(model, (int, float)) and us > 0:
            found.setdefault(str(r.get("preset")), round(model / us))
    return found


def _cell(value: Any) -> Any:
    """A CSV cell: nested values (clocks, case specs, samples) as JSON, None as empty."""
    if value is None:
        return ""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, separators=(",", ":"), default=str)
    return value


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as CSV text: one header of every field (the usual ones first), one line per row."""
    fields = [f for f in CSV_FIRST if any(f in r for r in rows)]
    for r in rows:
        fields += [k for k in r if k not in fields]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: _cell(r.get(k)) for k in fields})
    return buffer.getvalue()


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    try:
        Path(path).write_text(to_csv(rows), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}", "pass another --csv") from None
