#!/usr/bin/env bash
# The reference profiles shipped under profiles/reference/, as measured on an H200: one `replayssm profile` per line.
# --require-gpu so that a machine without a GPU fails instead of predicting. Rows are written as they finish;
# a line cut short by the device's time limit leaves a loadable file marked incomplete.
set -euo pipefail
cd "$(dirname "$0")/.."
M=nemotron-3-super-120b-a12b
Q=qwen3.5-122b-a10b
B=1,16,64,128,256,512
OUT=profiles/reference

replayssm gpu --measure
replayssm profile --require-gpu -p "$M" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats 15 --out "$OUT/h200-mamba2-fp32-split.json"
replayssm profile --require-gpu -p "$Q" --batch "$B" --state-dtype fp32 --read-dtype bf16,fp8 --repeats 15 --out "$OUT/h200-gdn-fp32-split.json"
replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype bf16 --repeats 15 --no-phases --out "$OUT/h200-bf16.json"
replayssm profile --require-gpu -p "$M" -p "$Q" --batch "$B" --state-dtype fp32 --draft 2,4 --accept-rate 0.9 --no-phases --repeats 15 --out "$OUT/h200-spec.json"
