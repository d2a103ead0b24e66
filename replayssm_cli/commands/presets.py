"""`replayssm presets`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from replayssm_cli import options
from replayssm_cli.model import ops
from replayssm_cli.model import presets as P
from replayssm_cli.console import out, print_json
from replayssm_cli.errors import UserError, cli_command

MIB = 2**20


@cli_command
def presets(
    name: Annotated[
        Optional[str],
        typer.Argument(help="A preset to show in full (name, display name, or a path to a .toml, a config.json or its model directory).",
                       show_default=False, autocompletion=options.complete_preset),
    ] = None,
    preset: Annotated[Optional[list[str]], options.preset("Presets to show in full; repeat for several.")] = None,
    tp: Annotated[int, options.tp("Tensor-parallel degree: heads and groups are divided as each GPU sees them.")] = 1,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON on stdout instead of a table.")] = False,
) -> None:
    """List the model presets, or show one with its state size per layer and per sequence at each state dtype.

    Examples:

      replayssm presets

      replayssm presets nemotron-3-super-120b-a12b --tp 4

      replayssm presets --preset-file ~/models/Qwen3.5-122B-A10B/config.json --json
    """
    files = list(preset_file or [])
    names = [*([name] if name is not None else []), *(preset or [])]
    if not names and not files:
        _list(tp, json_out)
        return
    shown = [P.resolve(n, tp) for n in dict.fromkeys(names)] + [P.load_preset_file(f, tp) for f in files]
    if json_out and len(shown) > 1:
        print_json([p.to_dict() for p in shown])
        return
    for p in shown:
        _show(p, json_out)


def _list(tp: int, json_out: bool) -> None:
    rows: list[tuple[P.Preset, P.Preset | None, str | None]] = []
    for base in P.list_presets():
        try:
            rows.append((base, P.with_tp(base, tp), None))
        except UserError as exc:
            rows.append((base, None, exc.message))
    if json_out:
        print_json([p.to_dict() if p is not None else {"name": b.name, "tp": tp, "error": e} for b, p, e in rows])
        return
    table = Table(title=f"Model presets (tp={tp})" if tp > 1 else "Model presets", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0))
    for col, justify in (("name", "left"), ("SSM+\nattn", "right"), ("shape per GPU", "left"),
                         ("state", "left"), ("MiB per\nlayer", "right"), ("MiB per\nseq", "right")):
        table.add_column(col, justify=justify, no_wrap=True)
    for base, p, _ in rows:
        layers = f"{base.ssm_layers}+{base.attn_layers}"
        if p is None:
            table.add_row(base.name, layers, f"[dim]tp={tp} doesn't divide[/]", base.state_dtype, "-", "-")
            continue
        flag = "*" if "state_dtype" in p.estimated else ""
        table.add_row(
            p.name, layers, p.label(), p.state_dtype + flag,
            f"{p.state_bytes_per_layer() / MIB:.2f}", f"{p.state_bytes_per_sequence() / MIB:.1f}",
        )
    out.print(table)
    out.print("[dim]State sizes are one sequence on one GPU at the shipped state dtype; * = dtype estimated. "
              "`replayssm presets NAME` shows sources and every dtype.[/]", highlight=False)


def _show(p: P.Preset, json_out: bool) -> None:
    if json_out:
        print_json(p.to_dict())
        return
    shape = P.shape_dict(p.shape)
    dims = "  ".join(f"{k}={v}" for k, v in shape.items())
    full = P.shape_dict(p.full_shape) if p.full_shape and p.tp > 1 else None
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("preset", f"{p.display} ({p.name})")
    if p.hf_id:
        head.add_row("checkpoint", p.hf_id)
    head.add_row("SSM kind", ops.named(p.kind).title)
    head.add_row("layers", f"{p.ssm_layers} SSM, {p.attn_layers} attention")
    head.add_row("shape per GPU", dims + (f"   (tp={p.tp} of " + "  ".join(f"{k}={v}" for k, v in full.items()) + ")" if full else ""))
    head.add_row("state dtype", p.state_dtype + (" (estimated)" if "state_dtype" in p.estimated else "") + " as shipped")
    flags = [f"dt_softplus={p.dt_softplus}", f"D={p.has_D}", f"z in kernel={p.has_z}"]
    head.add_row("kernel flags", ", ".join(flags))
    if p.a_log_range:
        what = ops.named(p.kind).a_label
        head.add_row("decay range", f"{what} in [{p.a_log_range[0]:g}, {p.a_log_range[1]:g}]")
    if p.e2e:
        head.add_row("end to end", ", ".join(f"{k}={v}" for k, v in p.e2e.items()))
    out.print(head)

    sizes = Table(title="Recurrent state, one sequence on one GPU", title_justify="left")
    sizes.add_column("state dtype")
    sizes.add_column("per layer", justify="right")
    sizes.add_column(f"per sequence ({p.ssm_layers} layers)", justify="right")
    for d in P.STATE_DTYPES:
        mark = " (shipped)" if d == p.state_dtype else ""
        sizes.add_row(d + mark, _bytes(p.state_bytes_per_layer(d)), _bytes(p.state_bytes_per_sequence(d)))
    out.print(sizes)

    src = Table(title="Sources", title_justify="left", show_header=False)
    src.add_column("figure", style="bold", no_wrap=True)
    src.add_column("source", overflow="fold")
    for k, v in p.sources.items():
        src.add_row(k, v)
    for k in p.estimated:
        src.add_row(f"{k} [yellow](estimated)[/]", p.estimated_reasons.get(k, ""))
    for note in p.notes:
        src.add_row("note", note)
    out.print(src)


def _bytes(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.2f} MiB"
    return f"{n / 2**10:.1f} KiB"
