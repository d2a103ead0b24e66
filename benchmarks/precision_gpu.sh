#!/usr/bin/env bash
# Every state precision on one GPU, both layers (Nemotron-3-Super's Mamba-2, Qwen3.5-122B's GDN), W = 16:
# our conventional and ReplaySSM kernels at fp32, bf16, fp16 and 8-bit (int8, fp8 e4m3) states, every 16-bit and
# 8-bit one rounded to nearest and stochastically, at batch 1, 8, 32, 64, 128, 256 and 512, through `replayssm profile`
# (rows with their provenance, each ratio within one file); FlashInfer's checkpointing_ssu at batch 256 at the same
# state dtypes where it stores them, through the profiler's baseline path (FlashInfer unpacked from
# .fi/flashinfer.tar.xz when that is here, its modules compiled in the background from the start); Nsight Compute's
# DRAM bytes of the 8-bit and stochastically rounded ReplaySSM steps at batch 256 against the cost model; then the
# summary (benchmarks/precision_report.py).
#
# Everything goes under $OUT (default runs/precision): PART.json (results file) and PART.log per part, ncu-8bit.json
# and ncu-sr.json, flashinfer-warm.log, steps.txt (each part's exit status and seconds), summary.md and summary.json.
# Progress lines on stderr. Parts run in this order, the ones the targets rest on first, each within its share of
# BUDGET_S (default 470 s, about 8 minutes): a part cut at its limit keeps the rows it finished (a results file marked
# incomplete) and the next part starts.
#   m2-256 gdn-256   both layers at batch 256, every precision
#   ncu              Nsight Compute bytes at batch 256: int8 and fp8 non-flush and flush steps, int8's stochastic flush
#   m2 gdn           the other batches (M2_BATCHES, GDN_BATCHES: default 1, 8, 32, 64, 128, 512), every precision
#   fi-256           FlashInfer's checkpointing_ssu (a Mamba-2 kernel) beside ours at batch 256, last: its modules
#                    compile in the background meanwhile
# Before the parts (and outside BUDGET_S), Triton's kernels are compiled: every part's configurations run once, one
# process per layer and state dtype in parallel, their rows discarded (warm/ under $OUT), so that the timed parts
# find each specialisation compiled instead of compiling it inside their share. WARM_S (default 120) bounds it; 0
# skips it.
# Usage: OUT=/path bash benchmarks/precision_gpu.sh [PART ...]
# DRY_RUN=1: on a machine without a GPU, each profile part predicted (--predict) instead of measured, the ncu and
# FlashInfer parts only said, the summary from the predicted files; the whole run in a few seconds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-runs/precision}"
BUDGET_S="${BUDGET_S:-470}"
M=nemotron-3-super-120b-a12b
Q=qwen3.5-122b-a10b
R="${REPEATS:-5}"
# fp32 first: the rows after it take their speedup_vs_fp32 from it. STATES and FI_STATES (FlashInfer's part, which
# compiles one module per dtype and rounding) may be narrowed from the environment.
STATES="${STATES:-fp32,int8,fp8,bf16,fp16}"
FI_STATES="${FI_STATES:-$STATES}"
ALL="m2-256 gdn-256 ncu m2 gdn fi-256"
# FI_S: fi-256's share (default 150 s, enough once FlashInfer's modules are compiled; a first run's compiles take about
# four minutes more)
declare -A SHARE=([m2-256]=55 [gdn-256]=65 [ncu]=100 [m2]=85 [gdn]=85 [fi-256]=${FI_S:-150})
M2_BATCHES="${M2_BATCHES:-1,8,32,64,128,512}"
GDN_BATCHES="${GDN_BATCHES:-1,8,32,64,128,512}"
PARTS="${*:-$ALL}"
for p in $PARTS; do
    case " $ALL " in
    *" $p "*) ;;
    *) echo "precision_gpu: unknown part $p (parts: $ALL)" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"
: > "$OUT/steps.txt"
DRY="${DRY_RUN:-0}"
MODE=(--require-gpu)
[ "$DRY" = 1 ] && MODE=(--predict)
started=$SECONDS

log() { echo "precision_gpu: $*" >&2; }

# FlashInfer from the carried archive, where there is one: into a folder of its own, put on the path of every part.
if [ -f .fi/flashinfer.tar.xz ] && [ "$DRY" != 1 ]; then
    SITE="${TMPDIR:-/tmp}/precision-flashinfer"
    mkdir -p "$SITE" && tar xJf .fi/flashinfer.tar.xz -C "$SITE" && export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    log "FlashInfer unpacked into $SITE"
fi

# FlashInfer compiles one module per state dtype and rounding with nvcc at first use (minutes each): each is built in
# a background process from the start, by the same baseline path at batch 1, so that fi-256 finds them compiled.
warm_flashinfer() {  # run in the background: exec, so that its pid is the Python that stops the compiles
    exec python - "$M" "$FI_STATES" <<'EOF'
import signal, subprocess, sys
code = """
import sys
from replayssm_cli.measure import bench
state, rounding = sys.argv[1], sys.argv[2]
spec = {"preset": PRESET, "variant": "baseline:flashinfer-checkpointing", "batch": 1, "window": 16, "state_dtype": state,
        "rounding": rounding, "io_dtype": "bf16", "layers": 1}
case = bench.make_case(spec, "cuda")
print(state, rounding, "compiled, check", case.check(), flush=True)
""".replace("PRESET", repr(sys.argv[1]))
states = sys.argv[2].split(",")
pairs = [(s, r) for r in ("nearest", "stochastic") for s in states if not (s == "fp32" and r == "stochastic")]
procs = [subprocess.Popen([sys.executable, "-c", code, s, r]) for s, r in pairs]
# stopped with the run: the compiles stop too
signal.signal(signal.SIGTERM, lambda *_: sys.exit([p.kill() for p in procs] and 143))
sys.exit(max(p.wait() for p in procs))
EOF
}
WARM_PID=""
WARM_S="${WARM_S:-120}"
if [ "$DRY" != 1 ] && [[ " $PARTS " == *" fi-256 "* ]]; then
    if python -c 'import flashinfer.mamba' 2>/dev/null; then
        warm_flashinfer > "$OUT/flashinfer-warm.log" 2>&1 &
        WARM_PID=$!
        log "compiling FlashInfer's checkpointing_ssu modules in the background (pid $WARM_PID)"
    else
        log "FlashInfer does not import here (no .fi/flashinfer.tar.xz?): fi-256 will say so and skip its baseline"
    fi
fi

profile() {  # LIMIT PART PRESET BATCHES [EXTRA...]: every precision (PART_STATES, default STATES), both roundings,
    # cut at LIMIT seconds
    local limit=$1 part=$2 preset=$3 batches=$4
    shift 4
    timeout -s TERM "$limit" replayssm profile "${MODE[@]}" -p "$preset" --batch "$batches" --window 16 \
        --state-dtype "${PART_STATES:-$STATES}" --stochastic-rounding --no-phases --repeats "$R" "$@" --out "$OUT/$part.json"
}

ncu_part() {  # LIMIT: the 8-bit steps, then the stochastic flushes, within LIMIT seconds together
    local until=$((SECONDS + $1)) rc=0
    if [ "$DRY" = 1 ]; then
        echo "not run (DRY_RUN=1): ncu_check.py --batch 256 --state-dtype int8,fp8 --configs nonflush,flush;" \
            "ncu_check.py --batch 256 --state-dtype int8 --rounding stochastic --configs flush"
        return 0
    fi
    timeout -s TERM $((until - SECONDS)) python benchmarks/ncu_check.py --batch 256 --window 16 --state-dtype int8,fp8 \
        --configs nonflush,flush --timeout 120 --out "$OUT/ncu-8bit.json" || rc=$?
    timeout -s TERM $((until - SECONDS > 1 ? until - SECONDS : 1)) python benchmarks/ncu_check.py --batch 256 --window 16 \
        --state-dtype int8 --rounding stochastic --configs flush --timeout 120 --out "$OUT/ncu-sr.json" || rc=$?
    return $rc
}

fi_part() {  # LIMIT: wait for the background compiles, then FlashInfer beside ours, within LIMIT seconds together
    local until=$((SECONDS + $1))
    if [ "$DRY" = 1 ]; then
        echo "not run (DRY_RUN=1): replayssm profile -p $M --batch 256 ... --baseline flashinfer-checkpointing"
        return 0
    fi
    while [ -n "$WARM_PID" ] && kill -0 "$WARM_PID" 2>/dev/null && [ "$SECONDS" -lt $((until - 20)) ]; do sleep 2; done
    [ -n "$WARM_PID" ] && kill -0 "$WARM_PID" 2>/dev/null && echo "FlashInfer still compiling; its rows take what is left"
    PART_STATES="$FI_STATES" profile $((until - SECONDS)) fi-256 "$M" 256 --baseline flashinfer-checkpointing
}

run_part() {
    local part=$1 start=$SECONDS
    local left=$((BUDGET_S - (SECONDS - started)))
    local limit=${SHARE[$part]}
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -le 5 ]; then
        echo "$part: not run, the budget of $BUDGET_S s is spent" | tee -a "$OUT/steps.txt" >&2
        return
    fi
    log "$part: starting, at most $limit s ($((SECONDS - started)) s in)"
    case $part in
    m2-256) profile "$limit" m2-256 "$M" 256 ;;
    gdn-256) profile "$limit" gdn-256 "$Q" 256 ;;
    m2) profile "$limit" m2 "$M" "$M2_BATCHES" ;;
    gdn) profile "$limit" gdn "$Q" "$GDN_BATCHES" ;;
    ncu) ncu_part "$limit" ;;
    fi-256) fi_part "$limit" ;;
    esac 2>&1 | tee "$OUT/$part.log" | grep --line-buffered -E '^(profile:|error|warning|wrote|results:|not run)' \
        | sed -u "s/^/  $part: /" >&2
    local rc=${PIPESTATUS[0]}
    echo "$part: exit $rc, $((SECONDS - start)) s" | tee -a "$OUT/steps.txt" >&2
}

warm_triton() {  # every batch of the parts, every precision, both roundings: one process per layer and state dtype
    local pids=() preset state extra
    mkdir -p "$OUT/warm"
    for preset in "$M" "$Q"; do
        for state in ${STATES//,/ }; do
            extra=()
            [ "$state" != fp32 ] && extra=(--stochastic-rounding)
            timeout -s TERM "$WARM_S" replayssm profile --require-gpu -p "$preset" --batch 1,8,32,64,128,256,512 \
                --window 16 --state-dtype "$state" "${extra[@]}" --no-phases --repeats 3 \
                --out "$OUT/warm/$preset-$state.json" > "$OUT/warm/$preset-$state.log" 2>&1 &
            pids+=($!)
        done
    done
    wait "${pids[@]}"
    # a warm-up that failed at once (a bad option, no GPU) says so instead of passing for a compile
    grep -l "^error" "$OUT"/warm/*.log 2>/dev/null | sed 's/^/precision_gpu: warm-up failed, see /' >&2
}
if [ "$DRY" != 1 ] && [ "$WARM_S" -gt 0 ]; then
    warm_start=$SECONDS
    log "compiling every part's kernels first: $(( $(echo "$STATES" | tr ',' ' ' | wc -w) * 2 )) processes, at most $WARM_S s"
    warm_triton
    echo "warm: $((SECONDS - warm_start)) s" | tee -a "$OUT/steps.txt" >&2
    started=$SECONDS
fi

for part in $ALL; do
    [[ " $PARTS " == *" $part "* ]] && run_part "$part"
done
if [ -n "$WARM_PID" ]; then
    kill "$WARM_PID" 2>/dev/null
    wait "$WARM_PID" 2>/dev/null
fi
python benchmarks/precision_report.py "$OUT" --out "$OUT/summary.md" --json "$OUT/summary.json"
log "done in $((SECONDS - started)) s; summary in $OUT/summary.md"
cat "$OUT/steps.txt" >&2
