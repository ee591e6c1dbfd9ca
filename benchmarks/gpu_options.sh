#!/usr/bin/env bash
# Soft-capping and sinks on one GPU (run through the device tool):
#   bash benchmarks/gpu_options.sh [name]          (default name: h100-options)
#
# 2. The campaign's options part (`flashcheck report --part options --preset gpu`) on the
#    Triton kernel (IEEE and tf32 dots) and FlexAttention, every dtype: forward and gradient
#    cases with a soft-cap and/or sinks, judged against the oracle and the bounds.
# 1. `flashcheck bench --part options`, forward and backward: the Triton kernel with each option
#    beside the same kernel without it on the same inputs (bf16, B·N = 16K, H·d = 2048,
#    d = 128 and 64, N = 1K, 4K, 16K), every output oracle-checked.
# REPORT_KERNELS="triton triton-tf32" narrows step 2; BENCH_LIMIT=0 skips step 1; SPLIT_GPUS=1 on a two-GPU machine runs the
# two steps at once, one per GPU. A campaign stopped by its limit resumes from the same
# command when $WORK still holds its folder (WORK=<dir> keeps it across machines).
# Each step is held to a deadline (SIGINT: bench keeps what it measured); the reports come back
# under $OUT with the logs, the bench's options table last.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-h100-options}
WORK=${WORK:-/tmp/fc-options}
mkdir -p "$OUT" "$WORK"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
python3 -m flashcheck.harness.cli env >"$OUT/env.log" 2>&1
bench() {
    local t1=$SECONDS status
    if [[ "${BENCH_LIMIT:-280}" == 0 ]]; then echo "bench skipped (BENCH_LIMIT=0)" >"$OUT/bench.log"; return; fi
    timeout -s INT -k 20 "${BENCH_LIMIT:-280}" python3 -m flashcheck.harness.cli bench \
        --part options --pass fwd --pass bwd ${BENCH_ARGS:-} --name "$NAME-bench" --out "$WORK" \
        >"$OUT/bench.log" 2>&1
    status=$?
    echo "bench exit status: $status after $((SECONDS - t1)) s" | tee -a "$OUT/bench.log"
    if [[ $status -ne 0 && -f "$WORK/$NAME-bench/results.jsonl" ]]; then
        python3 -m flashcheck.harness.cli bench --render-only --name "$NAME-bench" \
            --out "$WORK" >>"$OUT/bench.log" 2>&1
    fi
}
report() {
    local t0=$SECONDS kernels=()
    for k in ${REPORT_KERNELS:-triton triton-tf32 flex}; do kernels+=(--kernel "$k"); done
    timeout -s INT -k 20 "${REPORT_LIMIT:-240}" python3 -m flashcheck.harness.cli report \
        --preset gpu --part options --name "$NAME-report" --out "$WORK" "${kernels[@]}" \
        --timeout 120 >"$OUT/report.log" 2>&1
    REPORT_STATUS=$?
    echo "report exit status: $REPORT_STATUS after $((SECONDS - t0)) s" | tee -a "$OUT/report.log"
}
REPORT_STATUS=0
if [[ -n "${SPLIT_GPUS:-}" ]]; then
    # Two GPUs: the bench alone on GPU 1 (its timings undisturbed by another kernel on its
    # GPU; the host's cores are shared) while the campaign runs on GPU 0.
    CUDA_VISIBLE_DEVICES=1 bench &
    CUDA_VISIBLE_DEVICES=0 report
    wait
else
    bench
    report
fi
tar -C "$WORK" -czf "$OUT/options.tgz" . 2>/dev/null
tail -n 25 "$OUT/report.log"
if [[ -f "$WORK/$NAME-bench/bench.md" ]]; then
    sed -n '/^## Soft-capping and sinks/,/^## [^S]/p' "$WORK/$NAME-bench/bench.md"
fi
# The campaign's status (was the last test's: 1 whenever the bench was skipped).
exit "$REPORT_STATUS"
