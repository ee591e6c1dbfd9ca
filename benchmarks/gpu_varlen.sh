#!/usr/bin/env bash
# The Triton varlen kernel (kernels/triton_varlen.py, triton_varlen_bwd.py) on one GPU:
#   bash benchmarks/gpu_varlen.sh [name]          (default name: varlen-gpu)
#
# 1. `flashcheck report --kernel triton-varlen --preset gpu --device cuda`: the ragged campaign
#    (varlen families at the gpu sizes: block edges, empty sequences, one 512 x 2048 sequence
#    among short ones), fp16, bf16, fp32: each case's accuracy, its per-sequence gradient check
#    (dQ, dK, dV against the gradient oracle and the flash backward's bounds) and the
#    properties (sequence independence, batch invariance). The references (oracle, naive
#    baseline, bounds, per sequence and for the gradients) run ahead of the kernel on one
#    process per core, one task per sequence, the three dtypes side by side. The critical path
#    is the gradient oracle of the 512 x 2048 sequence (its strict fallback: one
#    single-threaded task per dtype of many minutes and ~3.5 GB); every other case's
#    references take seconds. The run is held to REPORT_LIMIT seconds (default 450) and
#    stopped with SIGINT, which stops the reference processes too: the campaign appends result
#    by result under reports/<name>/, and the same command on the same (warm) machine resumes
#    where it stopped (exit 124: run it again; finished results are not recomputed, but a
#    reference task cut off starts again from the beginning). DTYPES="fp16 bf16" runs those
#    dtypes only (default: all three; give a new name with it: a report keeps its dtypes).
# 2. benchmarks/gpu_varlen_bench.py (held to BENCH_LIMIT seconds, default 100; 0 skips it):
#    forward and forward + backward times of packed ragged batches (bf16, fp16, d = 128)
#    against the dense kernel on the padded batch, each shape checked against fp64 torch
#    attention.
# Then a short table. Back under $OUT: the report folder as <name>.tgz, both logs, the bench
# JSON.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-varlen-gpu}
WORK=${WORK:-$ROOT/reports}
mkdir -p "$OUT" "$WORK"
FC=${FC:-/tmp/fc}
python3 "$ROOT/benchmarks/source_tree.py" "$FC" >/dev/null
export PYTHONPATH=$FC${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1
START=$SECONDS

DTYPE_ARGS=()
for dt in ${DTYPES:-}; do DTYPE_ARGS+=(--dtype "$dt"); done
timeout -s INT -k 20 "${REPORT_LIMIT:-450}" python3 -m flashcheck.harness.cli report \
    --kernel triton-varlen --preset gpu --device cuda --name "$NAME" --out "$WORK" \
    ${DTYPE_ARGS[@]+"${DTYPE_ARGS[@]}"} >"$OUT/$NAME-report.log" 2>&1
report_rc=$?
report_s=$((SECONDS - START))
tar -C "$WORK" -czf "$OUT/$NAME.tgz" "$NAME" 2>/dev/null

if [[ "${BENCH_LIMIT:-100}" == 0 ]]; then
    bench_rc="skipped (BENCH_LIMIT=0)"
    : >"$OUT/$NAME-bench.log"
else
    timeout -k 10 "${BENCH_LIMIT:-100}" python3 benchmarks/gpu_varlen_bench.py \
        --json "$OUT/$NAME-bench.json" >"$OUT/$NAME-bench.log" 2>&1
    bench_rc=$?
fi
bench_s=$((SECONDS - START - report_s))

echo "== flashcheck report --kernel triton-varlen --preset gpu: exit $report_rc after ${report_s} s"
echo "   (0: every check passed; 1: a gated failure; 124: stopped at the limit, rerun to resume)"
grep -E "^triton-varlen |^    |exit status|^  - |[Ee]rror" "$OUT/$NAME-report.log" | head -20
echo
echo "== benchmarks/gpu_varlen_bench.py: exit $bench_rc"
grep -E "^\||torch|Error|error" "$OUT/$NAME-bench.log" | head -20
echo
echo "| step | exit | wall |"
echo "|---|---|---|"
echo "| report --kernel triton-varlen --preset gpu | $report_rc | ${report_s} s |"
echo "| gpu_varlen_bench.py | $bench_rc | ${bench_s} s |"
