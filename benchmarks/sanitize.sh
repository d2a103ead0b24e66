#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and synccheck over every shipped launch row of both ops, in one call on a GPU:
#   bash benchmarks/sanitize.sh [OUT_DIR] [CASE_SUBSTRING...]
# Each tool runs benchmarks/sanitize.py once over the cases (all of them by default).
# The logs go to OUT_DIR (default runs/sanitize), each case's distinct reports to reports.txt; the last lines printed
# are a table: tool, errors, exit code, seconds.
# SANITIZE_TOOLS chooses the tools (default "memcheck racecheck synccheck"), SANITIZE_STEPS the steps per case,
# SANITIZE_PRINT_LIMIT the reports each tool prints (default 100000: a limit hides the later cases' reports),
# SANITIZE_SET launch-row settings put in first (space-separated MODULE:TABLE:ROW:key=value,..., sanitize.py --set).
set -u
DIR="${1:-runs/sanitize}"
shift || true
mkdir -p "$DIR"
cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
if [ -z "$cs" ]; then
    echo "error: compute-sanitizer not found (it comes with the CUDA toolkit)" >&2
    exit 2
fi
cases=()
for c in "$@"; do cases+=(--case "$c"); done
steps=()
sets=()
for s in ${SANITIZE_SET:-}; do sets+=(--set "$s"); done
[ -n "${SANITIZE_STEPS:-}" ] && steps=(--steps "$SANITIZE_STEPS")
# compile every kernel once outside the sanitizer, so the tools' runs reuse Triton's cache
python benchmarks/sanitize.py "${cases[@]}" "${sets[@]}" --steps 1 >"$DIR/warmup.txt" 2>&1 || { echo "warm-up failed:" >&2; tail -n 20 "$DIR/warmup.txt" >&2; exit 1; }
summary=()
for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    extra=()
    [ "$tool" = racecheck ] && extra=(--racecheck-report analysis)
    start=$SECONDS
    "$cs" --tool "$tool" "${extra[@]}" --print-limit "${SANITIZE_PRINT_LIMIT:-100000}" --error-exitcode 9 \
        python benchmarks/sanitize.py "${cases[@]}" "${sets[@]}" "${steps[@]}" >"$DIR/$tool.txt" 2>&1
    code=$?
    errors=$(grep -Eo "ERROR SUMMARY: [0-9]+|RACECHECK SUMMARY: [0-9]+ hazards?" "$DIR/$tool.txt" | tail -n 1)
    summary+=("$(printf '%-10s %-32s exit %-3s %5s s' "$tool" "${errors:-no summary}" "$code" "$((SECONDS - start))")")
done
python benchmarks/sanitize_reports.py "$DIR"/*check.txt > "$DIR/reports.txt"
printf '%s\n' "${summary[@]}" | tee "$DIR/summary.txt"
