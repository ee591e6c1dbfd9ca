#!/usr/bin/env bash
# Campaign scaling, one GPU against two, measured side by side on a four-GPU machine (device
# tool): the campaign of gpu_campaign_scaling.sh runs at the same time in two "lanes", each with
# half the cores (taskset) and two of the GPUs: one lane with one kernel worker (its first GPU),
# the other with two. Run one after the other, runs of one configuration varied by 6-9 % on
# 2 x H200, as much as the margin measured; side by side, both configurations see the same
# machine (clocks, neighbours, caches) while they run. The one-GPU lane runs its campaign once,
# the two-GPU lane twice in a row (about as long), so neither lane runs alone for long.
# SWAP=1 exchanges the lanes (lane A: the first half of the cores and GPUs 0,1; lane B: the
# second half and GPUs 2,3), to show that neither lane is the faster one.
# Writes $OUT/lane-1gpu.md, $OUT/lane-2gpu.md, the saved results files, and prints the
# comparison of all of them last:
#   python3 benchmarks/campaign_speed.py --compare DIR/1gpu/run*.jsonl DIR/2gpu/run*.jsonl
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
source "$ROOT/benchmarks/gpu_campaign_common.sh"  # staging, versions, KERNELS
nvidia-smi --query-gpu=index,name --format=csv,noheader
nvidia-smi topo -m || true
lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA node)" || true
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
CORES=$(nproc)
if [ "$GPUS" -lt 4 ]; then
    echo "needs four GPUs (found $GPUS): use gpu_campaign_scaling.sh on two" >&2
    exit 2
fi
HALF=$((CORES / 2))
LANE_A="0-$((HALF - 1))"
LANE_B="$HALF-$((CORES - 1))"
lane() {  # lane NAME CPUS GPUS RUNS REPEAT
    CUDA_VISIBLE_DEVICES=$3 taskset -c "$2" python3 "$ROOT/benchmarks/campaign_speed.py" \
        --cold-caches --profile-phases --preset gpu --dtype fp16 "${KERNELS[@]}" \
        --save "$OUT/$1" --repeat "$5" --runs "$4" > "$OUT/lane-$1.md" 2>&1
}
if [ "${SWAP:-0}" = 1 ]; then
    ONE=("$LANE_B" 2) TWO=("$LANE_A" 0,1)
else
    ONE=("$LANE_A" 0) TWO=("$LANE_B" 2,3)
fi
echo "one GPU: cores ${ONE[0]}, GPU ${ONE[1]}; two GPUs: cores ${TWO[0]}, GPUs ${TWO[1]}"
lane 1gpu "${ONE[0]}" "${ONE[1]}" "$HALF:1" 1 &
P1=$!
lane 2gpu "${TWO[0]}" "${TWO[1]}" "$HALF:2" "${REPEAT2:-2}" &
P2=$!
RC=0
wait $P1 || RC=$?
wait $P2 || RC=$?
for f in "$OUT"/lane-*.md; do
    echo "== $f"
    grep -E "^run [0-9]+ \(|^wall |^kernel work per kernel worker" "$f" || tail -20 "$f"
done
python3 "$ROOT/benchmarks/campaign_speed.py" --compare "$OUT"/1gpu/run*.jsonl "$OUT"/2gpu/run*.jsonl
exit $RC
