"""User-facing errors: one line on stderr and a non-zero exit, the traceback only with REPLAYSSM_DEBUG=1."""

from __future__ import annotations

import errno
import functools
import os
import stat
import sys
from pathlib import Path
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


# The longest file name component POSIX file systems take (ext4, xfs, btrfs: 255 bytes).
NAME_MAX = 255


def _path_problem(path: Path) -> str | None:
    """What makes `path` unusable before it is even opened: an over-long name or a symlink loop; else None."""
    long = [part for part in path.parts if len(os.fsencode(part)) > NAME_MAX]
    if long:
        return f"has a name of {len(os.fsencode(long[0])):,} bytes; file names are at most {NAME_MAX}"
    return None


def _kind(mode: int) -> str | None:
    """'a directory', 'a FIFO (named pipe)', ... for what is not a regular file; None for a regular file."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe), not a file"),
             (stat.S_ISSOCK, "a socket, not a file"), (stat.S_ISCHR, "a character device, not a file"),
             (stat.S_ISBLK, "a block device, not a file"))
    return next((name for test, name in kinds if test(mode)), None if stat.S_ISREG(mode) else "not a regular file")


def _stat(path: Path, what: str) -> os.stat_result | None:
    """os.stat of the path; None when nothing is there; UserError naming a loop, a broken link or a bad parent."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise UserError(f"{what} {path} is a broken symlink (to {os.readlink(path)!r})") from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UserError(f"{what} {path} is a symlink loop") from None
        if exc.errno == errno.ENOTDIR:
            raise UserError(f"{what} {path}: a part of the path before its last name is a file, not a directory") from None
        if exc.errno == errno.ENAMETOOLONG:
            raise UserError(f"{what} {path} has a name too long for the file system") from None
        raise UserError(f"{what} {path} cannot be examined ({exc.strerror})") from None


def readable_path(path: Path, what: str, *, model_dir: bool = False) -> Path:
    """`path` if it is a regular file this process can read (with `model_dir`, a directory holding config.json
    stands for that config.json); else UserError saying what it is: missing, a directory, a FIFO, a loop."""
    shown = str(path)
    if not shown.strip():
        raise UserError(f"{what} is an empty path")
    problem = _path_problem(path)
    if problem:
        raise UserError(f"{what} {shown[:60]!r}{'...' if len(shown) > 60 else ''} {problem}")
    st = _stat(path, what)
    if st is None:
        raise UserError(f"{what} {shown} does not exist")
    kind = _kind(st.st_mode)
    if kind == "a directory" and model_dir:
        config = path / "config.json"
        if config.is_file():
            return readable_path(config, what)
        raise UserError(f"{what} {shown} is a directory without a config.json", "pass a preset .toml, a config.json, or a model directory holding one")
    if kind is not None:
        raise UserError(f"{what} {shown} is {kind}", "pass a file")
    if not os.access(path, os.R_OK):
        raise UserError(f"{what} {shown} cannot be read (permission denied)")
    return path


def writable_path(path: Path, what: str) -> Path:
    """`path` if a file could be written there: not empty, not '-', not a directory, FIFO or device, every name
    within the file system's limit, its nearest existing parent a directory; else UserError saying which."""
    shown = str(path)
    if not shown.strip():
        raise UserError(f"{what} is an empty path", "give a file name, e.g. runs/h200.json")
    if shown == "-":
        raise UserError(f"{what} - would write a file named '-'", "give a file name; --json prints to stdout")
    problem = _path_problem(path)
    if problem:
        raise UserError(f"cannot write {what} {shown[:60]!r}{'...' if len(shown) > 60 else ''}: it {problem}")
    for parent in path.parents:
        if os.path.lexists(parent):
            if not os.path.isdir(parent):
                raise UserError(f"cannot write {what} {shown}: {parent} is a file, not a directory")
            break
    st = _stat(path, what)
    if st is not None:
        kind = _kind(st.st_mode)
        if kind == "a directory":
            raise UserError(f"cannot write {what} {shown}: it is a directory", f"give a file path, e.g. {shown.rstrip('/')}/results.json")
        if kind is not None:
            raise UserError(f"cannot write {what} {shown}: it is {kind}", "give a regular file path")
    return path
