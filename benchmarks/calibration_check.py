"""How far the calibrated prediction is from a measurement where no shipped profile measured: times a grid between
and beside the reference's points (other batches, windows 8 and 32, a draft width of 3), predicts the same grid, and
writes both files and a comparison under the output folder.

    python benchmarks/calibration_check.py OUT_DIR            # on the H200: measure, predict, compare (about 5 min)
    python benchmarks/calibration_check.py OUT_DIR --compare  # compare OUT_DIR's measured.json and predicted.json again
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

PRESETS = ("nemotron-3-super-120b-a12b", "qwen3.5-122b-a10b")
GRID = ["--batch", "4,32,96,192", "--window", "8,32", "--read-dtype", "bf16", "--draft", "3", "--accept-rate", "0.9",
        "--repeats", "9"]


def _profile(out: Path, *extra: str) -> None:
    args = [sys.executable, "-m", "replayssm_cli.main", "profile", *(a for p in PRESETS for a in ("--preset", p)), *GRID,
            "--out", str(out), "--json", *extra]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)


def compare(measured_path: Path, predicted_path: Path) -> dict:
    """Per configuration: measured and predicted µs per token and speedup, the relative errors, and whether the
    time's error is within the prediction's own stated error."""
    from replayssm_cli.model import calibration
    from replayssm_cli.report.results import load

    measured, predicted = load(measured_path), load(predicted_path)
    by_key = {calibration.reference_key({**r, "source": "measured"}): r for r in predicted.rows}
    rows = []
    for m in measured.rows:
        p = by_key.get(calibration.reference_key(m))
        if p is None or m["status"] != "ok" or not m.get("us_per_token"):
            continue
        stated = (p.get("x_prediction") or {}).get("fit_error")
        err = p["us_per_token"] / m["us_per_token"] - 1
        speed_err = p["speedup"] / m["speedup"] - 1 if p.get("speedup") and m.get("speedup") else None
        rows.append({k: m.get(k) for k in ("op", "variant", "phase", "batch", "window", "state_dtype", "read_dtype", "draft")}
                    | {"us_measured": m["us_per_token"], "us_predicted": p["us_per_token"], "us_error": err,
                       "speedup_measured": m.get("speedup"), "speedup_predicted": p.get("speedup"), "speedup_error": speed_err,
                       "stated_error": stated, "within_stated": stated is not None and abs(err) <= stated,
                       "basis": (p.get("x_prediction") or {}).get("basis")})
    errs = sorted(abs(r["us_error"]) for r in rows)
    speed = sorted(abs(r["speedup_error"]) for r in rows if r["speedup_error"] is not None)

    def q(values: list[float], f: float) -> float | None:
        return values[min(len(values) - 1, math.floor(f * len(values)))] if values else None

    return {"rows": rows, "summary": {
        "configurations": len(rows), "us_error_median": q(errs, 0.5), "us_error_p90": q(errs, 0.9),
        "us_error_max": errs[-1] if errs else None, "speedup_error_median": q(speed, 0.5), "speedup_error_max": speed[-1] if speed else None,
        "within_stated": sum(r["within_stated"] for r in rows)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder for measured.json, predicted.json and calibration-check.json")
    parser.add_argument("--compare", action="store_true", help="only compare the files already in the folder")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.compare:
        _profile(out / "measured.json", "--require-gpu")
        _profile(out / "predicted.json", "--predict", "--gpu", "h200")
    result = compare(out / "measured.json", out / "predicted.json")
    (out / "calibration-check.json").write_text(json.dumps(result, indent=1) + "\n")
    s = result["summary"]
    print(f"{s['configurations']} configurations: µs per token within {100 * s['us_error_median']:.1f}% (median), "
          f"{100 * s['us_error_p90']:.1f}% (p90), {100 * s['us_error_max']:.1f}% (max); speedups within "
          f"{100 * s['speedup_error_median']:.1f}% (median), {100 * s['speedup_error_max']:.1f}% (max); "
          f"{s['within_stated']} within the prediction's stated error")
    for r in sorted(result["rows"], key=lambda r: -abs(r["us_error"]))[:12]:
        print(f"  {r['op']:<6} {r['variant']:<17} {r['phase']:<8} B{r['batch']:<4} W{r['window'] or '-':<3} "
              f"{r['state_dtype']}{'-' + r['read_dtype'] if r['read_dtype'] else ''} T{r['draft']}: measured "
              f"{r['us_measured']:.2f} µs, predicted {r['us_predicted']:.2f} ({100 * r['us_error']:+.1f}%, stated "
              f"±{100 * (r['stated_error'] or 0):.0f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
