#!/usr/bin/env bash
# The FP8 Triton forward on one GPU (Hopper): correctness against float64 and the class
# emulation, FlashAttention-3 Table 3, and timing against the bf16 forward and SDPA
# (benchmarks/fp8_check.py's docstring says what each step measures). Repo root is the cwd.
#   bash benchmarks/gpu_fp8.sh [--quick]        (about 3-4 minutes; --quick: about 2)
# Each step prints its own errors and the run goes on; the tables come last. The log comes back
# as $OUT/fp8-check.log. LIMIT (default 540 s) bounds the whole run.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
timeout -k 10 "${LIMIT:-540}" python3 benchmarks/fp8_check.py "$@" 2>&1 | tee "$OUT/fp8-check.log"
echo "fp8_check exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/fp8-check.log"
