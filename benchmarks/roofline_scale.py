"""How long `replayssm roofline` takes on a large results file (CPU): under 10 s at 10,000 rows (docs/design.md).

Builds a results file of N kernel rows from the shipped H200 reference (its configurations repeated over more batch
sizes), then times `replayssm roofline FILE` end to end in a fresh process (imports, loading, placing, the figure, the
HTML): its wall-clock time and the CPU seconds it used (on a machine whose cores are shared, the wall clock also counts
the waits for them), and the library's stages in this process. Prints one JSON object; exits 1 when the largest run's
CPU time is over the bound.

    python benchmarks/roofline_scale.py                   # 1,000, 3,000 and 10,000 rows
    python benchmarks/roofline_scale.py --rows 10000 --bound 10
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def scaled_file(rows: int, folder: Path) -> Path:
    """A results file of `rows` kernel rows: the reference's rows with their batch sizes shifted per repetition."""
    from replayssm_cli.report.results import Results, reference_profiles, write_atomic

    loaded = reference_profiles("h200")
    base = [r for res in loaded for r in res.rows if r["kind"] == "kernel" and r["status"] == "ok"]
    writer_rows = []
    rep = 0
    while len(writer_rows) < rows:
        for r in base:
            writer_rows.append(dict(r, batch=r["batch"] + 1024 * rep))
        rep += 1
    path = folder / f"scale-{rows}.json"
    env = next(res.environment for res in loaded if res.environment.get("ceilings"))
    results = Results(path=path, environment=env, spec={}, rows=writer_rows[:rows], complete=True, created=loaded[0].created)
    write_atomic(path, results.to_dict())
    return path


def stages(path: Path, out: Path) -> dict[str, float]:
    from replayssm_cli.report import roofline as rl
    from replayssm_cli.report import roofline_figure as figure

    times: dict[str, float] = {}
    t = time.perf_counter()
    files = rl.load_files([path])
    times["load_s"] = time.perf_counter() - t
    t = time.perf_counter()
    placement = rl.place(files, rl.roof_for(files[0][1]))
    _ = placement.pairs
    times["place_s"] = time.perf_counter() - t
    t = time.perf_counter()
    fig = figure.build_figure(placement)
    times["figure_s"] = time.perf_counter() - t
    t = time.perf_counter()
    figure.write_figure(fig, out)
    times["html_s"] = time.perf_counter() - t
    times["html_mb"] = out.stat().st_size / 1e6
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, action="append", help="rows per run, repeatable (default 1000, 3000, 10000)")
    parser.add_argument("--bound", type=float, default=10.0, help="CPU seconds allowed end to end at the largest size")
    args = parser.parse_args()
    sizes = args.rows or [1000, 3000, 10000]
    report = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for rows in sizes:
            path = scaled_file(rows, folder)
            out = folder / f"scale-{rows}.html"
            t = time.perf_counter()
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(
                [sys.executable, "-m", "replayssm_cli.main", "roofline", str(path), "--out", str(out), "--json"],
                capture_output=True, text=True, timeout=600,
            )
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            points = len(json.loads(done.stdout)["points"])
            report.append({"rows": rows, "points": points, "end_to_end_s": round(wall, 2), "cpu_s": round(cpu, 2),
                           **{k: round(v, 2) for k, v in stages(path, out).items()}})
            print(f"{rows:>6} rows: {wall:.2f} s end to end, {cpu:.2f} CPU s", file=sys.stderr)
    slowest = report[-1]["cpu_s"]
    print(json.dumps({"bound_s": args.bound, "runs": report, "within_bound": slowest <= args.bound}, indent=1))
    return 0 if slowest <= args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
