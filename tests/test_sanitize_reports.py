"""benchmarks/sanitize_reports.py over excerpts of real compute-sanitizer logs (benchmarks/notes/run-71/)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sanitize_reports", ROOT / "benchmarks" / "sanitize_reports.py")
sanitize_reports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sanitize_reports)

LOG = """========= COMPUTE-SANITIZER
== case gdn-split-fp8-large (batch 64, 4 steps)
== done gdn-split-fp8-large in 46.2 s
== case gdn-verify-fp32-small (batch 1, 4 steps)
========= Error: Race reported between Write access at _verify_kernel+0x9b80 in replay.py:1329
=========     and Write access at _verify_kernel+0x9b80 in replay.py:1329 [2047 hazards]
=========
========= Error: Race reported between Write access at _verify_kernel+0x4ee0 in replay.py:1325
=========     and Write access at _verify_kernel+0x4ee0 in replay.py:1325 [138 hazards]
=========
========= Error: Race reported between Write access at _verify_kernel+0x9b50 in replay.py:1329
=========     and Write access at _verify_kernel+0x9b50 in replay.py:1329 [2027 hazards]
== done gdn-verify-fp32-small in 2.7 s
== case mamba2-decode-fp32-small (batch 1, 2 steps)
========= Invalid __global__ write of size 4 bytes
========= RACECHECK SUMMARY: 3 hazards displayed (3 errors, 0 warnings)
"""


def test_reports_group_by_case_and_source_line():
    got = sanitize_reports.reports(LOG)
    assert list(got) == ["gdn-split-fp8-large", "gdn-verify-fp32-small", "mamba2-decode-fp32-small"]
    assert not got["gdn-split-fp8-large"]
    assert got["gdn-verify-fp32-small"] == {
        "Error: Write _verify_kernel replay.py:1329 / Write replay.py:1329": 2047 + 2027,
        "Error: Write _verify_kernel replay.py:1325 / Write replay.py:1325": 138,
    }
    # a memcheck error counts under its case; the summary line is not a report
    assert sum(got["mamba2-decode-fp32-small"].values()) == 1


def test_the_committed_logs_parse(capsys):
    logs = sorted((ROOT / "benchmarks" / "notes" / "run-71").glob("*check-*.txt"))
    assert logs
    sanitize_reports.main([str(p) for p in logs])
    printed = capsys.readouterr().out
    assert "gdn-replay-fp32-large                clean" in printed
    assert "gdn-verify-fp8-large" in printed and "replay.py:1329" in printed
