#!/usr/bin/env bash
# The Triton varlen kernel (kernels/triton_varlen.py, triton_varlen_bwd.py) on one GPU:
#   bash benchmarks/gpu_varlen.sh [name]          (default name: varlen-gpu)
#
# 1. benchmarks/gpu_varlen_bench.py: forward and forward + backward times of packed ragged
#    batches (bf16, fp16, d = 128) against the dense kernel on the padded batch, each shape
#    checked against fp64 torch attention (about 40 s).
# 2. `flashcheck report --kernel triton-varlen --preset gpu --device cuda`: the ragged campaign
#    (varlen families at the gpu sizes: block edges, empty sequences, one 512 x 2048 sequence
#    among short ones), fp16, bf16, fp32: each case's accuracy, its per-sequence gradient check
#    (dQ, dK, dV against the gradient oracle and the flash backward's bounds) and the
#    properties (sequence independence, batch invariance). The oracle's strict fallback on
#    the long sequence's gradients costs a minute or two of CPU per dtype, so the run is held
#    to what is left of BUDGET seconds (default 240 for the whole script): the campaign
#    appends result by result under reports/<name>/, and the same command on the same (warm)
#    machine resumes where it stopped (exit 124 means: run it again).
# Then a short table. Back under $OUT: the report folder as <name>.tgz, both logs, the bench
# JSON.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-varlen-gpu}
WORK=${WORK:-$ROOT/reports}
mkdir -p "$OUT" "$WORK"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1
START=$SECONDS

python3 benchmarks/gpu_varlen_bench.py --json "$OUT/$NAME-bench.json" >"$OUT/$NAME-bench.log" 2>&1
bench_rc=$?
bench_s=$((SECONDS - START))

LIMIT=$((${BUDGET:-240} - bench_s - 10))
((LIMIT < 60)) && LIMIT=60
timeout -k 10 "$LIMIT" python3 -m flashcheck.harness.cli report --kernel triton-varlen \
    --preset gpu --device cuda --name "$NAME" --out "$WORK" >"$OUT/$NAME-report.log" 2>&1
report_rc=$?
report_s=$((SECONDS - START - bench_s))
tar -C "$WORK" -czf "$OUT/$NAME.tgz" "$NAME" 2>/dev/null

echo "== benchmarks/gpu_varlen_bench.py: exit $bench_rc"
grep -E "^\||torch|Error|error" "$OUT/$NAME-bench.log" | head -20
echo
echo "== flashcheck report --kernel triton-varlen --preset gpu: exit $report_rc after ${report_s} s"
echo "   (0: every check passed; 1: a gated failure; 124: stopped at ${LIMIT} s, rerun to resume)"
grep -E "^triton-varlen |^    |exit status|^  - |Error" "$OUT/$NAME-report.log" | head -20
echo
echo "| step | exit | wall |"
echo "|---|---|---|"
echo "| gpu_varlen_bench.py | $bench_rc | ${bench_s} s |"
echo "| report --kernel triton-varlen --preset gpu | $report_rc | ${report_s} s |"
