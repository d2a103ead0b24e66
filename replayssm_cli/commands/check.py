"""`replayssm check`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def check() -> None:
    """(being built)"""
    raise UserError("'replayssm check' is not available in this build")
