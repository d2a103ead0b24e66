"""benchmarks/reference_table.py: the README's table is the one the shipped H200 files give, and how a cell is chosen
and written."""

from __future__ import annotations

from pathlib import Path

import benchmark_scripts

from replayssm_cli.report.results import Results, reference_profiles

README = Path(__file__).resolve().parents[1] / "README.md"
GDN = "qwen3.5-122b-a10b"
reference_table = benchmark_scripts.fixture("reference_table")


def _readme_table() -> str:
    lines = README.read_text().splitlines()
    start = lines.index(next(line for line in lines if line.startswith("| layer | batch | conventional |")))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return "\n".join(lines[start:end])


def test_readme_table_is_the_reference_table(reference_table):
    text, used = reference_table.table(reference_profiles("h200"))
    assert _readme_table() == text
    # every file a cell came from is named in the README's account of the files
    readme = README.read_text()
    assert used and all(f"`{profile.path.name}`" in readme for profile in used)


def _kernel(variant: str, batch: int, us: float, speedup: float | None = None, **extra) -> dict:
    row = dict(kind="kernel", flush="staggered", phase="avg", preset=GDN, batch=batch, variant=variant,
               state_dtype="fp32", read_dtype=None, draft=0, us_per_token=us, speedup=speedup, pct_copy_bw=96.0)
    row.update(extra)
    return row


def _profile(name: str, created: str, rows: list[dict]) -> Results:
    return Results(path=Path(name), environment={}, spec={}, rows=rows, created=created)


def test_cells_come_from_the_newest_file_and_show_their_target(reference_table):
    older = _profile("h200-a.json", "2026-11-29T00:00:00", [
        _kernel("conventional", 256, 520.0), _kernel("replay", 256, 290.0, 1.80, window=16),
        _kernel("conventional", 1, 4.4), _kernel("replay", 1, 4.5, 0.99),
        _kernel("spec-conventional", 256, 340.0, draft=4), _kernel("spec-replay", 256, 110.0, draft=4),
    ])
    newer = _profile("h200-b.json", "2026-11-30T00:00:00", [
        # another window's row of the same step, first in the file, is not the table's (W = 16)
        _kernel("conventional", 256, 524.0), _kernel("replay", 256, 200.0, 2.62, window=8),
        _kernel("replay", 256, 310.0, 1.69, window=16),
        _kernel("conventional", 1, 4.4), _kernel("replay", 1, 4.63, 0.9496),
        # a speculative pair missing its snapshot row: the pair comes whole from the older file
        _kernel("spec-replay", 256, 120.0, draft=4),
    ])
    text, used = reference_table.table([newer, older], batches=(1, 256))
    rows = text.splitlines()[2:]
    # batch 1: 0.9496 is within 0.005 of 0.95, so three decimals show it under; not bold
    assert rows[0].split(" | ")[3] == "0.950x"
    # batch 256: the newer file's 1.69x, under GDN's 1.7x (not bold); the speculative pair from the older, 3.09x bold
    cells = rows[1].split(" | ")
    assert cells[2] == "524 µs (**96% of copy**)"
    assert cells[3] == "1.69x" and cells[-1] == "**3.09x** |"
    assert [p.path.name for p in used] == ["h200-b.json", "h200-a.json"]


def test_a_gpu_without_files_is_one_line_and_exit_2():
    done = benchmark_scripts.run("reference_table", "--gpu", "nosuchgpu")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "nosuchgpu-*.json" in done.stderr
    done = benchmark_scripts.run("reference_table", "--batch", "1,x")
    assert done.returncode == 2 and "--batch" in done.stderr and done.stderr.count("\n") == 1


def test_the_files_of_a_folder(tmp_path):
    shipped = next(p for p in reference_profiles("h200") if p.path.name == "h200-gdn-fp32-split.json")
    (tmp_path / "h200-run.json").write_text(shipped.path.read_text())
    (tmp_path / "h100-run.json").write_text(shipped.path.read_text())
    done = benchmark_scripts.run("reference_table", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| GDN") or line.startswith("| | ")]
    # only the GPU's file: the fp32 state's columns filled, the bf16 state's and the speculative empty
    assert len(rows) == 4 and all(row.count("–") == 2 for row in rows)
    assert done.stdout.strip().splitlines()[-1].startswith("h200-run.json: commit ")
