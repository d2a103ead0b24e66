"""kernels/README.md's bytes-per-step tables, from the cost model (replayssm_cli/model/cost.py): print, write or check.

    python benchmarks/cost_tables.py                            # both tables, markdown, on stdout
    python benchmarks/cost_tables.py --write kernels/README.md  # replace the tables between their markers
    python benchmarks/cost_tables.py --check kernels/README.md  # exit 1 if the README's tables differ

Each table is one sequence (batch 1) of one layer at the op's reference shape (Nemotron-3-Super's Mamba-2 layer,
Qwen3.5-122B's GDN layer), fp32 state, bf16 inputs and outputs, W = 16, T = 4 drafts with 3 accepted per step.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from replayssm_cli.model import cost
from replayssm_cli.model.shapes import GDNShape, Mamba2Shape

SHAPES = {"mamba2": ("Nemotron-3-Super", Mamba2Shape(H=128, P=64, N=128, G=8)),
          "gdn": ("Qwen3.5-122B", GDNShape(H=16, HV=64, K=128, V=128))}
WINDOW, DRAFT, ACCEPTED = 16, 4, 3
READ_DTYPES = ("bf16", "fp8")
KERNEL = {"conventional": "`decode`", "replay": "`replay`", "split": "`replay`", "spec-conventional": "`decode_multi`",
          "spec-replay": "`verify` + `accept`"}
MIB = 2**20


def _rows(op: str) -> list[dict]:
    _, shape = SHAPES[op]
    kw = dict(batch=1, window=WINDOW, state_dtype="fp32", io_dtype="bf16")
    first = cost.cost_table(shape, read_dtype=READ_DTYPES[0], draft=DRAFT, accepted=ACCEPTED, **kw)
    spec = [r for r in first if r["variant"].startswith("spec-")]
    more = [r for rd in READ_DTYPES[1:] for r in cost.cost_table(shape, read_dtype=rd, **kw) if r["variant"] == "split"]
    return [r for r in first if r not in spec] + more + spec


def table(op: str) -> str:
    """The markdown table of one op: each kernel and phase, its reads, writes and total, and the factor over decode."""
    name, shape = SHAPES[op]
    lines = [f"{name} layer ({shape.label()}), one sequence, fp32 state, bf16 io, W = {WINDOW}, T = {DRAFT} with "
             f"{ACCEPTED} accepted (`python benchmarks/cost_tables.py`):", "",
             "| kernel | state | phase | fill | reads MiB | writes MiB | total MiB | decode / this |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    decode = next(r for r in _rows(op) if r["variant"] == "conventional")["total_bytes"]
    for r in _rows(op):
        state = "fp32" + (f", {r['read_dtype']} copy" if r["variant"] == "split" else "")
        fill = "" if r["fill"] is None or r["phase"] == "avg" else f"{r['fill']:g}"
        phase = "window average" if r["phase"] == "avg" and r["variant"] not in ("conventional", "spec-conventional") else (
            "" if r["variant"] in ("conventional", "spec-conventional") else r["phase"])
        ratio = decode / r["total_bytes"]
        lines.append(f"| {KERNEL[r['variant']]} | {state} | {phase} | {fill} | {r['bytes_read'] / MIB:.2f} | "
                     f"{r['bytes_written'] / MIB:.2f} | {r['total_bytes'] / MIB:.2f} | {ratio:.2f}x |")
    return "\n".join(lines) + "\n"


def _marks(op: str) -> tuple[str, str]:
    return f"<!-- cost_tables.py {op} -->\n", f"<!-- end cost_tables.py {op} -->"


def rewrite(text: str) -> str:
    """`text` with each op's table replaced between its markers; ValueError naming a missing marker."""
    for op in SHAPES:
        begin, end = _marks(op)
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise ValueError(f"no {begin.strip()} ... {end} block")
        text = pattern.sub(lambda m: begin + table(op) + end, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cost_tables.py", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, metavar="README", help="replace the tables between their markers in README")
    group.add_argument("--check", type=Path, metavar="README", help="exit 1 if README's tables are not the cost model's")
    args = parser.parse_args(argv)
    path = args.write or args.check
    if path is None:
        print("\n".join(table(op) for op in SHAPES), end="")
        return 0
    try:
        text = path.read_text()
        new = rewrite(text)
    except (OSError, ValueError) as exc:
        print(f"cost_tables.py: {path}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if new != text:
            print(f"cost_tables.py: {path}'s bytes tables are not the cost model's; run "
                  f"python benchmarks/cost_tables.py --write {path}", file=sys.stderr)
            return 1
        return 0
    path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
