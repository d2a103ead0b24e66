"""`replayssm gpu`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def gpu() -> None:
    """(being built)"""
    raise UserError("'replayssm gpu' is not available in this build")
