#!/usr/bin/env bash
# The precision floor on a GPU (run through the device tool):
#   bash benchmarks/gpu_precision_floor.sh
#
# A plain fp32 Triton kernel whose tl.dot runs at its default precision (tf32 on NVIDIA GPUs
# since Ampere; benchmarks/user_triton_plain.py), judged undeclared and declared tf32, beside
# the project's triton (fp32 IEEE dots) and triton-tf32 (declared tf32). Smoke campaigns, fp32,
# one line each with the exit status; the logs land under $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$OUT" || exit 1

run() {  # run NAME ARGS...: one smoke campaign, its exit status and its first findings
    local name=$1
    shift
    python3 -m flashcheck.harness.cli report --name "$name" --out "$OUT" --preset smoke \
        --dtype fp32 --device cuda --no-render "$@" >"$OUT/$name.log" 2>&1
    echo "$name: exit $?"
    grep -E "precision|FAIL-HARD|PASS" "$OUT/$name.log" | grep -v "^report" | head -4
}

run plain-undeclared --kernel user_triton_plain:attn
run plain-declared-tf32 --kernel user_triton_plain:attn --arithmetic tf32
run project-triton --kernel triton
run project-triton-tf32 --kernel triton-tf32
