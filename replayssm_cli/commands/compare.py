"""`replayssm compare`: speedup of one results file over another, row by row."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from replayssm_cli import options
from replayssm_cli.errors import cli_command


@cli_command
def compare(
    a: Annotated[Path, options.input_files_argument("The baseline results file (A).", "results file", show_default=False)],
    b: Annotated[Path, options.input_files_argument("The results file compared with it (B).", "results file", show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="Compare files from different GPUs or software versions anyway.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON on stdout.")] = False,
) -> None:
    """Compare two results files: B's speedup over A per matching row, "within noise" where the spreads overlap, and a geometric mean.

    Rows match on preset, variant, phase, batch, window, dtypes, draft, tp and flush mode; the geometric
    mean is over the whole-window (avg) rows.

    Examples:

      replayssm compare runs/before.json runs/after.json

      replayssm compare runs/h100.json runs/h200.json --force --json
    """
    from dataclasses import asdict

    from replayssm_cli.report import results
    from replayssm_cli.report.compare import compare_results, render
    from replayssm_cli.console import out, print_json, warn

    ra, rb = results.load(a), results.load(b)
    comp = compare_results(ra, rb, force=force)
    for name, res in ((a, ra), (b, rb)):
        if not res.complete:
            warn(f"{name} is incomplete (the run was cut short): only its finished rows are compared")
    if not comp.rows:
        warn("no row of A matches a row of B (same preset, variant, phase, batch, window, dtypes, draft, tp, flush)")
    if json_:
        print_json({"a": str(a), "b": str(b), **asdict(comp)})
        return
    out.print(render(comp, name_a=str(a), name_b=str(b)))
