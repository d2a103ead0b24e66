"""Recorded serving traffic: the per-request results of vLLM's and SGLang's serving benchmarks, or a CSV of running
requests over time, read into decode intervals and a concurrency timeline."""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replayssm_cli.errors import UserError

# Longer than any context a served model takes: a length above it is a unit or parsing error.
MAX_TOKENS = 10_000_000
# A request or a gap between tokens longer than a week is a unit or clock error.
MAX_SECONDS = 7 * 86400.0
# vLLM records per-request start times (time.perf_counter) from this pull request on; older files and SGLang's lack them.
VLLM_START_TIMES = "vLLM PR #32667 (2026-01)"
HINT_FORMATS = (
    "pass the file of `vllm bench serve --save-result --save-detailed`, SGLang's `bench_serving --output-file F "
    "--output-details`, or a CSV with columns time,running"
)
TIME_COLUMNS = ("time", "timestamp", "t", "ts")
RUNNING_COLUMNS = ("running", "running_requests", "num_requests_running", "concurrency", "decoding")


@dataclass
class Traffic:
    """What a traffic file holds, per request (arrays over the successful requests) or as a timeline.

    `decode_start`/`decode_end`: seconds from the first request's start, the span over which a request decodes
    (after its first token). `timeline`: (edges, running) with running[i] sequences decoding over
    [edges[i], edges[i+1]). `itl_values`: each inter-token gap (seconds), with `itl_request` the request it belongs to
    and, where the timeline is known, `itl_times` its midpoint.
    """

    path: Path
    format: str
    describe: str
    requests: int = 0
    failed: int = 0
    input_lens: np.ndarray | None = None
    output_lens: np.ndarray | None = None
    decode_start: np.ndarray | None = None
    decode_end: np.ndarray | None = None
    timeline: tuple[np.ndarray, np.ndarray] | None = None
    timeline_note: str = ""
    itl_times: np.ndarray | None = None
    itl_values: np.ndarray | None = None
    itl_request: np.ndarray | None = None
    duration: float | None = None
    mean_concurrency: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": str(self.path),
            "format": self.format,
            "describe": self.describe,
            "requests": self.requests,
            "failed": self.failed,
            "duration_s": self.duration,
            "timeline": self.timeline_note or None,
            "metadata": self.metadata,
            "could_not_compute": self.missing,
        }


def _bad(path: Path, what: str, hint: str = HINT_FORMATS) -> UserError:
    return UserError(f"traffic file {path}: {what}", hint)


def read(path: str | Path) -> Traffic:
    """Read a traffic file in any of the supported formats; anything else is one UserError naming what is wrong."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"traffic file {p} does not exist", HINT_FORMATS)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(p, f"cannot be read as text ({exc.__class__.__name__})") from None
    if not text.strip():
        raise _bad(p, "is empty: no requests")
    stripped = text.lstrip()
    if stripped.startswith("{") or stripped.startswith("["):
        return _read_json(p, text)
    return _read_csv(p, text)


def _json_docs(p: Path, text: str) -> list[dict[str, Any]]:
    """One JSON object, or JSON lines (SGLang's output file, and vLLM's with --append-result), one run a line."""
    try:
        doc = json.loads(text)
        docs = doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise _bad(p, f"line {n} is not JSON ({exc.msg}): corrupt or truncated") from None
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise _bad(p, "holds JSON that is not a benchmark result object")
    return docs


def _read_json(p: Path, text: str) -> Traffic:
    docs = _json_docs(p, text)
    doc = docs[-1]
    runs = f" (the last of {len(docs)} runs in the file)" if len(docs) > 1 else ""
    per_request = ("input_lens", "output_lens", "ttfts", "itls")
    if not any(k in doc for k in per_request):
        if any(k in doc for k in ("duration", "completed", "request_throughput")):
            raise _bad(p, "holds a benchmark summary without per-request fields (input_lens, output_lens, ttfts, itls)",
                       "re-run vLLM with `--save-result --save-detailed`, or SGLang's bench_serving with `--output-details`")
        raise _bad(p, "is JSON in an unknown format (no input_lens, output_lens, ttfts or itls)")
    sglang = "total_output_tokens_retokenized" in doc or "concurrency" in doc or "dataset_name" in doc
    fmt = "sglang" if sglang else "vllm"
    describe = ("SGLang bench_serving --output-details" if sglang else "vllm bench serve --save-detailed") + runs
    return _from_requests(p, doc, fmt, describe)


def _array(p: Path, doc: dict[str, Any], key: str, n: int | None) -> np.ndarray | None:
    if key not in doc or doc[key] is None:
        return None
    values = doc[key]
    if not isinstance(values, list):
        raise _bad(p, f"field {key} is not a list")
    if n is not None and len(values) != n:
        raise _bad(p, f"field {key} has {len(values)} entries, the others {n}: not one entry per request")
    try:
        arr = np.asarray([math.nan if v is None else v for v in values], dtype=float)
    except (TypeError, ValueError):
        raise _bad(p, f"field {key} holds values that are not numbers") from None
    return arr


def _check_lengths(p: Path, key: str, arr: np.ndarray) -> None:
    if not np.all(np.isfinite(arr)):
        raise _bad(p, f"{key} holds a missing or non-finite length", "lengths are token counts, 0 or more")
    if np.any(arr < 0):
        raise _bad(p, f"{key} holds a negative length ({arr.min():g})", "lengths are token counts, 0 or more")
    if np.any(arr > MAX_TOKENS):
        raise _bad(p, f"{key} holds an absurd length ({arr.max():g} tokens, over {MAX_TOKENS:,})",
                   "lengths are token counts; check the file's units")


def _check_seconds(p: Path, key: str, arr: np.ndarray) -> None:
    if np.any(arr < 0):
        raise _bad(p, f"{key} holds a negative time ({arr.min():g} s)", "times are seconds, 0 or more")
    if np.any(arr > MAX_SECONDS):
        raise _bad(p, f"{key} holds an absurd time ({arr.max():g} s, over a week)", "times are seconds; check the file's units")


def _failed(doc: dict[str, Any], n: int, output_lens: np.ndarray | None, ttfts: np.ndarray | None) -> np.ndarray:
    """Requests that failed: an error message, or (vLLM writes 0 for both) no output and no first token."""
    bad = np.zeros(n, dtype=bool)
    errors = doc.get("errors")
    if isinstance(errors, list) and len(errors) == n:
        bad |= np.array([bool(e) for e in errors])
    successes = doc.get("successes")
    if isinstance(successes, list) and len(successes) == n:
        bad |= ~np.array([bool(s) for s in successes])
    if output_lens is not None and ttfts is not None:
        bad |= (output_lens == 0) & (ttfts == 0)
    return bad


def _from_requests(p: Path, doc: dict[str, Any], fmt: str, describe: str) -> Traffic:
    n = next((len(doc[k]) for k in ("output_lens", "input_lens", "ttfts", "itls") if isinstance(doc.get(k), list)), 0)
    if n == 0:
        raise _bad(p, "holds no requests (its per-request lists are empty)")
    input_lens = _array(p, doc, "input_lens", n)
    output_lens = _array(p, doc, "output_lens", n)
    ttfts = _array(p, doc, "ttfts", n)
    starts = _array(p, doc, "start_times", n)
    latencies = _array(p, doc, "latencies", n)
    itls = doc.get("itls")
    if itls is not None and (not isinstance(itls, list) or len(itls) != n):
        raise _bad(p, "field itls is not one list of inter-token gaps per request")
    bad = _failed(doc, n, output_lens, ttfts)
    keep = ~bad
    if not keep.any():
        raise _bad(p, f"holds no successful request (all {n} failed)")
    t = Traffic(p, fmt, describe, requests=int(keep.sum()), failed=int(bad.sum()))
    t.metadata = {k: doc[k] for k in ("date", "backend", "model_id", "label", "request_rate", "max_concurrency", "gpu",
                                      "driver", "torch", "triton", "cuda", "vllm", "sglang") if k in doc}
    t.duration = float(doc["duration"]) if isinstance(doc.get("duration"), (int, float)) else None
    for key, arr in (("input_lens", input_lens), ("output_lens", output_lens)):
        if arr is not None:
            arr = arr[keep]
            _check_lengths(p, key, arr)
            setattr(t, key, arr.astype(np.int64))
    if t.input_lens is None:
        t.missing.append("context lengths: the file has no input_lens")
    if t.output_lens is None:
        t.missing.append("generation lengths: the file has no output_lens")

    gaps = None
    if itls is not None:
        gaps = []
        for i in np.flatnonzero(keep):
            g = itls[i]
            if not isinstance(g, list):
                raise _bad(p, f"itls[{i}] is not a list of inter-token gaps")
            try:
                arr = np.asarray(g, dtype=float)
            except (TypeError, ValueError):
                raise _bad(p, f"itls[{i}] holds values that are not numbers") from None
            if arr.size and not np.all(np.isfinite(arr)):
                raise _bad(p, f"itls[{i}] holds a non-finite gap")
            gaps.append(arr)
        flat = np.concatenate(gaps) if gaps else np.zeros(0)
        _check_seconds(p, "itls", flat)
        if flat.size == 0:
            gaps = None
    else:
        t.missing.append("inter-token latencies: the file has no itls (so the gain on your ITL is not computed)")
    if ttfts is not None:
        ttfts = ttfts[keep]
        if not np.all(np.isfinite(ttfts)):
            raise _bad(p, "ttfts holds a missing or non-finite time")
        _check_seconds(p, "ttfts", ttfts)
    if latencies is not None:
        latencies = latencies[keep]
        _check_seconds(p, "latencies", latencies[np.isfinite(latencies)])

    # Each request's decode span: from its first token to its last.
    first = ttfts
    span = None
    if gaps is not None:
        span = np.array([g.sum() for g in gaps])
    elif latencies is not None and ttfts is not None and np.all(np.isfinite(latencies)):
        span = np.maximum(latencies - ttfts, 0.0)
    if first is None or span is None:
        t.missing.append("concurrency over time: the file has neither ttfts with itls nor ttfts with latencies")
        return t

    offsets = None
    if starts is not None:
        starts = starts[keep]
        if not np.all(np.isfinite(starts)):
            raise _bad(p, "start_times holds a missing or non-finite time")
        offsets = starts - starts.min()
        _check_seconds(p, "start_times (from the first)", offsets)
        t.timeline_note = "decode spans from the file's start_times, ttfts and itls"
    else:
        offsets = _closed_loop_starts(first + span, doc)
        if offsets is not None:
            t.timeline_note = (
                f"start times reconstructed as a closed loop of max_concurrency {doc['max_concurrency']} at request rate "
                f"inf (the file has no start_times: SGLang, or vLLM before {VLLM_START_TIMES})"
            )
    busy = float(span.sum())
    if gaps is not None:
        lens = np.array([g.size for g in gaps])
        t.itl_request = np.repeat(np.arange(len(gaps)), lens)
        t.itl_values = np.concatenate(gaps)
    if offsets is None:
        if t.duration:
            t.mean_concurrency = busy / t.duration
        t.missing.append(
            "concurrency over time: the file has no start_times (SGLang, or vLLM before "
            f"{VLLM_START_TIMES}) and was not a closed loop at request rate inf; only the mean concurrency "
            "(decode time over duration) is known" + ("" if t.duration else ", and the file has no duration either")
        )
        return t
    t.decode_start = offsets + first
    t.decode_end = t.decode_start + span
    t.timeline = _timeline(t.decode_start, t.decode_end)
    if t.duration is None:
        t.duration = float(t.decode_end.max())
    if gaps is not None:
        ends = np.concatenate([np.cumsum(g) for g in gaps]) + np.repeat(t.decode_start, lens)
        t.itl_times = ends - t.itl_values / 2
    return t


def _closed_loop_starts(latency: np.ndarray, doc: dict[str, Any]) -> np.ndarray | None:
    """Start times of a run at request rate inf under max_concurrency C: each request takes the first free slot."""
    c = doc.get("max_concurrency")
    rate = doc.get("request_rate")
    if not isinstance(c, int) or c < 1 or rate not in ("inf", float("inf"), None):
        return None
    free = [0.0] * c
    starts = np.empty(len(latency))
    for i, lat in enumerate(latency):
        s = heapq.heappop(free)
        starts[i] = s
        heapq.heappush(free, s + float(lat))
    return starts


def _timeline(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The step function of sequences decoding: edges (k+1,) and running (k,) over [edges[i], edges[i+1])."""
    times = np.concatenate([start, end])
    delta = np.concatenate([np.ones(len(start)), -np.ones(len(end))])
    order = np.argsort(times, kind="stable")
    times, delta = times[order], delta[order]
    edges, idx = np.unique(times, return_index=True)
    counts = np.add.reduceat(delta, idx)
    running = np.cumsum(counts)[:-1]
    return edges, np.maximum(running, 0)


def _read_csv(p: Path, text: str) -> Traffic:
    import io

    import pandas as pd

    try:
        frame = pd.read_csv(io.StringIO(text), skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise _bad(p, f"is neither JSON nor a readable CSV ({exc.__class__.__name__})") from None
    cols = {str(c).strip().lower(): c for c in frame.columns}
    tcol = next((cols[c] for c in TIME_COLUMNS if c in cols), None)
    rcol = next((cols[c] for c in RUNNING_COLUMNS if c in cols), None)
    if tcol is None or rcol is None:
        have = ", ".join(str(c) for c in frame.columns) or "none"
        raise _bad(p, f"is not a format plan reads (CSV columns: {have}; a CSV needs a time and a running column)",
                   f"name the columns time,running (time in seconds or ISO 8601; running: sequences decoding); or {HINT_FORMATS}")
    if frame.empty:
        raise _bad(p, "holds no samples (a header and no rows)")
    running = pd.to_numeric(frame[rcol], errors="coerce").to_numpy(dtype=float)
    if not np.all(np.isfinite(running)):
        row = int(np.flatnonzero(~np.isfinite(running))[0]) + 2
        raise _bad(p, f"line {row}: running {frame[rcol].iloc[row - 2]!r} is not a number", "running is a count of sequences")
    if np.any(running < 0):
        raise _bad(p, f"running holds a negative count ({running.min():g})", "running is a count of sequences, 0 or more")
    if np.any(running > MAX_TOKENS):
        raise _bad(p, f"running holds an absurd count ({running.max():g})", "running is a count of sequences")
    times = pd.to_numeric(frame[tcol], errors="coerce")
    if times.isna().any():
        try:
            stamps = pd.to_datetime(frame[tcol], utc=True, format="ISO8601")
        except (ValueError, TypeError):
            raise _bad(p, f"column {tcol} holds values that are neither seconds nor ISO 8601 times") from None
        times = (stamps - stamps.min()).dt.total_seconds()
    t = times.to_numpy(dtype=float)
    order = np.argsort(t, kind="stable")
    t, running = t[order] - t.min(), running[order]
    if len(t) < 2:
        raise _bad(p, "holds one sample: a timeline needs two or more")
    step = np.diff(t)
    if np.any(step <= 0):
        raise _bad(p, "holds two samples at one time", "one sample per time")
    # Each sample holds until the next; the last for the median interval.
    edges = np.append(t, t[-1] + float(np.median(step)))
    out = Traffic(p, "csv", f"CSV of running sequences ({len(t)} samples)")
    out.timeline = (edges, running)
    out.timeline_note = "each sample's running count held until the next sample"
    out.duration = float(edges[-1])
    out.missing += [
        "sequence lengths: a CSV of running counts has none (quality is taken at the quality run's longest bucket)",
        "inter-token latencies: a CSV has none (the end-to-end gain comes from the shipped whole-model measurement)",
    ]
    return out
