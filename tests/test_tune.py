"""`replayssm tune`: the decision logic on crafted numbers, and the command on crafted results files."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from replayssm_cli.measure import trace as trace_mod
from replayssm_cli.advise import tuner, verdict
from replayssm_cli.main import app
from replayssm_cli.advise.tuner import Candidate, Timing
from replayssm_cli.model.dtypes import precision_label
from replayssm_cli.model.shapes import Mamba2Shape

FIXTURES = Path(__file__).parent / "fixtures"
MAMBA2_RESULTS = FIXTURES / "tune_mamba2_h200.json"
GDN_RESULTS = FIXTURES / "tune_gdn_h200.json"
SUPER, QWEN = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b"
# A short quality run: 300 generated tokens of 2 heads is enough to separate bf16 states (~3e-3) from a
# bf16 read copy (~3e-4) and fp8 (~4e-3) at the default 1e-3 budget.
QUICK = ("--steps", "300", "--heads", "2")
MIB = 2**20


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch, tmp_path):
    from replayssm_cli.measure import precompile

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(precompile, "wanted", lambda: False)
    monkeypatch.setenv("REPLAYSSM_CACHE_DIR", str(tmp_path / "cache"))


def invoke(*args: str):
    return CliRunner().invoke(app, ["tune", *args])


def run_json(*args: str) -> dict:
    res = invoke(*args, *QUICK, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def decision(report: dict, batch: int, mode: str = "decode") -> dict:
    return next(d for d in report["decisions"] if d["batch"] == batch and d["mode"].startswith(mode))


def candidate(d: dict, label: str) -> dict:
    return next(c for c in d["candidates"] if c["label"] == label)


def _timing(us: float, spread: float = 0.02) -> Timing:
    return Timing(us, us, spread, "measured")


def _decide(times: dict, errors: dict | None = None, mem: dict | None = None, **kw):
    cands = [c for c in tuner.candidates(windows=(16,), state_dtypes=("fp32", "bf16"), read_dtypes=("bf16",)) if c.label() in times]
    return tuner.decide(
        kw.pop("batch", 64),
        cands,
        timing=lambda c, b: times[c.label()],
        error=lambda c: (errors or {}).get(c.label(), 1e-7),
        memory=lambda c: {"state": (mem or {}).get(c.label(), MIB), "total": (mem or {}).get(c.label(), MIB)},
        layers=kw.pop("layers", 10),
        **kw,
    )


def test_decide_picks_the_fastest_within_both_budgets():
    d = _decide({
        "conventional fp32": _timing(100), "replay W16 fp32": _timing(60), "split W16 fp32+bf16": _timing(45),
        "replay W16 bf16": _timing(40), "conventional bf16": _timing(50),
    }, errors={"replay W16 bf16": 3e-3, "conventional bf16": 4e-3, "split W16 fp32+bf16": 3e-4})
    assert d.replay_pays and d.choice.candidate.label() == "split W16 fp32+bf16"
    assert d.choice.speedup == pytest.approx(100 / 45)
    verdicts = {a.candidate.label(): (a.verdict, a.rejected_for) for a in d.assessments}
    assert verdicts["replay W16 bf16"] == ("rejected", "error")
    assert verdicts["conventional bf16"] == ("rejected", "error")
    assert verdicts["replay W16 fp32"] == ("rejected", "slower")
    assert verdicts["conventional fp32"] == ("rejected", "slower")
    assert "batch 64: run split W16 fp32+bf16 (2.22x over conventional fp32)" == d.summary


def test_decide_keeps_conventional_when_replay_is_within_the_spread():
    d = _decide({"conventional fp32": _timing(100, 0.10), "replay W16 fp32": _timing(95, 0.10)})
    assert not d.replay_pays and d.choice.candidate.label() == "conventional fp32"
    rep = next(a for a in d.assessments if a.candidate.is_replay)
    assert rep.rejected_for == "no-gain" and "1.05x over conventional fp32" in rep.reason
    assert "ReplaySSM does not pay" in d.summary
    # The same 5% with tight samples is a win.
    d = _decide({"conventional fp32": _timing(100, 0.02), "replay W16 fp32": _timing(95, 0.02)})
    assert d.replay_pays and d.choice.candidate.label() == "replay W16 fp32"


def test_decide_rejects_over_the_memory_budget_with_the_arithmetic():
    mem = {"conventional fp32": 4 * MIB, "replay W16 fp32": 5 * MIB}
    times = {"conventional fp32": _timing(100), "replay W16 fp32": _timing(50)}
    # 64 sequences x 10 layers x 5 MiB = 3200 MiB of replay against 2560 MiB of conventional.
    d = _decide(times, mem=mem, memory_budget=3000 * MIB)
    rep = next(a for a in d.assessments if a.candidate.is_replay)
    assert rep.rejected_for == "memory"
    assert rep.reason == "64 x 50 MiB = 3.12 GiB, over the 2.93 GiB budget (fits 60 sequences)"
    assert d.choice.candidate.label() == "conventional fp32" and d.choice.seqs_fit == 75
    d = _decide(times, mem=mem, memory_budget=1000 * MIB)
    assert d.choice is None and d.summary == "no candidate meets the error and memory budgets"


def test_decide_failed_and_unmeasured_candidates_are_rejected():
    failed = Timing(float("nan"), float("nan"), 0.0, "measured", status="failed", note="failed its check against the reference (max error 4.0e-01)")
    d = _decide({"conventional fp32": _timing(100), "replay W16 fp32": failed, "split W16 fp32+bf16": None})
    got = {a.candidate.label(): a.rejected_for for a in d.assessments}
    assert got == {"conventional fp32": "", "replay W16 fp32": "failed", "split W16 fp32+bf16": "unavailable"}
    assert d.choice.candidate.label() == "conventional fp32" and d.choice.verdict == "recommended"


def test_decide_breaks_a_tie_on_the_smaller_error():
    d = _decide(
        {"conventional fp32": _timing(100), "replay W16 fp32": _timing(50), "replay W16 bf16": _timing(50)},
        errors={"replay W16 fp32": 1e-7, "replay W16 bf16": 5e-4},
    )
    assert d.choice.candidate.label() == "replay W16 fp32"


def test_candidates_cover_the_grid():
    cands = tuner.candidates(windows=(8, 16), state_dtypes=("fp32", "bf16"), read_dtypes=("bf16", "fp8"), drafts=(4,), accept_rate=0.5)
    labels = [c.label() for c in cands]
    assert labels[:2] == ["conventional fp32", "conventional bf16"]
    assert "split W8 fp32+fp8" in labels and "spec-replay T4 W16 bf16" in labels and "spec-conventional T4 fp32" in labels
    assert len(cands) == 2 + 4 + 4 + 2 + 4
    spec = next(c for c in cands if c.draft)
    assert spec.accepted == pytest.approx(0.5 + 0.25 + 0.125 + 0.0625)
    assert Candidate("split", "fp32", 8, "fp8").quality_key() == ("split", "fp32", 8, "fp8", "nearest")
    assert Candidate("spec-replay", "bf16", 16, draft=4, accepted=2.0).quality_key() == ("replay", "bf16", 16, None, "nearest")
    assert Candidate("spec-conventional", "fp16", draft=4, accepted=2.0).quality_key() == ("conventional", "fp16", None, None, "nearest")


def test_candidates_with_eight_bit_states_and_stochastic_rounding():
    cands = tuner.candidates(windows=(8,), state_dtypes=("fp32", "bf16", "int8"), read_dtypes=("bf16",), drafts=(2,),
                             roundings=("nearest", "stochastic"))
    labels = [c.label() for c in cands]
    # fp32 is stored exactly: no SR twin; 16-bit and 8-bit states both ways; no speculative 8-bit candidates
    assert labels[:5] == ["conventional fp32", "conventional bf16", "conventional bf16 SR", "conventional int8",
                          "conventional int8 SR"]
    assert "replay W8 int8 SR" in labels and "split W8 fp32+bf16" in labels and "replay W8 fp32 SR" not in labels
    assert not [c for c in cands if c.draft and c.state_dtype == "int8"]
    assert "spec-replay T2 W8 bf16 SR" in labels
    sr = next(c for c in cands if c.label() == "replay W8 int8 SR")
    assert sr.quality_key() == ("replay", "int8", 8, None, "stochastic")
    shape = Mamba2Shape(H=4, P=8, N=16, G=2)
    assert tuner.memory_of(shape, sr)["state"] == shape.state_elems + shape.state_rows * 4


def test_timing_from_rows_prefers_staggered_and_counts_tokens():
    rows = json.loads(GDN_RESULTS.read_text())["rows"]
    c = Candidate("spec-replay", "fp32", 16, draft=4, accepted=2.0)
    t = tuner.timing_from_rows(rows, c, 64, preset=QWEN)
    assert t.us == 280.0 and t.us_per_token == pytest.approx(280.0 / 3.0) and t.source == "measured"
    aligned = dict(rows[3], flush="aligned", us=10.0, us_per_token=10.0)
    t = tuner.timing_from_rows([aligned, rows[3]], Candidate("replay", "fp32", 16), 64)
    assert t.us == 95.0
    assert tuner.timing_from_rows(rows, Candidate("replay", "fp32", 8), 64) is None


def test_tune_picks_the_expected_answer_from_a_results_file():
    report = run_json("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "1,16,256",
                      "--window", "8,16", "--state-dtype", "fp32,bf16", "--read-dtype", "bf16,fp8")
    assert report["timing"]["mode"] == "results" and report["baseline"] == "conventional fp32"
    one, sixteen, big = decision(report, 1), decision(report, 16), decision(report, 256)
    # Batch 1: everything ReplaySSM is slower or within the spread; bf16 state is over the error budget.
    assert one["recommended"]["label"] == "conventional fp32" and not one["replay_pays"]
    assert candidate(one, "split W16 fp32+bf16")["rejected_for"] == "no-gain"
    assert candidate(one, "conventional bf16")["rejected_for"] == "error"
    # Batch 16: 5% faster with 10-12% spreads is not a win.
    assert sixteen["recommended"]["label"] == "conventional fp32"
    assert "within the spread" in candidate(sixteen, "split W16 fp32+bf16")["reason"]
    # Batch 256: split precision with a bf16 copy; fp8 faster but over budget; a failed kernel is out.
    rec = big["recommended"]
    assert rec["label"] == "split W16 fp32+bf16" and big["replay_pays"]
    assert rec["speedup"] == pytest.approx(568 / 210) and rec["source"] == "measured"
    assert rec["memory_per_layer"]["read_copy"] == 128 * 64 * 128 * 2 and rec["mem_per_seq"] == rec["memory_per_layer"]["total"] * 40
    assert candidate(big, "split W16 fp32+fp8")["rejected_for"] == "error"
    assert candidate(big, "replay W8 bf16")["rejected_for"] == "failed"
    assert candidate(big, "replay W16 fp32")["rejected_for"] == "slower"
    assert all(c["source"] == "measured" for d in report["decisions"] for c in d["candidates"])
    quality = {c["config"]: c for c in report["quality"]["configs"]}
    assert quality["conventional bf16"]["longest"] > 1e-3 > quality["split W16 fp32+bf16"]["longest"]


def test_tune_memory_budget_turns_down_the_fastest():
    report = run_json("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "8,16",
                      "--state-dtype", "fp32", "--read-dtype", "bf16", "--memory-budget", "50")
    d = decision(report, 256)
    split = candidate(d, "split W16 fp32+bf16")
    assert split["rejected_for"] == "memory" and "over the 50 GiB budget" in split["reason"]
    assert d["recommended"]["label"] == "replay W16 fp32"
    assert d["recommended"]["seqs_fit"] == int(50 * 2**30 // d["recommended"]["mem_per_seq"])
    assert report["memory_budget_bytes"] == 50 * 2**30


def test_tune_says_when_replay_is_slower_beyond_the_spread(tmp_path):
    """A ReplaySSM step slower than conventional by more than both spreads is called slower, not a tie."""
    data = json.loads(GDN_RESULTS.read_text())
    for row in data["rows"]:
        if row["variant"] == "replay" and row["batch"] == 1:
            row["us"] = row["us_per_token"] = 5.0
    results = tmp_path / "slower.json"
    results.write_text(json.dumps(data))
    one = decision(run_json("--preset", QWEN, "--results", str(results), "--batch", "1", "--window", "16",
                            "--state-dtype", "fp32", "--read-dtype", "none"), 1)
    assert one["recommended"]["label"] == "conventional fp32"
    assert one["recommended"]["reason"] == "ReplaySSM does not pay here: conventional decode is faster"
    replay = candidate(one, "replay W16 fp32")
    assert replay["rejected_for"] == "no-gain"
    assert replay["reason"] == "0.80x over conventional fp32: slower beyond the spread"


def test_tune_speculative_groups_from_a_results_file():
    report = run_json("--preset", QWEN, "--results", str(GDN_RESULTS), "--batch", "1,64", "--window", "16",
                      "--state-dtype", "fp32", "--read-dtype", "none", "--draft", "4", "--accept-rate", "0.8")
    assert [(d["batch"], d["mode"]) for d in report["decisions"]] == [
        (1, "decode"), (1, "verify T=4 (2.36 accepted)"), (64, "decode"), (64, "verify T=4 (2.36 accepted)"),
    ]
    assert decision(report, 1)["recommended"]["label"] == "conventional fp32"
    assert decision(report, 64)["recommended"]["label"] == "replay W16 fp32"
    spec = decision(report, 64, "verify")
    assert spec["recommended"]["label"] == "spec-replay T4 W16 fp32" and spec["baseline"] == "spec-conventional T4 fp32"
    assert spec["recommended"]["speedup"] == pytest.approx(900 / 280)
    assert spec["recommended"]["us_per_token"] == pytest.approx(280 / 3.3616)


def test_tune_predicts_what_the_results_file_lacks():
    """A candidate the H200 file lacks gets the calibrated predictor's time (fitted on the shipped H200 measurements),
    its interval the fit's error."""
    from replayssm_cli.model import calibration, presets

    report = run_json("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16,32",
                      "--state-dtype", "fp32", "--read-dtype", "bf16")
    d = decision(report, 256)
    assert candidate(d, "replay W16 fp32")["source"] == "measured"
    w32 = candidate(d, "replay W32 fp32")
    pred = calibration.predict_step(presets.resolve(SUPER), "replay", batch=256, window=32, state_dtype="fp32", gpu="h200")
    assert w32["source"] == "predicted" and "calibrated on H200" in w32["time_origin"]
    assert w32["us_per_token"] == pytest.approx(pred.us)
    # The file measured W16 only: a W32 time borrows the curve, so its interval is at least BORROWED_ERROR.
    assert "W32 never measured" in w32["time_origin"]
    assert w32["spread"] == pytest.approx(2 * max(pred.error, tuner.BORROWED_ERROR))


def test_tune_measures_on_a_gpu_through_the_profiler(monkeypatch):
    """With CUDA and no --results, tune profiles its candidates and runs the quality check on the kernels too."""
    from replayssm_cli.measure import profile as prof
    from replayssm_cli.measure import quality
    from replayssm_cli.report import results

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    measured = results.load(MAMBA2_RESULTS)
    seen = {}

    def fake_run_profile(spec, **kw):
        seen.update(spec=spec, kw=kw)
        return SimpleNamespace(results=measured, path=Path("runs/tune.json"), interrupted=False, gpu_name="NVIDIA H200")

    monkeypatch.setattr(prof, "run_profile", fake_run_profile)
    monkeypatch.setattr(quality, "run_kernels", lambda inputs, configs, **kw: {c: {"1-128": 1e-7, "129-1k": 2e-7} for c in configs})
    report = run_json("--preset", SUPER, "--batch", "256", "--window", "8,16", "--state-dtype", "bf16", "--read-dtype", "bf16")
    spec = seen["spec"]
    assert (spec.presets, spec.batches, spec.windows) == ((SUPER,), (256,), (8, 16))
    assert spec.state_dtypes == ("fp32", "bf16") and spec.read_dtypes == ("bf16",) and seen["kw"]["require_gpu"]
    assert report["timing"]["mode"] == "measured" and report["timing"]["results_file"] == "runs/tune.json"
    assert decision(report, 256)["recommended"]["label"] == "split W16 fp32+bf16"
    # The kernels rerun the quality inputs for the recommendation only.
    assert report["quality"]["kernel_device"] == "cuda"
    assert [c["config"] for c in report["quality"]["configs"] if c["kernel"]] == ["split W16 fp32+bf16"]


def test_tune_without_a_gpu_reads_the_shipped_h200_reference(tmp_path):
    """No GPU, the H200 (default): the reference profile's times, the newest run of a configuration first; the
    candidates it lacks predicted and scaled by its measured ones."""
    from replayssm_cli.report.results import load_reference

    out = tmp_path / "tune.json"
    res = invoke("--preset", QWEN, "--batch", "1,256", "--window", "16", "--state-dtype", "fp32,fp16", "--read-dtype", "none",
                 "--out", str(out), *QUICK)
    assert res.exit_code == 0, res.output
    assert "no CUDA GPU here: times from the shipped NVIDIA H200 reference profile" in " ".join(res.stderr.split())
    report = json.loads(out.read_text())
    assert report["timing"]["mode"] == "reference"
    ref = load_reference("h200")
    rows = [r for r in ref.rows if r["kind"] == "kernel" and r["preset"] == QWEN and r["variant"] == "replay"
            and r["batch"] == 256 and r["window"] == 16 and r["state_dtype"] == "fp32" and r["phase"] == "avg"
            and not r.get("draft")]
    replay = candidate(decision(report, 256), "replay W16 fp32")
    assert replay["source"] == "measured" and replay["us_per_token"] == pytest.approx(rows[0]["us_per_token"])
    fp16 = candidate(decision(report, 256), "replay W16 fp16")
    assert fp16["source"] == "predicted" and "calibrated on H200" in fp16["time_origin"]
    # the shipped file it was measured in, with its GPU, date and commit
    assert re.search(r"h200-[a-z0-9-]+\.json \(NVIDIA H200, \d{4}-\d\d-\d\d, [0-9a-f]{7}\)", replay["time_origin"])


def test_tune_predicts_without_a_gpu_and_says_so(tmp_path):
    out = tmp_path / "tune.json"
    res = invoke("--preset", QWEN, "--gpu", "b200", "--batch", "1,256", "--window", "16", "--out", str(out), "--details", *QUICK)
    assert res.exit_code == 0, res.output
    assert "no CUDA GPU here: predicting" in res.stderr
    assert "Recommendation" in res.stdout and "predicted" in res.stdout and "every candidate" in res.stdout
    assert "pred [1]" in res.stdout and "rests on a prediction: confirm with" in res.stdout
    report = json.loads(out.read_text())
    assert report["timing"]["mode"] == "predicted"
    assert {c["source"] for d in report["decisions"] for c in d["candidates"]} == {"predicted"}
    assert report["quality"]["op"] == "gdn" and report["quality"]["generated_tokens"] == 300


def test_tune_runs_quality_on_a_trace(tmp_path):
    rng = np.random.default_rng(1)
    T, H, P, N, G = 140, 4, 64, 128, 1
    arrays = {
        "x": rng.standard_normal((T, H, P)), "dt": 0.5 * rng.standard_normal((T, H)),
        "B": rng.standard_normal((T, G, N)), "C": rng.standard_normal((T, G, N)),
        "A": -np.linspace(1, 16, H), "D": np.ones(H), "dt_bias": np.linspace(-6.9, -2.25, H),
    }
    path = trace_mod.write(tmp_path / "t.npz", trace_mod.Trace("mamba2", arrays, prompt_tokens=40, model="tiny", layer=2))
    res = invoke("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16",
                 "--state-dtype", "fp32", "--read-dtype", "bf16", "--trace", str(path), "--json")
    assert res.exit_code == 0, res.output
    q = json.loads(res.stdout)["quality"]
    assert q["source"] == "trace tiny layer 2" and q["generated_tokens"] == 100 and q["prompt_tokens"] == 40
    assert "quality runs the trace's dimensions" in " ".join(res.stderr.split())


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "tune needs a preset"),
        (("--preset", "no-such-model"), "unknown preset"),
        (("--preset", SUPER, "--window", "0"), "--window 0 is out of range"),
        (("--preset", SUPER, "--window", "65"), "--window 65 is out of range"),
        (("--preset", SUPER, "--batch", "x"), "--batch 'x' is not an integer"),
        (("--preset", SUPER, "--batch", "0"), "--batch 0 is not a batch size"),
        (("--preset", SUPER, "--state-dtype", "fp64"), "--state-dtype 'fp64'"),
        (("--preset", SUPER, "--read-dtype", "int8"), "--read-dtype 'int8'"),
        (("--preset", SUPER, "--io-dtype", "fp8"), "--io-dtype 'fp8'"),
        (("--preset", SUPER, "--draft", "9"), "--draft 9 is out of range"),
        (("--preset", SUPER, "--accept-rate", "1.5"), "--accept-rate 1.5"),
        (("--preset", SUPER, "--error-budget", "0"), "--error-budget 0.0 must be positive"),
        (("--preset", SUPER, "--memory-budget", "-1"), "--memory-budget -1.0"),
        (("--preset", SUPER, "--heads", "0"), "--heads 0"),
        (("--preset", SUPER, "--heads", "1000"), "--heads 1000 is more than the 128 heads of a layer"),
        (("--preset", SUPER, "--steps", "100000000"), "--steps 100,000,000 needs about"),
        (("--preset", SUPER, "--memory-budget", "inf"), "--memory-budget inf must be a positive, finite number"),
        (("--preset", SUPER, "--memory-budget", "nan"), "--memory-budget nan"),
        (("--preset", SUPER, "--error-budget", "inf"), "--error-budget inf is not a relative error"),
        (("--preset", SUPER, "--out", "notes.txt"), "--out notes.txt exists and is not a tune report"),
        (("--preset", SUPER, "--tp", "3"), "tp=3 does not divide"),
        (("--preset", SUPER, "--results", "missing.json"), "does not exist"),
        (("--preset", QWEN, "--results", str(MAMBA2_RESULTS)), f"has no rows for preset {QWEN}"),
        (("--preset", SUPER, "--gpu", "no-such-gpu"), "unknown GPU"),
        (("--preset", QWEN, "--gpu", "h200", "--trace", "missing.npz"), "trace file missing.npz does not exist"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_tune_bad_options_exit_with_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.stderr
    assert (tmp_path / "notes.txt").read_text() == "my notes"


def test_tune_refuses_stochastic_rounding_of_odd_mamba2_rows(tmp_path):
    """Mamba-2's stores pair a row's neighbours: a preset of odd N asked for stochastic rounding is one line, exit 2."""
    config = json.loads((FIXTURES / "configs" / "nemotron_h_super.json").read_text())
    config["ssm_state_size"] = 127
    (tmp_path / "config.json").write_text(json.dumps(config))
    res = invoke("--preset-file", str(tmp_path / "config.json"), "--batch", "64", "--state-dtype", "bf16",
                 "--stochastic-rounding")
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "the rows of N = 127 have an odd length" in lines[0], res.stderr


def test_tune_trace_of_the_wrong_op(tmp_path):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((20, 1, 8))
    arrays = {"q": q, "k": q, "v": rng.standard_normal((20, 2, 4)), "g": -np.ones((20, 2)) * 0.1, "beta": np.full((20, 2), 0.5)}
    path = trace_mod.write(tmp_path / "gdn.npz", trace_mod.Trace("gdn", arrays, prompt_tokens=5))
    res = invoke("--preset", SUPER, "--gpu", "h200", "--trace", str(path))
    assert res.exit_code == 2
    assert "is from a gdn layer but preset nemotron-3-super-120b-a12b is mamba2" in res.stderr


def test_tune_help_has_examples():
    res = CliRunner().invoke(app, ["tune", "--help"])
    assert res.exit_code == 0
    assert "Examples" in res.stdout and "replayssm tune --preset" in res.stdout


def test_tune_measured_only_leaves_out_what_the_results_file_lacks():
    """--measured-only: the candidates the file measured compete; the others are turned down as untimed, not predicted."""
    report = run_json("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16,32",
                      "--state-dtype", "fp32", "--read-dtype", "bf16", "--measured-only")
    d = decision(report, 256)
    assert "not timed (--measured-only)" in report["timing"]["describe"]
    w32 = candidate(d, "replay W32 fp32")
    assert w32["rejected_for"] == "unavailable" and "not predicted" in w32["reason"]
    assert d["recommended"]["source"] == "measured" and d["recommended"]["label"] == "split W16 fp32+bf16"
    res = invoke("--preset", SUPER, "--measured-only")
    assert res.exit_code == 2 and "--measured-only needs --results" in res.stderr


def _pred(us: float, error: float = 0.05) -> Timing:
    return Timing(us, us, 2 * error, "predicted", origin="the cost model")


def test_decide_prefers_a_measured_candidate_over_a_prediction_within_its_error():
    """A predicted candidate 8% faster with a ±10% error does not displace the measured one."""
    d = _decide({"conventional fp32": _timing(100), "replay W16 fp32": _timing(60), "split W16 fp32+bf16": _pred(55, 0.10)})
    assert d.choice.candidate.label() == "replay W16 fp32" and not d.predicted
    split = next(a for a in d.assessments if a.candidate.label() == "split W16 fp32+bf16")
    assert split.rejected_for == "unconfirmed" and "beyond its error" in split.reason


def test_decide_a_prediction_wins_beyond_its_error_and_says_so():
    d = _decide({"conventional fp32": _timing(100), "replay W16 fp32": _timing(60), "split W16 fp32+bf16": _pred(40, 0.10)})
    assert d.choice.candidate.label() == "split W16 fp32+bf16" and d.replay_pays and d.predicted
    assert d.to_dict()["predicted"] is True
    line = verdict.lines_from([d], preset=SUPER, error_budget=1e-3)[0]
    assert line.source == "predicted"
    assert line.confirm == (f"replayssm profile -p {SUPER} -b 64 -w 16 --state-dtype fp32 --read-dtype bf16 --require-gpu")
    text = verdict.render([line], title="t", over="o")
    assert "rests on a prediction: confirm with" in text and line.confirm.split(" --require-gpu")[0][:60] in text


def test_decide_a_tie_goes_to_the_preset_dtype_and_the_shorter_window():
    d = _decide({"conventional fp32": _timing(100), "replay W16 fp32": _timing(50.5), "replay W16 bf16": _timing(50)},
                errors={"replay W16 bf16": 1e-5})
    assert d.choice.candidate.label() == "replay W16 fp32"
    bf16 = next(a for a in d.assessments if a.candidate.label() == "replay W16 bf16")
    assert bf16.rejected_for == "tie" and "keeps the preset's fp32 state" in bf16.reason
    cands = [Candidate("conventional", "fp32"), Candidate("replay", "fp32", 8), Candidate("replay", "fp32", 32)]
    times = {"conventional fp32": _timing(100), "replay W8 fp32": _timing(50.6), "replay W32 fp32": _timing(50)}
    d = tuner.decide(64, cands, timing=lambda c, b: times[c.label()], error=lambda c: 1e-7,
                     memory=lambda c: {"total": MIB}, layers=1)
    assert d.choice.candidate.label() == "replay W8 fp32"
    w32 = next(a for a in d.assessments if a.candidate.window == 32)
    assert w32.rejected_for == "tie" and "W8 is the shorter window" in w32.reason


def test_decide_beyond_the_spread_is_not_a_tie():
    d = _decide({"conventional fp32": _timing(100), "replay W16 fp32": _timing(56), "replay W16 bf16": _timing(50)},
                errors={"replay W16 bf16": 1e-5})
    assert d.choice.candidate.label() == "replay W16 bf16"


def test_calibrated_prediction_is_as_wide_as_its_pairs_stray():
    raw = _pred(100)
    pairs = [(_timing(110), _pred(100)), (_timing(130), _pred(100)), (_timing(120), _pred(100))]
    t = tuner.calibrated(raw, pairs, "replay at batch 64")
    assert t.us == pytest.approx(120) and t.spread == pytest.approx(2 * (10 / 120))
    one = tuner.calibrated(raw, pairs[:1], "replay at batch 64")
    assert one.spread == pytest.approx(2 * tuner.UNCALIBRATED_ERROR)


def test_tune_verdict_comes_first_and_fits_100_columns():
    res = invoke("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "1,16,256", "--window", "8,16",
                 "--state-dtype", "fp32,bf16", "--read-dtype", "bf16,fp8", *QUICK)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0] == f"replayssm tune: {SUPER} on NVIDIA H200: does ReplaySSM pay?"
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    table = {line.split()[0]: line for line in lines if line[:5].strip().isdigit()}
    assert set(table) == {"1", "16", "256"}
    assert table["256"].split()[1:5] == ["yes", "split", "W16", "fp32+bf16"] and "2.70x" in table["256"]
    assert table["1"].split()[1:4] == ["no", "conventional", "fp32"]
    assert "[1] measured, tune_mamba2_h200.json" in res.stdout
    assert "every candidate" not in res.stdout and "Output error vs fp64" not in res.stdout
    res = invoke("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16",
                 "--state-dtype", "fp32", "--read-dtype", "bf16", "--details", *QUICK)
    assert res.exit_code == 0 and "every candidate" in res.stdout
    assert res.stdout.index("does ReplaySSM pay?") < res.stdout.index("every candidate")


def test_tune_json_carries_the_verdict():
    report = run_json("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16",
                      "--state-dtype", "fp32", "--read-dtype", "bf16")
    (line,) = report["verdict"]
    assert line["batch"] == 256 and line["pays"] is True and line["label"] == "split W16 fp32+bf16"
    assert line["speedup"] == pytest.approx(568 / 210) and line["speedup_lo"] < line["speedup"] < line["speedup_hi"]
    assert line["speedup_over"] == "conventional fp32" and line["source"] == "measured" and line["confirm"] is None
    assert line["mem_per_seq_model"] == decision(report, 256)["recommended"]["mem_per_seq"]
    assert line["largest_batch"] == decision(report, 256)["recommended"]["seqs_fit"]
    assert line["error_budget_used"] == pytest.approx(line["error"] / 1e-3)


def test_tune_verdict_shows_the_measured_end_to_end_speedup(tmp_path):
    data = json.loads(MAMBA2_RESULTS.read_text())
    base = {"kind": "e2e", "op": "mamba2", "preset": SUPER, "phase": "avg", "batch": 256, "read_dtype": None,
            "state_dtype": "fp32", "io_dtype": "bf16", "draft": 0, "source": "measured", "status": "ok"}
    data["rows"] += [dict(base, variant="conventional", window=None, us=90000.0, x_us_p25=89000.0, x_us_p75=91000.0),
                     dict(base, variant="replay", window=16, us=80000.0, x_us_p25=79000.0, x_us_p75=81000.0)]
    path = tmp_path / "with-e2e.json"
    path.write_text(json.dumps(data))
    report = run_json("--preset", SUPER, "--results", str(path), "--batch", "256", "--window", "16",
                      "--state-dtype", "fp32", "--read-dtype", "none")
    (line,) = report["verdict"]
    assert line["label"] == "replay W16 fp32" and line["e2e_speedup"] == pytest.approx(90000 / 80000)
    assert line["e2e_speedup_lo"] == pytest.approx(89000 / 81000) and "with-e2e.json" in line["e2e_origin"]


def test_tune_progress_in_a_log_is_one_line_per_finished_configuration(monkeypatch, tmp_path):
    """Not a terminal (CliRunner): plain lines on stderr, one per finished configuration when nothing rate-limits them."""
    from replayssm_cli.measure import quality
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(tuning, "LOG_EVERY_S", 0.0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quality, "run_kernels", lambda inputs, configs, on_config=None, **kw: [
        on_config(i + 1) for i in range(len(configs))] and {c: {"1-128": 1e-7} for c in configs})
    measured = json.loads(MAMBA2_RESULTS.read_text())["rows"]
    monkeypatch.setattr(tuning, "_run_point", lambda point, context: _fake_measurement(point, measured))
    _fake_profiler(monkeypatch, tmp_path)
    res = invoke("--preset", SUPER, "--batch", "1,256", "--window", "16", "--state-dtype", "fp32", "--read-dtype", "bf16",
                 *QUICK)
    assert res.exit_code == 0, res.output
    err = res.stderr.splitlines()
    n = int(next(line for line in err if line.startswith("measuring ")).split()[1])
    measuring = [line for line in err if line.startswith("measure ")]
    assert n >= 4 and len(measuring) == n and measuring[-1].startswith(f"measure {n}/{n} configurations")
    assert any("conventional B256 fp32" in line for line in measuring)
    kernels = int(next(line for line in err if line.startswith("quality on the GPU kernels:")).split()[-2])
    assert kernels >= 1 and sum(line.startswith("quality on the GPU kernels ") for line in err) == kernels
    assert [line for line in err if line.startswith("quality (3 configs")][-1].startswith("quality (3 configs, synthetic (seed 0)) 300/300")


def _fake_profiler(monkeypatch, tmp_path, gpu_name="NVIDIA H200"):
    """The profiler's real grid and rows on a faked GPU: its setup (NVML, clocks) left out, the runner tune gives."""
    from replayssm_cli.model import gpus, presets
    from replayssm_cli.measure import grid
    from replayssm_cli.measure import profile as prof
    from replayssm_cli.report.results import ResultsWriter

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: gpu_name)

    def run_profile(spec, *, runner, out=None, **kw):
        resolved = [presets.resolve(n, spec.tp) for n in spec.presets]
        env = {"gpu": {"name": gpu_name, "key": "h200", "memory_total": 150 * 2**30}}
        writer = ResultsWriter(Path(out or tmp_path / "measured.json"), env, spec.to_dict())
        run = prof.run_grid(grid.plan(spec, resolved), {p.name: p for p in resolved}, writer, mode="measured",
                            ceilings=gpus.ceilings_for(gpus.load_gpu("h200")), free_bytes=None, runner=runner, progress=False,
                            context={"repeats": spec.repeats})
        run.gpu_name = gpu_name
        return run

    monkeypatch.setattr(prof, "run_profile", run_profile)


def _fake_measurement(point, rows):
    """bench.run_point's measurements for a point, from the fixture's row of the same configuration."""
    r = next(r for r in rows if r["variant"] == point.variant and r["batch"] == point.batch and r.get("window") == point.window
             and r["state_dtype"] == point.state_dtype and r.get("read_dtype") == point.read_dtype)
    return [{"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-7, "tolerance": 1e-3,
             "samples_us": [r["us"] * (1 + k / 1000) for k in (-3, -1, 0, 1, 3)], "steps": 32, "repeats": 5}]


def test_tune_quality_is_computed_once_per_inputs(monkeypatch, tmp_path):
    from replayssm_cli.measure import quality

    args = ("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "256", "--window", "16", "--state-dtype", "fp32",
            "--read-dtype", "bf16", *QUICK)
    first = invoke(*args, "--json")
    assert first.exit_code == 0 and "from the cache" not in first.stderr
    calls = []
    monkeypatch.setattr(quality, "run", lambda *a, **k: calls.append(a))
    second = invoke(*args, "--json")
    assert second.exit_code == 0 and not calls and "quality: 3 of 3 configs from the cache" in second.stderr
    assert json.loads(second.stdout)["quality"] == json.loads(first.stdout)["quality"]
    # Other inputs (another seed) are not served from the cache.
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("REPLAYSSM_CACHE_DIR", str(tmp_path / "cache"))
    third = invoke(*args, "--seed", "1", "--json")
    assert third.exit_code == 0 and "from the cache" not in third.stderr


def test_tune_results_from_another_gpu_than_gpu_is_an_error():
    res = invoke("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--gpu", "b200", *QUICK)
    assert res.exit_code == 2
    (line,) = res.stderr.strip().splitlines()
    assert "was measured on NVIDIA H200, not the NVIDIA B200 that --gpu names" in line and "drop --gpu" in line


def test_tune_measures_only_what_the_model_puts_within_reach(monkeypatch, tmp_path):
    """On an H200 the shipped reference guesses each time: at batch 256 the replay steps (about 1.9x) cannot catch the
    split ones (about 2.6x), so they are not measured; split W32, close to split W16, is; the baseline always is."""
    from replayssm_cli.measure import quality
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quality, "run_kernels", lambda inputs, configs, **kw: {c: {"1-128": 1e-7} for c in configs})
    seen = []

    def run_point(point, context):
        seen.append(point.label().split(" ", 1)[1])
        us = {"conventional": 547.0, "replay": 285.0, "split": 209.0}[point.variant]
        return [{"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-7, "tolerance": 1e-3,
                 "samples_us": [us * (1 + k / 1000) for k in (-3, -1, 0, 1, 3)], "steps": 32, "repeats": 5}]

    monkeypatch.setattr(tuning, "_run_point", run_point)
    _fake_profiler(monkeypatch, tmp_path)
    report = run_json("--preset", SUPER, "--batch", "256", "--window", "16,32", "--state-dtype", "fp32", "--read-dtype", "bf16")
    assert sorted(seen) == ["conventional B256 fp32", "split B256 W16 fp32-bf16", "split B256 W32 fp32-bf16"]
    skipped = json.loads((tmp_path / "measured.json").read_text())["skipped"]
    assert {s["what"].split(" ", 1)[1] for s in skipped} == {"replay B256 W16 fp32", "replay B256 W32 fp32"}
    assert all("out of reach of the best" in s["why"] for s in skipped)
    assert decision(report, 256)["recommended"]["label"] == "split W16 fp32+bf16"


class _Workers:
    """A pool in this process: start-up jobs done at once; compiles run one by one, in submission order, on a thread,
    the second and later only once the first point has been timed (so a wait for every compile would hang)."""

    def __init__(self, log, first_timed):
        import queue
        import threading

        self.log, self.first_timed, self.jobs, self.shut = log, first_timed, queue.Queue(), None
        log.append(("pool",))
        self.thread = threading.Thread(target=self._work, daemon=True)
        self.thread.start()

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future = Future()
        if fn.__name__ == "_ready":
            future.set_result(fn())
        else:
            self.log.append(("submit", self._label(fn, args)))
            self.jobs.put((future, fn, args))
        return future

    def _work(self):
        n = 0
        while (job := self.jobs.get()) is not None:
            future, fn, args = job
            if n and not self.first_timed.wait(10):
                future.set_exception(RuntimeError("the first point was never timed"))
                continue
            try:
                result = fn(*args)
            except Exception as exc:
                future.set_exception(exc)
                continue
            self.log.append(("compiled", self._label(fn, args)))
            future.set_result(result)
            n += 1

    @staticmethod
    def _label(fn, args):
        return f"quality {args[1].label()}" if fn.__name__ == "compile_quality" else args[0].label()

    def shutdown(self, wait=True, *, cancel_futures=False):
        self.jobs.put(None)
        self.shut = {"wait": wait, "cancel_futures": cancel_futures}


@pytest.mark.parametrize("flag", [None, "--no-precompile"])
def test_tune_times_each_configuration_once_its_own_compile_finished(monkeypatch, tmp_path, flag):
    """On a GPU the pool starts before the quality harness; every point to time is queued to compile at once, in the
    order it is timed; each is timed only once its own compile finished (the first before the others compiled), with
    the GPU to the timed run alone; nothing is timed that was not compiled first, and a candidate the model rules out
    is neither compiled nor timed. Then the kernel quality runs of the timed candidates are queued, and the kernels run
    a recommendation's only once its compile finished. --no-precompile starts no pool."""
    import threading

    from replayssm_cli.measure import bench, precompile, quality
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precompile, "wanted", lambda: True)
    log, first_timed, pools = [], threading.Event(), []

    def run_kernels(inputs, configs, **kw):
        log.extend(("kernels", f"quality {c.label()}") for c in configs)
        return {c: {"1-128": 1e-7} for c in configs}

    def stepwise_outputs(inputs, config, device):
        assert device == "cuda" and inputs.generated == precompile.OFFSETS + 2 * (config.window or 1)

    monkeypatch.setattr(quality, "run_kernels", run_kernels)
    monkeypatch.setattr(quality, "stepwise_outputs", stepwise_outputs)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(precompile, "_pool", lambda n, gate: pools.append(_Workers(log, first_timed)) or pools[-1])
    monkeypatch.setattr(bench, "compile_point", lambda point, context: None)
    real_quality = tuning._quality
    monkeypatch.setattr(tuning, "_quality", lambda *a, **kw: log.append(("quality",)) or real_quality(*a, **kw))

    def run_point(point, context):
        assert ("alone" in context) == (flag is None)
        with context["alone"]() if "alone" in context else contextlib.nullcontext():
            log.append(("time", point.label()))
        first_timed.set()
        us = {"conventional": 547.0, "replay": 285.0, "split": 209.0}[point.variant]
        return [{"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-7, "tolerance": 1e-3,
                 "samples_us": [us * (1 + k / 1000) for k in (-3, -1, 0, 1, 3)], "steps": 32, "repeats": 5}]

    monkeypatch.setattr(tuning, "_run_point", run_point)
    _fake_profiler(monkeypatch, tmp_path)
    res = invoke("--preset", SUPER, "--batch", "256", "--window", "16,32", "--state-dtype", "fp32", "--read-dtype", "bf16",
                 *QUICK, *([flag] if flag else []))
    assert res.exit_code == 0, res.output
    timed = [e[1] for e in log if e[0] == "time"]
    assert sorted(label.split(" ", 1)[1] for label in timed) == ["conventional B256 fp32", "split B256 W16 fp32-bf16",
                                                                  "split B256 W32 fp32-bf16"]
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("pre-compiled")]
    if flag:
        assert not pools and not line and not any(e[0] in ("submit", "compiled") for e in log)
        return
    (pool,) = pools
    assert pool.shut == {"wait": False, "cancel_futures": False}
    assert log.index(("pool",)) < log.index(("quality",))
    submitted = [e[1] for e in log if e[0] == "submit"]
    assert submitted[:3] == timed and log.index(("submit", timed[-1])) < log.index(("time", timed[0]))
    for label in timed:
        assert log.index(("compiled", label)) < log.index(("time", label))
    assert log.index(("time", timed[0])) < log.index(("compiled", timed[1]))
    runs = [e[1] for e in log if e[0] == "kernels"]
    assert runs and set(runs) <= set(submitted[3:]) and all(label.startswith("quality ") for label in submitted[3:])
    for label in runs:
        assert log.index(("compiled", label)) < log.index(("kernels", label))
    (line,) = line
    assert line.startswith(f"pre-compiled the kernels of 3 of 3 configurations and {len(submitted) - 3} of "
                           f"{len(submitted) - 3} kernel quality runs in ") and line.endswith(", none failed")


def test_tune_shuts_the_pool_down_when_it_measures_nothing(monkeypatch, tmp_path):
    """A pool started for a measurement that ends in an error first is shut down, its queued compiles cancelled, and
    says nothing."""
    from replayssm_cli.errors import UserError
    from replayssm_cli.measure import precompile
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precompile, "wanted", lambda: True)
    log, pools = [], []
    monkeypatch.setattr(precompile, "_pool", lambda n, gate: pools.append(_Workers(log, None)) or pools[-1])

    def no_gpu(*a, **kw):
        raise UserError("no GPU to measure on", "pass --results")

    monkeypatch.setattr(tuning, "_measure", no_gpu)
    res = invoke("--preset", SUPER, "--batch", "256", "--state-dtype", "fp32", *QUICK)
    assert res.exit_code == 2 and "no GPU to measure on" in res.stderr
    (pool,) = pools
    assert pool.shut == {"wait": False, "cancel_futures": True} and "pre-compiled" not in res.stderr


def test_within_reach_keeps_the_close_and_the_baseline():
    conv, close, far = Candidate("conventional", "fp32"), Candidate("split", "fp32", 16, "bf16"), Candidate("replay", "fp32", 16)
    near = Candidate("split", "fp32", 32, "bf16")
    guessed = {conv: _timing(547), close: _timing(209), near: _timing(230), far: _timing(285), Candidate("replay", "bf16", 16): None}
    kept = tuner.within_reach(guessed, always=[conv])
    assert conv in kept and close in kept and near in kept and far not in kept
    assert Candidate("replay", "bf16", 16) in kept


def test_engine_flags_say_what_selects_a_recommendation_and_what_nothing_does():
    from replayssm_cli.advise import engine_flags

    replay = Candidate("replay", "fp32", 16)
    v = engine_flags.vllm("mamba2", replay)
    assert v.flags == ["--mamba-ssm-cache-dtype float32", "--use-replayssm", "--replayssm-buffer-len 16"]
    assert v.config == {"mamba_ssm_cache_dtype": "float32", "use_replayssm": True, "replayssm_buffer_len": 16}
    assert v.version.startswith("vLLM") and "cache.py" in v.source
    g = engine_flags.sglang("mamba2", replay)
    assert g.flags == ["--mamba-ssm-dtype float32"] and "no switch for Mamba-2" in g.missing[0]
    g = engine_flags.sglang("gdn", Candidate("replay", "bf16", 8))
    assert g.flags == ["--mamba-ssm-dtype bfloat16", "--enable-linear-replayssm", "--linear-replayssm-cache-len 8"]
    v = engine_flags.vllm("gdn", Candidate("replay", "bf16", 8))
    assert v.flags == ["--mamba-ssm-cache-dtype bfloat16"] and "no switch for Gated DeltaNet" in v.missing[0]
    split = engine_flags.vllm("mamba2", Candidate("split", "fp32", 16, "bf16"))
    assert any("no switch for a bf16 read copy" in m for m in split.missing)
    spec = engine_flags.sglang("gdn", Candidate("spec-replay", "fp32", 16, draft=4, accepted=2.0))
    assert "--enable-linear-replayssm-spec" in spec.flags
    assert engine_flags.vllm("mamba2", Candidate("conventional", "fp16")).flags == ["--mamba-ssm-cache-dtype float16"]


def test_tune_prints_and_carries_the_engine_settings():
    args = ("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "1,256", "--window", "16",
            "--state-dtype", "fp32", "--read-dtype", "none", *QUICK)
    res = invoke(*args)
    assert res.exit_code == 0, res.output
    assert "replay W16 fp32 (batch 256) in the engines' own words:" in res.stdout
    assert "--mamba-ssm-cache-dtype float32 --use-replayssm --replayssm-buffer-len 16" in res.stdout
    report = run_json(*args[:-4])
    by_label = {e["label"]: e for e in report["engines"]}
    assert by_label["replay W16 fp32"]["batches"] == [256] and by_label["conventional fp32"]["batches"] == [1]
    assert by_label["replay W16 fp32"]["vllm"]["config"]["use_replayssm"] is True


def test_tune_repeats_only_what_is_close_to_the_best_and_noisy(monkeypatch, tmp_path):
    """Each configuration is first timed with QUICK_REPEATS replays; only one whose interval still reaches the best's
    and whose spread is over the floor is timed again with the profile's full count."""
    from replayssm_cli.measure import quality
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quality, "run_kernels", lambda inputs, configs, **kw: {c: {"1-128": 1e-7} for c in configs})
    repeats: dict[str, list[int]] = {}
    # (µs, relative half-width of the samples): W16 split sets the best; W32 split is close and noisy; conventional is
    # far from it, noisy or not.
    times = {"conventional": (547.0, 0.10), "split16": (209.0, 0.002), "split32": (212.0, 0.08)}

    def run_point(point, context):
        name = point.variant + (str(point.window) if point.variant == "split" else "")
        repeats.setdefault(name, []).append(context["repeats"])
        us, half = times[name]
        return [{"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-7, "tolerance": 1e-3,
                 "samples_us": [us * (1 + half * k) for k in (-1, -0.5, 0, 0.5, 1)], "steps": 32, "repeats": context["repeats"]}]

    monkeypatch.setattr(tuning, "_run_point", run_point)
    _fake_profiler(monkeypatch, tmp_path)
    run_json("--preset", SUPER, "--batch", "256", "--window", "16,32", "--state-dtype", "fp32", "--read-dtype", "bf16")
    quick, full = tuning.QUICK_REPEATS, 30
    # The first configuration has no best to be separated from yet.
    assert repeats == {"conventional": [quick, full], "split16": [quick], "split32": [quick, full]}


def test_close_and_noisy_needs_both():
    from replayssm_cli.advise.tuning import _close_and_noisy

    def m(us, half):
        return [{"phase": "avg", "ok": True, "samples_us": [us * (1 + half * k) for k in (-1, -0.5, 0, 0.5, 1)]}]

    assert _close_and_noisy(m(212, 0.08), 211.0)
    assert not _close_and_noisy(m(547, 0.10), 211.0)
    assert not _close_and_noisy(m(212, 0.002), 211.0)
    assert not _close_and_noisy([{"phase": "avg", "ok": False}], 211.0)


def test_profile_ends_with_the_speed_verdict(tmp_path):
    """`replayssm profile` prints the verdict last: per batch whether its ReplaySSM step pays, within 100 columns."""
    res = CliRunner().invoke(app, ["profile", "-p", SUPER, "--batch", "1,256", "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 0, res.output
    tail = res.stdout[res.stdout.index(f"replayssm profile: {SUPER} on NVIDIA H200: does ReplaySSM pay?"):]
    lines = tail.splitlines()
    assert all(len(line) <= 100 for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line[:5].strip().isdigit()}
    assert set(rows) == {"1", "256"} and rows["256"][1:5] == ["yes", "replay", "W16", "fp32"]
    assert "Precision is not checked here" in " ".join(tail.split()) and "pred [1]" in tail


def test_tune_says_in_one_line_that_a_results_file_is_incomplete(tmp_path):
    data = json.loads(MAMBA2_RESULTS.read_text())
    data["complete"] = False
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(data))
    res = invoke("--preset", SUPER, "--results", str(path), "--batch", "256", "--window", "16", "--state-dtype", "fp32",
                 "--read-dtype", "none", *QUICK)
    assert res.exit_code == 0, res.output
    warned = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert len(warned) == 1 and "is incomplete" in warned[0] and "predicted" in warned[0]


def test_tune_weighs_stochastic_rounding_and_eight_bit_states_by_bucket(tmp_path):
    out = tmp_path / "sr.json"
    res = invoke("--preset", SUPER, "--batch", "256", "--window", "16", "--state-dtype", "fp32,bf16,int8", "--read-dtype", "bf16",
                 "--stochastic-rounding", "--out", str(out), *QUICK)
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    configs = {c["config"]: c for c in report["quality"]["configs"]}
    # bf16 with stochastic rounding beside bf16 without; int8 checkpoints beside a bf16 read copy over fp32
    assert {"conventional bf16", "conventional bf16 SR", "replay W16 int8", "replay W16 int8 SR", "split W16 fp32+bf16",
            "conventional fp32"} <= set(configs)
    assert "replay W16 fp32 SR" not in configs and configs["replay W16 int8 SR"]["rounding"] == "stochastic"
    assert set(configs["replay W16 int8"]["buckets"]) == {"1-128", "129-1k"}
    int8 = candidate(decision(report, 256), "replay W16 int8 SR")
    assert int8["state_dtype"] == "int8" and int8["rounding"] == "stochastic" and int8["source"] == "predicted"


@pytest.mark.parametrize("args, needle", [
    (("--state-dtype", "fp32", "--stochastic-rounding"), "an fp32 state is stored exactly"),
    (("--gpu", "a100-sxm4-80gb", "--state-dtype", "fp8"), "fp8 checkpoints need sm_89 or newer"),
], ids=["stochastic-fp32", "fp8-on-sm80"])
def test_tune_refuses_an_impossible_precision_in_one_line(args, needle):
    res = invoke("--preset", SUPER, *args, *QUICK)
    assert res.exit_code == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], res.output


def test_tune_leaves_fp8_checkpoints_out_before_sm89():
    res = invoke("--preset", SUPER, "--gpu", "a100-sxm4-80gb", "--batch", "256", "--window", "16", "--read-dtype", "none",
                 *QUICK, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert "fp8 checkpoints left out" in " ".join(res.stderr.split())
    states = {c["state_dtype"] for d in report["decisions"] for c in d["candidates"]}
    assert "fp8" not in states and "int8" in states


def _energy_file_rows(preset: str, batch: int) -> dict:
    from replayssm_cli.report.results import energy_reference_rows

    rows = [r for r in energy_reference_rows("h200") if r["preset"] == preset and r["batch"] == batch
            and r.get("phase", "avg") == "avg" and r["state_dtype"] == "fp32"]
    return {r["variant"]: r for r in rows}


def test_verdict_gains_tokens_per_joule_from_a_file_that_measured_energy(tmp_path):
    """A results file measured with --energy: each batch's verdict says the recommendation's tokens per joule over
    conventional decode, from the file, and the text names the file it came from."""
    from replayssm_cli.report.results import reference_files

    energy_file = next(f for f in reference_files("energy") if f.name == "h200-profile-energy.json")
    args = ("--preset", SUPER, "--batch", "1,256", "--window", "16", "--state-dtype", "fp32", "--read-dtype", "none",
            "--results", str(energy_file), "--measured-only")
    report = run_json(*args)
    for batch in (1, 256):
        line = next(ln for ln in report["verdict"] if ln["batch"] == batch)
        rows = _energy_file_rows(SUPER, batch)
        assert line["label"] == "replay W16 fp32"
        want = rows["conventional"]["x_energy"]["j_per_step"] / rows["replay"]["x_energy"]["j_per_step"]
        assert line["tokens_per_j_gain"] == pytest.approx(want)
        assert line["tokens_per_j"] == pytest.approx(rows["replay"]["x_energy"]["tokens_per_j"])
        assert "h200-profile-energy.json (NVIDIA H200" in line["energy_origin"]
    res = invoke(*args, *QUICK)
    assert res.exit_code == 0, res.output
    text = " ".join(res.stdout.split())
    assert "tokens per joule over conventional fp32 (NVML's energy counter, idle draw subtracted): batch 1" in text
    assert "energy: h200-profile-energy.json (NVIDIA H200, 2026-12-02" in text
    energy = [ln for ln in res.stdout.splitlines() if "tokens per joule" in ln]
    assert energy and all(len(ln) <= 100 for ln in energy)


def test_verdict_without_energy_figures_says_nothing_of_energy(tmp_path):
    """Without a GPU the shipped energy profiles count only for the configurations they measured: a recommendation
    they lack gets no tokens per joule (none is made up from the time)."""
    report = run_json("--preset", QWEN, "--batch", "256", "--window", "8", "--state-dtype", "fp32", "--read-dtype", "none")
    line = report["verdict"][0]
    assert line["label"] == "replay W8 fp32"
    assert line["tokens_per_j_gain"] is None and line["energy_origin"] is None
    res = invoke("--preset", QWEN, "--batch", "256", "--window", "8", "--state-dtype", "fp32", "--read-dtype", "none", *QUICK)
    assert "tokens per joule" not in res.stdout


def test_verdict_reads_the_shipped_energy_profile_without_a_gpu():
    """No GPU, the H200: where the shipped energy profile measured the recommendation and its baseline, the verdict
    carries their tokens per joule, labelled with that file (not the reference the times came from)."""
    report = run_json("--preset", QWEN, "--batch", "256", "--window", "16", "--state-dtype", "fp32", "--read-dtype", "none")
    line = report["verdict"][0]
    rows = _energy_file_rows(QWEN, 256)
    assert line["label"] == "replay W16 fp32"
    assert line["tokens_per_j_gain"] == pytest.approx(rows["conventional"]["x_energy"]["j_per_step"]
                                                      / rows["replay"]["x_energy"]["j_per_step"])
    assert line["energy_origin"].startswith("h200-profile-energy.json")
    assert "h200-profile-energy.json" not in line["origin"]


def test_tune_energy_on_a_gpu_measures_it_and_the_verdict_reads_it(monkeypatch, tmp_path):
    """--energy on a (faked) GPU: the profile spec asks for energy, and the verdict's tokens per joule are the ratio
    of this run's joules per step, labelled measured here."""
    from replayssm_cli.measure import quality
    from replayssm_cli.advise import tuning

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quality, "run_kernels", lambda inputs, configs, **kw: {c: {"1-128": 1e-7} for c in configs})
    joules = {"conventional": 0.30, "replay": 0.15}
    specs = []

    def run_point(point, context):
        us = {"conventional": 547.0, "replay": 285.0}[point.variant]
        j = joules[point.variant]
        return [{"phase": "avg", "ok": True, "layers": 4, "check_max_err": 1e-7, "tolerance": 1e-3,
                 "samples_us": [us * (1 + k / 1000) for k in (-3, -1, 0, 1, 3)], "steps": 32, "repeats": 5,
                 "energy": {"j_per_step": j, "j_per_layer_step": j, "tokens_per_j": 256 / (40 * j), "spread": 0.01}}]

    monkeypatch.setattr(tuning, "_run_point", run_point)
    _fake_profiler(monkeypatch, tmp_path)
    from replayssm_cli.measure import profile as prof

    faked = prof.run_profile
    monkeypatch.setattr(prof, "run_profile", lambda spec, **kw: specs.append(spec) or faked(spec, **kw))
    res = invoke("--preset", SUPER, "--batch", "256", "--window", "16", "--state-dtype", "fp32", "--read-dtype", "none",
                 "--energy", *QUICK, "--json")
    assert res.exit_code == 0, res.output
    assert specs and all(s.energy for s in specs)
    line = json.loads(res.stdout)["verdict"][0]
    assert line["label"] == "replay W16 fp32"
    assert line["tokens_per_j_gain"] == pytest.approx(2.0) and line["energy_origin"] == "measured here"


DETAILS = ("--preset", SUPER, "--results", str(MAMBA2_RESULTS), "--batch", "1,256", "--window", "8,16",
           "--state-dtype", "fp32,bf16", "--read-dtype", "bf16,fp8")


def _on_terminal(width: int, *args: str) -> list[str]:
    """tune's output lines from the detail tables on, as a terminal of `width` columns shows them."""
    res = CliRunner().invoke(app, ["tune", *args, "--details", *QUICK],
                             env={"COLUMNS": str(width), "TTY_COMPATIBLE": "1", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    lines = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout).splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("Recommendation")):]


def _headers(lines: list[str], title: str) -> str:
    """The header lines of the table under `title` (those above its rule)."""
    start = lines.index(next(line for line in lines if line.startswith(title)))
    rule = next(i for i in range(start, len(lines)) if lines[i].strip().startswith("───"))
    return " ".join(lines[start + 1:rule])


@pytest.mark.parametrize("width", [80, 120])
def test_tune_details_fit_the_terminal(width):
    """At 80-120 columns the detail tables keep batch, variant, W, state→read and speedup, cut no number, and say
    which secondary columns they left out; --wide shows every column."""
    lines = _on_terminal(width, *DETAILS)
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    text = "\n".join(lines)
    for title in ("Recommendation", "batch 1, decode: every candidate", "batch 256, decode: every candidate"):
        headers = _headers(lines, title).split()
        assert {"variant", "W", "state→read", "speedup"} <= set(headers), (title, headers)
    assert "batch" in _headers(lines, "Recommendation").split()
    flat = " ".join(text.split())
    left_out = re.search(r"left out for the terminal's width: (.*?) \(--wide shows every column\)", flat)
    assert left_out and "µs/token (model)" in left_out.group(1).split(", ")
    report = run_json(*DETAILS)
    for d in report["decisions"]:
        title = f"batch {d['batch']}, decode: every candidate"
        rows = lines[lines.index(next(line for line in lines if line.startswith(title))):]
        for c in d["candidates"]:
            start = rf"^ {c['variant']}\s+{c['window'] or '-'}\s+{precision_label(c['state_dtype'], c['read_dtype'])}\s"
            row = next(line for line in rows if re.match(start, line))
            assert c["speedup"] is None or f" {c['speedup']:.2f}x " in row, (c["label"], row)
        rec = d["recommended"]
        assert f" {rec['speedup']:.2f}x " in text and f" ({rec['speedup_lo']:.2f}-{rec['speedup_hi']:.2f}) " in text
    wide = _on_terminal(width, *DETAILS, "--wide")
    assert not any("left out" in line for line in wide)
    every = _headers(wide, "Recommendation")
    for name in ("µs/token/layer", "µs/token (model)", "seqs fit", "error", "time", "MiB/seq (state+copy+buffers)"):
        assert name in every, name
    assert {"µs/token", "MiB/seq", "error", "time", "verdict"} <= set(_headers(wide, "batch 1, decode: every candidate").split())
