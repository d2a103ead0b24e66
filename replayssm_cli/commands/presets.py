"""`replayssm presets`."""

from __future__ import annotations

from replayssm_cli.errors import UserError, cli_command


@cli_command
def presets() -> None:
    """(being built)"""
    raise UserError("'replayssm presets' is not available in this build")
