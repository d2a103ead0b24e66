#!/usr/bin/env bash
# Energy per token on this GPU, in one command: the default profile grid and the whole-model step (e2e, batches 1, 64
# and 256) with --energy, NVML's total-energy counter around loops of at least a second (three per configuration),
# the idle draw measured before each run subtracted. Writes under $OUT (default runs/energy): profile-energy.json,
# e2e-energy.json, their logs, and energy.txt (joules per layer-step and per model step, tokens per joule, spread).
# --require-gpu: a machine without a GPU fails instead of predicting. Usage: OUT=dir benchmarks/energy_gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/energy}
mkdir -p "$OUT"
replayssm gpu --json > "$OUT/gpu.json"
start=$SECONDS
replayssm profile --require-gpu --energy --out "$OUT/profile-energy.json" > "$OUT/profile.txt" 2> >(tee "$OUT/profile.log" >&2)
echo "energy_gpu: profile --energy took $((SECONDS - start)) s" | tee -a "$OUT/profile.log" >&2
start=$SECONDS
replayssm e2e --energy --batch 1,64,256 --out "$OUT/e2e-energy.json" > "$OUT/e2e.txt" 2> >(tee "$OUT/e2e.log" >&2)
echo "energy_gpu: e2e --energy took $((SECONDS - start)) s" | tee -a "$OUT/e2e.log" >&2
python3 - "$OUT/profile-energy.json" "$OUT/e2e-energy.json" <<'EOF' | tee "$OUT/energy.txt"
import json
import sys

print(f"{'kind':6} {'preset':28} {'variant':13} {'W':>3} {'state':5} {'batch':>5} {'J/layer-step':>13} {'J/model step':>13} "
      f"{'tokens/J':>9} {'spread':>7} {'draw W':>7} {'idle W':>7} {'loop s':>6}")
for path in sys.argv[1:]:
    for r in json.load(open(path))["rows"]:
        e = r.get("x_energy")
        if r.get("phase", "avg") != "avg" or not e:
            continue
        per_layer = e.get("j_per_layer_step")
        print(f"{r['kind']:6} {r['preset']:28} {r['variant']:13} {r.get('window') or '':>3} {r['state_dtype']:5} {r['batch']:>5} "
              f"{per_layer if per_layer is not None else float('nan'):13.4g} {e['j_per_model_step']:13.4g} {e['tokens_per_j'] or 0:9.4g} "
              f"{e['spread'] or 0:7.1%} {e['draw_w']:7.0f} {e['idle_w']:7.0f} {e['loop_s']:6.2f}")
EOF
