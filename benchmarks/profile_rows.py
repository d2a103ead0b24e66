"""`replayssm profile` with kernel rows' settings overridden: the reference loop for a launch choice.

The sweeps (sweep_mamba2.py, sweep_gdn.py) time kernels under a loop of their own; the reference profile's loop
(`replayssm profile`: inputs rotated over several sets, its own state and cache placement) has disagreed with them
by a few percent, even on the sign of a change (benchmarks/notes/run-55.md), so a row is confirmed here before it ships. Each
--set names a module under replayssm_kernels, a table of launch configurations in it, a row of the table by name and
the fields to put in that row; everything after -- goes to `replayssm profile`.

    python benchmarks/profile_rows.py --set mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=0 -- \\
        -p nemotron-3-super-120b-a12b --batch 256,512 --state-dtype bf16 --no-phases --out runs/rows.json
    python benchmarks/profile_rows.py --set gdn.decode:DECODE_LAUNCH:decode:rows=4 -- -p qwen3.5-122b-a10b --batch 256
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys


def parse_set(text: str) -> tuple[str, str, str, dict[str, int]]:
    """MODULE:TABLE:ROW:key=value,... -> (module, table, row, settings); ValueError naming what is wrong."""
    parts = text.split(":")
    if len(parts) != 4 or not all(parts):
        raise ValueError(f"--set {text!r}: expected MODULE:TABLE:ROW:key=value,... "
                         "(e.g. mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=0)")
    module, table, row, pairs = parts
    settings = {}
    for pair in pairs.split(","):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {text!r}: {pair!r} is not key=value")
        try:
            settings[key] = int(value)
        except ValueError:
            raise ValueError(f"--set {text!r}: {key}={value!r} is not an integer") from None
    return module, table, row, settings


def apply_set(module: str, table: str, row: str, settings: dict[str, int]):
    """Put `settings` into the row of replayssm_kernels.MODULE's TABLE (a dict of launch configurations); return the
    row as changed, replaced in its table."""
    from replayssm_kernels import common

    try:
        mod = importlib.import_module(f"replayssm_kernels.{module}")
    except ImportError:
        raise ValueError(f"no module replayssm_kernels.{module} (e.g. mamba2.replay, gdn.decode)") from None
    rows = getattr(mod, table, None)
    if not isinstance(rows, dict) or not all(dataclasses.is_dataclass(r) for r in rows.values()):
        raise ValueError(f"replayssm_kernels.{module} has no table {table!r} of launch rows")
    if row not in rows:
        raise ValueError(f"{module}.{table} has no row {row!r}; its rows: {', '.join(rows)}")
    try:
        rows[row] = common.override(rows[row], settings)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{module}.{table}[{row}]: {exc}") from None
    return rows[row]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="profile_rows.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", default=[], metavar="MODULE:TABLE:ROW:key=value,...",
                        help="settings to put in a kernel row before profiling (repeatable)")
    args = parser.parse_args(ours)
    try:
        for text in args.set:
            row = apply_set(*parse_set(text))
            print(f"{text.rsplit(':', 1)[0]}: {row}", file=sys.stderr)
    except ValueError as exc:
        print(f"profile_rows: {exc}", file=sys.stderr)
        return 2
    from replayssm_cli.main import app

    # The CLI's own handling: a bad option or value is reported as `replayssm profile` reports it.
    try:
        app(["profile", *rest], prog_name="replayssm")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
