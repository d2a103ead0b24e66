"""benchmarks/ncu_sections.py without a GPU: its plan, its summary of committed Nsight Compute pages, and bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import benchmark_scripts

PAGES = Path(__file__).resolve().parents[1] / "profiles" / "reference" / "ncu" / "sections"
sections = benchmark_scripts.fixture("ncu_sections")


def _summary(sections, name: str) -> dict:
    rows = sections.page_rows(gzip.decompress((PAGES / name).read_bytes()).decode())
    return sections.summary(rows)


def test_plan_takes_each_state_to_nearest_then_stochastically(sections):
    plan = sections.plan("mamba2", 256, 16, ["bf16", "int8"], "flush")
    assert [label for label, _ in plan] == ["bf16", "bf16 SR", "int8", "int8 SR"]
    for (label, spec), rounding in zip(plan, ["nearest", "stochastic"] * 2):
        assert spec["op"] == "mamba2" and spec["variant"] == "replay" and spec["batch"] == 256
        assert spec["phase"] == "flush" and spec["flush"] == "aligned" and spec["rounding"] == rounding
        assert spec["state_dtype"] == label.split()[0]
    (_, conventional), _ = sections.plan("gdn", 64, 16, ["bf16"], "conventional")
    assert conventional["variant"] == "conventional" and conventional["preset"] == "qwen3.5-122b-a10b"


def test_summary_reads_the_mamba2_flush_pages(sections):
    near = _summary(sections, "mamba2-bf16-flush-256-55186d4.csv.gz")
    sr = _summary(sections, "mamba2-bf16-SR-flush-256-55186d4.csv.gz")
    assert list(near) == list(sr) == ["mamba2_heads_kernel"]
    near, sr = near["mamba2_heads_kernel"], sr["mamba2_heads_kernel"]
    assert near["duration"] == "484,832 ns" and sr["duration"] == "799,680 ns"
    assert near["instructions"] == "150,622,012 inst" and sr["instructions"] == "249,558,334 inst"
    assert near["regs"] == sr["regs"] == "168 register/thread"
    assert sr["stall long_scoreboard"] == "1.73" and sr["pipe alu %"] == "42.30"


def test_a_state_that_cannot_round_stochastically_is_one_line(sections, capsys, tmp_path):
    assert sections.main([str(tmp_path), "--state-dtype", "fp32"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --state-dtype fp32: stochastic rounding needs a 16-bit or 8-bit state (bf16, fp16, int8, "
                   "fp8)"]
