"""benchmarks/verify_phases.py without a GPU: its launch overrides checked as the verify checks them, one line each."""

from __future__ import annotations

import pytest

import benchmark_scripts


def _run(*argv):
    return benchmark_scripts.run("verify_phases", *argv)


@pytest.mark.parametrize("launch,message", [("XX=1", "unknown key 'XX'"), ("BPF=3", "must be a power of two"),
                                            ("BPF", "key=integer")])
def test_bad_launch_is_one_line(tmp_path, launch, message):
    done = _run("--launch", launch, "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert not (tmp_path / "phases.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_cuda(tmp_path):
    done = _run("--launch", "BPF=32", "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""
