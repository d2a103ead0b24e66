"""`replayssm check --compile`: every kernel and shipped launch row compiled per GPU generation, judged against the
committed spill baseline."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from replayssm_cli.measure import compile_check as cc
from replayssm_cli.main import app

ROW = {"op": "gdn", "entry": "replay", "row": "replay-split", "config": "fp32→bf16", "kernel": "_flush_kernel",
       "target": "sm_86", "triton": "3.6.0", "tuned": False, "regs": 168, "spills": 0, "shared": 44032,
       "status": "ok", "error": None}


def _key(row: dict) -> str:
    return f"{row['op']} {row['entry']} {row['row']} {row['config']} {row['kernel']} {row['target']}"


def test_judge_fails_compile_errors_rows_over_shared_memory_and_new_spills():
    baseline = {"3.6": {_key(ROW): 32}}
    assert cc.judge([ROW, dict(ROW, spills=32)], baseline) == []
    assert cc.judge([dict(ROW, kernel=None, status="not applicable", error="fp8 read copies need sm_89")], {}) == []
    more = cc.judge([dict(ROW, spills=40)], baseline)
    assert len(more) == 1 and "_flush_kernel spills 40 B, the baseline 32 B" in more[0] and "sm_86" in more[0]
    # a kernel or a Triton series the baseline lacks counts its spills from zero
    assert len(cc.judge([dict(ROW, spills=8, triton="3.9.0")], baseline)) == 1
    assert cc.has_baseline([dict(ROW, triton="3.9.0")], baseline) == ["3.9"]
    error = dict(ROW, kernel=None, status="error", error="CompilationError: at 12:4")
    over = dict(ROW, status="over shared memory", error="needs 120000 B of shared memory per program")
    lines = cc.judge([error, over], baseline)
    assert len(lines) == 2 and "CompilationError" in lines[0] and "120000 B" in lines[1]


def test_write_baseline_keeps_other_series(tmp_path):
    path = tmp_path / "spills.json"
    cc.write_baseline([dict(ROW, spills=16)], path)
    cc.write_baseline([dict(ROW, spills=24, triton="3.9.0"), dict(ROW, kernel=None, status="error")], path)
    assert cc.load_baseline(path) == {"3.6": {_key(ROW): 16}, "3.9": {_key(ROW): 24}}


def test_cases_cover_every_row_of_the_shipped_tables():
    keys = {c.key for c in cc.cases()}
    for module, table in (("replay", "REPLAY_LAUNCH"), ("verify", "VERIFY_LAUNCH"), ("decode", "DECODE_LAUNCH")):
        for name in getattr(cc._module(f"gdn.{module}"), table):
            assert any(k.startswith("gdn ") and f" {name} " in k for k in keys), name
    for module, table, entry in (("decode", "DECODE_LAUNCH", "decode"), ("replay", "STEP_LAUNCH", "replay"),
                                 ("replay", "MATERIALIZE_LAUNCH", "materialize"), ("verify", "VERIFY_LAUNCH", "verify")):
        for row in getattr(cc._module(f"mamba2.{module}"), table):
            assert any(k.startswith(f"mamba2 {entry} {row} ") for k in keys), row
    # an fp8 read copy applies from sm_89 only
    assert {c.min_arch for c in cc.cases() if c.config.endswith("fp8")} == {89}


def test_compile_refuses_the_interpreter_and_bad_targets():
    # the CPU suite runs under TRITON_INTERPRET=1, where nothing compiles
    res = CliRunner().invoke(app, ["check", "--compile", "--target", "sm_90"])
    assert res.exit_code == 2 and "TRITON_INTERPRET=1" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = CliRunner().invoke(app, ["check", "--target", "sm_90"])
    assert res.exit_code == 2 and "add --compile" in res.stderr
    assert cc.parse_targets("sm_80,90") == (80, 90)
    res = CliRunner().invoke(app, ["check", "--compile", "--target", "sm_75"])
    assert res.exit_code == 2 and "sm_75" in res.stderr and "sm_120" in res.stderr
    res = CliRunner().invoke(app, ["check", "--compile", "--function", "fold"])
    assert res.exit_code == 2 and "use one of" in res.stderr


def test_compile_check_compiles_for_the_oldest_and_newest_generation_against_the_baseline():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "replayssm_cli.main", "check", "--compile", "--json", "--op", "mamba2",
                           "--function", "accept_snapshot", "--target", "sm_80,sm_120"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [(r["row"], r["target"]) for r in rows] == [("decode-fp32-n128", "sm_80"), ("decode-fp32-n128", "sm_120")]
    assert all(r["status"] == "ok" and r["regs"] > 0 and r["kernel"] == "mamba2_accept_snapshot_kernel"
               for r in rows), rows
    assert not any(r["tuned"] for r in rows), "sm_80 and sm_120 take sm_90's rows untuned"


def test_a_row_with_pdl_compiles_for_a_chip_without_it_as_select_gives_it():
    """sm_80 to sm_89 run sm_90's rows without programmatic dependent launch; the check compiles them so, and refuses
    nothing that a user there would get."""
    replay = importlib.import_module("replayssm_kernels.gdn.replay")
    assert replay.REPLAY_LAUNCH["replay-split"].pdl, "the shipped split row launches its flushes early on sm_90"
    index = next(i for i, c in enumerate(cc.cases()) if (c.op, c.entry, c.row) == ("gdn", "replay", "replay-split"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import json; from replayssm_cli.measure import compile_check as cc; print(json.dumps(cc.compile_case({index}, 86)))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert rows and all(r["status"] == "ok" for r in rows), rows
    assert {r["kernel"] for r in rows} == {"_replay_kernel", "_flush_kernel"}


def test_the_stored_precisions_are_compiled_too():
    """Every row of the functions that store a state comes with an int8 checkpoint rounded stochastically, the first
    of each also with a bf16 state rounded stochastically and an fp8 one (sm_89 and newer); one such case compiles
    on the CPU for sm_80 with its scales and random draws, and the fp8 one is not applicable there."""
    every = cc.cases()
    for op in ("mamba2", "gdn"):
        for entry in cc.STORE_ENTRIES:
            configs = {c.config for c in every if c.op == op and c.entry == entry}
            assert {"int8+sr", "bf16+sr", "fp8"} <= configs, (op, entry, configs)
    assert {c.min_arch for c in every if c.config == "fp8"} == {89}
    index = next(i for i, c in enumerate(every) if (c.op, c.entry, c.config) == ("gdn", "decode", "int8+sr"))
    fp8 = next(i for i, c in enumerate(every) if (c.op, c.entry, c.config) == ("gdn", "decode", "fp8"))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json; from replayssm_cli.measure import compile_check as cc; "
            f"print(json.dumps([cc.compile_case({index}, 80), cc.compile_case({fp8}, 80)]))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows, fp8_rows = json.loads(done.stdout)
    assert rows and all(r["status"] == "ok" for r in rows), rows
    assert [r["status"] for r in fp8_rows] == ["not applicable"] and "fp8 states need sm_89" in fp8_rows[0]["error"]
