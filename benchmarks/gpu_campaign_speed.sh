#!/usr/bin/env bash
# Campaign throughput on the GPU machine (which cannot pip install the checkout):
# one user kernel, three dtypes, the gpu preset, with 16 reference workers and one kernel worker
# (the issue's goal: <= 60 s), the same with two kernel workers sharing the one GPU (the
# multi-GPU path; results must be identical), and with 4 reference workers.
#   bash benchmarks/gpu_campaign_speed.sh          (writes $OUT/campaign_speed.md)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
source "$ROOT/benchmarks/gpu_campaign_common.sh"  # staging, versions, KERNELS
python3 "$ROOT/benchmarks/campaign_speed.py" --runs 16:1 16:2 4:1 \
    --kernel user_kernels:textbook | tee "$OUT/campaign_speed.md"
