#!/usr/bin/env bash
# Wall time of `replayssm tune` on this GPU for one preset and three batch sizes, with the default candidates: once
# cold (the first run a user makes: an empty quality cache and an empty Triton cache, TRITON_CACHE_DIR a fresh folder
# under $OUT, so every kernel is compiled, in the pre-compile's workers beside the timed runs) and once warm (both caches filled by
# the cold run, as for every later run). Each run measures on the GPU (the candidates within reach, written as they
# finish under $OUT/runs/). Writes under $OUT (default runs/tune-gpu): gpu.json, cold.txt and warm.txt (the verdict),
# cold.log and warm.log (stderr: progress, the pre-compile's line, what was measured, the results file), cold.json and
# warm.json (the report, --out), and wall.txt (seconds per run and the pre-compile's line: how long the timed runs
# waited for the workers, and how many kernels tune compiled itself, which the workers' compiles should leave at those
# of configurations timed before a worker was up).
# Usage: OUT=dir benchmarks/tune_gpu.sh [PRESET] [BATCHES]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${OUT:-runs/tune-gpu}" && cd "${OUT:-runs/tune-gpu}" && pwd)
PRESET=${1:-nemotron-3-super-120b-a12b}
BATCHES=${2:-1,64,256}
unset TRITON_INTERPRET
export REPLAYSSM_CACHE_DIR="$OUT/cache"
export TRITON_CACHE_DIR="$OUT/triton-cache"
rm -rf "$REPLAYSSM_CACHE_DIR" "$TRITON_CACHE_DIR"
replayssm gpu --json > "$OUT/gpu.json"
: > "$OUT/wall.txt"
for run in cold warm; do
    start=$(date +%s.%N)
    (cd "$OUT" && replayssm tune --preset "$PRESET" --batch "$BATCHES" --out "$OUT/$run.json") \
        > "$OUT/$run.txt" 2> >(tee "$OUT/$run.log" >&2)
    end=$(date +%s.%N)
    python3 -c 'import sys; print(f"{sys.argv[1]}: {float(sys.argv[3]) - float(sys.argv[2]):.1f} s")' "$run" "$start" "$end" \
        | tee -a "$OUT/wall.txt" >&2
    grep -h "^pre-compiled" "$OUT/$run.log" | sed "s/^/$run: /" | tee -a "$OUT/wall.txt" >&2 || true
done
echo "tune_gpu: replayssm tune --preset $PRESET --batch $BATCHES; files under $OUT" >&2
cat "$OUT/wall.txt"
