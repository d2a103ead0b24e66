#!/usr/bin/env bash
# The test suite on an H200, then each shipped launch row of the kernels timed in the sweeps (sweep_mamba2.py at the
# Nemotron-3-Super layer, sweep_gdn.py at the Qwen3.5-122B layer), beside the conventional step it is compared with,
# at the batches whose grid takes that row. Each section writes its table (.txt), results (.json) and errors (.err)
# under DIR (default runs/tune), and DIR.tar.gz holds them all; a sweep past its time limit leaves the ones before it.
# The settings each row was chosen over, and their measurements, are in benchmarks/notes/. Rows the sweeps cannot
# reach have no section: GDN's verify with a read copy ("verify-split", "verify-fp8"), materialize's, and those keyed
# for other shapes than these two layers' (Mamba-2's N ≤ 64 and N > 128).
# Usage: benchmarks/tune_h200.sh [DIR] [SECTION ...]   (default: tests mamba2 gdn); with DRY_RUN=1 each sweep prints
# its plan (sweep --dry-run) and the tests are not run, so a section list can be checked without a GPU.
# Sections: tests; mamba2 (all of): mamba2-decode mamba2-decode-bf16 mamba2-decode-small mamba2-replay
#   mamba2-replay-bf16 mamba2-replay-small mamba2-replay-small-bf16 mamba2-replay-large mamba2-replay-large-bf16
#   mamba2-split mamba2-split-large mamba2-split-bf16-state mamba2-verify mamba2-verify-bf16 mamba2-verify-few-rows;
#   gdn (all of): gdn-decode gdn-decode-small gdn-decode-bf16 gdn-decode-bf16-small gdn-replay gdn-replay-small
#   gdn-split gdn-split-medium gdn-split-small gdn-fp8 gdn-fp8-medium gdn-fp8-small gdn-verify gdn-verify-medium
#   gdn-verify-small.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-runs/tune}"
shift || true
MAMBA2="mamba2-decode mamba2-decode-bf16 mamba2-decode-small mamba2-replay mamba2-replay-bf16 mamba2-replay-small
mamba2-replay-small-bf16 mamba2-replay-large mamba2-replay-large-bf16 mamba2-split mamba2-split-large
mamba2-split-bf16-state mamba2-verify mamba2-verify-bf16 mamba2-verify-few-rows"
GDN="gdn-decode gdn-decode-small gdn-decode-bf16 gdn-decode-bf16-small gdn-replay gdn-replay-small gdn-split
gdn-split-medium gdn-split-small gdn-fp8 gdn-fp8-medium gdn-fp8-small gdn-verify gdn-verify-medium gdn-verify-small"
SECTIONS=""
for s in ${*:-tests mamba2 gdn}; do
    case $s in
    mamba2) SECTIONS="$SECTIONS $MAMBA2" ;;
    gdn) SECTIONS="$SECTIONS $GDN" ;;
    *) SECTIONS="$SECTIONS $s" ;;
    esac
done
ALL=" tests $(echo $MAMBA2 $GDN) "
for s in $SECTIONS; do
    case $ALL in
    *" $s "*) ;;
    *) echo "tune_h200: unknown section $s (sections: tests mamba2 gdn, or one of:$ALL)" >&2; exit 2 ;;
    esac
done
mkdir -p "$DIR"

sweep() {  # NAME LIMIT_S SCRIPT ARGS...
    local name=$1 limit=$2 script=$3
    shift 3
    local start=$SECONDS
    if [ "${DRY_RUN:-0}" = 1 ]; then
        python "benchmarks/$script" "$@" --dry-run >"$DIR/$name.txt" 2>"$DIR/$name.err"
    else
        timeout "$limit" python "benchmarks/$script" "$@" --out "$DIR/$name.json" >"$DIR/$name.txt" 2>"$DIR/$name.err"
    fi
    echo "$name: exit $?, $((SECONDS - start)) s" >&2
}

gpu_tests() {  # NAME LIMIT_S TEST_PATHS...: the tests on the GPU, their output in $DIR/NAME.txt
    local name=$1 limit=$2 start=$SECONDS
    shift 2
    if [ "${DRY_RUN:-0}" = 1 ]; then
        echo "not run (DRY_RUN=1): pytest $*" >"$DIR/$name.txt"
    else
        timeout "$limit" python -m pytest -q -n 8 --tb=short "$@" >"$DIR/$name.txt" 2>&1
    fi
    echo "$name: exit $?, $((SECONDS - start)) s: $(tail -n 1 "$DIR/$name.txt")" >&2
}

shipped() {  # NAME LIMIT_S SCRIPT "KERNEL ..." "BATCH ..." [ARGS...]: each KERNEL at its shipped row at each BATCH
    local name=$1 limit=$2 script=$3 kernels=$4 batches=$5 args=() k b
    shift 5
    for k in $kernels; do args+=(--kernel "$k" --launch "$k:"); done
    for b in $batches; do args+=(--batch "$b"); done
    sweep "$name" "$limit" "$script" "$@" "${args[@]}"
}

M=sweep_mamba2.py
G=sweep_gdn.py
for section in $SECTIONS; do
    case $section in
    tests)
        gpu_tests tests 300 tests
        ;;
    mamba2-decode)
        # mamba2.decode DECODE_LAUNCH["decode-fp32-n128"]: an fp32 state, 64 < N ≤ 128, above 16 heads per SM (batch 17 and up).
        shipped mamba2-decode 100 $M "decode" "64 256"
        ;;
    mamba2-decode-bf16)
        # mamba2.decode DECODE_LAUNCH["decode-bf16-n128"]: a 2-byte state, 64 < N ≤ 128, every batch.
        shipped mamba2-decode-bf16 100 $M "decode" "1 64 256" --state-dtype bf16
        ;;
    mamba2-decode-small)
        # mamba2.decode DECODE_LAUNCH["decode-fp32-small"]: an fp32 state on at most 16 heads per SM (batch 16 and under).
        shipped mamba2-decode-small 100 $M "decode" "1 16"
        ;;
    mamba2-replay)
        # mamba2.replay STEP_LAUNCH["replay-fp32"]: an fp32 checkpoint without a copy, batch 3 to 82.
        shipped mamba2-replay 120 $M "decode replay replay-nonflush replay-flush" "16 64"
        ;;
    mamba2-replay-bf16)
        # mamba2.replay STEP_LAUNCH["replay-bf16"]: a 2-byte checkpoint without a copy, batch 3 to 82.
        shipped mamba2-replay-bf16 120 $M "decode replay" "16 64" --state-dtype bf16
        ;;
    mamba2-replay-small)
        # mamba2.replay STEP_LAUNCH["replay-fp32-small"]: an fp32 checkpoint, with or without a copy, under two tiles per SM (batch
        # 1 and 2).
        shipped mamba2-replay-small 120 $M "decode replay replay-nonflush replay-flush split-bf16 split-fp8" "1 2"
        ;;
    mamba2-replay-small-bf16)
        # mamba2.replay STEP_LAUNCH["replay-bf16-small"]: a 2-byte checkpoint under two tiles per SM (batch 1 and 2).
        shipped mamba2-replay-small-bf16 100 $M "decode replay" "1 2" --state-dtype bf16
        ;;
    mamba2-replay-large)
        # mamba2.replay STEP_LAUNCH["replay-fp32-large"]: an fp32 checkpoint without a copy from 80 (row, head) pairs per SM (batch
        # 83 and up).
        shipped mamba2-replay-large 150 $M "decode replay replay-nonflush replay-flush" "128 256 512"
        ;;
    mamba2-replay-large-bf16)
        # mamba2.replay STEP_LAUNCH["replay-bf16-large"]: a 2-byte checkpoint from batch 83 (heads programs, their flushes in the
        # same launch).
        shipped mamba2-replay-large-bf16 150 $M "decode replay" "128 256 512" --state-dtype bf16
        ;;
    mamba2-split)
        # mamba2.replay STEP_LAUNCH["replay-fp32-split"]: an fp32 checkpoint with a bf16 or fp8 read copy, batch 3 to 82.
        shipped mamba2-split 120 $M "decode split-bf16 split-bf16-nonflush split-bf16-flush split-fp8" "16 64"
        ;;
    mamba2-split-large)
        # mamba2.replay STEP_LAUNCH["replay-fp32-split-large"]: an fp32 checkpoint with a read copy from batch 83 (heads programs, then
        # the flushes' launch).
        shipped mamba2-split-large 150 $M "decode split-bf16 split-fp8" "128 256 512"
        ;;
    mamba2-split-bf16-state)
        # mamba2.replay STEP_LAUNCH["replay-bf16-split"] (and "replay-bf16-split-large", the same row): a 2-byte checkpoint with an fp8 read copy.
        shipped mamba2-split-bf16-state 120 $M "decode split-fp8" "16 64 256" --state-dtype bf16
        ;;
    mamba2-verify)
        # mamba2.verify VERIFY_LAUNCH["verify-fp32"]: an fp32 checkpoint's verify from 12 (row, head) pairs per SM (batch
        # 13 and up), beside decode_multi's DECODE_LAUNCH row.
        shipped mamba2-verify 120 $M "decode-multi verify" "64 256"
        ;;
    mamba2-verify-bf16)
        # mamba2.verify VERIFY_LAUNCH["verify-bf16"]: a 2-byte checkpoint's verify from batch 13.
        shipped mamba2-verify-bf16 120 $M "decode-multi verify" "64 256" --state-dtype bf16
        ;;
    mamba2-verify-few-rows)
        # mamba2.verify VERIFY_LAUNCH["verify-fp32-small"] (and -bf16-small): under 12 (row, head) pairs per SM (batch 12 and under), both states.
        for st in fp32 bf16; do
            shipped "mamba2-verify-few-rows-$st" 100 $M "decode-multi verify" "1 4 8" --state-dtype "$st"
        done
        ;;
    gdn-decode)
        # gdn.decode DECODE_LAUNCH["decode"]: an fp32 state from two heads per SM (batch 5 and up).
        shipped gdn-decode 100 $G "decode" "16 64 256"
        ;;
    gdn-decode-small)
        # gdn.decode DECODE_LAUNCH["decode-small"]: an fp32 state under two heads per SM (batch 4 and under).
        shipped gdn-decode-small 100 $G "decode" "1 2 4"
        ;;
    gdn-decode-bf16)
        # gdn.decode DECODE_LAUNCH["decode-bf16"]: a 2-byte state from batch 5.
        shipped gdn-decode-bf16 100 $G "decode" "16 64 256" --state-dtype bf16
        ;;
    gdn-decode-bf16-small)
        # gdn.decode DECODE_LAUNCH["decode-bf16-small"]: a 2-byte state at batch 4 and under.
        shipped gdn-decode-bf16-small 100 $G "decode" "1 4" --state-dtype bf16
        ;;
    gdn-replay)
        # gdn.replay REPLAY_LAUNCH["replay"]: a checkpoint without a copy (fp32 or 2-byte) from batch 5.
        shipped gdn-replay 150 $G "decode replay replay-nonflush replay-flush" "16 64 256"
        shipped gdn-replay-bf16 120 $G "decode replay" "64 256" --state-dtype bf16
        ;;
    gdn-replay-small)
        # gdn.replay REPLAY_LAUNCH["replay-small"]: a checkpoint without a copy under two programs per SM (batch 4 and under).
        for st in fp32 bf16; do
            shipped "gdn-replay-small-$st" 120 $G "decode replay replay-nonflush replay-flush" "1 2 4" \
                --state-dtype "$st"
        done
        ;;
    gdn-split)
        # gdn.replay REPLAY_LAUNCH["replay-split"] with its flush launch: a bf16 copy from 16 programs per SM (batch 33 up).
        shipped gdn-split 150 $G "decode split-bf16 split-bf16-nonflush split-bf16-flush" "64 256"
        ;;
    gdn-split-medium)
        # gdn.replay REPLAY_LAUNCH["replay-split-medium"] with its flush launch: a bf16 copy at batch 5 to 32.
        shipped gdn-split-medium 120 $G "decode split-bf16" "8 16 32"
        ;;
    gdn-split-small)
        # gdn.replay REPLAY_LAUNCH["replay-split-small"]: a bf16 copy at batch 4 and under, one launch.
        shipped gdn-split-small 120 $G "decode split-bf16" "1 2 4"
        ;;
    gdn-fp8)
        # gdn.replay REPLAY_LAUNCH["replay-fp8"] with its flush launch: an fp8 copy from batch 33.
        shipped gdn-fp8 150 $G "decode split-fp8" "64 256"
        ;;
    gdn-fp8-medium)
        # gdn.replay REPLAY_LAUNCH["replay-fp8-medium"] with its flush launch: an fp8 copy at batch 5 to 32.
        shipped gdn-fp8-medium 120 $G "decode split-fp8" "8 16 32"
        ;;
    gdn-fp8-small)
        # gdn.replay REPLAY_LAUNCH["replay-fp8-small"]: an fp8 copy at batch 4 and under, one launch.
        shipped gdn-fp8-small 120 $G "decode split-fp8" "1 2 4"
        ;;
    gdn-verify)
        # gdn.verify VERIFY_LAUNCH["verify"]: the verify without a copy from batch 33 (here fp32), beside "decode-multi".
        shipped gdn-verify 150 $G "decode-multi verify" "64 256"
        ;;
    gdn-verify-medium)
        # gdn.verify VERIFY_LAUNCH["verify-medium"]: the verify at batch 5 to 32.
        shipped gdn-verify-medium 120 $G "decode-multi verify" "8 16 32"
        ;;
    gdn-verify-small)
        # gdn.verify VERIFY_LAUNCH["verify-small"]: the verify at batch 4 and under.
        shipped gdn-verify-small 120 $G "decode-multi verify" "1 2 4"
        ;;
    esac
done
tar czf "$DIR.tar.gz" -C "$(dirname "$DIR")" "$(basename "$DIR")"
