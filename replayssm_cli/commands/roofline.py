"""`replayssm roofline`: every profiled kernel on the roofline of its GPU, as an HTML figure and a table."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from replayssm_cli import options
from replayssm_cli.errors import cli_command


class BytesSource(str, Enum):
    modelled = "modelled"
    measured = "measured"


class Phase(str, Enum):
    avg = "avg"
    nonflush = "nonflush"
    flush = "flush"
    all = "all"


class PlotlyJS(str, Enum):
    inline = "inline"
    cdn = "cdn"
    directory = "directory"


def _num(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


# Past this many points the table is a summary per preset: the rows are in --json and `replayssm show FILE`.
TABLE_ROWS = 400


def _summary(out, placement) -> None:
    groups: dict[tuple[str, str], list] = {}
    for p in placement.points:
        groups.setdefault((p.file, str(p.row.get("preset"))), []).append(p)
    for (file, preset), points in groups.items():
        pct = sorted(p.pct_of_roof for p in points)
        above = sum(p.above_roof for p in points)
        out.print(
            f"{preset} ({file}): {len(points):,} points, {sum(p.bound == 'memory' for p in points):,} memory-bound, "
            f"median {pct[len(pct) // 2]:.1f}% of roof" + (f", [bold red]{above} above it ![/]" if above else ""),
            highlight=False,
        )
    out.print(f"{len(placement.points):,} points: the full table is in --json, or `replayssm show FILE`", style="dim")


def _tables(placement) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    from replayssm_cli.console import out

    # A pipe or a file has no width: give the tables the room they need rather than 80 columns.
    if not out.is_terminal:
        out = Console(file=out.file, width=max(out.width, 140))
    roof = placement.roof
    out.print(
        f"[bold]{roof.gpu}[/]: points classified against {roof.memory.label} and {roof.compute.label} "
        f"(ridge {roof.ridge():.3g} FLOP/B)",
        highlight=False,
    )
    if len(placement.points) > TABLE_ROWS:
        _summary(out, placement)
        return
    groups: dict[tuple[str, str], list] = {}
    for p in placement.points:
        groups.setdefault((p.file, str(p.row.get("preset"))), []).append(p)
    several = len(placement.files) > 1
    for (file, preset), points in groups.items():
        title = f"{preset} ({file})" if several else preset
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("variant", "batch", "W", "dtypes", "phase", "bytes", "FLOP/B", "TFLOP/s", "roof", "bound", "% roof", "µs", "µs left"):
            table.add_column(name, justify="left" if name in ("variant", "dtypes", "phase", "bound") else "right", no_wrap=True)
        for p in points:
            r = p.row
            pct = f"{p.pct_of_roof:.1f}"
            if p.above_roof:
                pct = f"[bold red]{pct} ![/]"
            elif p.at_roof:
                pct = f"{pct} [dim]≈ ±{100 * p.tolerance:.1f}[/]"
            table.add_row(
                str(r.get("variant")) + (" (pred.)" if p.predicted else ""),
                str(r.get("batch")),
                str(r.get("window") or "-"),
                "/".join(str(r[k]) for k in ("state_dtype", "read_dtype") if r.get(k)) + (f" T{r['draft']}" if r.get("draft") else ""),
                str(r.get("phase")),
                "L2, ncu" if p.level == "L2" else "DRAM, ncu" if p.bytes_source == "measured" else "modelled",
                _num(p.intensity),
                _num(p.flops_per_s / 1e12),
                _num(p.roof_flops_per_s / 1e12),
                p.bound,
                pct,
                f"{p.us:,.1f}",
                f"{p.us_left:,.1f}",
            )
        out.print(table)
    out.print(
        "% roof: attained FLOP/s over the roof at the point's intensity; ≈ above 100 but within the time's quartile "
        "spread plus the ceiling's run-to-run spread; ! beyond it (a counting error)",
        style="dim", highlight=False,
    )


@cli_command
def roofline(
    results: Annotated[
        Optional[list[Path]],
        options.input_files_argument(
            "Results files from `replayssm profile`; several overlay as before/after. "
            "Default: the newest file in ./runs/, else the shipped H200 reference profile.",
            "results file",
            metavar="RESULTS",
            show_default=False,
        ),
    ] = None,
    gpu: Annotated[
        Optional[str],
        options.gpu("Draw the ceilings of this GPU (a spec key such as h200) instead of the one the results came from.", metavar="KEY"),
    ] = None,
    out_paths: Annotated[
        Optional[list[Path]],
        options.out(
            "Where to write the figure, repeatable: .html (self-contained, works offline), .png or .svg (need Chrome or Chromium).",
            "--out",
            metavar="PATH",
            show_default="roofline.html",
        ),
    ] = None,
    bytes_source: Annotated[
        BytesSource,
        typer.Option(
            "--bytes", help="Place points by the modelled DRAM bytes, or by those Nsight Compute measured (x_ncu_* fields), "
            "with an L2 point per kernel where it recorded L2 bytes."
        ),
    ] = BytesSource.modelled,
    phase: Annotated[
        Optional[list[Phase]],
        typer.Option("--phase", help="Phases to draw, repeatable: avg (the whole-window average), nonflush, flush, or all.",
                     show_default="avg"),
    ] = None,
    plotlyjs: Annotated[
        PlotlyJS,
        typer.Option("--plotlyjs", help="HTML only: plotly.js inlined (works offline, ~5 MB), from the CDN (needs the "
                     "network; the figure alone, ~0.25 MB for the shipped reference), or from a plotly.min.js written beside the file."),
    ] = PlotlyJS.inline,
    json_out: Annotated[bool, typer.Option("--json", help="Print the table (and the ceilings) as JSON on stdout.")] = False,
) -> None:
    """Place every profiled kernel on the roofline of its GPU and say how far each is from the roof.

    Writes a plotly figure (log-log arithmetic intensity against attained FLOP/s with ceilings, ridge
    points and arrows labelled with each kernel's speedup over its baseline; speedup against batch size;
    the whole model's inter-token latency where the file holds e2e rows) and prints per point its
    bound, its share of the roof and the time it leaves on the table. A point above a roof by more than
    its measurement's and the ceiling's spread is flagged as a measurement error.

    Examples:

      replayssm roofline

      replayssm roofline runs/before.json runs/after.json --out roofline.html --out roofline.png

      replayssm roofline runs/h200.json --bytes measured --phase all --plotlyjs cdn --json
    """
    from replayssm_cli.report import roofline as rl
    from replayssm_cli.report import roofline_figure as fig_mod
    from replayssm_cli.console import err, print_json, warn

    def note(line: str) -> None:
        # Unwrapped, so that a file name stays on one line for a log or a grep.
        err.print(line, highlight=False, soft_wrap=True)

    paths = list(out_paths or [Path("roofline.html")])
    fig_mod.check_outputs(paths)
    phases = ("avg",) if not phase else rl.PHASES if Phase.all in phase else tuple(dict.fromkeys(p.value for p in phase))
    said = []
    if results:
        files = rl.load_files(results)
        said.append("plotting " + ", ".join(str(p) for p in results))
    else:
        chosen = rl.load_default()
        files = chosen.files
        if chosen.skipped:
            said.append(f"skipping {len(chosen.skipped)} newer predicted file(s) in ./runs/ ({', '.join(chosen.skipped)}): "
                        "pass one to plot it")
        said.append(chosen.why)
    roof = rl.roof_for(files[0][1], gpu)
    if not gpu and len(files) > 1:
        first = rl.results_gpu_name(files[0][1])
        for label, res in files[1:]:
            other = rl.results_gpu_name(res)
            if other and first and other != first:
                warn(f"{label} came from {other}, not {first}: its points are drawn under the {roof.gpu} roof")
    rows = sum(len(res.rows) for _, res in files)
    progress = rl.progress_lines(rows)
    progress("placing the rows")
    placement = rl.place(files, roof, bytes_source.value, phases)
    # Which files were plotted, said once they are known to plot: a refusal stays one line.
    for line in said + placement.notes:
        note(line)
    for line in placement.warnings():
        warn(line)
    fig = fig_mod.build_figure(placement, progress)
    written = []
    for path in paths:
        progress(f"writing {path}")
        written.append(str(fig_mod.write_figure(fig, path, plotlyjs.value)))
        note(f"wrote {path}")
    if json_out:
        points = [p.to_dict() for p in placement.points]
        pairs = [p.to_dict() for p in placement.pairs]
        print_json({"gpu": roof.gpu, "roof": roof.to_dict(), "points": points, "speedups": pairs, "written": written})
    else:
        _tables(placement)
