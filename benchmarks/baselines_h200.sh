#!/usr/bin/env bash
# Our conventional and ReplaySSM kernels against the serving stacks' own kernels, on an H200: profiles/reference/h200-baselines.json.
# Both default presets, batch 1,16,64,256, W=16, fp32 state, every baseline that imports here (the others are skipped,
# each with one line naming what to install). What each needs on the machine:
#   flashinfer-ssu, flashinfer-checkpointing: pip install flashinfer-python apache-tvm-ffi (nvcc compiles them at first use, minutes)
#   fla: pip install fla-core einops
#   mamba-ssm: pip install mamba-ssm, or REPLAYSSM_MAMBA_SSM_TRITON=<sdist>/mamba_ssm/ops/triton/selective_state_update.py plus einops
#   vllm-ssu, vllm-gdn: vLLM installed
# Usage: benchmarks/baselines_h200.sh [RESULTS_FILE]   (default profiles/reference/h200-baselines.json)
# BASELINES (default all) and PRESET (default both) narrow the run, e.g. BASELINES=flashinfer-checkpointing
# PRESET=nemotron-3-super-120b-a12b.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-profiles/reference/h200-baselines.json}"
start=$SECONDS
replayssm profile --require-gpu ${PRESET:+-p "$PRESET"} --batch 1,16,64,256 --window 16 --state-dtype fp32 --no-phases \
    --baseline "${BASELINES:-all}" --out "$OUT"
echo "baselines_h200: $((SECONDS - start)) s, $OUT" >&2
