#!/usr/bin/env bash
# The soft-cap's cost in the Triton forward, the old tanh against the new, on one H100/H200:
#   bash benchmarks/gpu_softcap_speed.sh
# Runs benchmarks/gpu_softcap_speed.py (bf16, d = 128, B·N = 16K, H·d = 2048, N = 1K/4K/16K,
# causal and not; plain, old tanh, new tanh; every capped output checked against fp64 torch
# attention), held to LIMIT seconds (default 170). Prints the prediction first, the table last;
# the log and a JSON of the rows go under $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
cd "$ROOT" || exit 1
export PYTHONUNBUFFERED=1
timeout -s INT -k 10 "${LIMIT:-170}" python3 benchmarks/gpu_softcap_speed.py \
    --json "$OUT/softcap_speed.json" "$@" 2>&1 | tee "$OUT/softcap_speed.log"
exit "${PIPESTATUS[0]}"
