"""`replayssm compare`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def compare() -> None:
    """(being built)"""
    raise UserError("'replayssm compare' is not available in this build")
