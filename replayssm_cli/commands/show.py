"""`replayssm show`: a results file's table again, filtered; as JSON, or as CSV for a spreadsheet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from replayssm_cli import options
from replayssm_cli.errors import cli_command

# Columns of the table where stdout is a pipe or a file.
WIDE = 240


@cli_command
def show(
    results: Annotated[Path, options.input_files_argument("A results file from `replayssm profile`.", "results file",
                                                          metavar="RESULTS", show_default=False)],
    preset: Annotated[Optional[list[str]], options.words("--preset", "Only these presets, comma-separated or repeated.", complete=options.complete_preset)] = None,
    batch: Annotated[Optional[list[str]], options.batch("Only these batch sizes, comma-separated or repeated.")] = None,
    variant: Annotated[Optional[list[str]], options.words("--variant", "Only these variants (conventional, replay, split, "
                                                          "spec-conventional, spec-replay, baseline:<name>).")] = None,
    csv_path: Annotated[Optional[Path], options.out("Also write the rows, every field, as CSV for a spreadsheet.", "--csv",
                                                    metavar="PATH")] = None,
    e2e: Annotated[bool, typer.Option("--e2e", help="Show the whole-model (e2e) rows instead of the kernel rows.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print the rows as JSON on stdout instead of the table.")] = False,
) -> None:
    """Show a results file's rows as `profile` printed them, filtered by preset, batch and variant.

    The table is the profile's (times with their spread, bandwidth and share of the ceiling, speedup
    over each row's baseline, where each figure came from); --csv writes every field of the rows
    shown, nested ones as JSON, for a spreadsheet; --json prints them for jq.

    Examples:

      replayssm show runs/20261130-h200.json

      replayssm show runs/spec.json --preset nemotron-3-super-120b-a12b --batch 1,256 --variant spec-replay

      replayssm show runs/20261130-h200.json --csv rows.csv --json
    """
    from replayssm_cli.report import selection as report
    from replayssm_cli.console import err, note, out, print_json, sized
    from replayssm_cli.report.profile_table import render_table
    from replayssm_cli.report.provenance import file_label
    from replayssm_cli.report.results import origin_of
    from replayssm_cli.report.roofline import load_files, results_gpu_name

    loaded = load_files([results])[0][1]
    batches = [int(b) for value in batch or [] for b in str(value).split(",") if b.strip()]
    rows = report.select(loaded, presets=preset or (), batches=batches, variants=variant or (),
                         kinds=("e2e",) if e2e else ("kernel",))
    if csv_path is not None:
        report.write_csv(rows, csv_path)
        # Unwrapped, so that the file name stays whole on one line.
        err.print(f"wrote {len(rows)} rows to {csv_path}", highlight=False, soft_wrap=True)
    if json_:
        print_json(rows)
        return
    if not rows:
        note(f"{results} holds no {'e2e' if e2e else 'kernel'} rows" + ("" if e2e else "; --e2e shows the whole-model rows"))
        return
    if e2e:
        from replayssm_cli.report import roofline as rl

        for r in rows:
            out.print(f"{rl.describe(r)}: {r.get('us', 0) / 1000:.3f} ms per model step", highlight=False)
        return
    title = f"replayssm show · {results_gpu_name(loaded) or 'unknown GPU'} · {file_label(loaded)}"
    caption = ("µs per token per layer with ± half the interquartile range; %BW: modelled bytes over the time, as a share "
               "of the ceiling the profile used; speedup over the row's speedup_over baseline (quartile range)")
    # Each row names the file it was measured in, so that the table's provenance line is the file's, not "here".
    origin = origin_of(loaded)
    shown = [r if "x_origin" in r else {**r, "x_origin": origin} for r in rows]
    console = sized(out, WIDE)
    table = render_table(shown, title=title, caption=caption, layers_of=report.layers_of(rows),
                         width=out.width if out.is_terminal else None)
    console.print(table)
    if not loaded.complete:
        note(f"{results} is incomplete (the run was interrupted): these are the rows it has")
