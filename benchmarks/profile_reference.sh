#!/usr/bin/env bash
# The reference profiles shipped under profiles/reference/, as measured on an H200: one `replayssm profile` per part.
# --require-gpu so that a machine without a GPU fails instead of predicting. Rows are written as they finish;
# a part cut short by a time limit leaves a loadable file marked incomplete.
# Usage: benchmarks/profile_reference.sh [PART ...]   parts: ceilings mamba2 gdn bf16 spec (default: all, in order)
set -euo pipefail
cd "$(dirname "$0")/.."
M=nemotron-3-super-120b-a12b
Q=qwen3.5-122b-a10b
B=1,16,64,128,256,512
R=9
OUT=profiles/reference

for part in ${*:-ceilings mamba2 gdn bf16 spec}; do
    start=$SECONDS
    case $part in
    ceilings) replayssm gpu --measure ;;
    mamba2) replayssm profile --require-gpu -p "$M" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats "$R" \
                --out "$OUT/h200-mamba2-fp32-split.json" ;;
    gdn) replayssm profile --require-gpu -p "$Q" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats "$R" \
             --out "$OUT/h200-gdn-fp32-split.json" ;;
    bf16) replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype bf16 --repeats "$R" --no-phases \
              --out "$OUT/h200-bf16.json" ;;
    spec) replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype fp32 --draft 2,4 --accept-rate 0.9 \
              --no-phases --repeats "$R" --out "$OUT/h200-spec.json" ;;
    *) echo "profile_reference: unknown part $part (parts: ceilings mamba2 gdn bf16 spec)" >&2; exit 2 ;;
    esac
    echo "profile_reference: $part in $((SECONDS - start)) s" >&2
done
