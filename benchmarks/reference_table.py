"""The README's table of a GPU's reference profiles: per layer and batch, the conventional step (µs per layer-step,
share of the copy bandwidth) and ReplaySSM's ratios over it (fp32 state, split precision, bf16 state, speculative
T = 4 over the snapshot path), each cell from the newest file under profiles/reference/ that measured it, the ratios
within that one file. A cell that meets its target (docs/design.md §9) is bold; a ratio within 0.005 of its target is
printed to three decimals, so that two-decimal rounding does not hide which side of it the ratio fell.

    python benchmarks/reference_table.py              # the H200's files (h200-*.json)
    python benchmarks/reference_table.py --gpu h100   # another GPU's, as profile_reference.sh names them
    python benchmarks/reference_table.py --dir DIR    # the files in DIR rather than the installed package's
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HEADER = ("| layer | batch | conventional | ReplaySSM | split (bf16 read copy) | bf16 state | speculative T=4 |\n"
          "|---|---|---|---|---|---|---|")
FAMILY = {"mamba2": "Mamba-2", "gdn": "GDN"}
WINDOW, DRAFT = 16, 4
# docs/design.md §9, by column and batch: ReplaySSM's (by layer kind at 1 and 256), the other columns' at 256; the
# conventional step's share of copy bandwidth from batch 128 up.
TARGETS: dict[tuple[str, int], Any] = {
    ("replay", 1): {"mamba2": 1.0, "gdn": 0.95}, ("replay", 64): 1.5, ("replay", 256): {"mamba2": 1.9, "gdn": 1.7},
    ("split", 256): 2.6, ("bf16", 256): 1.6, ("spec", 256): 3.0,
}
COPY_TARGET, COPY_BATCH = 90.0, 128


def _row(profile, preset: str, batch: int, variant: str, state: str = "fp32", read: str | None = None,
         draft: int = 0) -> dict | None:
    from replayssm_cli.report.results import rows_matching

    rows = rows_matching(profile.rows, kind="kernel", flush="staggered", phase="avg", preset=preset, batch=batch,
                         variant=variant, state_dtype=state, read_dtype=read)
    return next((row for row in rows if (row.get("draft") or 0) == draft and row.get("window") in (None, WINDOW)
                 and row.get("us_per_token")), None)


def _newest(profiles, *wanted: dict) -> tuple[list[dict], Any] | None:
    """The rows `wanted` (each `_row`'s keywords) from the newest profile that holds them all, and that profile."""
    for profile in profiles:
        rows = [_row(profile, **w) for w in wanted]
        if all(rows):
            return rows, profile
    return None


def _ratio(value: float, target: float | None) -> str:
    text = f"{value:.3f}" if target is not None and abs(value - target) < 0.005 else f"{value:.2f}"
    return f"**{text}x**" if target is not None and value >= target else f"{text}x"


def _speedup(rows: list[dict] | None, target: float | None) -> str | None:
    """A row's own ratio over its file's conventional step, or None where no file has it."""
    if rows is None or rows[0].get("speedup") is None:
        return None
    return _ratio(rows[0]["speedup"], target)


def _target(column: str, batch: int, kind: str) -> float | None:
    target = TARGETS.get((column, batch))
    return target.get(kind) if isinstance(target, dict) else target


def _us(value: float) -> str:
    return f"{value:.2f} µs" if value < 10 else f"{value:.0f} µs"


def table(profiles, batches: tuple[int, ...] = (1, 64, 256, 512)) -> tuple[str, list]:
    """The table's markdown and the profiles its cells came from (newest first)."""
    from replayssm_cli.model.presets import DEFAULT_PRESETS, load_preset

    presets = [p for p in DEFAULT_PRESETS if any(r.get("preset") == p for prof in profiles for r in prof.rows)]
    lines, used = [HEADER], []

    def take(found):
        if found is None:
            return None
        if found[1] not in used:
            used.append(found[1])
        return found[0]

    for name in presets:
        preset = load_preset(name)
        label = f"{FAMILY[preset.kind]}, {preset.display} ({preset.shape.label().replace('-', ' ')})"
        first_pct = True
        for batch in batches:
            base = dict(preset=name, batch=batch)
            conv = take(_newest(profiles, dict(base, variant="conventional")))
            if conv is None:
                continue
            us, pct = conv[0]["us_per_token"], conv[0].get("pct_copy_bw")
            cells = [_us(us)]
            if batch > 1 and pct is not None:
                share = f"{pct:.0f}%" + (" of copy" if first_pct else "")
                first_pct = False
                bold = batch >= COPY_BATCH and pct >= COPY_TARGET
                cells[0] += f" ({'**' + share + '**' if bold else share})"
            split = _target("split", batch, preset.kind)
            cells.append(_speedup(take(_newest(profiles, dict(base, variant="replay"))),
                                  _target("replay", batch, preset.kind)) or "–")
            cell = _speedup(take(_newest(profiles, dict(base, variant="split", read="bf16"))), split) or "–"
            fp8 = _speedup(take(_newest(profiles, dict(base, variant="split", read="fp8"))), split)
            cells.append(cell + (f" (fp8 copy {fp8})" if fp8 else ""))
            cells.append(_speedup(take(_newest(profiles, dict(base, variant="replay", state="bf16"))),
                                  _target("bf16", batch, preset.kind)) or "–")
            spec = take(_newest(profiles, dict(base, variant="spec-conventional", draft=DRAFT),
                                dict(base, variant="spec-replay", draft=DRAFT)))
            cells.append(_ratio(spec[0]["us_per_token"] / spec[1]["us_per_token"], _target("spec", batch, preset.kind))
                         if spec else "–")
            lines.append(f"| {label} | {batch} | ".replace("|  |", "| |") + " | ".join(cells) + " |")
            label = ""
    return "\n".join(lines), sorted(used, key=lambda profile: profile.created, reverse=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="h200", help="the GPU key the files are named after (default h200)")
    parser.add_argument("--batch", default="1,64,256,512", help="batches, comma-separated (default 1,64,256,512)")
    parser.add_argument("--dir", help="read the files from this folder (default: the shipped profiles/reference/)")
    args = parser.parse_args(argv)
    try:
        batches = tuple(int(b) for b in args.batch.split(","))
    except ValueError:
        print(f"error: --batch {args.batch!r} is not a comma-separated list of integers (e.g. 1,64,256)",
              file=sys.stderr)
        return 2
    from replayssm_cli.report.results import reference_profiles

    profiles = reference_profiles(args.gpu, args.dir)
    if not profiles:
        print(f"error: no reference profiles named {args.gpu}-*.json under {args.dir or 'profiles/reference/'} (run "
              "benchmarks/profile_reference.sh on that GPU, or pass --gpu with the key its files carry)",
              file=sys.stderr)
        return 2
    text, used = table(profiles, batches)
    print(text)
    print()
    for profile in used:
        env = profile.environment
        gpu = env.get("gpu") or {}
        where = f"{gpu.get('name', '?')} {str(gpu.get('uuid', '?'))[:12]}"
        print(f"{profile.path.name}: commit {env.get('commit')}, {where}, {profile.created[:10]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
