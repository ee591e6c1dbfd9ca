#!/usr/bin/env bash
# The phase timeline of the one-GPU campaign of gpu_campaign_scaling.sh (run on a one-GPU machine
# through the device tool): gpu preset, fp16, the same built-in kernels and user kernel, one
# kernel worker, a reference process per core, empty Triton and TorchInductor caches, rendering
# included. `flashcheck report --profile-phases` prints the phase table last: per phase its busy
# and exclusive seconds, how much ran under kernel work, and the serial share (no kernel worker
# busy) that bounds what a second GPU can give (Amdahl: 1 / (s + (1 - s) / 2)).
#   bash benchmarks/gpu_campaign_phases.sh    (writes $OUT/campaign_phases.txt, the results file)
# KW=2 runs two kernel workers (two GPUs, or two sharing one).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
mkdir -p "$OUT"
source "$ROOT/benchmarks/gpu_campaign_common.sh"  # staging, versions, KERNELS
nvidia-smi --query-gpu=name --format=csv,noheader
CACHES=$(mktemp -d)
export TRITON_CACHE_DIR="$CACHES/triton" TORCHINDUCTOR_CACHE_DIR="$CACHES/inductor"
RUN=$(mktemp -d)
python3 -m flashcheck.harness.cli report --name phases --out "$RUN" --preset gpu --dtype fp16 \
    "${KERNELS[@]}" --kernel-workers "${KW:-1}" --fail-on never --profile-phases \
    2>"$OUT/campaign_phases.stderr" | tee "$OUT/campaign_phases.txt"
cp "$RUN/phases/results.jsonl" "$OUT/campaign_phases.results.jsonl"
