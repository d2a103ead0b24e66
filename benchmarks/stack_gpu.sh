#!/usr/bin/env bash
# The kernels on this GPU with the image's own torch and Triton: the GPU-marked tests, `replayssm check` (every kernel
# against its reference), the chip's launch table, and (with nothing launched) every kernel and shipped row compiled
# for this chip's generation. Logs under $OUT (default ./stack-gpu): versions.txt, gpu.json, gpu-tests.log,
# check.json, check.log, compile.json, compile.log, and summary.txt with each step's exit status. Exits non-zero when
# a step failed; every step runs regardless.
# Usage: OUT=/path benchmarks/stack_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-stack-gpu}"
mkdir -p "$OUT"
unset TRITON_INTERPRET
: > "$OUT/summary.txt"
status=0

step() {
    local name=$1
    shift
    local start=$SECONDS
    "$@"
    local rc=$?
    echo "$name: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt" >&2
    [ "$rc" -eq 0 ] || status=1
}

versions() {
    python -c 'import sys, torch, triton; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda); print("triton", triton.__version__); print("gpu", torch.cuda.get_device_name(0), "sm_%d%d" % torch.cuda.get_device_capability(0))'
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
}

arch=$(python -c 'import torch; print("sm_%d%d" % torch.cuda.get_device_capability(0))')
step versions versions > "$OUT/versions.txt" 2>&1
step gpu replayssm gpu --json > "$OUT/gpu.json" 2> "$OUT/gpu.log"
step gpu-tests python -m pytest -q -p no:xdist -m gpu tests > "$OUT/gpu-tests.log" 2>&1
step check replayssm check --json > "$OUT/check.json" 2> "$OUT/check.log"
step compile replayssm check --compile --target "$arch" --json > "$OUT/compile.json" 2> "$OUT/compile.log"
cat "$OUT/versions.txt" "$OUT/summary.txt" >&2
exit $status
