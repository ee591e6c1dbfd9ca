#!/usr/bin/env bash
# This project's forward raced against the Triton tutorial's, with `flashcheck bench --kernel`,
# on one GPU (run through the device tool):
#   PEERS=build/peers bash benchmarks/gpu_bench_tutorial.sh [name]     (default name: tutorial)
#
# PEERS is a folder holding `tutorial_attention.py`: a flashcheck kernel
# `attention(q, k, v, *, causal=False)` around the tutorial's forward (python/tutorials/
# 06-fused-attention.py of triton-lang/triton; not in the Triton wheel nor in this repository:
# benchmarks/RESULTS.md says what was raced). `flashcheck bench --part grid --dtype fp16` (the
# tutorial takes fp16 only) at d = 64 and 128, N = 1K, 4K, 16K, providers triton, SDPA flash,
# SDPA cuDNN and the tutorial; every output checked against the oracle. Held to BUDGET seconds
# (default 560): past it the bench is stopped with SIGINT and keeps what it measured; run again
# on a checkout holding reports/bench/<name>/results.jsonl to resume. The tutorial autotunes on
# its first call at each shape (recorded as first_call_s, outside the timed runs; the picks go to
# the log). Back under $OUT: bench-tutorial.tgz (the report folder) and the log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-tutorial}
BUDGET=${BUDGET:-560}
PEERS=$(cd "${PEERS:-$ROOT/build/peers}" && pwd) || exit 2
mkdir -p "$OUT"
LOG="$OUT/bench-tutorial.log"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc:$PEERS${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT" || exit 1
timeout -s INT -k 20 "$((BUDGET - 30))" python3 -m flashcheck.harness.cli bench --name "$NAME" \
    --out "$ROOT/reports/bench" --part grid --dtype fp16 --d 64 --d 128 \
    --n 1024 --n 4096 --n 16384 --provider triton --provider sdpa-flash \
    --provider sdpa-cudnn --kernel tutorial_attention:attention 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
echo "== exit status $status after $SECONDS s" | tee -a "$LOG"
python3 -m flashcheck.harness.cli bench --render-only --name "$NAME" \
    --out "$ROOT/reports/bench" >>"$LOG" 2>&1
tar -C "$ROOT/reports/bench" -czf "$OUT/bench-tutorial.tgz" "$NAME" 2>>"$LOG"
exit "$status"
