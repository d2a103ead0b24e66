"""Every command's --help works, and `replayssm --help` lists every command (generic over the registered commands)."""

from __future__ import annotations

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
