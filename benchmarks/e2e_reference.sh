#!/usr/bin/env bash
# The end-to-end decode estimate shipped as profiles/reference/h200-e2e.json, on an H200: one decode step of the whole
# model for the Nemotron-3-Super and Qwen3.5-122B shapes, batch 1, 64 and 256 at a 4096-token context, conventional
# against ReplaySSM (W = 16, fp32 state). Twelve configurations, each timed as six CUDA graphs: about two minutes.
set -euo pipefail
cd "$(dirname "$0")/.."

replayssm e2e --preset nemotron-3-super-120b-a12b --preset qwen3.5-122b-a10b --batch 1,64,256 --context 4096 \
  --variant conventional,replay --window 16 --state-dtype fp32 --out profiles/reference/h200-e2e.json "$@"
