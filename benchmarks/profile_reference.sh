#!/usr/bin/env bash
# The reference profiles shipped under profiles/reference/, one `replayssm profile` per part, named after the GPU they
# ran on (its spec key, h200-*.json on an H200, else its name), so that `roofline` and `tune` take them as that GPU's
# reference. --require-gpu so that a machine without a GPU fails instead of predicting. Rows are written as they
# finish; a part cut short by a time limit leaves a loadable file marked incomplete.
# Usage: benchmarks/profile_reference.sh [PART ...]   parts: ceilings mamba2 gdn bf16 spec small mamba2-bf16
# gdn-bf16 spec-small gdn-spec (default: all but the last five, in order). small re-measures batches 1 and 16 alone
# (both presets, fp32 with split precision, and bf16 state), mamba2-bf16 and gdn-bf16 each layer's bf16 state alone,
# spec-small the speculative rows at batch 1 and gdn-spec the GDN layer's speculative rows alone, into files of their
# own; the merged reference takes each configuration from the newest file that measured it. Last, the README's table
# from this GPU's files (benchmarks/reference_table.py).
set -euo pipefail
cd "$(dirname "$0")/.."
M=nemotron-3-super-120b-a12b
Q=qwen3.5-122b-a10b
B=1,16,64,128,256,512
R=9
OUT=profiles/reference
# this GPU's spec key (h200), else its name in lower case with dashes; without a GPU `replayssm gpu` says so
INFO=$(replayssm gpu --json) || exit 2
GPU=$(python3 -c 'import json, re, sys
d = json.loads(sys.argv[1])
print(d["spec"]["key"] if d["spec"] else re.sub("[^a-z0-9]+", "-", d["gpu"]["name"].lower()).strip("-"))' "$INFO")
echo "profile_reference: files $OUT/$GPU-*.json" >&2

for part in ${*:-ceilings mamba2 gdn bf16 spec}; do
    start=$SECONDS
    case $part in
    ceilings) replayssm gpu --measure ;;
    mamba2) replayssm profile --require-gpu -p "$M" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats "$R" \
                --out "$OUT/$GPU-mamba2-fp32-split.json" ;;
    gdn) replayssm profile --require-gpu -p "$Q" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats "$R" \
             --out "$OUT/$GPU-gdn-fp32-split.json" ;;
    gdn-bf16) replayssm profile --require-gpu -p "$Q" --batch "$B" --state-dtype bf16 --repeats "$R" --no-phases \
                  --out "$OUT/$GPU-gdn-bf16.json" ;;
    mamba2-bf16) replayssm profile --require-gpu -p "$M" --batch "$B" --state-dtype bf16 --repeats "$R" --no-phases \
                     --out "$OUT/$GPU-mamba2-bf16.json" ;;
    bf16) replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype bf16 --repeats "$R" --no-phases \
              --out "$OUT/$GPU-bf16.json" ;;
    small) replayssm profile --require-gpu -p "$M" -p "$Q" --batch 1,16 --state-dtype fp32 --read-dtype bf16,fp8 \
               --repeats "$R" --out "$OUT/$GPU-small-grid.json"
           replayssm profile --require-gpu -p "$M" -p "$Q" --batch 1,16 --state-dtype bf16 --repeats "$R" --no-phases \
               --out "$OUT/$GPU-small-grid-bf16.json" ;;
    spec-small) replayssm profile --require-gpu -p "$M" --batch 1 --state-dtype fp32 --draft 2,4 --accept-rate 0.9 \
                    --no-phases --repeats "$R" --out "$OUT/$GPU-spec-small.json" ;;
    gdn-spec) replayssm profile --require-gpu -p "$Q" --batch "$B" --state-dtype fp32 --draft 2,4 --accept-rate 0.9 \
                  --no-phases --repeats "$R" --out "$OUT/$GPU-gdn-spec.json" ;;
    spec) replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype fp32 --draft 2,4 --accept-rate 0.9 \
              --no-phases --repeats "$R" --out "$OUT/$GPU-spec.json" ;;
    *) echo "profile_reference: unknown part $part (parts: ceilings mamba2 gdn bf16 spec small mamba2-bf16 gdn-bf16 spec-small gdn-spec)" >&2
       exit 2 ;;
    esac
    echo "profile_reference: $part in $((SECONDS - start)) s" >&2
done
# the README's table from this GPU's files, each cell from the newest file that measured it
python3 benchmarks/reference_table.py --gpu "$GPU" --dir "$OUT" || true
