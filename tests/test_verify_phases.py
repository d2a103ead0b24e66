"""benchmarks/verify_phases.py without a GPU: its launch overrides checked as the verify checks them, one line each."""

from __future__ import annotations

import pytest

import benchmark_scripts


def _run(*argv):
    return benchmark_scripts.run("verify_phases", *argv)


@pytest.mark.parametrize("op,launch,message", [("mamba2", "XX=1", "unknown key 'XX'"),
                                               ("mamba2", "BPF=3", "must be a power of two"),
                                               ("mamba2", "BPF", "key=integer"),
                                               ("gdn", "BPF=32", "unknown key 'BPF'"),
                                               ("gdn", "KSPLIT=3", "KSPLIT")])
def test_bad_launch_is_one_line(tmp_path, op, launch, message):
    done = _run("--op", op, "--launch", launch, "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert not (tmp_path / "phases.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_cuda(tmp_path):
    done = _run("--launch", "BPF=32", "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""
