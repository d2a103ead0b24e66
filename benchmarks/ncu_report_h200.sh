#!/usr/bin/env bash
# On a GPU with Nsight Compute: profile Nemotron-3-Super at batch 64 with --ncu-report, keeping each kernel's
# .ncu-rep, then draw the hierarchical roofline (DRAM and L2 points per kernel) from the rows' Nsight Compute bytes.
#
#     OUT=out bash benchmarks/ncu_report_h200.sh
#
# Writes under $OUT: ncu-profile.json (the results), ncu-profile.txt (the tables, the .ncu-rep names in the last
# column), hierarchical.json (the placed points: level DRAM and L2, each with its roof), hierarchical.html, and
# ncu-rep/*.ncu-rep (one per configuration, to open in Nsight Compute).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT/ncu-rep"
python3 -m replayssm_cli.main profile --preset nemotron-3-super-120b-a12b --batch 64 --no-phases --require-gpu \
    --ncu-report "$OUT/ncu-rep" --out "$OUT/ncu-profile.json" --wide 2>&1 | tee "$OUT/ncu-profile.txt"
python3 -m replayssm_cli.main roofline "$OUT/ncu-profile.json" --bytes measured --out "$OUT/hierarchical.html" --json \
    > "$OUT/hierarchical.json"
ls -la "$OUT/ncu-rep"
python3 - "$OUT/hierarchical.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
levels = sorted({(p["variant"], p["level"]) for p in doc["points"]})
print("points by level:", levels)
assert {level for _, level in levels} == {"DRAM", "L2"}, "no L2 point: the profile recorded no x_ncu_l2_bytes"
PY
