"""`replayssm profile`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def profile() -> None:
    """(being built)"""
    raise UserError("'replayssm profile' is not available in this build")
