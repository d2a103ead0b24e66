"""Every kernel against its reference on small random cases, on this device (CUDA, or the CPU through Triton's interpreter)."""

from __future__ import annotations

import os
from typing import Any

from replayssm_cli.errors import UserError
from replayssm_cli.model.dtypes import precision_label

KERNEL_OF = {
    "conventional": "decode",
    "replay": "replay",
    "split": "replay split",
    "spec-replay": "verify+accept",
    "spec-conventional": "decode_multi",
}
SHAPES = {
    "mamba2": {"op": "mamba2", "H": 4, "P": 24, "N": 12, "G": 2},
    "gdn": {"op": "gdn", "H": 2, "HV": 4, "K": 24, "V": 20},
}
BATCH = 3
WINDOW = 4
DRAFT = 3
# (variant, state dtype, read dtype, io dtype, draft)
GRID = (
    ("conventional", "fp32", None, "bf16", 0),
    ("conventional", "bf16", None, "bf16", 0),
    ("conventional", "fp16", None, "fp32", 0),
    ("replay", "fp32", None, "bf16", 0),
    ("replay", "bf16", None, "bf16", 0),
    ("split", "fp32", "bf16", "bf16", 0),
    ("split", "fp32", "fp8", "bf16", 0),
    ("spec-replay", "fp32", None, "bf16", DRAFT),
    ("spec-conventional", "fp32", None, "bf16", DRAFT),
    # 8-bit states, each row over its fp32 scale
    ("conventional", "int8", None, "bf16", 0),
    ("conventional", "fp8", None, "bf16", 0),
    ("replay", "int8", None, "bf16", 0),
    ("replay", "fp8", None, "bf16", 0),
)


def device() -> Any:
    """CUDA where present, else the CPU when TRITON_INTERPRET=1 is set; otherwise a UserError saying how."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda")
    if os.environ.get("TRITON_INTERPRET", "") == "1":
        return torch.device("cpu")
    raise UserError(
        "no CUDA GPU to check the kernels on",
        "set TRITON_INTERPRET=1 to check them on the CPU through Triton's interpreter (slow)",
    )


def refuse_missing_features(read_dtypes, state_dtypes=()) -> None:
    """A UserError (one line, exit 2) where this machine's GPU lacks a feature asked for: fp8 read copies or fp8
    checkpoints before sm_89. Nothing to refuse without a GPU (the interpreter, or a prediction)."""
    import torch

    if "fp8" not in (*(read_dtypes or ()), *(state_dtypes or ())) or not torch.cuda.is_available():
        return
    refuse_fp8_on(torch.device("cuda", torch.cuda.current_device()), read_dtypes, state_dtypes)


def refuse_fp8_on(dev: Any, read_dtypes=(), state_dtypes=()) -> None:
    """refuse_missing_features on one device (a CUDA device; the CPU refuses nothing)."""
    import torch

    from replayssm_kernels import families

    try:
        if "fp8" in (read_dtypes or ()):
            families.check_read_dtype(torch.float8_e4m3fn, dev)
        if "fp8" in (state_dtypes or ()):
            families.check_state_dtype(torch.float8_e4m3fn, dev)
    except families.UnsupportedOnChip as exc:
        raise UserError(str(exc)) from None


def label(spec: dict[str, Any]) -> str:
    """The case without its shape: batch, window, drafts, state→read dtype, io dtype."""
    parts = [f"B{spec['batch']}"]
    if spec.get("window"):
        parts.append(f"W{spec['window']}")
    if spec.get("draft"):
        parts.append(f"T{spec['draft']}")
    parts.append(precision_label(spec["state_dtype"], spec.get("read_dtype"), spec.get("rounding")))
    parts.append(f"io {spec['io_dtype']}")
    return " ".join(parts)


def shape_label(shape: dict[str, Any]) -> str:
    return "-".join(f"{k}{v}" for k, v in shape.items() if k != "op")


def cases(op: str | None = None, rounding: str = "nearest") -> list[dict[str, Any]]:
    """The check grid as bench case specs: every kernel, a few dtypes, shapes that are not powers of two, rows at staggered
    fills; with `rounding` stochastic, every 16-bit and 8-bit case also rounding stochastically (fp32 is stored exactly)."""
    from replayssm_cli.measure.grid import roundings, rounding_for

    ops = [op] if op else list(SHAPES)
    out = []
    for o in ops:
        grid = dict.fromkeys((case, rounding_for(case[1], r)) for case in GRID for r in roundings(rounding))
        for seed, ((variant, sd, rd, io, draft), ro) in enumerate(grid):
            replay = variant in ("replay", "split", "spec-replay")
            accept = [1.0 / (draft + 1)] * (draft + 1) if draft else []
            out.append({
                "shape": SHAPES[o], "variant": variant, "batch": BATCH, "window": WINDOW if replay else None,
                "state_dtype": sd, "read_dtype": rd, "io_dtype": io, "rounding": ro, "draft": draft, "accept": accept,
                "flush": "staggered", "layers": 1, "seed": seed,
            })
    return out


def run_checks(specs: list[dict[str, Any]], dev: Any, *, progress: bool = True) -> list[dict[str, Any]]:
    """Check each case once: the kernel and its reference from the same inputs and state; one result dict per case."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.measure import bench
    from replayssm_cli.console import err
    from replayssm_kernels import families

    results = []
    bar = Progress(
        TextColumn("[bold]check[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        console=err, transient=True, disable=not progress,
    )
    with bar:
        task = bar.add_task("", total=len(specs))
        for spec in specs:
            name = label(spec)
            bar.update(task, description=f"{spec['shape']['op']} {KERNEL_OF[spec['variant']]} {name}")
            row = {
                "op": spec["shape"]["op"], "kernel": KERNEL_OF[spec["variant"]], "variant": spec["variant"], "case": name,
                "shape": shape_label(spec["shape"]),
                "device": str(dev), "max_err": None, "tolerance": bench.tolerance(spec["state_dtype"], spec.get("read_dtype"), spec["io_dtype"]),
                "ok": False, "error": None, "refused": None,
            }
            case = None
            try:
                case = bench.make_case(spec, dev)
                row["max_err"] = case.check()
                row["ok"] = row["max_err"] <= row["tolerance"]
                if not row["ok"]:
                    row["error"] = f"max relative error {row['max_err']:.2e} over the tolerance {row['tolerance']:.0e}"
            except families.UnsupportedOnChip as exc:
                # a feature this chip lacks (fp8 before sm_89): not run, and not a failing kernel
                row["ok"], row["refused"] = None, str(exc)
            except Exception as exc:
                first = str(exc).splitlines()[0] if str(exc) else ""
                row["error"] = f"{type(exc).__name__}: {first}"
            finally:
                if case is not None:
                    case.close()
            results.append(row)
            bar.advance(task)
    return results


def render(results: list[dict[str, Any]], dev: Any):
    from rich import box
    from rich.table import Table

    shapes = "; ".join(sorted({f"{r['op']} {r['shape']}" for r in results}))
    table = Table(
        title=f"replayssm check · {dev}", header_style="bold", box=box.SIMPLE_HEAD, caption_justify="left",
        caption=f"shapes: {shapes}, rows at staggered fills, a whole window of steps (every row flushes)\n"
        "max rel err: max |kernel − reference| / max |reference| over the outputs of every step and the final state",
    )
    for name in ("op", "kernel", "case", "max rel err", "tolerance", "result"):
        table.add_column(name, justify="right" if name in ("max rel err", "tolerance") else "left", no_wrap=name != "result")
    for r in results:
        err = "–" if r["max_err"] is None else f"{r['max_err']:.2e}"
        if r.get("refused"):
            verdict = f"[yellow]refused[/] {r['refused']}"
        else:
            verdict = "[green]pass[/]" if r["ok"] else f"[red]FAIL[/] {r['error'] or ''}"
        table.add_row(r["op"], r["kernel"], r["case"], err, f"{r['tolerance']:.0e}", verdict)
    return table
