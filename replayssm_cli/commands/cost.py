"""`replayssm cost`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def cost() -> None:
    """(being built)"""
    raise UserError("'replayssm cost' is not available in this build")
