"""Every command's --help works, `replayssm --help` lists every command, and usage errors are one line with exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from replayssm_cli.main import app

runner = CliRunner()


def _command_names() -> list[str]:
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    names += [g.name or g.typer_instance.info.name for g in app.registered_groups]
    return sorted(n for n in names if n)


def test_there_are_commands():
    assert {"gpu", "presets"} <= set(_command_names())


# Ids are prefixed: a bare id "gpu" would read as the gpu marker and be skipped on machines without CUDA.
@pytest.mark.parametrize("name", _command_names(), ids=lambda n: f"cmd-{n}")
def test_command_help_exits_zero(name):
    result = runner.invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.stdout and name in result.stdout


def test_root_help_lists_every_command():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0, result.output
    for name in _command_names():
        assert name in result.stdout, name


@pytest.mark.parametrize("name", ["gpu", "presets"], ids=lambda n: f"cmd-{n}")
def test_help_has_examples(name):
    result = runner.invoke(app, [name, "--help"])
    assert "Examples" in result.stdout and f"replayssm {name}" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [["nosuch"], ["profile", "--repeats", "abc"], ["tune", "--error-budget", "x"], ["compare"], ["cost", "--bogus"]],
    ids=["unknown-command", "bad-int", "bad-float", "missing-argument", "unknown-option"],
)
def test_usage_errors_are_one_line_with_exit_code_2(argv):
    result = subprocess.run([sys.executable, "-m", "replayssm_cli.main", *argv], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
