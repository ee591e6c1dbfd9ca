#!/usr/bin/env bash
# Backward timing of `flashcheck bench` on one GPU (run through the device tool):
#   bash benchmarks/gpu_bench_backward.sh [name]     (default name: h200-bwd)
#
# Two runs of `flashcheck bench --pass bwd --part grid`, bf16, providers triton, SDPA flash,
# cuDNN and efficient, FlexAttention and naive:
#   1. <name>:       d = 128, N = 1K, 4K, 16K, causal and not (the SPEC 7 goal shapes);
#   2. <name>-dims:  d = 64 and 256 at N = 4K, causal and not.
# Each timed configuration's dQ, dK, dV are checked against the oracle (docs/bench.md). The
# whole script is held to BUDGET seconds (default 450, under the 8 minutes asked for): each run
# gets a deadline and is stopped with SIGINT when it passes it, which makes `flashcheck bench`
# keep what it measured (results.jsonl is appended shape by shape) and exit 130; the script
# then renders whatever is there with --render-only. The same command resumes both runs.
# Back under $OUT: bench-backward.tgz (both report folders: results.jsonl, bench.md,
# bench.json), the two bench.md files and the log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-h200-bwd}
BUDGET=${BUDGET:-450}
WORK=${WORK:-/tmp/fc-bench}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/bench-backward.log"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
START=$SECONDS
PROVIDERS=()
for p in triton sdpa-flash sdpa-cudnn sdpa-efficient flex naive; do PROVIDERS+=(--provider "$p"); done
COMMON=(--pass bwd --part grid --dtype bf16 --out "$WORK" "${PROVIDERS[@]}")

run() {  # run NAME SHARE_OF_WHAT_IS_LEFT ARGS...: one bench run under its deadline
    local name=$1 share=$2
    shift 2
    local left=$((BUDGET - (SECONDS - START) - 25))  # 25 s kept for rendering and tar
    local limit=$((left * share / 100))
    if ((limit < 30)); then
        echo "== $name: no time left ($left s); not started" | tee -a "$LOG"
        return
    fi
    echo "== $name: flashcheck bench ${COMMON[*]} $* (deadline ${limit} s)" | tee -a "$LOG"
    timeout -s INT -k 20 "$limit" python3 -m flashcheck.harness.cli bench --name "$name" \
        "${COMMON[@]}" "$@" 2>&1 | tee -a "$LOG"
    local status=${PIPESTATUS[0]}
    echo "== $name: exit status $status after $((SECONDS - START)) s" | tee -a "$LOG"
    if [[ $status -ne 0 && -f "$WORK/$name/results.jsonl" ]]; then
        python3 -m flashcheck.harness.cli bench --render-only --name "$name" --out "$WORK" \
            >>"$LOG" 2>&1
    fi
}

python3 -m flashcheck.harness.cli env >>"$LOG" 2>&1
run "$NAME" 70 --d 128 --n 1024 --n 4096 --n 16384
run "$NAME-dims" 100 --d 64 --d 256 --n 4096
tar -C "$WORK" -czf "$OUT/bench-backward.tgz" "$NAME" "$NAME-dims" 2>>"$LOG"
for n in "$NAME" "$NAME-dims"; do
    [[ -f "$WORK/$n/bench.md" ]] && cp "$WORK/$n/bench.md" "$OUT/$n.md"
done
echo "done in $((SECONDS - START)) s" | tee -a "$LOG"
