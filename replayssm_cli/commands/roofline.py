"""`replayssm roofline`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def roofline() -> None:
    """(being built)"""
    raise UserError("'replayssm roofline' is not available in this build")
