"""Where a step kernel's warps spend their time, from Nsight Compute's source counters (one launch, on a GPU).

Runs one kernel of `sweep_gdn.py` or `sweep_mamba2.py` (same shapes, inputs and launch settings) under ncu with
the SourceCounters and WarpStateStats sections, exports the per-instruction SASS page, and sums the warp-state
samples and executed instructions over the kernel's code regions: straight-line code and each loop (a span closed
by a backward branch; a loop nested in another counts in both). Writes the report, the pages as CSV and the
summary as JSON under DIR, and prints the summary.

    python benchmarks/ncu_stalls.py --op gdn --kernel verify --batch 256 runs/stalls
    python benchmarks/ncu_stalls.py --op mamba2 --kernel verify --batch 256 --launch verify:rows=64 runs/stalls
    python benchmarks/ncu_stalls.py --op mamba2 --kernel verify --batch 256 --fill 16 runs/stalls  # every row folds
    python benchmarks/ncu_stalls.py --resummarize profiles/reference/ncu/stalls   # from stored CSVs, no GPU
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SKIP = 3  # launches of the kernel before the profiled one (the stack's own first call, then warm steps)
# The launch sampled by default: a step's first (on large grids a Mamba-2 step on a 2-byte or 1-byte tile runs its
# non-flush launch as heads_kernel, its flushes as flush_kernel; --kernel-name picks another).
KERNEL_NAMES = {"verify": "verify_kernel", "decode-multi": "decode_multi", "decode": "decode_kernel",
                "replay": "replay_kernel|heads_kernel", "split-bf16": "replay_kernel|heads_kernel"}


def _child(op: str, kernel: str, batch: int, launch: dict, state_dtype: str, fill: int | None) -> None:
    """The profiled process: one layer of `kernel` at `batch`, stepped past the skipped launches, every step from
    the stack's starting fills or, given `fill`, with every row's fill set to it."""
    import torch

    import sweep_common as common

    common.STATE["dtype"] = state_dtype
    sweep = __import__("sweep_gdn" if op == "gdn" else "sweep_mamba2")
    stack = sweep.Stack(kernel, batch, 1, launch, "cuda")
    for _ in range(SKIP + 1):
        stack.rewind()
        if fill is not None:
            for layer in stack.layers:
                layer.fill.fill_(fill)
        stack.step()
    torch.cuda.synchronize()


def _text(path: Path) -> str:
    """A stored page, plain or gzipped (as committed under profiles/reference/ncu/stalls)."""
    return gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()


def _column(header: list[str], *needles: str) -> int | None:
    """The first column whose name contains every needle (case-insensitive), or None."""
    for i, name in enumerate(header):
        if all(n.lower() in name.lower() for n in needles):
            return i
    return None


def _first(*columns: int | None) -> int | None:
    return next((c for c in columns if c is not None), None)


def _number(cell: str) -> float:
    try:
        return float(cell.replace(",", ""))
    except ValueError:
        return 0.0


SPEED_OF_LIGHT = ("Duration", "DRAM Throughput", "L1/TEX Cache Throughput", "L2 Cache Throughput",
                  "Compute (SM) Throughput", "Warp Cycles Per Issued Instruction", "Achieved Occupancy",
                  "Registers Per Thread", "Grid Size", "Block Size")


def details(details_csv: str) -> dict:
    """The speed-of-light, warp-state, launch and occupancy figures of the details page, as 'value unit'."""
    out = {}
    for r in csv.reader(io.StringIO(details_csv)):
        if len(r) >= 15 and r[12] in SPEED_OF_LIGHT:
            out[r[12]] = f"{r[14]} {r[13]}".strip()
    return out


def summarize(source_csv: str, details_csv: str = "") -> dict:
    """Samples and executed warp instructions per region of the SASS page and per opcode, shared-memory wavefronts
    (bank conflicts as the excess over ideal), the details page's headline figures, and the costliest instructions."""
    rows = list(csv.reader(io.StringIO(source_csv)))
    start = next((i for i, r in enumerate(rows) if _column(r, "address") is not None and _column(r, "source") is not None),
                 None)
    if start is None:
        raise ValueError("no Address and Source columns: not the source page of `ncu --page source --csv`")
    header, body = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
    c_addr, c_src = _column(header, "address"), _column(header, "source")
    c_samp = _first(_column(header, "warp stall sampling", "all"), _column(header, "sampling"))
    c_exec = _first(_column(header, "warp", "instructions executed"), _column(header, "instructions executed"))
    exact = {name.strip().lower(): i for i, name in enumerate(header)}
    c_wf, c_ex = exact.get("l1 wavefronts shared"), exact.get("l1 wavefronts shared excessive")
    ins = []
    for r in body:
        try:
            addr = int(r[c_addr], 16)
        except ValueError:
            continue
        ins.append({"addr": addr, "sass": r[c_src].strip(), "samples": _number(r[c_samp]) if c_samp is not None else 0.0,
                    "executed": _number(r[c_exec]) if c_exec is not None else 0.0,
                    "wavefronts": _number(r[c_wf]) if c_wf is not None else 0.0,
                    "excessive": _number(r[c_ex]) if c_ex is not None else 0.0})
    opcodes: dict[str, dict[str, float]] = {}
    for i in ins:
        words = i["sass"].split()
        op = (words[1] if words and words[0].startswith("@") and len(words) > 1 else words[0] if words else "?")
        entry = opcodes.setdefault(op.split(".")[0], {"samples": 0.0, "executed": 0.0})
        entry["samples"] += i["samples"]
        entry["executed"] += i["executed"]
    loops = []
    for i in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", i["sass"])
        if m and int(m.group(1), 16) < i["addr"]:
            loops.append((int(m.group(1), 16), i["addr"]))
    regions = []
    for lo, hi in sorted(loops):
        inside = [i for i in ins if lo <= i["addr"] <= hi]
        regions.append({"region": f"loop {lo:#x}-{hi:#x}", "instructions": len(inside),
                        "samples": sum(i["samples"] for i in inside), "executed": sum(i["executed"] for i in inside)})
    rest = [i for i in ins if not any(lo <= i["addr"] <= hi for lo, hi in loops)]
    regions.append({"region": "outside loops", "instructions": len(rest), "samples": sum(i["samples"] for i in rest),
                    "executed": sum(i["executed"] for i in rest)})
    top = sorted(ins, key=lambda i: -i["samples"])[:25]
    return {"columns": {"samples": header[c_samp] if c_samp is not None else None,
                        "executed": header[c_exec] if c_exec is not None else None},
            "details": details(details_csv),
            "total_samples": sum(i["samples"] for i in ins), "total_executed": sum(i["executed"] for i in ins),
            "shared_wavefronts": sum(i["wavefronts"] for i in ins),
            "shared_wavefronts_excessive": sum(i["excessive"] for i in ins),
            "regions": regions,
            "opcodes": dict(sorted(opcodes.items(), key=lambda kv: -kv[1]["samples"])[:15]),
            "top": [{k: i[k] for k in ("addr", "sass", "samples", "executed")} for i in top]}


def main(argv: list[str] | None = None) -> int:
    import sweep_common as common

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("gdn", "mamba2"))
    parser.add_argument("--kernel", choices=sorted(KERNEL_NAMES))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--launch", default=None, help="KERNEL:key=value,... (default: the kernel's shipped row)")
    parser.add_argument("--state-dtype", default="fp32", choices=("fp32", "bf16", "fp16"),
                        help="state (checkpoint) dtype, as the sweeps' (default fp32)")
    parser.add_argument("--kernel-name", default=None,
                        help="which of the step's launches to sample, a regex over kernel names (default: its first; "
                             "flush_kernel: a two-launch step's flushes)")
    parser.add_argument("--fill", type=int, default=None,
                        help="every row's buffer fill before the sampled launch, for the kernels with a cache (replay, "
                             "split-bf16, verify: a verify at a fill of W or more folds first); default: the sweep's "
                             "fills, spread over the window")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resummarize", action="store_true",
                        help="recompute DIR's summaries from its stored CSVs (no GPU or ncu needed)")
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    if args.resummarize:
        sources = sorted(args.dir.glob("*-source.csv*"))
        if not sources:
            print(f"error: no NAME-source.csv or NAME-source.csv.gz under {args.dir}; give the DIR an earlier run "
                  "wrote", file=sys.stderr)
            return 2
        for source in sources:
            name = source.name.split("-source.csv")[0]
            det = next(iter(sorted(args.dir.glob(f"{name}-details.csv*"))), None)
            try:
                summary = summarize(_text(source), _text(det) if det else "")
            except ValueError as exc:
                print(f"error: {source}: {exc}", file=sys.stderr)
                return 2
            (args.dir / f"{name}-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
            _print(name, summary)
        return 0
    if args.op is None or args.kernel is None:
        parser.error("--op and --kernel are required unless --resummarize")
    if args.fill is not None:
        sweep = __import__("sweep_gdn" if args.op == "gdn" else "sweep_mamba2")
        # a replay step takes fills below W (at W - 1 it flushes); a verify's, after an accept, reach W - 1 + T
        top = sweep.WINDOW - 1 + (sweep.DRAFT if args.kernel == "verify" else 0)
        if args.kernel.startswith("decode"):
            parser.error(f"--fill applies to the kernels with a cache (replay, split-bf16, verify), not --kernel "
                         f"{args.kernel}")
        if not 0 <= args.fill <= top:
            parser.error(f"--fill {args.fill}: a {args.kernel} step's fill is in [0, {top}]")
    launch = {}
    if args.launch:
        try:
            named, launch = common.parse_launch(args.launch)
        except ValueError as exc:
            parser.error(str(exc))
        if named != args.kernel:
            parser.error(f"--launch {args.launch!r} names {named}; give settings for --kernel {args.kernel}")
    if args.child:
        _child(args.op, args.kernel, args.batch, launch, args.state_dtype, args.fill)
        return 0
    from replayssm_cli.measure import ncu

    binary = ncu.ncu_binary()
    if binary is None:
        print("error: ncu not found on PATH or under /opt/nvidia; install Nsight Compute", file=sys.stderr)
        return 2
    args.dir.mkdir(parents=True, exist_ok=True)
    name = f"{args.op}-{args.kernel}-{args.batch}" + ("" if args.state_dtype == "fp32" else f"-{args.state_dtype}")
    if args.kernel_name:
        name += "-" + re.sub(r"[^A-Za-z0-9_]+", "_", args.kernel_name)
    if args.fill is not None:
        name += f"-fill{args.fill}"
    rep = args.dir / name
    child = [sys.executable, __file__, "--child", "--op", args.op, "--kernel", args.kernel, "--batch", str(args.batch),
             "--state-dtype", args.state_dtype]
    if args.launch:
        child += ["--launch", args.launch]
    if args.fill is not None:
        child += ["--fill", str(args.fill)]
    sampled = args.kernel_name or KERNEL_NAMES[args.kernel]
    cmd = [binary, "--section", "SourceCounters", "--section", "WarpStateStats", "--section", "LaunchStats",
           "--section", "Occupancy", "--section", "SpeedOfLight", "-k", f"regex:{sampled}",
           "--launch-skip", str(SKIP), "--launch-count", "1", "-f", "-o", str(rep), *child, str(args.dir)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"error: ncu exited {done.returncode}: {last}", file=sys.stderr)
        return 1
    source = subprocess.run([binary, "--import", f"{rep}.ncu-rep", "--page", "source", "--csv", "--print-source",
                             "sass"], capture_output=True, text=True, check=True).stdout
    page = subprocess.run([binary, "--import", f"{rep}.ncu-rep", "--page", "details", "--csv"],
                          capture_output=True, text=True, check=True).stdout
    (args.dir / f"{name}-source.csv").write_text(source)
    (args.dir / f"{name}-details.csv").write_text(page)
    summary = summarize(source, page)
    (args.dir / f"{name}-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    _print(name, summary)
    return 0


def _print(name: str, summary: dict) -> None:
    total = summary["total_samples"] or 1.0
    print(f"{name}: {summary['total_samples']:.0f} samples, {summary['total_executed']:.0f} warp instructions; "
          + ", ".join(f"{k} {v}" for k, v in summary["details"].items()))
    print(f"  shared-memory wavefronts {summary['shared_wavefronts']:.3g}, "
          f"{summary['shared_wavefronts_excessive']:.3g} of them from bank conflicts")
    for r in summary["regions"]:
        print(f"  {r['region']:28s} {r['instructions']:6d} instrs  {r['executed']:14.0f} executed  "
              f"{r['samples']:10.0f} samples ({r['samples'] / total:.0%})")
    print("  samples by opcode: " + ", ".join(f"{op} {v['samples'] / total:.0%}"
                                            for op, v in list(summary["opcodes"].items())[:8]))
    for i in summary["top"][:12]:
        print(f"  {i['addr']:#07x} {i['samples']:8.0f}  {i['sass'][:90]}")


if __name__ == "__main__":
    sys.exit(main())
