"""`replayssm cost`: modelled bytes, FLOPs, arithmetic intensity and memory of every decode kernel, on any machine."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer

from replayssm_cli import options
from replayssm_cli.console import out, print_json
from replayssm_cli.model import cost as cost_model
from replayssm_cli.model.cost import cost_table
from replayssm_cli.model.dtypes import IODtype, ReadDtype, Rounding, StateDtype, default_read_dtype
from replayssm_cli.errors import UserError, cli_command
from replayssm_cli.model.presets import DEFAULT_PRESETS, resolve

MAX_DRAFT = 8


def _si(value: float) -> str:
    """Three significant digits and a decimal prefix: 1.08 G, 613 M, 9.31 k."""
    for scale, prefix in ((1e12, " T"), (1e9, " G"), (1e6, " M"), (1e3, " k"), (1, "  ")):
        if abs(value) >= scale:
            return f"{value / scale:#.3g}".rstrip(".") + prefix
    return f"{value:g}  "


def _mib(value: float) -> str:
    return f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value / 2**10:.1f} KiB"


def _fill(value: Any) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else str(value)


E = TypeVar("E", bound=Enum)


def _metavar(enum: type[Enum]) -> str:
    return "[" + "|".join(m.value for m in enum) + "]"


def _dtype(value: str, enum: type[E], option: str) -> E:
    """The enum member named `value`, or one line naming the valid ones (typer's own error is a box)."""
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(m.value for m in enum)
        raise UserError(f"{option} must be one of {valid}, got {value!r}") from None


def _validate(window: int, batch: int, draft: int, accepted: float | None, tp: int) -> None:
    if not 1 <= window <= 64:
        raise UserError(f"--window must be between 1 and 64, got {window}")
    if batch < 1:
        raise UserError(f"--batch must be at least 1, got {batch}")
    if not 0 <= draft <= 8:
        raise UserError(f"--draft must be between 0 and 8, got {draft}")
    if accepted is not None and draft == 0:
        raise UserError("--accepted needs --draft (the drafts per verify step)")
    if accepted is not None and not 0 < accepted <= draft:
        raise UserError(f"--accepted must be above 0 and at most --draft ({draft}), got {accepted:g}")
    if tp < 1:
        raise UserError(f"--tp must be at least 1, got {tp}")


def _print_table(title: str, caption: str, rows: list[dict[str, Any]], *, int_ops: bool = False) -> None:
    from rich import box
    from rich.table import Table

    table = Table(
        title=title, caption=caption, title_justify="left", caption_justify="left",
        box=box.SIMPLE_HEAD, padding=0, pad_edge=False,
    )
    table.add_column("variant", no_wrap=True)
    table.add_column("phase", no_wrap=True)
    names = ("fill", "read", "written", "FLOPs", *(("int ops",) if int_ops else ()), "FLOP/B", "× conv", "mem/seq")
    for name in names:
        table.add_column(name, justify="right", no_wrap=True)
    for r in rows:
        ints = (_si(r["int_ops"]),) if int_ops else ()
        table.add_row(
            r["variant"] + (f" {r['read_dtype']}" if r["variant"] == "split" else ""),
            r["phase"],
            _fill(r["fill"]),
            _si(r["bytes_read"]),
            _si(r["bytes_written"]),
            _si(r["flops"]),
            *ints,
            f"{r['intensity']:.2f}",
            f"{r['bytes_ratio']:.2f}x",
            _mib(r["mem_per_seq"]),
        )
    out.print(table)


@cli_command
def cost(
    preset: Annotated[Optional[list[str]], options.preset(show_default="the two defaults")] = None,
    preset_file: Annotated[Optional[list[Path]], options.preset_file()] = None,
    window: Annotated[int, options.window()] = 16,
    state_dtype: Annotated[Optional[str], options.state_dtype("State and checkpoint dtype:", show_default="the preset's own (auto)")] = None,
    read_dtype: Annotated[Optional[str], options.read_dtype("Dtype of the split-precision rows' read copy:", show_default="bf16 over fp32, fp8 over a 16-bit state, none over 8 bits")] = None,
    stochastic_rounding: Annotated[bool, options.stochastic_rounding()] = False,
    io_dtype: Annotated[str, options.io_dtype("Dtype of the inputs and outputs:")] = IODtype.bf16.value,
    batch: Annotated[Optional[list[str]], options.batch("Sequences decoded per step, comma-separated or repeated.", show_default="256")] = None,
    draft: Annotated[int, options.draft("Speculative drafts per verify step T (0: no speculative rows).", lo=0, show_default=True)] = 0,
    accept_rate: Annotated[Optional[float], options.accept_rate("Probability that each draft is accepted (the first rejection ends the run), as in `profile` and `tune`.")] = None,
    accept_dist: Annotated[Optional[str], options.accept_dist("Weights of accepting 0..T drafts, comma-separated (T+1 of them).")] = None,
    accepted: Annotated[
        Optional[float], options.number("--accepted", "Mean drafts accepted per verify step (instead of --accept-rate).", 0.0, MAX_DRAFT, lo_open=True, show_default="all of them")
    ] = None,
    tp: Annotated[int, options.tp("Tensor-parallel degree dividing the heads.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON on stdout.")] = False,
) -> None:
    """Modelled DRAM bytes, FLOPs and arithmetic intensity of one decode step of one SSM layer.

    Conventional decode; ReplaySSM non-flush steps, flush and window average;
    split precision; with --draft, both speculative verifies; memory per sequence.
    Counted from the preset's shapes: no GPU needed.

    Examples:

      replayssm cost

      replayssm cost --preset nemotron-3-super-120b-a12b --window 32 --read-dtype fp8

      replayssm cost -p qwen3.5-122b-a10b --batch 1,64,256 --draft 4 --accept-rate 0.8 --json

      replayssm cost --state-dtype int8 --stochastic-rounding
    """
    batches = [int(b) for b in batch or ["256"]]
    accepted = _mean_accepted(draft, accepted, accept_rate, accept_dist)
    for b in batches:
        _validate(window, b, draft, accepted, tp)
    state = _dtype(state_dtype, StateDtype, "--state-dtype") if state_dtype is not None else None
    read = _dtype(read_dtype, ReadDtype, "--read-dtype") if read_dtype is not None else None
    io = _dtype(io_dtype, IODtype, "--io-dtype")
    rounding = Rounding.stochastic if stochastic_rounding else Rounding.nearest
    names = options.preset_names_given(preset, preset_file) or list(DEFAULT_PRESETS)
    everything: list[dict[str, Any]] = []
    for name in names:
        p = resolve(name, tp)
        st = state.value if state else p.state_dtype
        options.refuse_precision(st, read.value if read else None, rounding.value)
        rd = read.value if read else default_read_dtype(st)
        for b in batches:
            everything.extend(_preset_rows(p, st, rd, io, b, window, draft, accepted, tp, as_json, rounding.value))
    if as_json:
        print_json(everything)


def _mean_accepted(draft: int, accepted: float | None, rate: float | None, dist: str | None) -> float | None:
    """Mean drafts accepted per verify step from --accepted, --accept-rate or --accept-dist (None: all of them)."""
    if accepted is not None or draft == 0 or (rate is None and not dist):
        return accepted
    from replayssm_cli.measure.grid import accept_probs, mean_accepted

    weights = options.accept_weights(dist)
    if weights and len(weights) != draft + 1:
        raise UserError(f"--accept-dist has {len(weights)} weights but --draft {draft} needs {draft + 1} (for 0..{draft} accepted)")
    mean = mean_accepted(accept_probs(draft, rate if rate is not None else 0.0, weights))
    if mean <= 0:
        raise UserError("the acceptance given accepts no draft at all", "pass an --accept-rate or --accept-dist that accepts some")
    return mean


def _preset_rows(p: Any, st: str, read: str | None, io: Any, batch: int, window: int, draft: int, accepted: float | None,
                 tp: int, as_json: bool, rounding: str) -> list[dict[str, Any]]:
    try:
        rows = cost_table(
            p.shape,
            batch=batch,
            window=window,
            state_dtype=st,
            read_dtype=read,
            rounding=rounding,
            io_dtype=io.value,
            draft=draft,
            accepted=accepted,
            has_z=p.has_z,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    head = {"preset": p.name, "op": p.kind, "shape": p.shape.label(), "tp": tp, "batch": batch}
    # mem_per_seq is one layer's, as in the results file; mem_per_seq_model all the preset's SSM layers'.
    rows = [{**head, **r, "mem_per_seq_model": r["mem_per_seq"] * p.ssm_layers} for r in rows]
    if not as_json:
        title = (
            f"{p.display}: {p.kind} {p.shape.label()}"
            + (f" (tp {tp})" if tp > 1 else "")
            + f", batch {batch}, window {window}, state {st}" + (" stochastic" if rounding == "stochastic" else "")
            + f", io {io.value}"
            + (f", T = {draft}, {rows[-1]['accepted']:g} accepted" if draft else "")
        )
        caption = (
            f"DRAM bytes and FLOPs of one decode step of one layer, whole batch ({p.ssm_layers} SSM layers "
            "per model step). × conv: the conventional kernel's bytes over this row's (spec-replay: over "
            "spec-conventional's). mem/seq: one sequence's state or checkpoint, read copy, buffers, "
            "counters and snapshots in one layer."
            + (" int ops: stochastic rounding's random bits (a Philox4x32-10 draw of "
               f"{cost_model.PHILOX_INT_OPS} integer operations per head, and per stored element "
               f"{cost_model.PAIR_INT_OPS // 2 + cost_model.HALF_INT_OPS} in Mamba-2 (a hash of "
               f"{cost_model.PAIR_INT_OPS} per pair) and {cost_model.HASH_INT_OPS} in GDN), counted apart from FLOPs."
               if rounding == "stochastic" else "")
        )
        _print_table(title, caption, rows, int_ops=rounding == "stochastic")
    return rows
