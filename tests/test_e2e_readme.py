"""The README's table of our e2e estimates beside the engines' published figures: each of our cells is what the tool gives."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from replayssm_cli.measure import e2e
from replayssm_cli.model import hybrid
from replayssm_cli.model import presets as P

ROOT = Path(__file__).resolve().parents[1]
PRESETS = {
    "Nemotron-3-Nano-4B": "nemotron-3-nano-4b", "Qwen3.5-4B": "qwen3.5-4b",
    "Nemotron-3-Super-120B-A12B": "nemotron-3-super-120b-a12b", "Qwen3.5-122B-A10B": "qwen3.5-122b-a10b",
}


def table_rows() -> list[tuple[str, int, str]]:
    """(preset, batch, our cell) for every row of the comparison table."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index("| model | batch | published | ours |")
    rows, preset = [], None
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        model, batch, _, ours = (c.strip() for c in line.strip("|").split("|"))
        if model:
            preset = PRESETS[model.split(" ")[0].rstrip(",")]
        rows.append((preset, int(batch), ours))
    return rows


def test_table_covers_every_model():
    assert {p for p, _, _ in table_rows()} == set(PRESETS.values())


@pytest.mark.parametrize("preset, batch, ours", table_rows(), ids=lambda v: str(v)[:30])
def test_our_cells_are_the_tools(preset, batch, ours):
    cells = re.findall(r"([\d.]+)x (predicted(?: \(\w+\))?|measured \(H200, bf16\))", ours)
    assert cells, ours
    for value, what in cells:
        if what.startswith("predicted"):
            wd = what[len("predicted ("):-1] if "(" in what else "bf16"
            spec = e2e.E2ESpec(presets=(preset,), batches=(batch,), contexts=(4096,))
            got = hybrid.predicted_shares(hybrid.inventory(P.load_preset(preset), weight_dtype=wd), spec, "fp32")[0]["speedup"]
        else:
            rows = json.loads((ROOT / "profiles/reference/h200-e2e.json").read_text())["rows"]
            got = next(r["speedup"] for r in rows if r["preset"] == preset and r["batch"] == batch and r.get("speedup"))
        assert f"{got:.{len(value.split('.')[1])}f}" == value, (what, got)
