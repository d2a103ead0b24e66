"""`replayssm gpu`."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer
from rich import box
from rich.table import Table

from replayssm_cli.model import gpus as G
from replayssm_cli import options
from replayssm_cli.console import note, out, print_json, warn
from replayssm_cli.errors import UserError, cli_command


@cli_command
def gpu(
    gpu_key: Annotated[Optional[str], options.gpu("Show this GPU's spec without detecting one (a key such as h200, or 'list').")] = None,
    measure: Annotated[bool, typer.Option("--measure", help="Measure copy, read, L2, FP32, TF32 and BF16 ceilings on this GPU and cache them.")] = False,
    index: Annotated[int, options.count("--index", "Which GPU to detect (NVML index).", 0, 1023)] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="JSON on stdout instead of tables.")] = False,
) -> None:
    """Detect this GPU, match it to its datasheet, and show the ceilings the roofline will use.

    The theoretical DRAM bandwidth (2 x max memory clock x bus width) is shown beside the datasheet figure.

    --measure times kernels for the ceilings and caches them per GPU name and driver; later commands use them.

    Examples:

      replayssm gpu

      replayssm gpu --measure

      replayssm gpu --gpu h100-sxm --json
    """
    if gpu_key is not None:
        if measure:
            raise UserError("--measure needs the GPU in this machine; drop --gpu")
        if gpu_key.strip().lower() == "list":
            _list(json_out)
            return
        spec = G.load_gpu(gpu_key)
        ceilings = G.datasheet_ceilings(spec)
        if json_out:
            print_json({"gpu": None, "spec": spec.to_dict(), "theoretical_gbs": None, "ceilings": ceilings.to_dict(),
                        "launch_table": G.launch_table(spec.compute_capability)})
            return
        _spec_table(spec)
        _ceilings_table(ceilings, spec)
        return

    detected = G.detect(index)
    spec = detected.spec
    if measure:
        ceilings: G.Ceilings | None = G.measure_ceilings(index, progress=not json_out)
        note(f"ceilings cached in {G.cache_path()}")
    elif spec is not None:
        ceilings = G.ceilings_for(spec, detected)
    else:
        ceilings = G.cached_ceilings(detected.name, detected.driver)
    if spec is None:
        warn(f"no spec file matches {detected.name!r}; known GPUs: {', '.join(G.gpu_keys())}")
    if json_out:
        print_json({
            "gpu": detected.to_dict(),
            "spec": spec.to_dict() if spec else None,
            "theoretical_gbs": detected.theoretical_gbs,
            "ceilings": ceilings.to_dict() if ceilings else None,
            "launch_table": G.launch_table(detected.compute_capability),
        })
        return
    _detected_table(detected)
    if ceilings is not None:
        _ceilings_table(ceilings, spec)
    elif spec is None:
        note("no ceilings: run `replayssm gpu --measure`, or name a spec with --gpu KEY where a command takes one")


def _list(json_out: bool) -> None:
    specs = G.list_gpus()
    if json_out:
        print_json([s.to_dict() for s in specs])
        return
    table = Table(title="GPU specs (dense tensor rates)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col in ("key", "DRAM", "FP32", "TF32", "BF16", "FP8", "L2 MiB", "SMs", "GiB"):
        table.add_column(col, justify="left" if col == "key" else "right", no_wrap=True)
    for s in specs:
        table.add_row(s.key, G.format_gbs(s.hbm_gbs), f"{s.fp32_tflops:g}", f"{s.tf32_tflops:g}", f"{s.bf16_tflops:g}",
                      f"{s.fp8_tflops:g}" if s.fp8_tflops else "-", f"{s.l2_mib:g}", str(s.sm_count), f"{s.memory_gib:g}")
    out.print(table)
    out.print("[dim]Rates in TFLOP/s. `replayssm gpu --gpu KEY` shows one with its sources.[/]", highlight=False)


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column()
    return grid


def _detected_table(d: G.DetectedGpu) -> None:
    grid = _grid()
    grid.add_row("GPU", f"{d.name} (index {d.index})")
    grid.add_row("compute capability", d.compute_capability or "-")
    grid.add_row("memory", f"{d.memory_total / 2**30:.1f} GiB ({d.memory_free / 2**30:.1f} free)" if d.memory_total else "-")
    grid.add_row("SMs", f"{d.sm_count} (from {d.sm_count_source})" if d.sm_count else "-")
    grid.add_row("max clocks", f"SM {_mhz(d.max_sm_clock_mhz)}, memory {_mhz(d.max_mem_clock_mhz)}")
    grid.add_row("memory bus", f"{d.bus_width_bits} bit" if d.bus_width_bits else "-")
    grid.add_row("power limit", f"{d.power_limit_w:.0f} W" if d.power_limit_w else "-")
    grid.add_row("driver", d.driver or "-")
    grid.add_row("spec", f"{d.spec.key} ({d.spec.name})" if d.spec else "[yellow]no match[/]")
    grid.add_row("launch table", _table_line(d.compute_capability))
    theoretical = d.theoretical_gbs
    if theoretical is not None:
        how = f"2 x {d.max_mem_clock_mhz} MHz x {d.bus_width_bits} bit / 8"
        grid.add_row("DRAM bandwidth", f"{G.format_gbs(theoretical)} theoretical ({how})")
    else:
        grid.add_row("DRAM bandwidth", "theoretical unknown (NVML gives no memory clock or bus width)")
    if d.spec:
        grid.add_row("", f"{G.format_gbs(d.spec.hbm_gbs)} datasheet")
    out.print(grid)


def _spec_table(s: G.GpuSpec) -> None:
    grid = _grid()
    grid.add_row("GPU", f"{s.name} (spec {s.key}, not detected)")
    if s.compute_capability:
        grid.add_row("compute capability", s.compute_capability)
        grid.add_row("launch table", _table_line(s.compute_capability))
    grid.add_row("memory", f"{s.memory_gib:g} GiB {s.memory_type or ''}".rstrip())
    grid.add_row("SMs", str(s.sm_count))
    grid.add_row("L2", f"{s.l2_mib:g} MiB")
    grid.add_row("DRAM bandwidth", f"{G.format_gbs(s.hbm_gbs)} datasheet")
    grid.add_row("FP8 tensor", G.format_tflops(s.fp8_tflops) if s.fp8_tflops else "none")
    out.print(grid)
    src = Table(title="Sources", title_justify="left", show_header=False)
    src.add_column(style="bold", no_wrap=True)
    src.add_column(overflow="fold")
    for k, v in s.sources.items():
        src.add_row(k, v)
    for k, v in s.estimated.items():
        src.add_row(f"{k} [yellow](estimated)[/]", v)
    for k, v in s.notes.items():
        src.add_row(f"{k} (note)", v)
    out.print(src)


def _ceilings_table(c: G.Ceilings, spec: G.GpuSpec | None) -> None:
    title = f"Ceilings in use: {c.source}"
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("ceiling", "value", "datasheet", "share"):
        table.add_column(col, justify="left" if col == "ceiling" else "right", no_wrap=True)
    rows: list[tuple[str, Any, Any, Any]] = [
        ("copy (read + write)", c.copy_gbs, spec.hbm_gbs if spec else None, G.format_gbs),
        ("read stream", c.read_gbs, spec.hbm_gbs if spec else None, G.format_gbs),
        ("L2 read", c.l2_gbs, None, G.format_gbs),
        ("FP32 FMA", c.fp32_tflops, spec.fp32_tflops if spec else None, G.format_tflops),
        ("TF32 GEMM", c.tf32_tflops, spec.tf32_tflops if spec else None, G.format_tflops),
        ("BF16 GEMM", c.bf16_tflops, spec.bf16_tflops if spec else None, G.format_tflops),
    ]
    for name, value, sheet, fmt in rows:
        if value is None:
            continue
        share = f"{100 * value / sheet:.0f}%" if sheet and c.source != "datasheet" else "-"
        table.add_row(name, fmt(value), fmt(sheet) if sheet else "-", share)
    out.print(table)
    if c.source == "datasheet":
        note("datasheet figures; `replayssm gpu --measure` measures this GPU's own")




def _table_line(compute_capability: str | None) -> str:
    table = G.launch_table(compute_capability)
    if table is None:
        return "-"
    if table["family"] is None:
        return f"[yellow]none[/]: {table['error']}"
    lacks = [name for name, has in (("fp8 read copies", table["fp8"]), ("PDL", table["pdl"])) if not has]
    return table["table"] + (f"; no {' or '.join(lacks)} on this chip" if lacks else "")


def _mhz(v: int | None) -> str:
    return f"{v} MHz" if v else "-"
