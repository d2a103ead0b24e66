"""`replayssm tune`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def tune() -> None:
    """(being built)"""
    raise UserError("'replayssm tune' is not available in this build")
