"""The scripts under benchmarks/ as the tests reach them: imported as modules, or run as commands."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/NAME.py imported as module NAME (registered in sys.modules, as the scripts import each other's)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def fixture(name: str):
    """A module-scoped fixture yielding benchmarks/NAME.py as a module, unregistered after the test module."""

    @pytest.fixture(scope="module")
    def script():
        yield load(name)
        sys.modules.pop(name, None)

    return script


def run(name: str, *argv: str, interpret: bool | None = None) -> subprocess.CompletedProcess:
    """`python benchmarks/NAME.py ARGV...`, its output captured, in this environment, or with TRITON_INTERPRET=1
    (interpret=True) or without it (False: a script that compiles kernels for a GPU target instead of running them)."""
    env = None
    if interpret is not None:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        if interpret:
            env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), *argv], capture_output=True, text=True,
                          timeout=120, env=env)
