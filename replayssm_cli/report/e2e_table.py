"""The whole-model step's tables: measured rows, the layer inventory, predicted shares and the memory plan."""

from __future__ import annotations

from replayssm_cli.measure.e2e import VARIANTS
from replayssm_cli.model.hybrid import CATEGORIES, CONV_WIDTH, GIB, MIB, Inventory
from typing import Any


def render_table(rows: list[dict[str, Any]], *, title: str, caption: str | None = None):
    """The rich table of e2e rows: ITL, tokens/s, category shares, speedup, per preset, context and batch."""
    from rich import box
    from rich.table import Table

    several = len({r["preset"] for r in rows}) > 1
    # The collectives' share, where ranks ran them (e2e --tp-launch spawn|torchrun).
    comm = any("x_share_comm" in r for r in rows)
    table = Table(title=title, caption=caption, caption_justify="left", title_justify="left", box=box.SIMPLE_HEAD)
    cols = (["preset"] if several else []) + ["context", "batch", "variant", "ITL ms", "tok/s", "SSM %\n(kernel)",
                                              "attn %", "MLP %", *(["comm %"] if comm else []), "other %", "speedup\n(kernel)", "max\nbatch"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("preset", "variant") else "right", no_wrap=True)
    order = {v: i for i, v in enumerate(VARIANTS)}
    for r in sorted(rows, key=lambda r: (r["preset"], r.get("x_context") or 0, r["batch"], order.get(r["variant"], 9))):
        if r["status"] != "ok":
            cells = [str(r.get("x_context")), str(r["batch"]), r["variant"], "[red]check failed[/]"] + [""] * (8 if comm else 7)
        else:
            ssm = f"{100 * r['x_share_ssm']:.1f} ({100 * (r.get('x_share_ssm_kernel') or 0):.1f})"
            sp = "–"
            if r.get("speedup"):
                sp = f"{r['speedup']:.2f}x" + (f" ({r['x_kernel_speedup']:.2f}x)" if r.get("x_kernel_speedup") else "")
            cells = [str(r.get("x_context")), str(r["batch"]), r["variant"], f"{r['us'] / 1e3:.2f}",
                     f"{r['x_tokens_per_s']:,.0f}", ssm, f"{100 * r['x_share_attn']:.1f}", f"{100 * r['x_share_mlp']:.1f}",
                     *([f"{100 * r.get('x_share_comm', 0.0):.1f}"] if comm else []), f"{100 * r['x_share_other']:.1f}", sp, str(r.get("x_max_batch") if r.get("x_max_batch") is not None else "–")]
        table.add_row(*(([r["preset"]] if several else []) + cells))
    return table


def inventory_table(inv: Inventory):
    """The layer inventory as a rich table: per block kind its count, matrices, parameters and bf16 weight GiB."""
    from rich import box
    from rich.table import Table

    p = inv.preset
    table = Table(title=f"{p.display} · tp {p.tp} · {inv.family.name} blocks · order from {inv.order_source}",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("block", "count", "per block (per GPU, in→out)", "params/block", f"GiB all ({inv.weight_dtype})"):
        table.add_column(col, justify="left" if col in ("block", "per block (per GPU, in→out)") else "right")
    what = {
        "ssm": lambda b: f"{p.kind} {p.label()}; conv {b.sizes['conv_dim']}x{CONV_WIDTH}; gated norm /{b.sizes['norm_group']}",
        "attn": lambda b: f"{b.sizes['heads']} heads, {b.sizes['kv_heads']} KV, dim {b.sizes['head_dim']}"
        + (f", RoPE {b.sizes['rotary']}" if b.sizes["rotary"] else "") + (", output gate" if inv.family.attn_gate else ""),
        "mlp": lambda b: f"{inv.family.mlp}",
        "moe": lambda b: f"{b.sizes['experts']} experts, {b.sizes['topk']} per token, {inv.family.mlp}"
        + (f", latent {b.sizes['latent']}" if b.sizes["latent"] else ""),
        "head": lambda b: f"vocab {b.sizes['vocab']}",
    }
    for kind in ("ssm", "attn", "mlp", "moe", "head"):
        block = inv.head if kind == "head" else inv.blocks.get(kind)
        if block is None:
            continue
        count = 1 if kind == "head" else inv.count(kind)
        mats = "; ".join(lin.label() for lin in block.linears)
        table.add_row(kind, str(count), f"{what[kind](block)}\n{mats}", f"{block.params / 1e6:,.1f} M",
                      f"{block.nbytes(inv.weight_dtype) * count / GIB:,.2f}")
    return table


def prediction_table(entry: dict[str, Any]):
    """The dry run's predicted shares and speedups of one preset as a rich table, marked predicted."""
    from rich import box
    from rich.table import Table

    rows = entry["predicted"]
    table = Table(title=f"predicted at {entry['weight_dtype']} weights, KV {entry['kv_dtype']}, {entry['state_dtype']} state "
                        "(bytes moved per step; not measured)", title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("context", "batch", "weights read GiB", "SSM %", "attn %", "MLP %", "other %", f"{rows[0]['variant'] if rows else 'replay'} speedup"):
        table.add_column(col, justify="right")
    for r in rows:
        sh = r["shares"]
        table.add_row(str(r["context"]), str(r["batch"]), f"{r['weight_bytes_read'] / GIB:.2f}", *(f"{100 * sh[k]:.1f}" for k in CATEGORIES),
                      f"{r['speedup']:.2f}x")
    return table


def memory_table(entry: dict[str, Any], batches: tuple[int, ...]):
    """The dry run's memory plan of one preset as a rich table."""
    from rich import box
    from rich.table import Table

    table = Table(title=entry["weights"].get("describe") or entry["weights"].get("error"), title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("context", "variant", "KV MiB/seq", "SSM MiB/seq", "conv+act MiB/seq", "max batch", *[f"B{b}" for b in batches]):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for m in entry.get("memory", []):
        ps = m["per_seq"]
        fits = ["✓" if m["fits"][b] else "[red]✗[/]" for b in batches]
        table.add_row(str(m["context"]), m["variant"], f"{ps['kv'] / MIB:,.1f}", f"{ps['ssm'] / MIB:,.1f}",
                      f"{(ps['conv'] + ps['activations']) / MIB:,.1f}", "–" if m["max_batch"] is None else str(m["max_batch"]), *fits)
    return table


def largest_fit_lines(max_batch_by: dict[str, int | None]) -> list[str]:
    return [f"largest batch that fits: {key}: {value}" for key, value in sorted(max_batch_by.items()) if value is not None]
