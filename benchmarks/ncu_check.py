"""Check the cost model against Nsight Compute: modelled vs measured DRAM bytes per kernel and phase, on a GPU.

Runs each configuration once under ncu (clocks left alone, L2 flushed before every kernel) for the two
default presets at batch 64 and 256: conventional decode, ReplaySSM non-flush and flush steps and the
whole-window average, and split precision (bf16 read copy) non-flush and flush (--configs picks some), at each
--state-dtype (an 8-bit state has no split rows: no read copy is narrower), rounded to nearest or with
--rounding stochastic. Prints a table of modelled against measured bytes read and written with the relative
difference, and writes JSON with --out.
--remodel recomputes the model's side of a stored check (its JSON) with the current cost model, keeping
what was measured: no GPU or ncu needed.

    python benchmarks/ncu_check.py --out profiles/reference/h200-ncu-check.json
    python benchmarks/ncu_check.py --preset nemotron-3-super-120b-a12b --batch 256 --window 16
    python benchmarks/ncu_check.py --batch 256 --state-dtype bf16,int8 --rounding stochastic --configs conventional,flush
    python benchmarks/ncu_check.py --remodel profiles/reference/ncu/h200-nemotron-3-super.json --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

# (name for --configs, variant, read dtype, phase)
CONFIGS = (
    ("conventional", "conventional", None, "avg"),
    ("nonflush", "replay", None, "nonflush"),
    ("flush", "replay", None, "flush"),
    ("avg", "replay", None, "avg"),
    ("split-nonflush", "split", "bf16", "nonflush"),
    ("split-flush", "split", "bf16", "flush"),
)
CONFIG_NAMES = tuple(c[0] for c in CONFIGS)


def plan(presets: list[Any], batches: list[int], window: int, state_dtype: str, io_dtype: str, layers: int,
         rounding: str = "nearest", configs: tuple[str, ...] = CONFIG_NAMES) -> list[dict[str, Any]]:
    """One entry per (preset, batch, variant, phase): the case spec for ncu and the cost model's count. A split
    configuration whose read copy is not narrower than the state is left out."""
    from replayssm_cli.model import cost
    from replayssm_cli.model.dtypes import precision_problem
    from replayssm_cli.measure import ncu
    from replayssm_cli.measure.grid import Point, nonflush_fill, rounding_for

    rounding = rounding_for(state_dtype, rounding)
    entries = []
    for given, preset in presets:
        for batch in batches:
            for name, variant, read_dtype, phase in CONFIGS:
                if name not in configs or precision_problem(state_dtype, read_dtype):
                    continue
                w = None if variant == "conventional" else window
                point = Point(
                    preset=preset.name, source_name=given, op=preset.kind, variant=variant, batch=batch, window=w,
                    state_dtype=state_dtype, read_dtype=read_dtype, io_dtype=io_dtype, layers_cap=layers, rounding=rounding,
                )
                fill = {"nonflush": nonflush_fill(window), "flush": window - 1}.get(phase) if w else None
                modelled = cost.step_cost(
                    preset.shape, variant, phase, batch=batch, window=w, fill=fill, state_dtype=state_dtype,
                    read_dtype=read_dtype, io_dtype=io_dtype, has_z=getattr(preset, "has_z", True), rounding=rounding,
                )
                entries.append({
                    "preset": preset.name, "op": preset.kind, "variant": variant, "phase": phase, "batch": batch,
                    "window": w, "fill": fill, "state_dtype": state_dtype, "read_dtype": read_dtype, "io_dtype": io_dtype,
                    "rounding": rounding,
                    "model_bytes_read": modelled.bytes_read, "model_bytes_written": modelled.bytes_written,
                    "model_flops": modelled.flops, "model_int_ops": modelled.int_ops,
                    "spec": ncu.case_spec(point, phase),
                })
    return entries


MODEL_KEYS = ("preset", "variant", "phase", "batch", "read_dtype", "state_dtype", "rounding", "model_bytes_read",
              "model_bytes_written", "model_flops")
MEASURED_KEYS = ("bytes_read", "bytes_written", "dram_bytes", "l2_bytes", "l2_write_bytes", "flops", "us", "launches")


def _stored_measurements(entries: list[dict[str, Any]], rows: list[dict[str, Any]],
                         default: dict[str, Any]) -> list[dict[str, Any]]:
    """What a stored check measured, in the order of `entries` (a configuration it lacks reads as not measured);
    `default` fills a stored row's keys it lacks."""
    key = ("preset", "variant", "phase", "batch", "read_dtype", "state_dtype", "rounding")

    def of(r: dict[str, Any]) -> tuple:
        # rows of a check written before state dtypes and rounding were per row: the check's one dtype, to nearest
        return tuple(r.get("rounding") or "nearest" if k == "rounding" else r.get(k, default.get(k)) for k in key)

    by_key = {of(r): r for r in rows}
    measured = []
    for entry in entries:
        row = by_key.get(tuple(entry[k] for k in key))
        if row is None:
            measured.append({"ok": False, "reason": "not in the stored check"})
            continue
        got = {name: row.get(f"ncu_{name}") for name in MEASURED_KEYS}
        measured.append({"ok": row.get("ok"), "reason": row.get("reason"), **got})
    return measured


def _pct(measured: float | None, modelled: float) -> float | None:
    return None if measured is None or not modelled else 100.0 * (measured - modelled) / modelled


def _mb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e6:,.2f}"


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f}%"


def main(argv: list[str] | None = None) -> int:
    from replayssm_cli.measure import ncu
    from replayssm_cli.model import presets as presets_mod

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", help="preset (repeat); default: the two default presets")
    parser.add_argument("--batch", default="64,256", help="batch sizes, comma-separated (default 64,256)")
    parser.add_argument("--window", type=int, default=16, help="ReplaySSM window W (default 16)")
    parser.add_argument("--state-dtype", default="fp32", help="state dtypes, comma-separated (default fp32)")
    parser.add_argument("--rounding", default="nearest", choices=("nearest", "stochastic"),
                        help="how the 16-bit and 8-bit states are stored (default nearest; fp32 always exactly)")
    parser.add_argument("--configs", default=",".join(CONFIG_NAMES),
                        help=f"configurations, comma-separated, of {', '.join(CONFIG_NAMES)} (default all)")
    parser.add_argument("--io-dtype", default="bf16", help="input/output dtype (default bf16)")
    parser.add_argument("--layers", type=int, default=1, help="SSM layers per configuration (ncu flushes L2 per kernel; default 1)")
    parser.add_argument("--ncu", default=None, help="path to ncu (default: found on PATH or under /opt/nvidia)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per ncu run (default 600)")
    parser.add_argument("--out", type=Path, default=None, help="write the table as JSON here")
    parser.add_argument("--remodel", type=Path, default=None, metavar="JSON",
                        help="a stored check: recompute its model columns with the current cost model (no GPU)")
    args = parser.parse_args(argv)

    stored = None
    if args.remodel:
        try:
            stored = json.loads(args.remodel.read_text())
            settings = stored["settings"]
            args.window, args.state_dtype, args.io_dtype = settings["window"], settings["state_dtype"], settings["io_dtype"]
            args.layers, names, batches = settings["layers"], settings["presets"], settings["batches"]
            args.rounding = settings.get("rounding", "nearest")
            args.configs = ",".join(settings.get("configs", CONFIG_NAMES))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {args.remodel} is not a stored ncu check ({exc}); pass a file ncu_check.py --out wrote",
                  file=sys.stderr)
            return 2
    else:
        ok, reason = ncu.ncu_available(args.ncu)
        if not ok:
            print(f"error: {reason}", file=sys.stderr)
            return 2
        names = args.preset or list(presets_mod.DEFAULT_PRESETS)
        batches = [int(b) for b in args.batch.split(",") if b.strip()]
    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    unknown = [c for c in configs if c not in CONFIG_NAMES]
    if unknown:
        print(f"error: --configs {','.join(unknown)} is not a configuration; choose from {', '.join(CONFIG_NAMES)}", file=sys.stderr)
        return 2
    state_dtypes = [d.strip() for d in args.state_dtype.split(",") if d.strip()]
    presets = [(name, presets_mod.resolve(name)) for name in names]
    entries = [e for d in state_dtypes
               for e in plan(presets, batches, args.window, d, args.io_dtype, args.layers, args.rounding, configs)]
    if stored is None:
        measured = ncu.measure([e["spec"] for e in entries], ncu=args.ncu, timeout_s=args.timeout)
    else:
        measured = _stored_measurements(entries, stored["rows"], {"state_dtype": args.state_dtype})

    from rich.console import Console
    from rich.table import Table

    sr = " rounded stochastically" if args.rounding == "stochastic" else ""
    table = Table(title=f"Cost model vs Nsight Compute, DRAM MB per decode step per layer (W={args.window}, {args.state_dtype} state{sr})")
    for col in ("preset", "variant", "state", "phase", "B", "read model", "read ncu", "Δread", "write model", "write ncu", "Δwrite",
                "total Δ", "L2 write", "FLOP Δ", "µs (ncu)"):
        table.add_column(col, justify="left" if col in ("preset", "variant", "phase") else "right")
    rows = []
    for entry, got in zip(entries, measured):
        row = {k: v for k, v in entry.items() if k != "spec"}
        row["ok"] = bool(got.get("ok"))
        row["reason"] = got.get("reason")
        for key in MEASURED_KEYS:
            row[f"ncu_{key}"] = got.get(key)
        model_total = entry["model_bytes_read"] + entry["model_bytes_written"]
        row["diff_read_pct"] = _pct(got.get("bytes_read"), entry["model_bytes_read"])
        row["diff_written_pct"] = _pct(got.get("bytes_written"), entry["model_bytes_written"])
        row["diff_total_pct"] = _pct(got.get("dram_bytes"), model_total)
        row["diff_l2_written_pct"] = _pct(got.get("l2_write_bytes"), entry["model_bytes_written"])
        row["diff_flops_pct"] = _pct(got.get("flops"), entry["model_flops"])
        rows.append(row)
        variant = entry["variant"] + (f"→{entry['read_dtype']}" if entry["read_dtype"] else "")
        state = entry["state_dtype"] + (" SR" if entry["rounding"] == "stochastic" else "")
        if not row["ok"]:
            table.add_row(entry["preset"], variant, state, entry["phase"], str(entry["batch"]), _mb(entry["model_bytes_read"]),
                          f"[red]{row['reason']}[/]", "", _mb(entry["model_bytes_written"]), "", "", "", "", "", "")
            continue
        table.add_row(
            entry["preset"], variant, state, entry["phase"], str(entry["batch"]),
            _mb(entry["model_bytes_read"]), _mb(got.get("bytes_read")), _signed(row["diff_read_pct"]),
            _mb(entry["model_bytes_written"]), _mb(got.get("bytes_written")), _signed(row["diff_written_pct"]),
            _signed(row["diff_total_pct"]), _signed(row["diff_l2_written_pct"]), _signed(row["diff_flops_pct"]),
            "–" if got.get("us") is None else f"{got['us']:.1f}",
        )
    console = Console()
    # A pipe or a file gets the whole table, not one squeezed to 80 columns.
    (console if console.is_terminal else Console(width=200)).print(table)
    print("DRAM writes still dirty in L2 when a kernel ends are not in ncu's dram__bytes_write; 'L2 write' compares "
          "the bytes the SMs wrote into L2 with the model's bytes written.")
    if args.out:
        from replayssm_cli.measure.environment import software

        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        doc = {
            "kind": "replayssm-ncu-check",
            "created": now if stored is None else stored["created"],
            "environment": software() if stored is None else stored["environment"],
            "ncu": {"path": args.ncu or ncu.ncu_binary(), "version": ncu.ncu_version(args.ncu)} if stored is None
            else stored["ncu"],
            "settings": {"window": args.window, "state_dtype": args.state_dtype, "io_dtype": args.io_dtype,
                         "layers": args.layers, "batches": batches, "presets": names, "rounding": args.rounding,
                         "configs": list(configs)},
            "rows": rows,
        }
        if stored is not None:
            doc["remodelled"] = {"at": now, "environment": software(),
                                 "previous_model": [{k: r.get(k) for k in MODEL_KEYS} for r in stored["rows"]]}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
