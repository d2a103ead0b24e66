"""benchmarks/compile_report.py without a GPU: every step kernel compiled for sm_90 and read back, and bad input."""

from __future__ import annotations

import benchmark_scripts
import pytest


@pytest.fixture(scope="module")
def fp32():
    """One compile of every step kernel at fp32, with the SASS listing of GDN's verify list kernel after the table."""
    return benchmark_scripts.run("compile_report", "--sass", "_verify_list_kernel", interpret=False)


def _table(done) -> dict[tuple[str, str], dict[str, int]]:
    lines = done.stdout.strip().split("\n\n")[0].splitlines()
    header = lines[0].split()
    # "global ld" and "global st" and the other two-word names are one column each
    names = ["op", "case", "kernel", "regs", "local", "shared", "total", "global ld", "global st", "shfl", "shared ld",
             "shared st", "barrier", "fp32", "mufu", "mma", "atomic"]
    assert " ".join(header) == " ".join(names)
    rows = {}
    for line in lines[1:]:
        cells = line.split()
        # a replay that takes its flushes in a second launch has a second kernel, its flush kernel
        case = cells[1] + (" flushes" if cells[2].endswith("flush_kernel") else "")
        rows[cells[0], case] = dict(zip(names[3:], map(int, cells[3:])))
    return rows


def test_step_kernels_compile_for_sm90_with_the_state_dtype_asked_for(fp32):
    bf16 = benchmark_scripts.run("compile_report", "--state-dtype", "bf16", interpret=False)
    assert fp32.returncode == 0 and bf16.returncode == 0, fp32.stderr + bf16.stderr
    a, b = _table(fp32), _table(bf16)
    cases = {"decode", "replay", "split-bf16", "verify"}
    assert set(a) == set(b) == {(op, case) for op in ("mamba2", "gdn") for case in cases} | {("gdn", "split-bf16 flushes")}
    assert all(row["regs"] > 0 and row["total"] > 0 for row in a.values())
    for op in ("mamba2", "gdn"):
        # a bf16 tile is a different kernel: its decode and replay compile differently from the fp32 ones
        for case in ("decode", "replay"):
            assert a[op, case] != b[op, case], (op, case)
        # split precision keeps its fp32 checkpoint whatever --state-dtype says
        assert a[op, "split-bf16"] == b[op, "split-bf16"]
    # Mamba-2's verify takes the checkpoint dtype asked for, GDN's keeps an fp32 one
    assert a["mamba2", "verify"] != b["mamba2", "verify"] and a["gdn", "verify"] == b["gdn", "verify"]
    # a bf16 tile is half the bytes: GDN's pipelined replay chunks take less shared memory
    assert b["gdn", "replay"]["shared"] < a["gdn", "replay"]["shared"]
    # the shipped verify rows: Mamba-2's without spills; GDN's takes its row sums on the tensor cores (few shuffles
    # left) with the 24 B of spills its fold's pipelined loop costs at 168 registers (measured faster, benchmarks/notes/run-59.md)
    assert a["mamba2", "verify"]["local"] == 0 == b["mamba2", "verify"]["local"]
    assert a["gdn", "verify"]["mma"] > 0 and a["gdn", "verify"]["shfl"] < 150 and a["gdn", "verify"]["local"] <= 24


def test_bad_launch_is_one_line_and_a_nonzero_exit():
    done = benchmark_scripts.run("compile_report", "--op", "gdn", "--launch", "flush:rows=16", interpret=False)
    assert done.returncode == 2 and "expected CASE:key=value" in done.stderr and "Traceback" not in done.stderr
    done = benchmark_scripts.run("compile_report", "--op", "gdn", "--launch", "replay:maxnreg=None", interpret=False)
    assert done.returncode == 2 and "'maxnreg=None' is not field=integer" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = benchmark_scripts.run("compile_report", "--state-dtype", "fp8", interpret=False)
    assert done.returncode == 2 and "invalid choice" in done.stderr
    # under the interpreter it would run the kernels at full size instead of compiling them
    done = benchmark_scripts.run("compile_report", "--op", "gdn", interpret=True)
    assert done.returncode == 2 and "run compile_report without it" in done.stderr and "Traceback" not in done.stderr


def test_sass_lists_a_kernels_memory_instructions_in_order(fp32):
    done = fp32
    assert done.returncode == 0, done.stderr
    head, _, listing = done.stdout.partition("\ngdn verify _verify_list_kernel: memory and synchronisation instructions")
    assert listing, done.stdout
    rows = [line.split(None, 1) for line in listing.strip().splitlines()[1:]]
    indices = [int(index) for index, _ in rows]
    assert indices == sorted(set(indices)) and len(indices) >= 3
    opcodes = [text.split()[1] if text.startswith("@") else text.split()[0] for _, text in rows]
    # the list kernel reads each row's fills and slot, counts the heads that fold with an atomic, and exits
    assert any(op.startswith("LDG") for op in opcodes) and "EXIT" in opcodes
    assert any(op.startswith(("ATOMG", "RED")) for op in opcodes)
    done = benchmark_scripts.run("compile_report", "--op", "mamba2", "--sass", "no_such_kernel", interpret=False)
    assert done.returncode == 2 and "no compiled kernel's name contains it" in done.stderr
    assert "Traceback" not in done.stderr
