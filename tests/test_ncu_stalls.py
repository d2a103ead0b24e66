"""benchmarks/ncu_stalls.py without a GPU: its summaries of the committed Nsight Compute captures, and bad input."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

import benchmark_scripts

CAPTURES = Path(__file__).resolve().parents[1] / "profiles" / "reference" / "ncu" / "stalls"
stalls = benchmark_scripts.fixture("ncu_stalls")


def _run(*argv):
    return benchmark_scripts.run("ncu_stalls", *argv)


def _page(name: str) -> str:
    return gzip.decompress((CAPTURES / name).read_bytes()).decode()


def test_gdn_verify_capture_is_summarized_by_region_opcode_and_bank_conflicts(stalls):
    s = stalls.summarize(_page("gdn-verify-256-source.csv.gz"), _page("gdn-verify-256-details.csv.gz"))
    assert s["columns"] == {"samples": "Warp Stall Sampling (All Samples)", "executed": "Instructions Executed"}
    assert s["details"]["Duration"] == "1.64 ms" and s["details"]["L1/TEX Cache Throughput"] == "86.73 %"
    # two loops (the flush-first fold, never run in this launch, and the tile loop) and the code outside them
    loops = [r for r in s["regions"] if r["region"].startswith("loop")]
    assert len(loops) == 2 and loops[0]["executed"] == 0
    assert sum(r["executed"] for r in s["regions"]) == s["total_executed"] == 438583296
    assert loops[1]["executed"] / s["total_executed"] == pytest.approx(0.739, abs=0.001)
    assert 0 < s["shared_wavefronts_excessive"] < s["shared_wavefronts"]
    assert s["shared_wavefronts_excessive"] / s["shared_wavefronts"] == pytest.approx(0.595, abs=0.001)
    assert list(s["opcodes"])[:4] == ["FADD", "SHFL", "STS", "LDS"]
    assert s["top"][0]["sass"].startswith("BAR.SYNC") and s["top"][0]["samples"] == 7013


def test_committed_summaries_are_what_the_script_makes_of_the_committed_pages(tmp_path):
    for page in CAPTURES.glob("*.csv.gz"):
        shutil.copy(page, tmp_path / page.name)
    done = _run("--resummarize", str(tmp_path))
    assert done.returncode == 0, done.stderr
    made = sorted(tmp_path.glob("*-summary.json"))
    assert [p.name for p in made] == sorted(p.name for p in CAPTURES.glob("*-summary.json")) and len(made) == 15
    for path in made:
        assert json.loads(path.read_text()) == json.loads((CAPTURES / path.name).read_text()), path.name
    assert "gdn-verify-256: 157641 samples" in done.stdout


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path):
    done = _run("--resummarize", str(tmp_path))
    assert done.returncode == 2 and "no NAME-source.csv" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "x-source.csv").write_text("a,b\n1,2\n")
    done = _run("--resummarize", str(tmp_path))
    assert done.returncode == 2 and "not the source page" in done.stderr and "Traceback" not in done.stderr
    done = _run("--op", "gdn", "--kernel", "verify", "--launch", "replay:chunk=16", str(tmp_path))
    assert done.returncode == 2 and "give settings for --kernel verify" in done.stderr
    done = _run("--op", "gdn", "--kernel", "verify", "--launch", "verify:chunk=x", str(tmp_path))
    assert done.returncode == 2 and "is not field=integer" in done.stderr and "Traceback" not in done.stderr
    done = _run(str(tmp_path))
    assert done.returncode == 2 and "--op and --kernel are required" in done.stderr
    done = _run("--op", "mamba2", "--kernel", "verify", "--fill", "20", str(tmp_path))
    assert done.returncode == 2 and "a verify step's fill is in [0, 19]" in done.stderr
    done = _run("--op", "gdn", "--kernel", "replay", "--fill", "16", str(tmp_path))
    assert done.returncode == 2 and "a replay step's fill is in [0, 15]" in done.stderr
    done = _run("--op", "gdn", "--kernel", "decode", "--fill", "3", str(tmp_path))
    assert done.returncode == 2 and "not --kernel decode" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("extra,regex,suffix", [
    ((), "regex:replay_kernel|heads_kernel", "mamba2-replay-256-bf16"),
    (("--kernel-name", "flush_kernel"), "regex:flush_kernel", "mamba2-replay-256-bf16-flush_kernel"),
])
def test_the_sampled_launch_is_the_steps_first_or_the_one_named(stalls, monkeypatch, tmp_path, capsys, extra, regex,
                                                                suffix):
    """ncu samples a step's first launch by default (a two-launch Mamba-2 step's non-flush launch is heads_kernel),
    or the launch --kernel-name names, into a capture named after it."""
    import subprocess
    from types import SimpleNamespace

    from replayssm_cli.measure import ncu

    seen = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return SimpleNamespace(returncode=1, stdout="", stderr="fake ncu: stopped here")

    monkeypatch.setattr(ncu, "ncu_binary", lambda: "/opt/ncu")
    monkeypatch.setattr(subprocess, "run", fake_run)
    code = stalls.main(["--op", "mamba2", "--kernel", "replay", "--state-dtype", "bf16", "--batch", "256", *extra,
                        str(tmp_path)])
    assert code == 1 and "fake ncu: stopped here" in capsys.readouterr().err
    cmd = seen[0]
    assert cmd[cmd.index("-k") + 1] == regex and cmd[cmd.index("-o") + 1] == str(tmp_path / suffix)
