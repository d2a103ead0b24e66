"""The `replayssm` command: wires one module per command, nothing else."""

from __future__ import annotations

from typing import Annotated

import typer

from replayssm_cli import __version__
from replayssm_cli.commands import check, compare, cost, e2e, gpu, presets, profile, roofline, tune

app = typer.Typer(
    name="replayssm",
    help="Measure whether ReplaySSM decode pays on your GPU, for your model, batch sizes and precision.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"replayssm {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", help="Print the version and exit.", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Measure whether ReplaySSM decode pays on your GPU, for your model, batch sizes and precision."""


app.command("profile")(profile.profile)
app.command("roofline")(roofline.roofline)
app.command("tune")(tune.tune)
app.command("e2e")(e2e.e2e)
app.command("cost")(cost.cost)
app.command("compare")(compare.compare)
app.command("check")(check.check)
app.command("gpu")(gpu.gpu)
app.command("presets")(presets.presets)


if __name__ == "__main__":
    app()
