"""`replayssm profile` under every stop and beside other runs: SIGTERM and Ctrl-C keep the finished rows and list the
rest once, fast; names are unique per run; an unrelated file is never overwritten; no temporary file is left or read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from typer.testing import CliRunner


from replayssm_cli.measure import profile as prof
from replayssm_cli.report import results
from replayssm_cli.main import app

SUPER = "nemotron-3-super-120b-a12b"

# A measured profile whose stand-in runner takes 50 ms a point (no GPU), run as its own process.
SLOW_PROFILE = textwrap.dedent("""
    import sys, time, types
    import replayssm_cli
    from replayssm_cli.measure import grid, profile as prof
    from replayssm_cli.main import app

    def run_point(point, context):
        time.sleep(0.05)
        samples = [10.0 + point.batch * (1 + i / 100) for i in range(9)]
        return [{"phase": phase, "ok": True, "layers": 1, "check_max_err": 1e-4, "samples_us": samples}
                for phase in grid.point_phases(point)]

    replayssm_cli.measure.bench = types.SimpleNamespace(run_point=run_point)
    sys.modules["replayssm_cli.measure.bench"] = replayssm_cli.measure.bench
    prof.detect_mode = lambda require_gpu: "measured"
    prof.measured_setup = lambda gpu, spec: {
        "environment": {"gpu": {"name": "NVIDIA H200"}}, "ceilings": None, "free_bytes": 2**36,
        "gpu_key": "h200", "gpu_name": "NVIDIA H200", "context": {}}
    app(["profile", "--preset", "%s", "--batch", ",".join(str(b) for b in range(1, 200)), "--out", sys.argv[1]])
""" % SUPER)


def _stop_while_running(tmp_path, sig):
    """Start SLOW_PROFILE, stop it with `sig` once it has rows; (exit code, seconds from the signal to its last line
    on stderr, stderr, the results path). The interpreter's own teardown (torch's) after that line is not counted."""
    import threading

    out = tmp_path / "run.json"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_PROFILE, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.is_file() and len(results.load(out).rows) >= 3:
            break
        if proc.poll() is not None:
            reader.join(timeout=10)
            pytest.fail("the profile ended before writing rows: " + "".join(line for _, line in lines)[-2000:])
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("the profile wrote no rows")
    sent = time.monotonic()
    proc.send_signal(sig)
    proc.stdout.read()
    proc.wait(timeout=30)
    reader.join(timeout=10)
    stderr = "".join(line for _, line in lines)
    return proc.returncode, lines[-1][0] - sent, stderr, out


@pytest.mark.parametrize("sig, code, word", [(signal.SIGTERM, 143, "terminated (SIGTERM)"), (signal.SIGINT, 130, "interrupted")],
                         ids=["sigterm", "ctrl-c"])
def test_profile_stopped_keeps_rows_and_lists_the_rest_once(tmp_path, sig, code, word):
    rc, took, stderr, out = _stop_while_running(tmp_path, sig)
    assert rc == code, stderr
    # a bound loose enough for a loaded 2-core machine that still fails a rewrite of the file per unfinished
    # configuration (about 400 here, over 10 s)
    assert took < 5.0, f"stopping took {took:.2f} s"
    assert word in stderr and "Traceback" not in stderr
    got = results.load(out)
    assert not got.complete and len(got.rows) >= 3
    run_labels = {f"{SUPER} {v} B{b}" for v in ("conventional", "replay") for b in range(1, 200)}
    finished = {f"{r['preset']} {r['variant']} B{r['batch']}" for r in got.rows}
    skipped = [s["what"] for s in got.skipped]
    assert all(s["why"] == prof.INTERRUPTED for s in got.skipped)
    # every configuration is either a row or listed once as not run
    assert len(skipped) == len(set(skipped))
    assert {" ".join(s.split()[:3]) for s in skipped} | finished == run_labels
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"], "no temporary or lock file is left"


def test_profile_two_runs_at_once_write_two_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    paths = {results.default_out("h200") for _ in range(50)}
    assert len(paths) == 50, "names are unique within one millisecond"
    # the same generated name for two runs: the second is refused, the first file kept
    monkeypatch.setattr(results, "default_out", lambda key, directory="runs": tmp_path / "runs" / "same-h200.json")
    first = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", "1"])
    assert first.exit_code == 0, first.output
    kept = (tmp_path / "runs" / "same-h200.json").read_text()
    second = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", "16"])
    assert second.exit_code == 2 and "another run" in second.stderr
    assert (tmp_path / "runs" / "same-h200.json").read_text() == kept


def test_profile_runs_in_the_same_second_keep_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for batch in ("1", "16"):
        res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", batch, "--no-phases"])
        assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "runs").iterdir())
    assert len(files) == 2 and {results.load(f).rows[0]["batch"] for f in files} == {1, 16}


@pytest.mark.parametrize("name, content", [("notes.txt", "my notes\n"), ("other.json", '{"kind": "something"}')])
def test_profile_out_never_overwrites_an_unrelated_file(tmp_path, monkeypatch, name, content):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = tmp_path / name
    target.write_text(content)
    os.chmod(target, 0o644)
    res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", "1", "--out", str(target)])
    assert res.exit_code == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "not a replayssm results file" in res.stderr
    assert target.read_text() == content and (target.stat().st_mode & 0o777) == 0o644


def test_profile_out_replaces_an_earlier_results_file_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    target = tmp_path / "p.json"
    for batch in ("1", "16"):
        res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--batch", batch, "--no-phases", "--out", str(target)])
        assert res.exit_code == 0, res.output
    assert "replacing the results file" in res.stderr
    assert {r["batch"] for r in results.load(target).rows} == {16}
    assert (target.stat().st_mode & 0o777) == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("value, words", [("-", "--out -"), ("", "--out"), (".", "directory")],
                         ids=["dash", "empty", "dot"])
def test_profile_out_bad_names_are_one_line(tmp_path, monkeypatch, value, words):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--out", value])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and words in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_profile_out_directory_is_named_as_one(tmp_path):
    res = CliRunner().invoke(app, ["profile", "--preset", SUPER, "--out", str(tmp_path)])
    assert res.exit_code == 2 and "is a directory" in res.stderr


def test_loaders_ignore_what_a_killed_run_leaves(tmp_path):
    """kill -9 mid-write leaves a temporary file (and a lock): neither is taken for a results file."""
    runs = tmp_path / "runs"
    w = results.ResultsWriter(runs / "h200-a.json", {"gpu": {"name": "NVIDIA H200"}}, {})
    w.close()
    time.sleep(0.01)
    (runs / ".h200-a.json.12345.abcd.tmp").write_text('{"kind": "replayssm-results", "rows": [')
    (runs / ".h200-tmp-old.json").write_text("{")
    (runs / ".b.json.lock").write_text("999999")
    assert results.newest(runs).name == "h200-a.json"
    assert [f.path.name for f in results.reference_profiles("h200", runs)] == ["h200-a.json"]
    # a lock whose process is gone is taken over
    w = results.ResultsWriter(runs / "b.json", {}, {})
    w.close()
    assert not (runs / ".b.json.lock").exists() and json.loads((runs / "b.json").read_text())["complete"]
