"""User-facing errors: one line on stderr and a non-zero exit, the traceback only with REPLAYSSM_DEBUG=1."""

from __future__ import annotations

import functools
import os
import sys
from typing import Callable, TypeVar

import typer

F = TypeVar("F", bound=Callable)

EXIT_USER_ERROR = 2


class UserError(Exception):
    """A known failure the user can fix: what is wrong, and what would be right."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


def debug_enabled() -> bool:
    return os.environ.get("REPLAYSSM_DEBUG", "") not in ("", "0")


def cli_command(fn: F) -> F:
    """Wrap a command so that a UserError becomes one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            if debug_enabled():
                raise
            print(f"error: {exc.line()}", file=sys.stderr)
            raise typer.Exit(EXIT_USER_ERROR) from None

    return wrapper  # type: ignore[return-value]
