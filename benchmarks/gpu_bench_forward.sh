#!/usr/bin/env bash
# Forward timing of `flashcheck bench` on one GPU (run through the device tool):
#   bash benchmarks/gpu_bench_forward.sh [name]     (default name: h200)
#
# `flashcheck bench --part grid`, fp16 and bf16, providers triton, SDPA flash and SDPA cuDNN
# (the floor and the goal of the forward-speed work), written to this checkout's
# reports/bench/<name>/ (d = 128 at every N: the goal shapes) and reports/bench/<name>-dims/
# (d = 64 and 256). SKIP_D128=1 runs the second only. Every timed output
# is checked against the oracle (docs/bench.md). The script is held to BUDGET seconds (default
# 480): the run gets a deadline and is stopped with SIGINT when it passes it, which makes
# `flashcheck bench` keep what it measured (results.jsonl is appended shape by shape) and exit
# 130; the script then renders what is there. Run it again on a checkout holding that
# results.jsonl to resume. Back under $OUT: bench-forward.tgz (the report folder) and the log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-h200}
BUDGET=${BUDGET:-480}
mkdir -p "$OUT"
LOG="$OUT/bench-forward.log"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
START=$SECONDS
COMMON=(--part grid --dtype bf16 --dtype fp16 --out "$ROOT/reports/bench" --provider triton
        --provider sdpa-flash --provider sdpa-cudnn)

run() {  # run NAME ARGS...: one bench run under what is left of the budget, then render
    local name=$1
    shift
    local left=$((BUDGET - (SECONDS - START) - 40))  # 40 s kept for rendering and tar
    if ((left < 30)); then
        echo "== no time left ($left s): $name $* not started" | tee -a "$LOG"
        return
    fi
    echo "== flashcheck bench --name $name ${COMMON[*]} $* (deadline ${left} s)" | tee -a "$LOG"
    timeout -s INT -k 20 "$left" python3 -m flashcheck.harness.cli bench --name "$name" \
        --no-render "${COMMON[@]}" "$@" 2>&1 | tee -a "$LOG"
    echo "== exit status ${PIPESTATUS[0]} after $((SECONDS - START)) s" | tee -a "$LOG"
    python3 -m flashcheck.harness.cli bench --render-only --name "$name" \
        --out "$ROOT/reports/bench" >>"$LOG" 2>&1
}

python3 -m flashcheck.harness.cli env >>"$LOG" 2>&1
[[ -n ${SKIP_D128:-} ]] || run "$NAME" --d 128
run "$NAME-dims" --d 64 --d 256
tar -C "$ROOT/reports/bench" -czf "$OUT/bench-forward.tgz" "$NAME" "$NAME-dims" 2>>"$LOG"
echo "done in $((SECONDS - START)) s" | tee -a "$LOG"
