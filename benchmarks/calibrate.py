"""Fit the efficiencies of predicted kernel times to a GPU's measured reference profiles and write them as the
shipped calibration (profiles/calibration/<gpu>.json), printing the fit's error.

    python benchmarks/calibrate.py               # the H200's shipped files (profiles/reference/h200-*.json)
    python benchmarks/calibrate.py --gpu b200    # another GPU's files, as profile_reference.sh names them
    python benchmarks/calibrate.py --dir DIR     # the files in DIR rather than the installed package's
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", default="h200", help="the GPU key the reference files are named after (default h200)")
    parser.add_argument("--dir", help="read the files from this folder (default: the shipped profiles/reference/)")
    parser.add_argument("--out", help="where to write (default: profiles/calibration/<gpu>.json of this checkout)")
    args = parser.parse_args(argv)
    from replayssm_cli.model import calibration, gpus
    from replayssm_cli.report.results import reference_profiles

    profiles = reference_profiles(args.gpu, args.dir)
    if not profiles:
        print(f"error: no reference profiles named {args.gpu}-*.json under {args.dir or 'profiles/reference/'}", file=sys.stderr)
        return 2
    doc = calibration.fit(profiles, gpus.load_gpu(args.gpu))
    out = Path(args.out) if args.out else Path(__file__).resolve().parent.parent / "profiles" / "calibration" / f"{args.gpu}.json"
    calibration.write(doc, out)
    err = doc["fit_error"]
    print(f"{out}: {len(doc['curves'])} curves, {err['points']} points from {len(doc['files'])} files; "
          f"calibrated points within {100 * err['max']:.1f}%, leave-one-out median {100 * err['loo_median']:.1f}%, "
          f"max {100 * err['loo_max']:.1f}%")
    for curve in doc["curves"]:
        worst = max((abs(p["loo"]) for p in curve["points"] if p["loo"] is not None), default=0.0)
        print(f"  {curve['key']:<34} {len(curve['points'])} points, efficiency "
              + " ".join(f"{p['eff']:.2f}" for p in curve["points"]) + f"; leave-one-out up to {100 * worst:.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
