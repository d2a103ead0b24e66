"""benchmarks/profile_rows.py: kernel rows' settings overridden before `replayssm profile` runs."""

from __future__ import annotations

import importlib
import json

import pytest

import benchmark_scripts

script = benchmark_scripts.fixture("profile_rows")


@pytest.fixture
def replay_rows():
    """mamba2.replay's STEP_LAUNCH and gdn.decode's DECODE_LAUNCH, restored after the test."""
    replay = importlib.import_module("replayssm_kernels.mamba2.replay")
    decode = importlib.import_module("replayssm_kernels.gdn.decode")
    saved = dict(replay.STEP_LAUNCH), dict(decode.DECODE_LAUNCH)
    yield replay, decode
    replay.STEP_LAUNCH.update(saved[0])
    decode.DECODE_LAUNCH.update(saved[1])


def test_set_changes_the_named_row_only(script, replay_rows):
    replay, decode = replay_rows
    before = replay.STEP_LAUNCH["replay-fp32-large"]
    row = script.apply_set(*script.parse_set("mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=0,stages=2"))
    assert row is replay.STEP_LAUNCH["replay-bf16-large"]
    assert (row.prefetch, row.stages, row.precision) == (False, 2, "tf32")
    assert replay.STEP_LAUNCH["replay-fp32-large"] == before
    small = decode.DECODE_LAUNCH["decode-bf16-small"]
    row = script.apply_set(*script.parse_set("gdn.decode:DECODE_LAUNCH:decode-small:rows=16"))
    assert row is decode.DECODE_LAUNCH["decode-small"] and row.rows == 16
    assert decode.DECODE_LAUNCH["decode-bf16-small"] == small


@pytest.mark.parametrize("text,message", [
    ("mamba2.replay:STEP_LAUNCH", "expected MODULE:TABLE:ROW:key=value"),
    ("mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch", "'prefetch' is not key=value"),
    ("mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=on", "prefetch='on' is not an integer"),
    ("mamba2.replays:STEP_LAUNCH:replay-bf16-large:prefetch=1", "no module replayssm_kernels.mamba2.replays"),
    ("mamba2.replay:LARGE_STEPS:1:prefetch=1", "has no table 'LARGE_STEPS'"),
    ("mamba2.replay:STEP_LAUNCH:replay-bf16-huge:prefetch=1", "has no row 'replay-bf16-huge'"),
    ("mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefech=1", "StepConfig has no field 'prefech'"),
    ("gdn.decode:DECODE_LAUNCH:decode-large:rows=4", "has no row 'decode-large'; its rows: decode, decode-small"),
    ("gdn.decode:DECODE_LAUNCH:decode:ROWS=4", "DecodeConfig has no field 'ROWS'"),
])
def test_bad_set_is_one_line_and_exit_2(script, replay_rows, capsys, text, message):
    before = replay_rows[0].STEP_LAUNCH["replay-bf16-large"]
    assert script.main(["--set", text, "--", "--help"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert replay_rows[0].STEP_LAUNCH["replay-bf16-large"] is before


def test_profile_runs_after_the_set(script, replay_rows, tmp_path, capsys):
    """The arguments after -- go to `replayssm profile` (predicted rows on a machine without a GPU), after the row is
    set; a bad profile option is its one-line error and exit 2."""
    out = tmp_path / "rows.json"
    assert script.main(["--set", "mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=0", "--", "-p",
                        "nemotron-3-super-120b-a12b", "--batch", "1", "--state-dtype", "bf16", "--no-phases",
                        "--out", str(out)]) == 0
    assert replay_rows[0].STEP_LAUNCH["replay-bf16-large"].prefetch is False
    rows = json.loads(out.read_text())["rows"]
    assert {r["variant"] for r in rows} == {"conventional", "replay"} and all(r["batch"] == 1 for r in rows)
    capsys.readouterr()
    assert script.main(["--set", "mamba2.replay:STEP_LAUNCH:replay-bf16-large:prefetch=1", "--", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "No such option: --bogus" in err
