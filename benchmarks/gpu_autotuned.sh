#!/usr/bin/env bash
# An autotuned Triton kernel through flashcheck on a GPU (run through the device tool):
#   bash benchmarks/gpu_autotuned.sh report test   # campaign, then suite, each --budget 3m
#   KERNELS="attn attn_batch_bug" BUDGET=5m bash benchmarks/gpu_autotuned.sh report
#
# benchmarks/user_triton_autotuned.py wraps the project's forward in triton.autotune over 16
# configurations keyed on (Nq, Nk, d, dv): every new shape re-tunes. "report" runs the campaign
# (fp16, bf16, gpu preset), "test" the property suite, on the kernels named in $KERNELS (default
# the planted batch bug), each under a time budget ($BUDGET, default 3m), timed with its exit
# status. Logs land under $OUT, a table last.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$OUT" || exit 1
ROWS=()

timed() {  # timed NAME COMMAND...: run it, log it, keep one row of the final table
    local name=$1
    shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    ROWS+=("| $name | $rc | $((SECONDS - t0)) s | $(grep -cE 'FAIL-HARD' "$OUT/$name.log") |")
}

parts=${*:-report test}
for part in $parts; do
    for k in ${KERNELS:-attn_batch_bug}; do
        case $part in
        report)
            timed "report-$k" python3 -m flashcheck.harness.cli report --name "at-$k" \
                --out "$OUT" --kernel "user_triton_autotuned:$k" --dtype fp16 --dtype bf16 \
                --preset gpu --device cuda --no-render --budget "${BUDGET:-3m}"
            ;;
        test)
            timed "test-$k" python3 -m flashcheck.harness.cli test \
                "user_triton_autotuned:$k" --dtype fp16 --dtype bf16 --device cuda \
                --budget "${BUDGET:-3m}" -- -p flashcheck.properties.plugin
            ;;
        esac
    done
done
echo "| run | exit | wall | lines with FAIL-HARD |"
echo "|---|---|---|---|"
printf '%s\n' "${ROWS[@]}"
