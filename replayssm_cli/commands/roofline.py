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


def _num(value: float, digits: int = 3) -> str:
    return f"{value:.{digits}g}"


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
    groups: dict[tuple[str, str], list] = {}
    for p in placement.points:
        groups.setdefault((p.file, str(p.row.get("preset"))), []).append(p)
    several = len(placement.files) > 1
    for (file, preset), points in groups.items():
        title = f"{preset} ({file})" if several else preset
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for name in ("variant", "batch", "W", "dtypes", "phase", "FLOP/B", "TFLOP/s", "roof", "bound", "% roof", "µs", "µs left"):
            table.add_column(name, justify="left" if name in ("variant", "dtypes", "phase", "bound") else "right", no_wrap=True)
        for p in points:
            r = p.row
            pct = f"[bold red]{p.pct_of_roof:.1f} ![/]" if p.above_roof else f"{p.pct_of_roof:.1f}"
            table.add_row(
                str(r.get("variant")) + (" (pred.)" if p.predicted else ""),
                str(r.get("batch")),
                str(r.get("window") or "-"),
                "/".join(str(r[k]) for k in ("state_dtype", "read_dtype") if r.get(k)) + (f" T{r['draft']}" if r.get("draft") else ""),
                str(r.get("phase")),
                _num(p.intensity),
                _num(p.flops_per_s / 1e12),
                _num(p.roof_flops_per_s / 1e12),
                p.bound,
                pct,
                f"{p.us:,.1f}",
                f"{p.us_left:,.1f}",
            )
        out.print(table)


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
            "--bytes", help="Place points by the modelled DRAM bytes, or by those Nsight Compute measured (x_ncu_* fields)."
        ),
    ] = BytesSource.modelled,
    json_out: Annotated[bool, typer.Option("--json", help="Print the table (and the ceilings) as JSON on stdout.")] = False,
) -> None:
    """Place every profiled kernel on the roofline of its GPU and say how far each is from the roof.

    Writes a plotly figure (log-log arithmetic intensity against attained FLOP/s, ceilings, ridge
    points, ReplaySSM speedup arrows; achieved bandwidth against batch size) and prints per point its
    bound, its share of the roof and the time it leaves on the table. A point above a roof is flagged
    as a measurement error.

    Examples:

      replayssm roofline

      replayssm roofline runs/before.json runs/after.json --out roofline.html --out roofline.png

      replayssm roofline runs/h100.json --gpu h200 --bytes measured --json
    """
    from replayssm_cli import roofline as rl
    from replayssm_cli.console import note, print_json, warn

    paths = list(out_paths or [Path("roofline.html")])
    rl.check_outputs(paths)
    files = rl.load_files(results) if results else rl.load_default()
    roof = rl.roof_for(files[0][1], gpu)
    if not gpu and len(files) > 1:
        first = rl.results_gpu_name(files[0][1])
        for label, res in files[1:]:
            other = rl.results_gpu_name(res)
            if other and first and other != first:
                warn(f"{label} came from {other}, not {first}: its points are drawn under the {roof.gpu} roof")
    placement = rl.place(files, roof, bytes_source.value)
    for line in placement.notes:
        note(line)
    for line in placement.warnings():
        warn(line)
    fig = rl.build_figure(placement)
    written = []
    for path in paths:
        written.append(str(rl.write_figure(fig, path)))
        note(f"wrote {path}")
    if json_out:
        points = [p.to_dict() for p in placement.points]
        print_json({"gpu": roof.gpu, "roof": roof.to_dict(), "points": points, "written": written})
    else:
        _tables(placement)
