#!/usr/bin/env bash
# The paged decode kernels on one GPU (run through the device tool, repo root as cwd):
#   bash benchmarks/gpu_decode.sh
#
# 1. `flashcheck report --kernel triton-decode-paged --preset gpu` and the same for
#    triton-combine (fp16, bf16, fp32): every family of the paged layout and of the merge,
#    judged per sequence against the oracle, with the properties (batch invariance gated:
#    both kernels declare it). Reports under reports/decode-gpu-*/.
# 2. `flashcheck bench --decode`: latency and K/V bandwidth of triton-decode-paged, SDPA and
#    FlexAttention's paged attention at decode shapes, every output oracle-checked on
#    sampled sequences (reports/bench/decode/bench-decode.md).
# Then a short table (SPLIT_SWEEP=1 adds benchmarks/probe_decode_split.py before it). Each step has its own time limit (CAMPAIGN_BUDGET seconds per kernel,
# default 120; BENCH_BUDGET, default 200): a step out of time keeps what it measured, and
# running the script again resumes it (delete reports/decode-gpu-* and reports/bench/decode to
# start over). Back under $OUT: decode-gpu.tgz (the reports) and decode-gpu.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
LOG="$OUT/decode-gpu.log"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
FC=(python3 -m flashcheck.harness.cli)
"${FC[@]}" env >>"$LOG" 2>&1
declare -A RC
for k in triton-decode-paged triton-combine; do
    echo "== flashcheck report --kernel $k --preset gpu" | tee -a "$LOG"
    timeout -s INT -k 20 ${CAMPAIGN_BUDGET:-120} "${FC[@]}" report --kernel "$k" --preset gpu \
        --dtype fp16 --dtype bf16 --dtype fp32 --name "decode-gpu-$k" --out reports 2>&1 |
        tee -a "$LOG"
    RC[$k]=${PIPESTATUS[0]}
done
echo "== flashcheck bench --decode" | tee -a "$LOG"
timeout -s INT -k 20 ${BENCH_BUDGET:-200} "${FC[@]}" bench --decode 2>&1 | tee -a "$LOG"
RC[bench]=${PIPESTATUS[0]}
"${FC[@]}" bench --decode --render-only >>"$LOG" 2>&1
if [[ -n ${SPLIT_SWEEP:-} ]]; then  # optional: the kernel at other fixed split sizes
    timeout -k 10 120 python3 benchmarks/probe_decode_split.py 2>&1 | tee -a "$LOG"
fi
tar -C reports -czf "$OUT/decode-gpu.tgz" decode-gpu-triton-decode-paged \
    decode-gpu-triton-combine bench/decode 2>>"$LOG"
{
    echo
    echo "== summary (exit status: 0 pass, 1 a failure at the gate, 124/130 out of time)"
    for k in triton-decode-paged triton-combine; do
        echo "campaign $k: exit ${RC[$k]}"
        grep -E "^triton-(decode-paged|combine) (fp16|bf16|fp32):" "$LOG" | grep "^$k " || true
    done
    echo "bench --decode: exit ${RC[bench]}"
    if [[ -f reports/bench/decode/bench-decode.md ]]; then
        grep -E "^\| (shape|\`)" reports/bench/decode/bench-decode.md
    fi
} | tee -a "$LOG"
