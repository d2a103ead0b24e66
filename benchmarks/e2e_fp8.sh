#!/usr/bin/env bash
# The end-to-end decode estimate at bf16 and fp8 weights (--weight-dtype), batch 1 to 512 at a 4096-token context,
# conventional against ReplaySSM (W = 16, each preset's own state dtype), for the small presets the engines publish
# results on (small: Nemotron-3-Nano-4B, Qwen3.5-4B, Nemotron-3-Nano-30B-A3B) or the large ones (large: Nemotron-3-Super,
# Qwen3.5-122B). Each `replayssm e2e` run is stopped with Ctrl-C after RUN_LIMIT seconds (its finished rows stay in its
# file). Writes under $OUT (default runs/e2e-fp8): gpu.json; gpu-tests.txt (small: the fp8 and FlashInfer GPU tests);
# per preset and weight dtype <preset>-<dtype>.json (results), .log (stderr); summary.txt (every row, one line each).
# GPU_TESTS=0 skips the GPU tests.
# Usage: OUT=dir [WEIGHT_DTYPES="bf16 fp8"] [RUN_LIMIT=140] [GPU_TESTS=1] benchmarks/e2e_fp8.sh small|large [BATCHES]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=$(mkdir -p "${OUT:-runs/e2e-fp8}" && cd "${OUT:-runs/e2e-fp8}" && pwd)
WHICH=${1:-small}
BATCHES=${2:-1,32,128,256,512}
RUN_LIMIT=${RUN_LIMIT:-140}
case "$WHICH" in
    small) PRESETS="nemotron-3-nano-4b qwen3.5-4b nemotron-3-nano-30b-a3b" ;;
    large) PRESETS="nemotron-3-super-120b-a12b qwen3.5-122b-a10b" ;;
    *) echo "e2e_fp8: the first argument is small or large, got '$WHICH'" >&2; exit 2 ;;
esac
replayssm gpu --json > "$OUT/gpu.json" 2> "$OUT/gpu.log"
if [ "$WHICH" = small ] && [ "${GPU_TESTS:-1}" != 0 ]; then
    timeout -s INT 150 python -m pytest -q -p no:xdist -m gpu tests/test_e2e_fp8.py -rs > "$OUT/gpu-tests.txt" 2>&1
    echo "gpu tests: exit $?" >> "$OUT/gpu-tests.txt"
    tail -3 "$OUT/gpu-tests.txt" >&2
fi
for dtype in ${WEIGHT_DTYPES:-bf16 fp8}; do
    for preset in $PRESETS; do
        timeout -s INT "$RUN_LIMIT" replayssm e2e --preset "$preset" --batch "$BATCHES" --context 4096 \
            --variant conventional,replay --window 16 --weight-dtype "$dtype" --out "$OUT/$preset-$dtype.json" \
            > /dev/null 2> "$OUT/$preset-$dtype.log"
        echo "e2e_fp8: $preset $dtype: exit $?" | tee -a "$OUT/exits.txt" >&2
    done
done
python - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import sys
from pathlib import Path

from replayssm_cli.report.results import load

print(f"{'preset':28} {'weights':7} {'attn':10} {'batch':>5} {'conv ms':>8} {'replay ms':>9} {'speedup':>7} {'SSM %':>6} {'MLP %':>6}")
for path in sorted(Path(sys.argv[1]).glob("*-*.json")):
    if path.name == "gpu.json":
        continue
    try:
        rows = load(path).rows
    except Exception as exc:  # an unreadable file is reported, the others still summarised
        print(f"{path.name}: {exc}")
        continue
    ok = [r for r in rows if r.get("status") == "ok"]
    for r in sorted((r for r in ok if r["variant"] == "replay"), key=lambda r: r["batch"]):
        base = next((b for b in ok if b["variant"] == "conventional" and (b["preset"], b["batch"]) == (r["preset"], r["batch"])), None)
        print(f"{r['preset']:28} {r.get('x_weight_dtype', 'bf16'):7} {r.get('x_attn_backend', '?'):10} {r['batch']:>5} "
              f"{base['us'] / 1e3 if base else float('nan'):>8.2f} {r['us'] / 1e3:>9.2f} {r.get('speedup') or float('nan'):>7.3f} "
              f"{100 * (base or r)['x_share_ssm']:>6.1f} {100 * (base or r)['x_share_mlp']:>6.1f}")
PY
echo "e2e_fp8 $WHICH: files under $OUT" >&2
