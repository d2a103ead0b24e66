"""Where output goes: results to stdout (tables or JSON), progress, hints and warnings to stderr."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from rich.console import Console

out = Console()
err = Console(stderr=True)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def print_json(obj: Any) -> None:
    """Plain JSON on stdout (no colour, NaN as null) so that `| jq` works."""
    sys.stdout.write(json.dumps(_clean(obj), indent=2, default=str) + "\n")
    sys.stdout.flush()


def sized(console: Console, width: int, *, wide: bool = False) -> Console:
    """`console` itself on a terminal, its tables fitted to it; with `wide`, or for a pipe or a file, a console of
    `width` columns on the same file, so that no table is squeezed to 80 columns."""
    if console.is_terminal and not wide:
        return console
    return Console(file=console.file, width=width, force_terminal=console.is_terminal)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/] {message}", highlight=False)


def note(message: str) -> None:
    err.print(message, highlight=False)
