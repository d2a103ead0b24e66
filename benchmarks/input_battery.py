"""A battery of bad inputs for options, presets, configs, traces and paths, run through the CLI on a
machine without a GPU; prints how many meet the promise and writes every case with its outcome as JSON.

A refused case meets it with exit code 2, one line on stderr that starts with "error:", no traceback, nothing on
stdout and no file written; an accepted case (an alias, a model directory) with exit code 0; a recorded-ceilings
case with exactly one warning that names the figures used instead.

    python benchmarks/input_battery.py [--json battery.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "fixtures" / "configs"
SUPER, QWEN, SMALL = "nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b", "nemotron-h-8b"


def files(d: Path) -> dict[str, str]:
    """Bad files the cases name, made in `d`."""
    toml = (ROOT / "profiles" / "models" / f"{SMALL}.toml").read_text()
    made: dict[str, str] = {}

    def put(name: str, content: str | bytes) -> None:
        path = d / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
        made[name] = str(path)

    def cfg(name: str, **edits) -> str:
        c = json.loads((CONFIGS / name).read_text())
        for k, v in edits.items():
            c.pop(k, None) if v is None else c.__setitem__(k, v)
        return json.dumps(c)

    import re

    without_e2e = re.sub(r"\[e2e\]\n(?:[^\[].*\n|\n)*", "", toml)
    put("e2e-int.toml", "e2e = 5\n" + without_e2e)
    put("sources-string.toml", 'sources = "a paper"\n' + toml.split("[sources]")[0])
    put("pattern-int.toml", re.sub(r'layer_pattern = ".*"', "layer_pattern = 5", toml))
    put("heads-2e40.toml", toml.replace("heads = 128", "heads = 1099511627776"))
    put("heads-string.toml", toml.replace("heads = 128", 'heads = "128"'))
    put("flag-string.toml", toml.replace("dt_softplus = true", 'dt_softplus = "yes"'))
    put("unknown-key.toml", toml.replace("[ssm]", "[ssm]\nheads_typo = 3"))
    put("a-log-nan.toml", toml.replace("a_log_range = [1.0, 16.0]", "a_log_range = [1.0, nan]"))
    put("notes-int.toml", "notes = 3\n" + toml)
    put("binary.toml", bytes(range(256)) * 4)
    put("not-toml.toml", "kind = [")
    put("list.json", "[1, 2]")
    put("deep.json", "[" * 200_000 + "]" * 200_000)
    put("broken.json", '{"model_type": "mamba2",')
    put("expand-two.json", cfg("mamba2_2.7b.json", expand="two", num_heads=None))
    put("groups-eight.json", cfg("mamba2_2.7b.json", n_groups="eight"))
    put("head-dim-0.json", cfg("mamba2_2.7b.json", head_dim=0, num_heads=None))
    put("heads-80.7.json", cfg("mamba2_2.7b.json", num_heads=80.7))
    put("float64.json", cfg("mamba2_2.7b.json", torch_dtype="float64"))
    put("interval-0.json", cfg("qwen3_next_80b.json", full_attention_interval=0))
    put("layer-types-string.json", cfg("qwen3_next_80b.json", layer_types="linear"))
    put("pattern-int.json", cfg("nemotron_h_super.json", hybrid_override_pattern=5))
    put("pickle.npz", b"\x80\x04\x95" + bytes(64))
    put("binary.npz", bytes(range(256)))
    np.save(d / "array.npy", np.zeros(3))
    made["array.npy"] = str(d / "array.npy")
    np.savez(d / "object.npz", meta=np.array(["{}"], dtype=object))
    made["object.npz"] = str(d / "object.npz")
    (d / "dir").mkdir()
    made["dir"] = str(d / "dir")
    os.mkfifo(d / "fifo")
    made["fifo"] = str(d / "fifo")
    os.symlink(d / "loop-b", d / "loop-a")
    os.symlink(d / "loop-a", d / "loop-b")
    made["loop"] = str(d / "loop-a")
    os.symlink(d / "gone", d / "dangling")
    made["dangling"] = str(d / "dangling")
    put("plain-file", "x")
    model = d / "Mamba2-Local"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "mamba2_2.7b.json").read_text())
    made["model-dir"] = str(model)
    return made


def cases(f: dict[str, str]) -> list[tuple[str, str, list[str]]]:
    """(expectation, what, argv): expectation 'refuse' or 'accept'."""
    r: list[tuple[str, str, list[str]]] = []
    refuse = lambda what, *argv: r.append(("refuse", what, list(argv)))  # noqa: E731
    accept = lambda what, *argv: r.append(("accept", what, list(argv)))  # noqa: E731
    # Empty values.
    for cmd in (["profile"], ["tune", "-p", SMALL], ["cost"], ["e2e", "--dry-run"]):
        for opt in ("--preset", "--batch", "--window", "--gpu", "--state-dtype", "--preset-file"):
            if not (cmd[0] == "cost" and opt == "--gpu"):
                refuse(f"{cmd[0]} {opt} ''", *cmd, opt, "")
    for cmd in (["profile"], ["tune", "-p", SMALL], ["e2e"]):
        refuse(f"{cmd[0]} --out ''", *cmd, "--out", "")
    refuse("cost --batch 1,,16", "cost", "--batch", "1,,16")
    refuse("cost --batch 16,", "cost", "--batch", "16,")
    refuse("roofline ''", "roofline", "")
    refuse("compare '' x", "compare", "", "x")
    refuse("presets --tp ''", "presets", "--tp", "")
    # Repeated single-valued options.
    refuse("cost --window twice", "cost", "--window", "8", "--window", "16")
    refuse("cost --tp and --tensor-parallel-size", "cost", "--tp", "2", "--tensor-parallel-size", "4")
    refuse("profile --gpu twice", "profile", "--gpu", "h200", "--gpu", "b200")
    refuse("tune --preset A --preset B", "tune", "--preset", SUPER, "--preset", QWEN)
    refuse("tune --accept-rate twice", "tune", "-p", SMALL, "--draft", "2", "--accept-rate", "0.5", "--accept-rate", "0.6")
    refuse("e2e --window twice", "e2e", "--dry-run", "--window", "8", "--window", "16")
    refuse("roofline --bytes twice", "roofline", "--bytes", "modelled", "--bytes", "measured")
    refuse("gpu --gpu twice", "gpu", "--gpu", "h200", "--gpu", "b200")
    refuse("presets --tp twice", "presets", "--tp", "2", "--tp", "4")
    refuse("profile --phases --no-phases", "profile", "--phases", "--no-phases")
    refuse("cost --json twice", "cost", "--json", "--json")
    # Numbers: non-finite, out of range, not numbers.
    for cmd in (["profile", "--draft", "2"], ["tune", "-p", SMALL, "--draft", "2"], ["cost", "--draft", "2"]):
        for v in ("nan", "inf", "-1", "2", "x"):
            refuse(f"{cmd[0]} --accept-rate {v}", *cmd, "--accept-rate", v)
    for v in ("nan,1,1", "0.2,,0.3", "-1,1,1", "0,0,0", "1"):
        refuse(f"profile --accept-dist {v}", "profile", "--draft", "2", "--accept-dist", v)
        refuse(f"cost --accept-dist {v}", "cost", "--draft", "2", "--accept-dist", v)
    for cmd in (["profile"], ["tune", "-p", SMALL], ["cost"], ["e2e", "--dry-run"]):
        for v in ("0", "-4", "1000000000", "1.5", "abc"):
            refuse(f"{cmd[0]} --batch {v}", *cmd, "--batch", v)
        for v in ("0", "65"):
            refuse(f"{cmd[0]} --window {v}", *cmd, "--window", v)
        for v in ("0", "100"):
            refuse(f"{cmd[0]} --tp {v}", *cmd, "--tp", v)
    refuse("profile --draft 9", "profile", "--draft", "9")
    refuse("cost --draft 9", "cost", "--draft", "9")
    refuse("e2e --context 0", "e2e", "--dry-run", "--context", "0")
    refuse("e2e --max-weights-gib nan", "e2e", "--dry-run", "--max-weights-gib", "nan")
    refuse("e2e --max-weights-gib -1", "e2e", "--dry-run", "--max-weights-gib", "-1")
    refuse("profile --repeats 0", "profile", "--repeats", "0")
    refuse("profile --layers 0", "profile", "--layers", "0")
    refuse("gpu --index -1", "gpu", "--index", "-1")
    # Dtypes.
    for v in ("fp7", "int8", "fp8_e5m2", "float64", "auto,fp32"):
        refuse(f"cost --state-dtype {v}", "cost", "--state-dtype", v)
    refuse("cost --read-dtype fp32", "cost", "--read-dtype", "fp32")
    refuse("profile --io-dtype int8", "profile", "--io-dtype", "int8")
    refuse("tune --read-dtype none,bf16", "tune", "-p", SMALL, "--read-dtype", "none,bf16")
    # Conflicts.
    refuse("profile --predict --require-gpu", "profile", "--predict", "--require-gpu")
    refuse("profile --accept-rate without --draft", "profile", "--accept-rate", "0.9")
    refuse("tune --accept-rate without --draft", "tune", "-p", SMALL, "--accept-rate", "0.9")
    refuse("cost --accept-rate without --draft", "cost", "--accept-rate", "0.9")
    refuse("cost --accepted with --accept-rate", "cost", "--draft", "2", "--accepted", "1", "--accept-rate", "0.5")
    refuse("e2e --dry-run --out F", "e2e", "--dry-run", "--out", "plan.json")
    # Paths to write.
    for cmd in (["profile"], ["tune", "-p", SMALL], ["e2e"]):
        refuse(f"{cmd[0]} --out -", *cmd, "--out", "-")
        refuse(f"{cmd[0]} --out DIR", *cmd, "--out", f["dir"])
        refuse(f"{cmd[0]} --out under a file", *cmd, "--out", f["plain-file"] + "/x.json")
        refuse(f"{cmd[0]} --out long name", *cmd, "--out", "d/" + "n" * 300)
    refuse("roofline --out FIFO", "roofline", "--out", f["fifo"])
    # Paths to read.
    for what in ("dir", "fifo", "loop", "dangling"):
        refuse(f"presets --preset-file {what}", "presets", "--preset-file", f[what])
        refuse(f"cost --preset {what}", "cost", "--preset", f[what])
        refuse(f"tune --results {what}", "tune", "-p", SMALL, "--results", f[what])
        refuse(f"compare {what}", "compare", f[what], f[what])
        refuse(f"roofline {what}", "roofline", f[what])
    refuse("presets --preset-file missing", "presets", "--preset-file", f["dir"] + "/missing.json")
    for n in (300, 10_000):
        refuse(f"cost --preset <{n} chars>", "cost", "--preset", "x" * n)
        refuse(f"profile --preset <{n} chars>", "profile", "--preset", "x" * n)
        refuse(f"presets <{n} chars>", "presets", "x" * n)
    refuse("cost --preset <300-char path>", "cost", "--preset", "d/" + "x" * 300 + ".toml")
    # Preset files and configs.
    for name in ("e2e-int.toml", "sources-string.toml", "pattern-int.toml", "heads-2e40.toml", "heads-string.toml", "flag-string.toml",
                 "unknown-key.toml", "a-log-nan.toml", "notes-int.toml", "binary.toml", "not-toml.toml", "list.json", "deep.json",
                 "broken.json", "expand-two.json", "groups-eight.json", "head-dim-0.json", "heads-80.7.json", "float64.json",
                 "interval-0.json", "layer-types-string.json", "pattern-int.json"):
        refuse(f"presets --preset-file {name}", "presets", "--preset-file", f[name])
        refuse(f"cost --preset {name}", "cost", "--preset", f[name])
    # Traces.
    for name in ("pickle.npz", "binary.npz", "array.npy", "object.npz", "dir", "fifo"):
        refuse(f"tune --trace {name}", "tune", "-p", SMALL, "--gpu", "h100-sxm", "--trace", f[name])
    # The vocabulary: accepted.
    for v in ("float32", "bfloat16", "float16", "auto"):
        accept(f"cost --state-dtype {v}", "cost", "-p", SMALL, "--batch", "8", "--state-dtype", v, "--json")
    accept("cost --read-dtype fp8_e4m3", "cost", "-p", SMALL, "--batch", "8", "--read-dtype", "fp8_e4m3", "--json")
    accept("cost --tensor-parallel-size 2", "cost", "-p", SMALL, "--batch", "8", "--tensor-parallel-size", "2", "--json")
    accept("cost -p A -p B --batch 1,64", "cost", "-p", SUPER, "-p", QWEN, "--batch", "1,64", "--json")
    accept("cost --draft 2 --accept-rate 0.8", "cost", "-p", SMALL, "--batch", "8", "--draft", "2", "--accept-rate", "0.8", "--json")
    accept("cost --draft 2 --accept-dist", "cost", "-p", SMALL, "--batch", "8", "--draft", "2", "--accept-dist", "0.2,0.3,0.5", "--json")
    accept("cost --preset-file model-dir", "cost", "--preset-file", f["model-dir"], "--batch", "8", "--json")
    accept("presets model-dir", "presets", f["model-dir"], "--json")
    accept("presets --preset model-dir", "presets", "--preset", f["model-dir"], "--json")
    accept("e2e --dry-run --state-dtype bfloat16", "e2e", "--dry-run", "-p", QWEN, "--state-dtype", "bfloat16", "--json")
    return r


def judge(expect: str, res, before: set[str], after: set[str]) -> str | None:
    """None when the outcome meets the promise, else what is wrong."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    if "Traceback" in res.output or (res.exception is not None and not isinstance(res.exception, SystemExit)):
        return f"traceback ({type(res.exception).__name__})"
    if expect == "accept":
        return None if res.exit_code == 0 else f"exit {res.exit_code}: {' '.join(lines)[:160]}"
    if res.exit_code != 2:
        return f"exit {res.exit_code}" + (f": {' '.join(lines)[:160]}" if lines else "")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return f"{len(lines)} stderr lines: {' | '.join(lines)[:160]}"
    if res.stdout.strip():
        return "printed on stdout"
    if after != before:
        return f"wrote {sorted(after - before)}"
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every case with its outcome here")
    args = ap.parse_args()
    from replayssm_cli.main import app

    runner = CliRunner()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        work = d / "cwd"
        work.mkdir()
        made = files(d)
        cwd = os.getcwd()
        os.chdir(work)
        try:
            for expect, what, argv in cases(made):
                before = set(os.listdir(work))
                res = runner.invoke(app, argv)
                after = set(os.listdir(work))
                for extra in after - before:
                    (work / extra).unlink() if (work / extra).is_file() else None
                wrong = judge(expect, res, before, after)
                first = next((line for line in res.stderr.splitlines() if line.strip()), "")
                results.append({"what": what, "expect": expect, "ok": wrong is None, "wrong": wrong, "exit": res.exit_code, "stderr": first[:300]})
        finally:
            os.chdir(cwd)
    results.append(ceilings_case())
    ok = sum(r["ok"] for r in results)
    for r in results:
        if not r["ok"]:
            print(f"  not met: {r['what']}: {r['wrong']}", file=sys.stderr)
    by = {e: (sum(r["ok"] for r in results if r["expect"] == e), sum(r["expect"] == e for r in results)) for e in ("refuse", "accept", "warn")}
    print(f"{ok} of {len(results)} inputs meet the promise ({100 * ok / len(results):.0f}%): "
          + ", ".join(f"{e} {a}/{n}" for e, (a, n) in by.items() if n))
    if args.json:
        args.json.write_text(json.dumps({"met": ok, "tried": len(results), "cases": results}, indent=1))


def ceilings_case() -> dict:
    """A malformed ceilings cache entry for the detected GPU: one warning naming the figures used instead."""
    import contextlib
    import io

    from replayssm_cli.model import gpus

    what = "ceilings cache entry with copy_gbs 'fast'"
    with tempfile.TemporaryDirectory() as d:
        old = os.environ.get(gpus.CACHE_ENV)
        os.environ[gpus.CACHE_ENV] = d
        name, driver = "NVIDIA H100 80GB HBM3", "1.0"
        Path(d, "ceilings.json").write_text(json.dumps({"version": 1, "entries": {f"{name}|driver {driver}": {"copy_gbs": "fast"}}}))
        detected = gpus.DetectedGpu(index=0, name=name, uuid=None, compute_capability="9.0", memory_total=None, memory_free=None,
                                    max_sm_clock_mhz=None, max_mem_clock_mhz=None, bus_width_bits=None, power_limit_w=None,
                                    driver=driver, sm_count=None, sm_count_source=None, spec=gpus.load_gpu("h100-sxm"))
        buf = io.StringIO()
        from replayssm_cli import console

        saved = console.err.file
        console.err.file = buf
        try:
            with contextlib.redirect_stderr(buf):
                gpus.ceilings_for(detected.spec, detected)
        except Exception as exc:  # noqa: BLE001  (the battery records whatever happens)
            return {"what": what, "expect": "warn", "ok": False, "wrong": f"{type(exc).__name__}: {exc}", "exit": None, "stderr": ""}
        finally:
            console.err.file = saved
            if old is None:
                os.environ.pop(gpus.CACHE_ENV, None)
            else:
                os.environ[gpus.CACHE_ENV] = old
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    text = " ".join(" ".join(lines).split())
    ok = "warning" in text and "datasheet" in text and "TB/s" in text
    return {"what": what, "expect": "warn", "ok": ok, "wrong": None if ok else f"stderr: {text[:160] or 'nothing'}", "exit": None, "stderr": text[:300]}


if __name__ == "__main__":
    main()
