#!/usr/bin/env bash
# Past one GPU, on a machine with 2 to 8 GPUs: `replayssm e2e --tp 2` and `--tp 4` over as many processes and GPUs
# (NCCL, NVLink multicast off) for the 120B-class presets at batch 64 and 256, conventional against ReplaySSM
# (W = 16, each preset's own state dtype, 4096-token context), each beside the same shard timed alone on one GPU
# (--tp-launch one-gpu, no collectives); then the default `replayssm profile` timed on one GPU and on every GPU
# (--gpus all). A --tp past the visible GPUs is refused in one line and the script goes on.
# Each run is stopped with Ctrl-C after RUN_LIMIT seconds (its finished rows stay in its file).
# Before the e2e runs, the GPU tests of tests/test_tensor_parallel.py: vLLM's split checked over NCCL and a tiny step
# timed with its collectives inside CUDA graphs.
# Writes under $OUT (default runs/tp-gpus), at most 8 files: log.txt (GPUs, links and versions, the GPU tests' output,
# every command's stderr and exit); e2e-tp2.json and e2e-tp4.json (the ranks' rows, both presets: rank 0's results
# file); e2e-tp2-one-gpu.json and e2e-tp4-one-gpu.json (one GPU's shard alone); summary.txt (every e2e row and the
# profile wall times); profile-1gpu.json and profile-gpus.json. `e2e` takes about 8 minutes, `profile` about 2.
# Usage: OUT=dir [RUN_LIMIT=100] [TPS="2 4"] benchmarks/tp_gpus.sh [e2e|profile|all]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${OUT:-runs/tp-gpus}" && cd "${OUT:-runs/tp-gpus}" && pwd)
WHAT=${1:-all}
RUN_LIMIT=${RUN_LIMIT:-100}
PRESETS="-p nemotron-3-super-120b-a12b -p qwen3.5-122b-a10b"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
unset TRITON_INTERPRET
LOG="$OUT/log.txt"

run() {
    local name=$1
    shift
    local start=$SECONDS
    echo "== $name: $*" >> "$LOG"
    timeout -s INT -k 60 "$RUN_LIMIT" "$@" > /dev/null 2>> "$LOG"
    local rc=$?
    echo "$name: exit $rc, $((SECONDS - start)) s" | tee -a "$LOG" >&2
}

{
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv
    nvidia-smi topo -m
    python -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "triton", triton.__version__, "gpus", torch.cuda.device_count())'
} >> "$LOG" 2>&1

if [ "$WHAT" = e2e ] || [ "$WHAT" = all ]; then
    # First the split over NCCL (tiny models against the unsharded step) and a tiny step with its collectives in CUDA graphs.
    start=$SECONDS
    echo "== gpu tests: tests/test_tensor_parallel.py -m gpu" >> "$LOG"
    timeout -s INT -k 30 300 python -m pytest -q -p no:xdist -m gpu tests/test_tensor_parallel.py -rs >> "$LOG" 2>&1
    echo "gpu tests: exit $?, $((SECONDS - start)) s" | tee -a "$LOG" >&2
    # The ranks first, so that a run cut short by the machine's time limit has them.
    for launch in spawn one-gpu; do
        for tp in ${TPS:-2 4}; do
            file="$OUT/e2e-tp$tp.json"
            [ "$launch" = one-gpu ] && file="$OUT/e2e-tp$tp-one-gpu.json"
            run "e2e tp$tp $launch" replayssm e2e $PRESETS --batch 64,256 --context 4096 --variant conventional,replay \
                --window 16 --tp "$tp" --tp-launch "$launch" --out "$file"
        done
    done
fi

if [ "$WHAT" = profile ] || [ "$WHAT" = all ]; then
    run "profile 1 GPU" env CUDA_VISIBLE_DEVICES=0 replayssm profile --require-gpu --out "$OUT/profile-1gpu.json"
    if replayssm profile --help 2>/dev/null | grep -q -- "--gpus"; then
        run "profile all GPUs" replayssm profile --require-gpu --gpus all --out "$OUT/profile-gpus.json"
    else
        echo "profile all GPUs: not run, this replayssm's profile has no --gpus" | tee -a "$LOG" >&2
    fi
fi

python - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json
import sys
from pathlib import Path

from replayssm_cli.report.results import load

out = Path(sys.argv[1])
print(f"{'preset':28} {'tp':>2} {'launch':8} {'batch':>5} {'variant':12} {'ITL ms':>8} {'tok/s':>9} {'SSM %':>6} {'attn %':>6} "
      f"{'MLP %':>6} {'comm %':>6} {'speedup':>7}")
for path in sorted(out.glob("e2e-tp*.json")):
    try:
        results = load(path)
    except Exception as exc:  # an unreadable file is reported, the others still summarised
        print(f"{path.name}: {exc}")
        continue
    for r in sorted(results.rows, key=lambda r: (r["preset"], r["batch"], r["variant"])):
        if r.get("status") != "ok":
            print(f"{r['preset']:28} {r['tp']:>2} {r.get('x_tp_launch', '?'):8} {r['batch']:>5} {r['variant']:12} {r.get('status')}")
            continue
        print(f"{r['preset']:28} {r['tp']:>2} {r.get('x_tp_launch', '?'):8} {r['batch']:>5} {r['variant']:12} {r['us'] / 1e3:>8.2f} "
              f"{r['x_tokens_per_s']:>9,.0f} {100 * r['x_share_ssm']:>6.1f} {100 * r['x_share_attn']:>6.1f} {100 * r['x_share_mlp']:>6.1f} "
              f"{100 * r.get('x_share_comm', 0.0):>6.1f} {r.get('speedup') or float('nan'):>7.3f}")
    for s in results.skipped:
        print(f"  skipped {s['what']}: {s['why']}")
print()
for line in (out / "log.txt").read_text().splitlines() if (out / "log.txt").exists() else []:
    if ": exit " in line or "not run" in line:
        print(line)
PY
echo "tp_gpus $WHAT: files under $OUT" >&2
