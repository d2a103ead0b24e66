#!/usr/bin/env bash
# The reference profiles shipped under profiles/reference/: one `replayssm profile` run per line, on an H200.
# Both default presets (Nemotron-3-Super, Qwen3.5-122B); --require-gpu so a machine without a GPU fails instead of predicting.
set -euo pipefail
cd "$(dirname "$0")/.."
BATCHES=1,16,64,128,256,512

replayssm profile --require-gpu --batch "$BATCHES" --state-dtype fp32 --read-dtype bf16,fp8 --out profiles/reference/h200-fp32-split.json
replayssm profile --require-gpu --batch "$BATCHES" --state-dtype bf16 --out profiles/reference/h200-bf16.json
replayssm profile --require-gpu --batch "$BATCHES" --state-dtype fp32 --draft 2,4 --accept-rate 0.9 --no-phases --out profiles/reference/h200-fp32-spec.json
