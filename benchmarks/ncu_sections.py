"""Where a step's kernels spend their time at a state precision, from Nsight Compute's sections (on a GPU).

Profiles one ReplaySSM or conventional step of a default preset's layer (the profiler's own case, as
ncu_check.py builds it) at each --state-dtype, rounded to nearest and stochastically, under ncu with the
SpeedOfLight, Occupancy, LaunchStats, ComputeWorkloadAnalysis, InstructionStats and WarpStateStats sections plus
each stall reason's warps per issued instruction and the ALU and FMA pipes' use. Writes each run's page as CSV
under DIR and prints one table per kernel: what stochastic rounding changes in a kernel that is not bound by
memory (instructions, issue, stalls) beside what it does not (bytes).

    python benchmarks/ncu_sections.py --op mamba2 --state-dtype bf16,int8 --phase flush runs/sections
    python benchmarks/ncu_sections.py --op gdn --state-dtype bf16 --phase conventional runs/sections
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "ComputeWorkloadAnalysis", "InstructionStats",
            "WarpStateStats")
STALLS = ("long_scoreboard", "short_scoreboard", "wait", "math_pipe_throttle", "barrier", "membar", "lg_throttle",
          "mio_throttle", "not_selected", "selected", "no_instruction", "dispatch_stall", "drain",
          "branch_resolving", "imc_miss", "misc", "sleeping", "tex_throttle")
PIPES = ("alu", "fma", "fmaheavy", "fp16", "lsu", "tensor_op_hmma")
# the extra metrics ncu collects, each with its label in the table
EXTRA = ({f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_active": f"pipe {p} %" for p in PIPES}
         | {f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio": f"stall {s}" for s in STALLS})
# (label, section, metric name) shown in the table
SHOWN = (
    ("duration", "GPU Speed Of Light Throughput", "Duration"),
    ("DRAM %", "GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("SM %", "GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("regs", "Launch Statistics", "Registers Per Thread"),
    ("occupancy % (theory)", "Occupancy", "Theoretical Occupancy"),
    ("occupancy % (achieved)", "Occupancy", "Achieved Occupancy"),
    ("instructions", "Instruction Statistics", "Executed Instructions"),
    ("issue slots busy %", "Compute Workload Analysis", "Issue Slots Busy"),
    ("cycles per issue", "Warp State Statistics", "Warp Cycles Per Issued Instruction"),
)

_SHOWN_BY = {(section, metric): label for label, section, metric in SHOWN}


def plan(op: str, batch: int, window: int, dtypes: list[str], phase: str) -> list[tuple[str, dict]]:
    """(label, ncu case spec) for each state dtype, to nearest then stochastically, at `phase`."""
    import ncu_check

    from replayssm_cli.model import presets

    name = {"mamba2": "nemotron-3-super-120b-a12b", "gdn": "qwen3.5-122b-a10b"}[op]
    out = []
    for dtype in dtypes:
        for rounding in ("nearest", "stochastic"):
            (entry,) = ncu_check.plan([(name, presets.resolve(name))], [batch], window, dtype, "bf16", 1, rounding,
                                      (phase,))
            out.append((f"{dtype}{' SR' if rounding == 'stochastic' else ''}", entry["spec"]))
    return out


def profile(label: str, spec: dict, out: Path, ncu: str, timeout: float) -> list[dict]:
    """One ncu run of a spec: its details page rows (kernel ID, kernel name, section, metric, unit, value)."""
    from replayssm_cli.measure import ncu as ncu_mod

    kinds = ncu_mod.kernels_for(spec["op"], spec.get("variant", "conventional"))
    with tempfile.TemporaryDirectory(prefix="replayssm-sections-") as tmp:
        job = Path(tmp) / "spec.json"
        warmup, _ = ncu_mod.profiled_steps(spec)
        job.write_text(json.dumps({"case": spec, "warmup": warmup, "steps": 1, "info": str(Path(tmp) / "info.json")},
                                  default=str))
        cmd = ncu_mod.ncu_command(ncu, job, ncu_mod.kernel_regex(kinds), list(EXTRA), page="details",
                                  sections=SECTIONS)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    safe = label.replace(" ", "-")
    (out / f"{spec['op']}-{safe}.csv").write_text(done.stdout)
    (out / f"{spec['op']}-{safe}.log").write_text(done.stderr)
    rows = page_rows(done.stdout)
    if done.returncode != 0 or not rows:
        raise RuntimeError(f"ncu exit {done.returncode} for {label}: {done.stderr.strip().splitlines()[-1:]}")
    return rows


def page_rows(text: str) -> list[dict]:
    """The rows of a details page ncu printed as CSV (after any lines of its own before the header)."""
    start = text.find('"ID"')
    return [] if start < 0 else list(csv.DictReader(io.StringIO(text[start:])))


def summary(rows: list[dict]) -> dict[str, dict[str, str]]:
    """{kernel: {label: value}} from a details page (the first launch of each kernel name)."""
    first: dict[str, str] = {}
    out: dict[str, dict[str, str]] = {}
    for r in rows:
        name = r["Kernel Name"]
        if first.setdefault(name, r["ID"]) != r["ID"]:
            continue
        values = out.setdefault(name, {})
        metric = r["Metric Name"]
        if (label := _SHOWN_BY.get((r["Section Name"], metric))) is not None:
            values[label] = f"{r['Metric Value']} {r.get('Metric Unit') or ''}".strip()
        elif metric in EXTRA:
            values[EXTRA[metric]] = r["Metric Value"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder for the CSV pages and summary.json")
    parser.add_argument("--op", choices=("mamba2", "gdn"), default="mamba2")
    parser.add_argument("--state-dtype", default="bf16", help="state dtypes, comma-separated (16-bit or 8-bit)")
    parser.add_argument("--phase", choices=("flush", "nonflush", "conventional"), default="flush")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per ncu run (default 300)")
    args = parser.parse_args(argv)

    from replayssm_cli.measure import ncu as ncu_mod

    dtypes = [d.strip() for d in args.state_dtype.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in ("bf16", "fp16", "int8", "fp8")]
    if bad or not dtypes:
        given = ",".join(bad) if bad else repr(args.state_dtype)
        print(f"error: --state-dtype {given}: stochastic rounding needs a 16-bit or 8-bit state (bf16, fp16, int8, "
              "fp8)", file=sys.stderr)
        return 2
    ok, reason = ncu_mod.ncu_available()
    if not ok:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    found: dict[str, dict[str, dict[str, str]]] = {}
    for label, spec in plan(args.op, args.batch, args.window, dtypes, args.phase):
        print(f"ncu_sections: {args.op} {args.phase} {label} at {args.batch}", file=sys.stderr, flush=True)
        found[label] = summary(profile(label, spec, args.out, ncu_mod.ncu_binary(), args.timeout))
    (args.out / f"{args.op}-{args.phase}-summary.json").write_text(json.dumps(found, indent=1) + "\n")
    labels = [lab for lab, _, _ in SHOWN] + list(EXTRA.values())
    kernels = sorted({k for per in found.values() for k in per})
    for kernel in kernels:
        print(f"\n{args.op} {args.phase} B{args.batch}: {kernel}")
        table = [[found[c].get(kernel, {}).get(lab, "–") for c in found] for lab in labels]
        width = 2 + max(len(v) for row in table + [list(found)] for v in row)
        print(f"{'':28}" + "".join(f"{c:>{width}}" for c in found))
        for lab, cells in zip(labels, table):
            if any(v not in ("–", "0") for v in cells):
                print(f"{lab:28}" + "".join(f"{v:>{width}}" for v in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
