"""What benchmarks/precision_gpu.sh measured, in one page: each state precision's speed and what it is over.

Reads the results files and Nsight Compute checks the script wrote into one folder and prints, as Markdown:

- per layer and batch, each precision's conventional and ReplaySSM step (µs per token per layer), the ReplaySSM
  step's speedup over the conventional step at the same precision and rounding, both steps' speedup over the fp32
  conventional step, and what stochastic rounding costs over rounding to nearest (x_vs_nearest);
- FlashInfer's checkpointing_ssu beside our ReplaySSM step at the same state dtype and rounding (x_vs_ours: its µs
  over ours, above 1 ours is faster);
- Nsight Compute's DRAM bytes against the cost model's, and whether each is within 5%;
- the state-precision targets at batch 256, each with the figure it rests on.

Every figure names the file it came from (its GPU, date and commit), and a predicted file (DRY_RUN=1) says so.

    python benchmarks/precision_report.py runs/precision
    python benchmarks/precision_report.py runs/precision --out summary.md --json summary.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# The state-precision targets at batch 256 (docs/design.md §9): an 8-bit checkpoint's ReplaySSM step over the
# conventional step at its precision (Mamba-2), stochastic rounding's cost over rounding to nearest, and Nsight
# Compute's bytes against the model.
TARGET_8BIT = 1.7
TARGET_SR_COST = 1.03
TARGET_NCU = 5.0
PRECISIONS = (("fp32", "nearest"), ("bf16", "nearest"), ("bf16", "stochastic"), ("fp16", "nearest"),
              ("fp16", "stochastic"), ("int8", "nearest"), ("int8", "stochastic"), ("fp8", "nearest"), ("fp8", "stochastic"))


def _label(state: str, rounding: str) -> str:
    return state + (" SR" if rounding == "stochastic" else "")


def load_rows(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """(kernel rows of every results file and ncu check rows, each with its file's number in x_from ("[1]"); the
    files read, as "[1] label")."""
    from replayssm_cli.report import provenance, results

    rows, checks, files = [], [], []
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("kind") == results.KIND:
            res = results.load(path)
            files.append(f"[{len(files) + 1}] " + provenance.file_label(res) + ("" if res.complete else ", cut short"))
            rows += [{**r, "x_from": f"[{len(files)}]"} for r in res.rows
                     if r.get("kind", "kernel") == "kernel" and r.get("phase") == "avg"]
        elif doc.get("kind") == "replayssm-ncu-check":
            env = doc.get("environment") or {}
            files.append(f"[{len(files) + 1}] {path.name} (Nsight Compute {(doc.get('ncu') or {}).get('version') or ''}, "
                         f"{str(doc.get('created', ''))[:10]}, {env.get('commit') or 'no commit'})")
            checks += [{**r, "x_from": f"[{len(files)}]"} for r in doc.get("rows", [])]
    return rows, checks, files


def _us(value: float | None) -> str:
    return "–" if value is None else (f"{value:.1f}" if value >= 10 else f"{value:.2f}")


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _cost(value: float | None) -> str:
    return "–" if value is None else f"{100 * (value - 1):+.1f}%"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}%"


def _find(rows: list[dict[str, Any]], **want: Any) -> dict[str, Any] | None:
    """The first ok row with these fields (rounding read as nearest where a row has none)."""
    for r in rows:
        if r.get("status") != "ok":
            continue
        if all((r.get(k) or "nearest" if k == "rounding" else r.get(k)) == v for k, v in want.items()):
            return r
    return None


def speed_table(rows: list[dict[str, Any]], op: str) -> list[str]:
    """One line per (batch, precision) that a file measured for this op."""
    mine = [r for r in rows if r.get("op") == op and not str(r.get("variant", "")).startswith("baseline:")]
    if not mine:
        return []
    lines = ["| batch | state | conventional µs | ReplaySSM µs | ReplaySSM over conventional | conventional over fp32 | "
             "ReplaySSM over fp32 | SR cost, conventional | SR cost, ReplaySSM | from |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for batch in sorted({r["batch"] for r in mine}):
        for state, rounding in PRECISIONS:
            conv = _find(mine, variant="conventional", batch=batch, state_dtype=state, rounding=rounding)
            rep = _find(mine, variant="replay", batch=batch, state_dtype=state, rounding=rounding, read_dtype=None)
            if conv is None and rep is None:
                continue
            src = (rep or conv)["x_from"]
            lines.append(f"| {batch} | {_label(state, rounding)} | {_us(conv and conv['us_per_token'])} | "
                         f"{_us(rep and rep['us_per_token'])} | {_x(rep and rep.get('speedup'))} | "
                         f"{_x(conv and conv.get('speedup_vs_fp32'))} | {_x(rep and rep.get('speedup_vs_fp32'))} | "
                         f"{_cost(conv and conv.get('x_vs_nearest'))} | {_cost(rep and rep.get('x_vs_nearest'))} | {src} |")
    return lines


def flashinfer_table(rows: list[dict[str, Any]]) -> list[str]:
    theirs = [r for r in rows if r.get("variant") == "baseline:flashinfer-checkpointing"]
    if not theirs:
        return []
    lines = ["| batch | state | ours µs | checkpointing_ssu µs | its µs over ours | settings | from |", "|---|---|---|---|---|---|---|"]
    for r in sorted(theirs, key=lambda r: (r["batch"], r["state_dtype"], r.get("rounding") or "nearest")):
        label = _label(r["state_dtype"], r.get("rounding") or "nearest")
        if r.get("status") != "ok":
            lines.append(f"| {r['batch']} | {label} | – | failed: {r.get('x_error') or 'its check'} | – | – | {r['x_from']} |")
            continue
        settings = ", ".join(f"{k}={v}" for k, v in (r.get("x_settings") or {}).items())
        lines.append(f"| {r['batch']} | {label} | {_us(r.get('x_ours_us'))} | {_us(r['us_per_token'])} | "
                     f"{_x(r.get('x_vs_ours'))} | {settings or '–'} | {r['x_from']} |")
    return lines


def _ncu_diff(r: dict[str, Any]) -> float | None:
    return r.get("diff_total_pct")


def ncu_table(checks: list[dict[str, Any]]) -> list[str]:
    if not checks:
        return []
    lines = ["| preset | state | step | model MB | ncu MB | total Δ | L2 write Δ | within 5% | from |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in checks:
        step = r["variant"] if r["variant"] == "conventional" else f"{r['variant']} {r['phase']}"
        model = (r["model_bytes_read"] + r["model_bytes_written"]) / 1e6
        if not r.get("ok"):
            lines.append(f"| {r['preset']} | {_label(r['state_dtype'], r.get('rounding') or 'nearest')} | {step} | "
                         f"{model:,.2f} | not measured: {r.get('reason')} | – | – | – | {r['x_from']} |")
            continue
        diff, l2, measured = _ncu_diff(r), r.get("diff_l2_written_pct"), r.get("ncu_dram_bytes")
        ok = "yes" if diff is not None and abs(diff) <= TARGET_NCU else "no"
        lines.append(f"| {r['preset']} | {_label(r['state_dtype'], r.get('rounding') or 'nearest')} | {step} | {model:,.2f} | "
                     f"{'–' if measured is None else f'{measured / 1e6:,.2f}'} | {_pct(diff)} | {_pct(l2)} | {ok} | "
                     f"{r['x_from']} |")
    return lines


def targets(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state-precision targets at batch 256, each with its figure, whether it is met, and the file it rests on (None:
    not measured)."""
    out = []
    for state in ("int8", "fp8"):
        r = _find(rows, op="mamba2", variant="replay", batch=256, state_dtype=state, rounding="nearest", read_dtype=None)
        out.append({"target": f"Mamba-2 {state} checkpoint, ReplaySSM over conventional {state} at 256 >= {TARGET_8BIT}x",
                    "value": r and r.get("speedup"), "met": None if r is None or r.get("speedup") is None else r["speedup"] >= TARGET_8BIT,
                    "from": r and r["x_from"], "row": r or {}})
    # our kernels' steps only: a baseline's own cost of rounding stochastically is shown in its table
    sr = [r for r in rows if r.get("batch") == 256 and r.get("x_vs_nearest") is not None
          and not str(r.get("variant", "")).startswith("baseline:")]
    for which, of in (("worst step", sr), ("worst ReplaySSM step", [r for r in sr if r.get("variant") == "replay"])):
        worst = max(of, key=lambda r: r["x_vs_nearest"], default=None)
        out.append({"target": f"stochastic rounding costs under 3% over rounding to nearest ({which} at 256)",
                    "value": worst and worst["x_vs_nearest"],
                    "met": None if worst is None else worst["x_vs_nearest"] < TARGET_SR_COST,
                    "what": worst and f"{worst['op']} {worst['variant']} {_label(worst['state_dtype'], 'stochastic')}",
                    "from": worst and worst["x_from"], "row": worst or {}})
    for state, rounding in (("int8", "nearest"), ("fp8", "nearest"), ("int8", "stochastic"), ("fp8", "stochastic"), ("fp16", "stochastic")):
        r = _find(rows, variant="baseline:flashinfer-checkpointing", batch=256, state_dtype=state, rounding=rounding)
        out.append({"target": f"faster than FlashInfer's checkpointing_ssu at {_label(state, rounding)}, batch 256",
                    "value": r and r.get("x_vs_ours"), "met": None if r is None or r.get("x_vs_ours") is None else r["x_vs_ours"] > 1,
                    "from": r and r["x_from"], "row": r or {}})
    measured = [r for r in checks if r.get("ok") and _ncu_diff(r) is not None]
    worst_ncu = max(measured, key=lambda r: abs(_ncu_diff(r)), default=None)
    out.append({"target": f"Nsight Compute's DRAM bytes within {TARGET_NCU:g}% of the model (worst step)",
                "value": worst_ncu and _ncu_diff(worst_ncu),
                "met": None if worst_ncu is None else abs(_ncu_diff(worst_ncu)) <= TARGET_NCU,
                "what": worst_ncu and f"{worst_ncu['preset']} {worst_ncu['variant']} {worst_ncu['phase']} "
                                      f"{_label(worst_ncu['state_dtype'], worst_ncu.get('rounding') or 'nearest')}",
                "from": worst_ncu and worst_ncu["x_from"]})
    for t in out:
        t["predicted"] = t.pop("row", {}).get("source") == "predicted"
    return out


def render(rows: list[dict[str, Any]], checks: list[dict[str, Any]], files: list[str]) -> str:
    from replayssm_cli.model.presets import DEFAULT_PRESETS, resolve

    lines = ["# State precisions: speed, stochastic rounding's cost, FlashInfer, and Nsight Compute's bytes", ""]
    lines += [*(f"{f}  " for f in files), ""] if files else ["No results file in this folder.", ""]
    lines += ["µs per token per layer, W = 16, staggered flushes, the whole-window average; every ratio within one file. "
              "SR: stochastic rounding; its cost is the step's µs over the same step rounded to nearest.", ""]
    for name in DEFAULT_PRESETS:
        p = resolve(name)
        table = speed_table(rows, p.kind)
        if table:
            lines += [f"## {p.display} ({ops_title(p.kind)} {p.label()})", "", *table, ""]
    fi = flashinfer_table(rows)
    if fi:
        lines += ["## FlashInfer's checkpointing_ssu beside ours (same loop, inputs and check)", "", *fi, ""]
    nc = ncu_table(checks)
    if nc:
        lines += ["## Nsight Compute's DRAM bytes against the cost model, batch 256", "", *nc, "",
                  "L2 write Δ: the bytes the SMs wrote into L2 against the model's bytes written (DRAM writes still "
                  "dirty in L2 when a kernel ends are not in ncu's DRAM count).", ""]
    lines += ["## Targets", "", "| target | figure | met | from |", "|---|---|---|---|"]
    for t in targets(rows, checks):
        value = "not measured" if t["value"] is None else (_pct(t["value"]) if "Nsight" in t["target"] else
                                                           _cost(t["value"]) if "costs" in t["target"] else _x(t["value"]))
        if t.get("what"):
            value += f" ({t['what']})"
        met = "–" if t["met"] is None else ("yes" if t["met"] else "no") + (" (predicted)" if t.get("predicted") else "")
        lines.append(f"| {t['target']} | {value} | {met} | {t['from'] or '–'} |")
    return "\n".join(lines) + "\n"


def ops_title(kind: str) -> str:
    from replayssm_cli.model import ops

    return ops.named(kind).title


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="the folder precision_gpu.sh wrote ($OUT)")
    parser.add_argument("--out", type=Path, help="also write the Markdown here")
    parser.add_argument("--json", type=Path, help="write the targets and the files read as JSON here")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder} is not a folder; pass the $OUT that precision_gpu.sh wrote", file=sys.stderr)
        return 2
    rows, checks, files = load_rows(args.folder)
    text = render(rows, checks, files)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps({"files": files, "targets": targets(rows, checks)}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
