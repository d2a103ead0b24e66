"""benchmarks/tune_h200.sh without a GPU: every section names a launch row the kernels ship, and a dry run plans only
those rows."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tune_h200.sh"
TEXT = SCRIPT.read_text()
# A section's first comment line: the module and table of the row it times, then its index, its name or its key.
ROW = re.compile(r'# (mamba2|gdn)\.(\w+) (\w+)(?:\[(\d+)\]|\["([\w-]+)"\]| \((\d), (\d+), ·\))?')


def _group(name: str) -> list[str]:
    return re.search(rf'^{name}="([^"]*)"', TEXT, re.M).group(1).split()


SECTIONS = _group("MAMBA2") + _group("GDN")


def _run(tmp_path: Path, *sections: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DRY_RUN="1", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "tune"), *sections], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.mark.parametrize("section", SECTIONS)
def test_each_section_times_a_shipped_row(section):
    arm = re.search(rf"^    {re.escape(section)}\)\n        (#[^\n]*)", TEXT, re.M)
    assert arm, f"{section} is listed but has no case of its own"
    match = ROW.match(arm.group(1))
    assert match, f"{section}'s first line does not name its row: {arm.group(1)}"
    op, module, table, index, name, size, max_n = match.groups()
    rows = getattr(importlib.import_module(f"replayssm_kernels.{op}.{module}"), table)
    if index is not None:
        assert int(index) < len(rows)
    elif name is not None:
        assert name in rows
    elif size is not None:
        assert any(key[:2] == (int(size), int(max_n)) for key, _ in rows)


def test_a_dry_run_plans_each_kernel_at_its_shipped_row_only(tmp_path):
    done = _run(tmp_path, "tests", "mamba2-split-bf16-state", "gdn-verify-small")
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stderr.splitlines()] == [
        "tests", "mamba2-split-bf16-state", "gdn-verify-small"]
    assert all(": exit 0," in line for line in done.stderr.splitlines())
    plans = (tmp_path / "tune" / "mamba2-split-bf16-state.txt").read_text().splitlines()
    assert len(plans) == 2 * 3 and all(line.endswith(" 1 launch settings") for line in plans)
    assert (tmp_path / "tune" / "gdn-verify-small.err").read_text() == ""
    assert "not run" in (tmp_path / "tune" / "tests.txt").read_text()


def test_an_unknown_section_is_one_line_and_exit_2_before_anything_runs(tmp_path):
    done = _run(tmp_path, "gdn-decode", "gdn-nosuch")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unknown section gdn-nosuch" in done.stderr
    assert not (tmp_path / "tune").exists()
