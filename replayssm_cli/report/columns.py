"""A table fitted to the terminal: secondary columns left out in a set order so that no cell is cut, and the line
that says which."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence


def left_out(dropped: Sequence[str]) -> str:
    """The caption line naming the columns left out for the terminal's width."""
    return f"left out for the terminal's width: {', '.join(dropped)} (--wide shows every column)"


def _texts(name: str, cells: Sequence[Mapping[str, str]]) -> list[str]:
    """A column's header and its cells as they print (rich markup aside)."""
    from rich.text import Text

    return [name, *(Text.from_markup(c.get(name, "")).plain for c in cells)]


def columns_to_drop(names: Sequence[str], cells: Sequence[Mapping[str, str]], width: int, drop_order: Sequence[str],
                    pieces: Mapping[str, Callable[[str], list[str]]] | None = None,
                    floors: Mapping[str, int] | None = None) -> tuple[list[str], dict[str, int]]:
    """The columns of `drop_order` to leave out, first listed first, so that the others fit `width` with no cell
    cut, and the width each column needs.

    A column needs its widest cell (rich markup aside) and its header; a column in `pieces` wraps, and needs only
    its widest unbreakable piece (pieces[name] splits a cell or its header), or floors[name] where that is more (a
    column of sentences, readable only so wide). A table with box SIMPLE_HEAD and pad_edge=False adds three columns
    of padding and rule per column, less one. Columns not in drop_order stay.
    """
    pieces, floors = pieces or {}, floors or {}

    def need(name: str) -> int:
        texts = _texts(name, cells)
        if name not in pieces:
            return max(len(t) for t in texts)
        widest = max(len(part) for t in texts for part in pieces[name](t))
        return max(widest, min(floors.get(name, 0), max(len(t) for t in texts)))

    widths = {name: need(name) for name in names}
    kept = list(names)
    dropped = []
    for name in drop_order:
        if sum(widths[n] for n in kept) + 3 * len(kept) - 1 <= width:
            break
        if name in kept:
            kept.remove(name)
            dropped.append(name)
    return dropped, widths


def fitted_table(names: Sequence[str], cells: Sequence[Mapping[str, str]], *, width: int | None, drop_order: Sequence[str],
                 pieces: Mapping[str, Callable[[str], list[str]]] | None = None, floors: Mapping[str, int] | None = None,
                 left: Sequence[str] = (), title: str | None = None, caption: Sequence[str] = ()):
    """A rich table of `cells` (one dict per row, by column name) under `names`; with `width` (the terminal's columns)
    the columns of `drop_order` are left out as columns_to_drop says (with `pieces` and `floors`) and the caption
    names them. Columns in `pieces`
    wrap between their pieces, the others never; where the rest would not fit at their full width, the wrapped
    columns get fixed widths between their widest piece and their widest cell. `left`: the left-justified columns."""
    from rich import box
    from rich.table import Table

    pieces = pieces or {}
    dropped, needed = columns_to_drop(names, cells, width, drop_order, pieces, floors) if width else ([], {})
    kept = [n for n in names if n not in dropped]
    fixed: dict[str, int] = {}
    if width:
        full = {n: max(len(t) for t in _texts(n, cells)) for n in kept}
        slack = width - (sum(needed[n] for n in kept) + 3 * len(kept) - 1)
        # rich shrinks wrapped columns past their widest piece when the table is too wide; fixed widths never are
        if slack >= 0 and sum(full.values()) + 3 * len(kept) - 1 > width:
            for n in (n for n in kept if n in pieces):
                fixed[n] = needed[n] + min(slack, full[n] - needed[n])
                slack -= fixed[n] - needed[n]
    lines = [*caption, *([left_out(dropped)] if dropped else [])]
    table = Table(title=title, title_justify="left", caption="\n".join(lines) or None, caption_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for name in kept:
        table.add_column(name, justify="left" if name in left else "right", no_wrap=name not in pieces,
                         width=fixed.get(name))
    for row in cells:
        table.add_row(*(row.get(name, "") for name in kept))
    return table
