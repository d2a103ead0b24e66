"""benchmarks/verify_phases.py without a GPU: its launch overrides checked as the verify checks them, one line each."""

from __future__ import annotations

import subprocess

import pytest

import benchmark_scripts

script = benchmark_scripts.fixture("verify_phases")


@pytest.fixture
def run(script, capsys):
    """verify_phases.main in this process: (exit code, stdout, stderr) as the command gives them."""

    def call(*argv):
        code = script.main(list(argv))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, out, err)

    return call


@pytest.mark.parametrize("op,launch,message", [("mamba2", "XX=1", "has no field 'XX'"),
                                               ("mamba2", "FOLD_CHUNK", "is not field=integer"),
                                               ("gdn", "FOLD_CHUNK=32", "VerifyConfig has no field 'FOLD_CHUNK'"),
                                               ("gdn", "ksplit", "is not field=integer")])
def test_bad_launch_is_one_line(run, tmp_path, op, launch, message):
    done = run("--op", op, "--launch", launch, "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr
    assert not (tmp_path / "phases.json").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the refusal without a GPU")
def test_refuses_without_cuda(run, tmp_path):
    done = run("--launch", "rows=16", "--out", str(tmp_path / "phases.json"))
    assert done.returncode == 2
    assert "needs a CUDA GPU" in done.stderr and done.stdout == ""
