#!/usr/bin/env bash
# Campaign scaling over GPUs (run on the two-GPU machine through the device tool): the same
# campaign with one kernel worker (GPU 0 only) and with one kernel worker per GPU, every run
# with empty compile caches (RUNS="..." overrides the N:K list, e.g. to repeat the first).
# Results must be bit for bit identical; the goal is two GPUs >= 1.8x one GPU's results/s.
# Every run records its phase timeline: its table and its kernel work per kernel, then the
# runs' table with each serial share. REPEAT=N runs the list N times, alternating, and adds
# each configuration's median, min and max wall and the speedup's spread over the pairs.
# One run of this campaign takes 3 to 6.5 minutes on an H200: keep a command's runs under the
# device's 10-minute limit (e.g. RUNS="32:1" in one call, RUNS="32:2" in the next, each with
# its own $OUT), then read the saved files together, here or anywhere:
#   python3 benchmarks/campaign_speed.py --compare A/scaling-results/run0.jsonl B/...
#   bash benchmarks/gpu_campaign_scaling.sh        (writes $OUT/campaign_scaling.md)
# Runs one after the other see the machine drift (6-9 % between runs of one configuration on
# 2 x H200); on a four-GPU machine, gpu_campaign_lanes.sh runs both configurations side by side.
# Kernels: every built-in one that runs on this machine except flex (FlexAttention compiles
# once per shape, about 3 s each, which alone would take one run past the device's
# 10-minute command limit), plus one user kernel; fp16; the gpu preset.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
source "$ROOT/benchmarks/gpu_campaign_common.sh"  # staging, versions, KERNELS
nvidia-smi --query-gpu=name --format=csv,noheader
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())")
CORES=$(nproc)
python3 "$ROOT/benchmarks/campaign_speed.py" --cold-caches --profile-phases --preset gpu --dtype fp16 \
    "${KERNELS[@]}" --save "$OUT/scaling-results" --repeat "${REPEAT:-1}" --runs ${RUNS:-"$CORES:1" "$CORES:$GPUS"} | tee "$OUT/campaign_scaling.md"
