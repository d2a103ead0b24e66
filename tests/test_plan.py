"""`replayssm plan --traffic`: the engines' traffic files read into decode spans, cohorts and the projection onto
measured times, on day-night files written in vLLM's, SGLang's and the CSV format, and on crafted times."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from benchmark_scripts import load
from replayssm_cli.advise import plan as plan_mod
from replayssm_cli.model import presets
from replayssm_cli.advise import traffic, tuner
from replayssm_cli.main import app
from replayssm_cli.advise.tuner import MIN_SPREAD, Candidate

SUPER = "nemotron-3-super-120b-a12b"
LAYERS = 40
example = load("traffic_example")


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("traffic")
    return {
        "vllm": example.main(["--format", "vllm", "--requests", "3000", "--out", str(d / "day.json")]),
        "sglang": example.main(["--format", "sglang", "--requests", "2000", "--max-concurrency", "48", "--out", str(d / "run.jsonl")]),
        "csv": example.main(["--format", "csv", "--csv-step-s", "30", "--out", str(d / "running.csv")]),
    }


@pytest.fixture(scope="module")
def vllm(files):
    return traffic.read(files["vllm"])


def invoke(*args: str):
    return CliRunner().invoke(app, ["plan", *args])


def one_line_error(res, *words: str) -> None:
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    for w in words:
        assert w in lines[0], lines[0]


# Reading the engines' files.


def test_vllm_file_decode_spans_and_day_night_timeline(vllm):
    doc = json.loads(Path(vllm.path).read_text())
    failed = sum(1 for e in doc["errors"] if e)
    assert vllm.format == "vllm" and vllm.failed == failed > 0 and vllm.requests == 3000 - failed
    # The timeline is the count of spans open at each time, checked by brute force at random times.
    edges, running = vllm.timeline
    rng = np.random.default_rng(1)
    for t in rng.uniform(edges[0], edges[-1], 50):
        want = int(((vllm.decode_start <= t) & (vllm.decode_end > t)).sum())
        i = np.searchsorted(edges, t, side="right") - 1
        assert running[i] == want
    # Night at both ends, day in the middle: mid-day concurrency is many times the night's.
    mid = (edges[:-1] > 0.4 * edges[-1]) & (edges[:-1] < 0.6 * edges[-1])
    night = edges[:-1] < 0.1 * edges[-1]
    assert running[mid].mean() > 8 * running[night].mean() and running.max() > 200
    # Each span starts at the request's start + TTFT and lasts the sum of its gaps.
    starts = np.array(doc["start_times"])
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    k = 7
    i = ok[k]
    assert vllm.decode_start[k] == pytest.approx(starts[i] - starts[ok].min() + doc["ttfts"][i])
    assert vllm.decode_end[k] - vllm.decode_start[k] == pytest.approx(sum(doc["itls"][i]))
    assert vllm.itl_values.size == sum(len(doc["itls"][i]) for i in ok)


def test_sglang_closed_loop_reconstructs_its_concurrency(files):
    t = traffic.read(files["sglang"])
    assert t.format == "sglang" and "closed loop of max_concurrency 48" in t.timeline_note
    edges, running = t.timeline
    assert running.max() <= 48
    mean = float((np.diff(edges) * running).sum() / (edges[-1] - edges[0]))
    doc = json.loads(Path(files["sglang"]).read_text())
    # SGLang's own "concurrency" is total latency over duration (prefill included), ours decode spans only.
    assert 0.85 * doc["concurrency"] < mean <= doc["concurrency"] * 1.01


def test_sglang_at_a_request_rate_keeps_only_the_mean(tmp_path, files):
    doc = json.loads(Path(files["sglang"]).read_text())
    doc["request_rate"] = 8.0
    p = tmp_path / "rate.jsonl"
    p.write_text(json.dumps(doc) + "\n")
    t = traffic.read(p)
    assert t.timeline is None and any("concurrency over time" in m for m in t.missing)
    spans = sum(sum(g) for g in doc["itls"])
    assert t.mean_concurrency == pytest.approx(spans / doc["duration"])
    # One cohort at the mean, its ITL the file's own mean gap.
    out = invoke("--traffic", str(p), "--preset", SUPER, "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    (cohort,) = plan["cohorts"]
    gaps = [g for gs in doc["itls"] for g in gs]
    assert cohort["batch"] == round(t.mean_concurrency) and cohort["itl_ms"] == pytest.approx(1e3 * sum(gaps) / len(gaps))
    assert plan["totals"]["itl_from"].startswith("your ITL")


def test_csv_of_running_requests(files):
    t = traffic.read(files["csv"])
    edges, running = t.timeline
    assert t.format == "csv" and t.duration == pytest.approx(86400)
    assert len(running) == 86400 // 30 and any("sequence lengths" in m for m in t.missing)


def test_jsonl_takes_the_last_run(tmp_path, files):
    doc = json.loads(Path(files["sglang"]).read_text())
    first = dict(doc, input_lens=doc["input_lens"][:10], output_lens=doc["output_lens"][:10], ttfts=doc["ttfts"][:10],
                 itls=doc["itls"][:10], errors=[""] * 10)
    p = tmp_path / "two.jsonl"
    p.write_text(json.dumps(first) + "\n" + json.dumps(doc) + "\n")
    t = traffic.read(p)
    assert t.requests == 2000 and "the last of 2 runs" in t.describe


def _vllm_doc(files, requests: int | None = None) -> dict:
    """The day's vLLM file, or its first `requests` requests (enough for the checks of a bad file, and fast)."""
    doc = json.loads(Path(files["vllm"]).read_text())
    if requests is not None:
        for key in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors"):
            doc[key] = doc[key][:requests]
    return doc


def _write(tmp_path, doc, name="t.json") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda d: {k: v for k, v in d.items() if k not in ("input_lens", "output_lens", "ttfts", "itls")}, ("without per-request fields", "--save-detailed")),
        (lambda d: {**d, "output_lens": [-3] + d["output_lens"][1:]}, ("negative length",)),
        (lambda d: {**d, "input_lens": [10**9] + d["input_lens"][1:]}, ("absurd length",)),
        (lambda d: {**d, "ttfts": [-0.5] + d["ttfts"][1:]}, ("negative time",)),
        (lambda d: {**d, "itls": [[1e7]] + d["itls"][1:]}, ("absurd time",)),
        (lambda d: {**d, "input_lens": [], "output_lens": [], "ttfts": [], "itls": [], "errors": []}, ("no requests",)),
        (lambda d: {**d, "errors": ["boom"] * len(d["errors"])}, ("no successful request",)),
        (lambda d: {**d, "ttfts": d["ttfts"][:-1]}, ("not one entry per request",)),
        (lambda d: {"model": "x", "rows": [1, 2]}, ("unknown format",)),
    ],
    ids=["summary-only", "negative-length", "absurd-length", "negative-ttft", "absurd-itl", "no-requests", "all-failed",
         "ragged", "unknown-json"],
)
def test_bad_vllm_files_are_one_line(tmp_path, files, change, words):
    res = invoke("--traffic", _write(tmp_path, change(_vllm_doc(files, 40))), "--preset", SUPER, "--steps", "0")
    one_line_error(res, *words)


@pytest.mark.parametrize(
    "text, words",
    [
        ("", ("empty",)),
        ("when,load\n1,2\n2,3\n", ("a CSV needs a time and a running column",)),
        ("time,running\n0,4\n10,-1\n", ("negative count",)),
        ("time,running\n0,4\n10,many\n", ("is not a number",)),
        ("time,running\n", ("no samples",)),
        ('{"input_lens": [1, 2], "output_lens": [3', ("not JSON",)),
    ],
    ids=["empty", "unknown-columns", "negative-running", "not-a-number", "header-only", "truncated-json"],
)
def test_bad_csv_and_text_files_are_one_line(tmp_path, text, words):
    res = invoke("--traffic", _write(tmp_path, text, "t.csv"), "--preset", SUPER, "--steps", "0")
    one_line_error(res, *words)


@pytest.mark.parametrize("args, words", [(("--cohorts", "0,16"), "from 1 to"), (("--cohorts", "64,16"), "must be increasing"),
                                         (("--cohorts", "a,b"), "not an integer"), (("--cohorts", "1,,16"), "empty item"),
                                         (("--error-budget", "0"), "must be positive"),
                                         (("--memory-budget", "-4"), "out of range"), (("--memory-budget", "inf"), "not a finite number"),
                                         (("--steps", "-1"), "from 0 to"), (("--steps", "100000000"), "from 0 to"),
                                         (("--heads", "100000"), "from 1 to"), (("--heads", "1000", "--steps", "16"), "more than the 128 heads")],
                         ids=["zero-edge", "decreasing", "not-ints", "empty-item", "zero-budget", "negative-memory",
                              "infinite-memory", "negative-steps", "steps-past-range", "heads-past-range", "heads-past-layer"])
def test_bad_options_are_one_line(files, args, words):
    one_line_error(invoke("--traffic", str(files["csv"]), "--preset", SUPER, *args), words)


def test_missing_file_and_unknown_preset(tmp_path, files):
    one_line_error(invoke("--traffic", str(tmp_path / "nope.json"), "--steps", "0"), "does not exist")
    doc = _vllm_doc(files, 40)
    doc["model_id"] = "someone/unknown-model"
    one_line_error(invoke("--traffic", _write(tmp_path, doc), "--steps", "0"), "plan needs a preset", "unknown-model")


# The projection onto crafted times: every figure checked against a hand computation.


def _row(variant: str, batch: int, us: float, *, kind: str = "kernel", window: int | None = None) -> dict:
    return {
        "kind": kind, "op": "mamba2", "preset": SUPER, "variant": variant, "phase": "avg", "batch": batch,
        "window": window, "state_dtype": "fp32", "read_dtype": None, "io_dtype": "bf16", "draft": 0, "tp": 1,
        "flush": "staggered", "source": "measured", "status": "ok", "us": us, "us_per_token": us, "spread": 0.0,
    }


def _results(tmp_path, conv: dict[int, float], rep: dict[int, float], e2e: dict[int, float] | None = None) -> Path:
    rows = [_row("conventional", b, us) for b, us in conv.items()]
    rows += [_row("replay", b, us, window=16) for b, us in rep.items()]
    rows += [_row("conventional", b, us, kind="e2e") for b, us in (e2e or {}).items()]
    env = {"commit": "abc1234", "mode": "measured", "gpu": {"name": "NVIDIA H200", "key": "h200", "driver": "580.159.04",
                                                            "memory_total": 150 * 2**30}}
    doc = {"kind": "replayssm-results", "schema_version": 1, "created": "2026-11-30T12:00:00+00:00", "complete": True,
           "environment": env, "spec": {}, "rows": rows, "skipped": []}
    p = tmp_path / "crafted.json"
    p.write_text(json.dumps(doc))
    return p


def _csv(tmp_path, levels: list[tuple[float, int]]) -> Path:
    """A CSV holding each (seconds, running) level in turn."""
    t, lines = 0.0, ["time,running"]
    for secs, n in levels:
        lines.append(f"{t},{n}")
        t += secs
    lines.append(f"{t},0")
    p = tmp_path / "levels.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_interpolation_says_where_each_time_came_from(tmp_path):
    src = plan_mod.load_source(_results(tmp_path, {1: 10.0, 64: 136.0, 256: 520.0}, {1: 12.0, 64: 70.0}), SUPER)
    times = plan_mod.Times(src, SUPER)
    conv, rep = Candidate("conventional", "fp32"), Candidate("replay", "fp32", 16)
    assert times(conv, 64).us_per_token == 136.0 and "batch 64 of crafted.json (NVIDIA H200, 2026-11-30, abc1234)" in times(conv, 64).note
    mid = times(conv, 160)
    assert mid.us_per_token == pytest.approx(136 + (520 - 136) * 96 / 192) and "interpolated between batch 64 and 256" in mid.note
    far = times(rep, 128)
    assert far.us_per_token == pytest.approx(70 + 58 * 64 / 63) and "extrapolated beyond batch 64" in far.note
    assert times(Candidate("replay", "bf16", 16), 64) is None


def test_cohorts_gains_and_traffic_weighted_totals_by_hand(tmp_path):
    conv, rep, e2e = {1: 10.0, 256: 520.0}, {1: 20.0, 256: 260.0}, {1: 10_000.0, 256: 90_000.0}
    res = _results(tmp_path, conv, rep, e2e)
    levels = [(600.0, 1), (300.0, 256), (100.0, 0)]
    # The closing sample (nothing running) holds for the median interval, 300 s.
    total = 1000.0 + 300.0
    out = invoke("--traffic", str(_csv(tmp_path, levels)), "--preset", SUPER, "--results", str(res), "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    by = {c["cohort"]: c for c in doc["cohorts"]}
    assert set(by) == {"1-15", "256+"}
    low, high = by["1-15"], by["256+"]
    # Time shares over the whole trace (the idle 100 s included); tokens as time x concurrency / ITL.
    assert low["time_share"] == pytest.approx(600 / total) and high["time_share"] == pytest.approx(300 / total)
    tok_low, tok_high = 600 * 1 / 10_000, 300 * 256 / 90_000
    assert high["token_share"] == pytest.approx(tok_high / (tok_low + tok_high), rel=1e-6)
    # Batch 1: replay is slower, conventional stays; batch 256: replay 2x, the model step loses 40 x 260 us.
    assert low["recommended"]["variant"] == "conventional" and not low["replay_pays"]
    assert high["recommended"]["label"] == "replay W16 fp32" and high["kernel_speedup"] == pytest.approx(2.0)
    saved = LAYERS * (520 - 260)
    assert high["e2e_speedup"] == pytest.approx(90_000 / (90_000 - saved))
    assert high["flush"]["every_tokens"] == 16 and high["flush"]["rows_per_step"] == 16
    p = presets.load_preset(SUPER)
    mem = tuner.memory_of(p.shape, Candidate("replay", "fp32", 16))["total"] * p.ssm_layers
    assert high["mem_per_seq_model"] == mem and high["peak_fits"] and high["peak_need_bytes"] == 256 * mem
    tot = doc["totals"]
    itl_before = (tok_low * 10_000 + tok_high * 90_000) / (tok_low + tok_high)
    itl_after = (tok_low * 10_000 + tok_high * (90_000 - saved)) / (tok_low + tok_high)
    assert tot["itl_ms_before"] == pytest.approx(itl_before / 1e3) and tot["itl_speedup"] == pytest.approx(itl_before / itl_after)
    gain = (600 / 10_000 + 300 * 256 / (90_000 - saved)) / (600 / 10_000 + 300 * 256 / 90_000)
    assert tot["tokens_per_s_gain"] == pytest.approx(gain)
    assert doc["switch"][0]["run"] == "conventional fp32" and doc["switch"][-1]["run"] == "replay W16 fp32"


def test_switch_point_is_the_tuners_crossover(tmp_path):
    conv, rep = {1: 5.0, 64: 140.0}, {1: 6.0, 64: 80.0}
    res = _results(tmp_path, conv, rep)
    out = invoke("--traffic", str(_csv(tmp_path, [(10.0, n) for n in range(1, 65)])), "--preset", SUPER, "--results", str(res),
                 "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)

    def at(t: dict, b: int) -> float:
        return t[1] + (t[64] - t[1]) * (b - 1) / 63

    # ReplaySSM is chosen where its pessimistic time beats conventional's optimistic one (spreads at their floor).
    first = next(b for b in range(1, 65) if at(rep, b) * (1 + MIN_SPREAD / 2) < at(conv, b) * (1 - MIN_SPREAD / 2))
    assert doc["switch"][0] == {"from": 1, "to": first - 1, "run": "conventional fp32", "replay": False}
    assert doc["switch"][1] == {"from": first, "to": 64, "run": "replay W16 fp32", "replay": True}
    text = invoke("--traffic", str(_csv(tmp_path, [(10.0, n) for n in range(1, 65)])), "--preset", SUPER, "--results", str(res),
                  "--steps", "0")
    assert f"ReplaySSM at {first} or more running sequences" in " ".join(text.stdout.split())


def test_quality_margin_is_the_budget_over_the_error_at_the_cohorts_lengths(tmp_path, files):
    res = _results(tmp_path, {1: 10.0, 256: 520.0}, {1: 20.0, 256: 260.0}, {1: 10_000.0, 256: 90_000.0})
    out = invoke("--traffic", str(files["sglang"]), "--preset", SUPER, "--results", str(res), "--steps", "200", "--heads", "1",
                 "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    errors = {c["config"]: c["buckets"] for c in doc["quality"]["configs"]}
    for c in doc["cohorts"]:
        err = errors[c["recommended"]["label"]][c["quality_bucket"]]
        assert c["quality_error"] == err and c["quality_margin"] == pytest.approx(1e-3 / err)


def test_day_night_vllm_on_the_shipped_reference(files):
    out = invoke("--traffic", str(files["vllm"]), "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert doc["preset"]["name"] == SUPER  # from the file's model_id
    cohorts = doc["cohorts"]
    assert [c["cohort"] for c in cohorts] == ["1-15", "16-63", "64-127", "128-255", "256+"]
    assert sum(c["token_share"] for c in cohorts) == pytest.approx(1.0)
    assert sum(c["time_share"] for c in cohorts) + doc["load"]["idle_share"] == pytest.approx(1.0)
    # More rows share a step's weights as the batch grows, so the kernel gain rises across cohorts.
    gains = [c["kernel_speedup"] for c in cohorts]
    assert gains == sorted(gains) and all(math.isfinite(g) for g in gains)
    assert all("h200-" in c["time_from"] for c in cohorts)
    flags = doc["engine_flags"]
    assert {f["label"] for f in flags} == {c["recommended"]["label"] for c in cohorts}
    assert sorted(b for f in flags for b in f["batches"]) == sorted(c["batch"] for c in cohorts)
    assert all(f["vllm"]["flags"][0].startswith("--mamba-ssm-cache-dtype ") for f in flags)
    tot = doc["totals"]
    e2e = [c["e2e_speedup"] for c in cohorts]
    assert min(e2e) <= tot["itl_speedup"] <= max(e2e) and tot["itl_from"].startswith("your ITL")


def test_partial_file_uses_what_it_has(tmp_path, files):
    doc = _vllm_doc(files)
    ok = [i for i, e in enumerate(doc["errors"]) if not e]
    doc["latencies"] = [doc["ttfts"][i] + sum(doc["itls"][i]) for i in range(len(doc["ttfts"]))]
    del doc["itls"], doc["input_lens"]
    out = invoke("--traffic", _write(tmp_path, doc), "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    plan = json.loads(out.stdout)
    missing = " ".join(plan["traffic"]["could_not_compute"])
    assert "inter-token latencies" in missing and "context lengths" in missing
    assert plan["totals"]["itl_from"].startswith("the whole-model conventional step of h200-e2e.json")
    assert plan["traffic"]["requests"] == len(ok)


def test_plan_table_names_its_sources(files):
    out = invoke("--traffic", str(files["vllm"]), "--steps", "0")
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    for words in ("Sequences decoding over time", "traffic-weighted: mean ITL", "switch:", "interpolated between batch",
                  "in the engines' own words:", "- vLLM",
                  "#1 h200-", "(NVIDIA H200, 2026-11-30"):
        assert words in text, words


def test_help_has_examples():
    res = invoke("--help")
    assert res.exit_code == 0 and "Examples" in res.stdout and "replayssm plan --traffic" in res.stdout


# The rollout gate.


def _gate_case(tmp_path, spread: float = 0.3):
    """One level of 256 sequences; replay 60 us against conventional 100 us per layer, a 9 ms model step: the
    tokens/s gain is 9000 / (9000 - 40 x 40) and its pessimistic bound 9000 / (9000 - 40 x (85 - 69))."""
    res = _results(tmp_path, {1: 5.0, 256: 100.0}, {1: 4.0, 256: 60.0}, {1: 8000.0, 256: 9000.0})
    doc = json.loads(res.read_text())
    for r in doc["rows"]:
        r["spread"] = spread
    res.write_text(json.dumps(doc))
    return str(res), str(_csv(tmp_path, [(100.0, 256)]))


def test_gate_parses_thresholds():
    from replayssm_cli.advise import gate

    g = gate.parse(["min-gain=1.05,quality-margin=2", "memory-headroom=10%"])
    assert g == gate.Gate(min_gain=1.05, min_gain_lo=1.0, quality_margin=2.0, memory_headroom=0.1)
    assert not gate.parse(None).active


@pytest.mark.parametrize("spec, words", [("speed=2", "is not a threshold"), ("min-gain=fast", "is not a number"),
                                         ("min-gain=-1", "must be positive"), ("memory-headroom=150%", "below 1")],
                         ids=["unknown-key", "not-a-number", "negative", "headroom-over-1"])
def test_gate_bad_thresholds_are_one_line(tmp_path, spec, words):
    res, traffic_file = _gate_case(tmp_path)
    one_line_error(invoke("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--gpu", "h200", "--gate", spec), words)


def test_gate_practical_and_statistical_thresholds(tmp_path):
    res, traffic_file = _gate_case(tmp_path)
    gain, lo = 9000 / (9000 - 40 * 40), 9000 / (9000 - 40 * (85 - 69))
    base = ("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--gpu", "NVIDIA H200", "--json")
    ok = invoke(*base, "--gate", f"min-gain={gain - 0.01:.3f}")
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["gate"]["passed"] and doc["totals"]["tokens_per_s_gain"] == pytest.approx(gain)
    assert doc["totals"]["tokens_per_s_gain_lo"] == pytest.approx(lo)
    practical = invoke(*base, "--gate", f"min-gain={gain + 0.01:.3f}")
    assert practical.exit_code == 1 and "gate failed: min-gain" in practical.stderr
    # The gain clears the practical threshold but not the statistical one: the gate still fails, and says which.
    statistical = invoke(*base, "--gate", f"min-gain={gain - 0.01:.3f},min-gain-lo={lo + 0.01:.3f}")
    assert statistical.exit_code == 1
    failed = [t["threshold"] for t in json.loads(statistical.stdout)["gate"]["thresholds"] if not t["passed"]]
    assert failed == ["min-gain-lo"] and "min-gain-lo" in statistical.stderr


def test_gate_memory_headroom_and_quality_margin(tmp_path):
    res, traffic_file = _gate_case(tmp_path)
    base = ("--traffic", traffic_file, "-p", SUPER, "-r", res, "--gpu", "h200", "--json")
    p = presets.load_preset(SUPER)
    mem = tuner.memory_of(p.shape, Candidate("replay", "fp32", 16))["total"] * p.ssm_layers
    budget_gib = 256 * mem / 0.8 / 2**30  # the peak takes 80% of it: 20% free
    out = invoke(*base, "--steps", "0", "--memory-budget", f"{budget_gib:.6f}", "--gate", "memory-headroom=25%")
    assert out.exit_code == 1
    v = json.loads(out.stdout)["gate"]["thresholds"][0]
    assert v["threshold"] == "memory-headroom" and v["value"] == pytest.approx(0.2, abs=1e-4) and not v["passed"]
    # Without a quality run there is no margin to check: the gate fails rather than passes it.
    out = invoke(*base, "--steps", "0", "--gate", "quality-margin=2")
    assert out.exit_code == 1 and "no quality margin" in out.stderr
    out = invoke(*base, "--steps", "150", "--heads", "1", "--gate", "quality-margin=1.5")
    doc = json.loads(out.stdout)
    margin = doc["cohorts"][0]["quality_margin"]
    assert doc["gate"]["thresholds"][0]["value"] == margin and out.exit_code == (0 if margin >= 1.5 else 1)


def test_gate_refuses_results_from_another_environment(tmp_path, files):
    res, traffic_file = _gate_case(tmp_path)
    base = ("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--gate", "min-gain=1.01")
    one_line_error(invoke(*base), "the gate needs the GPU the traffic is served on")
    one_line_error(invoke(*base, "--gpu", "b200"), "refuses crafted.json", "gpu NVIDIA H200", "b200")
    one_line_error(invoke(*base, "--gpu", "h200", "--driver", "550.54.15"), "driver 580.159.04", "550.54.15")
    one_line_error(invoke(*base, "--gpu", "h200", "--torch", "2.11"), "does not record its torch")
    # The vLLM file names its GPU (vllm bench serve --metadata gpu=...): the gate reads it from there.
    ok = invoke("--traffic", str(files["vllm"]), "--steps", "0", "--gate", "min-gain=1.0001", "--torch", "2.11", "--json")
    assert ok.exit_code in (0, 1), ok.output
    assert json.loads(ok.stdout)["gate"]["target"]["gpu"] == "NVIDIA H200"
    assert "driver, triton not named" in " ".join(ok.stderr.split())


def test_a_configuration_must_fit_the_cohorts_peak(tmp_path):
    res, traffic_file = _gate_case(tmp_path, spread=0.0)
    p = presets.load_preset(SUPER)
    conv_mem = tuner.memory_of(p.shape, Candidate("conventional", "fp32"))["total"] * p.ssm_layers
    rep_mem = tuner.memory_of(p.shape, Candidate("replay", "fp32", 16))["total"] * p.ssm_layers
    # Room for 256 conventional states, not for 256 checkpoints with their buffers: ReplaySSM is left out.
    budget_gib = 256 * (conv_mem + rep_mem) / 2 / 2**30
    out = invoke("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--memory-budget", f"{budget_gib:.6f}", "--json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    cohort = doc["cohorts"][0]
    assert cohort["recommended"]["variant"] == "conventional" and cohort["peak_fits"]
    assert doc["switch"][-1]["run"] == "conventional fp32"
    roomy = json.loads(invoke("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--json").stdout)
    assert roomy["cohorts"][0]["recommended"]["variant"] == "replay"


def test_vllm_file_before_start_times_from_a_closed_loop(tmp_path, files):
    doc = _vllm_doc(files, 400)
    del doc["start_times"]
    doc.update(max_concurrency=32, request_rate="inf")
    t = traffic.read(_write(tmp_path, doc))
    assert "closed loop of max_concurrency 32" in t.timeline_note and t.timeline[1].max() <= 32
    doc["request_rate"] = 4.0
    t = traffic.read(_write(tmp_path, doc))
    assert t.timeline is None and "no start_times" in " ".join(t.missing)


def test_traffic_weighted_energy_from_rows_with_x_energy(tmp_path):
    res, traffic_file = _gate_case(tmp_path, spread=0.0)
    doc = json.loads(Path(res).read_text())
    joules = {("kernel", "conventional"): 0.010, ("kernel", "replay"): 0.006, ("e2e", "conventional"): 3.0}
    for r in doc["rows"]:
        j = joules.get((r["kind"], r["variant"]))
        if j is not None:
            key = "j_per_layer_step" if r["kind"] == "kernel" else "j_per_model_step"
            r["x_energy"] = {key: j * r["batch"] / 256, "spread": 0.01}
    Path(res).write_text(json.dumps(doc))
    out = invoke("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0", "--json")
    assert out.exit_code == 0, out.output
    e = json.loads(out.stdout)["totals"]["energy"]
    assert e["ssm_j_per_token_before"] == pytest.approx(LAYERS * 0.010 / 256)
    assert e["ssm_tokens_per_j_gain"] == pytest.approx(0.010 / 0.006)
    saved = LAYERS * (0.010 - 0.006) / 256
    assert e["model_tokens_per_j_gain"] == pytest.approx((3.0 / 256) / (3.0 / 256 - saved))
    text = invoke("--traffic", traffic_file, "-p", SUPER, "-r", res, "--steps", "0")
    assert "energy: SSM layers" in " ".join(text.stdout.split())
    (tmp_path / "plain").mkdir()
    without, _ = _gate_case(tmp_path / "plain")
    plain = invoke("--traffic", traffic_file, "-p", SUPER, "-r", without, "--steps", "0", "--json")
    assert "profile --energy" in json.loads(plain.stdout)["totals"]["energy"]["note"]
