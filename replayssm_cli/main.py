"""The `replayssm` command: wires one module per command, nothing else."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

# The click exceptions typer raises (typer may carry its own copy of click): found from one it exports.
_BASES = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
UsageError, ClickException = _BASES["UsageError"], _BASES["ClickException"]

from replayssm_cli import __version__
from replayssm_cli.commands import check, compare, cost, e2e, gpu, plan, presets, profile, roofline, show, tune
from replayssm_cli.options import OneValueCommand


class OneLineErrors(TyperGroup):
    """The command group, with click's usage errors printed as one line on stderr (exit code 2) like ours."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":
                return super().main(args, prog_name, complete_var, standalone_mode=True, **extra)
            where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "replayssm"
            print(f"error: {exc.format_message().rstrip('.')}; see '{where} --help'", file=sys.stderr)
            sys.exit(exc.exit_code)
        except ClickException as exc:
            print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="replayssm",
    cls=OneLineErrors,
    help="Measure whether ReplaySSM decode pays on your GPU, for your model, batch sizes and precision.",
    no_args_is_help=True,
    add_completion=True,
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


app.command("profile", cls=OneValueCommand)(profile.profile)
app.command("roofline", cls=OneValueCommand)(roofline.roofline)
app.command("tune", cls=OneValueCommand)(tune.tune)
app.command("e2e", cls=OneValueCommand)(e2e.e2e)
app.command("plan", cls=OneValueCommand)(plan.plan)
app.command("cost", cls=OneValueCommand)(cost.cost)
app.command("compare", cls=OneValueCommand)(compare.compare)
app.command("check", cls=OneValueCommand)(check.check)
app.command("gpu", cls=OneValueCommand)(gpu.gpu)
app.command("presets", cls=OneValueCommand)(presets.presets)
app.command("show", cls=OneValueCommand)(show.show)


if __name__ == "__main__":
    app()
