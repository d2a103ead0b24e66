"""Write a recorded-traffic file with a day-night load in the engines' own formats, for `replayssm plan --traffic`.

    python benchmarks/traffic_example.py --format vllm --out day-vllm.json
    python benchmarks/traffic_example.py --format sglang --max-concurrency 64 --out run.jsonl
    python benchmarks/traffic_example.py --format csv --out running.csv

vllm: the file of `vllm bench serve --save-result --save-detailed` (with start_times, as vLLM writes since PR
#32667) over one day of arrivals compressed into --day-s seconds: the arrival rate follows a day-night curve
(night at the start and end, peak at mid-day), generation lengths are log-normal, and each token's gap grows with
the sequences decoding beside it (--itl-ms + --itl-ms-rise x (1 - exp(-running / --itl-seqs))), as a whole-model step does whose MoE
reads more experts' weights as its batch grows.
sglang: the line `bench_serving --output-file F --output-details` appends for a closed-loop run (request rate inf,
--max-concurrency), which records no start times. csv: a sample of running sequences every --csv-step-s seconds
over a real 24-hour day (as scraped from vLLM's `vllm:num_requests_running`), ISO 8601 times.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np


def arrivals(n: int, day_s: float, swing: float, rng: np.random.Generator) -> np.ndarray:
    """n arrival times over [0, day_s) with rate proportional to 1 - swing * cos(2 pi t / day_s) (night at t = 0)."""
    grid = np.linspace(0.0, day_s, 4097)
    rate = 1.0 - swing * np.cos(2 * math.pi * grid / day_s)
    cdf = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2)])
    cdf /= cdf[-1]
    return np.sort(np.interp(rng.random(n), cdf, grid))


def running_at(times: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Sequences decoding at each time."""
    s, e = np.sort(start), np.sort(end)
    return np.searchsorted(s, times, side="right") - np.searchsorted(e, times, side="right")


def lengths(args: argparse.Namespace, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompt and generation lengths (log-normal) and TTFTs (a prefill growing with the prompt, plus queueing)."""
    out_lens = np.clip(np.rint(rng.lognormal(math.log(args.output_median), 0.8, n)), 2, args.max_output).astype(int)
    in_lens = np.clip(np.rint(rng.lognormal(math.log(args.input_median), 0.9, n)), 8, 32000).astype(int)
    ttfts = 0.02 + in_lens * 2e-5 + rng.exponential(0.03, n)
    return in_lens, out_lens, ttfts


def gaps_at(args: argparse.Namespace, running: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Inter-token gaps (seconds) of tokens decoded beside `running` sequences."""
    itl_ms = args.itl_ms + args.itl_ms_rise * (1 - np.exp(-running / args.itl_seqs))
    return itl_ms / 1e3 * rng.lognormal(0.0, 0.05, running.size)


def simulate(args: argparse.Namespace, starts: np.ndarray, rng: np.random.Generator) -> dict:
    """Requests starting at `starts`: their gaps follow the concurrency of a first pass at a flat ITL, then once more
    the concurrency those gaps give."""
    n = len(starts)
    in_lens, out_lens, ttfts = lengths(args, n, rng)
    first = starts + ttfts
    end = first + (out_lens - 1) * args.itl_ms / 1e3
    gaps: list[np.ndarray] = []
    for _ in range(2):
        gaps, ends = [], np.empty(n)
        for i in range(n):
            approx = first[i] + np.arange(1, out_lens[i]) * (end[i] - first[i]) / max(out_lens[i] - 1, 1)
            g = gaps_at(args, running_at(approx, first, end), rng)
            gaps.append(g)
            ends[i] = first[i] + g.sum()
        end = ends
    return {"input_lens": in_lens, "output_lens": out_lens, "ttfts": ttfts, "itls": gaps, "end": end}


def _failures(doc: dict, n: int, rng: np.random.Generator, share: float) -> None:
    """Mark a few requests failed the way the benchmarks record them: an error, no output, no first token."""
    for i in np.flatnonzero(rng.random(n) < share):
        doc["errors"][i] = "aiohttp.client_exceptions.ServerDisconnectedError: Server disconnected"
        doc["output_lens"][i] = 0
        doc["ttfts"][i] = 0.0
        doc["itls"][i] = []
        doc["generated_texts"][i] = ""


def vllm_doc(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    starts = arrivals(args.requests, args.day_s, args.swing, rng)
    sim = simulate(args, starts, rng)
    n = args.requests
    clock = 350000.0 + starts  # vLLM records time.perf_counter(), whose origin is arbitrary
    doc = {
        "date": "20261201-120000", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": args.model, "tokenizer_id": args.model, "num_prompts": n, "request_rate": "inf" if args.rate_inf else round(n / args.day_s, 3),
        "burstiness": 1.0, "max_concurrency": None, "gpu": args.gpu,
        "duration": float(sim["end"].max()), "completed": n, "failed": 0,
        "input_lens": sim["input_lens"].tolist(), "output_lens": sim["output_lens"].tolist(),
        "ttfts": [round(float(x), 6) for x in sim["ttfts"]],
        "itls": [[round(float(x), 6) for x in g] for g in sim["itls"]],
        "start_times": [round(float(x), 6) for x in clock],
        "generated_texts": [""] * n, "errors": [""] * n,
    }
    _failures(doc, n, rng, args.failed)
    doc["failed"] = sum(1 for e in doc["errors"] if e)
    doc["completed"] = n - doc["failed"]
    doc["total_input_tokens"] = int(sum(doc["input_lens"]))
    doc["total_output_tokens"] = int(sum(doc["output_lens"]))
    doc["output_throughput"] = doc["total_output_tokens"] / doc["duration"]
    return doc


def sglang_doc(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    """A closed loop: each request starts when one of max_concurrency slots frees, so about that many decode at once
    (SGLang records no start times; the duration is the loop's)."""
    n, c = args.requests, args.max_concurrency
    in_lens, out_lens, ttfts = lengths(args, n, rng)
    gaps = [gaps_at(args, np.full(k - 1, c), rng) for k in out_lens]
    latency = ttfts + np.array([g.sum() for g in gaps])
    free = [0.0] * c
    for lat in latency:
        heapq.heappush(free, heapq.heappop(free) + float(lat))
    duration = max(free)
    return {
        "backend": "sglang", "dataset_name": "random", "request_rate": float("inf"), "max_concurrency": c,
        "duration": duration, "completed": n, "total_input_tokens": int(in_lens.sum()),
        "total_output_tokens": int(out_lens.sum()), "total_output_tokens_retokenized": int(out_lens.sum()),
        "concurrency": float(latency.sum() / duration),
        "input_lens": in_lens.tolist(), "output_lens": out_lens.tolist(),
        "ttfts": [round(float(x), 6) for x in ttfts],
        "itls": [[round(float(x), 6) for x in g] for g in gaps],
        "generated_texts": [""] * n, "errors": [""] * n,
    }


def csv_text(args: argparse.Namespace, rng: np.random.Generator) -> str:
    """Running sequences sampled over a real day: the day-night curve times a peak, with noise."""
    steps = int(86400 / args.csv_step_s)
    t0 = datetime(2026, 11, 30, tzinfo=timezone.utc)
    lines = ["time,running"]
    level = 0.0
    for i in range(steps):
        phase = 1.0 - args.swing * math.cos(2 * math.pi * i / steps)
        target = args.csv_peak * phase / (1 + args.swing)
        level = 0.8 * level + 0.2 * target
        running = max(0, int(rng.poisson(max(level, 0.0))))
        stamp = (t0 + timedelta(seconds=i * args.csv_step_s)).isoformat().replace("+00:00", "Z")
        lines.append(f"{stamp},{running}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--format", choices=("vllm", "sglang", "csv"), default="vllm")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--day-s", type=float, default=250.0, help="seconds one day of arrivals is compressed into (vllm)")
    ap.add_argument("--swing", type=float, default=0.85, help="day-night swing of the arrival rate, 0-1")
    ap.add_argument("--output-median", type=float, default=120.0)
    ap.add_argument("--input-median", type=float, default=800.0)
    ap.add_argument("--max-output", type=int, default=4096)
    # The whole-model step of Nemotron-3-Super on an H200 (profiles/reference/h200-e2e.json: 9.9, 62 and 90 ms at
    # batch 1, 64 and 256) rises as more rows touch more experts' weights, then flattens.
    ap.add_argument("--itl-ms", type=float, default=10.0, help="ITL of a lone sequence")
    ap.add_argument("--itl-ms-rise", type=float, default=80.0, help="ITL added as the batch grows, approached ...")
    ap.add_argument("--itl-seqs", type=float, default=60.0, help="... with this scale in sequences decoding")
    ap.add_argument("--failed", type=float, default=0.004, help="share of failed requests (vllm)")
    ap.add_argument("--max-concurrency", type=int, default=64, help="closed-loop slots (sglang)")
    ap.add_argument("--rate-inf", action="store_true", help="record request_rate inf (vllm)")
    ap.add_argument("--csv-step-s", type=float, default=10.0)
    ap.add_argument("--csv-peak", type=float, default=300.0)
    ap.add_argument("--model", default="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16")
    ap.add_argument("--gpu", default="NVIDIA H200")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.format == "csv":
        args.out.write_text(csv_text(args, rng))
    elif args.format == "sglang":
        args.out.write_text(json.dumps(sglang_doc(args, rng)) + "\n")
    else:
        args.out.write_text(json.dumps(vllm_doc(args, rng)))
    return args.out


if __name__ == "__main__":
    print(main())
