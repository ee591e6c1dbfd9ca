#!/usr/bin/env bash
# The forward's fused multiply-add exponent (LaunchConfig.fma_exponent) against the exact form,
# on one H100/H200:
#   bash benchmarks/gpu_fma_exponent.sh
# Runs benchmarks/gpu_fma_exponent.py (bf16 and fp16, d = 64 and 128, causal and not, N = 1K /
# 4K / 16K, B·N = 16K, H·d = 2048; every output off and on checked against float64 torch
# attention; the saved ~1e12 cases judged with the fast path on), held to LIMIT seconds
# (default 175). Prints the prediction first, the tables last; the log and a JSON of the rows
# go under $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
cd "$ROOT" || exit 1
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout -s INT -k 10 "${LIMIT:-175}" python3 benchmarks/gpu_fma_exponent.py \
    --json "$OUT/fma_exponent.json" "$@" 2>&1 | tee "$OUT/fma_exponent.log"
exit "${PIPESTATUS[0]}"
