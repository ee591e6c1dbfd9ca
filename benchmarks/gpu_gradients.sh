#!/usr/bin/env bash
# The GPU report's gradient part (run through the device tool): dQ, dK, dV of the Triton
# backward (kernels/triton_flash_bwd.py), SDPA's flash,
# efficient, cuDNN and math backends, FlexAttention and the naive baseline, `gpu` preset, every
# dtype, against the gradient oracle and the bounds. The results go to reports/<name>/ inside
# the checkout (an ignored path, kept while the machine stays warm), so a second call with the
# same command resumes where a call stopped at the device's 10-minute limit; the report folder
# comes back as $OUT/<name>.tgz.
#   bash benchmarks/gpu_gradients.sh [name]        (default name: h200-gradients)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
NAME=${1:-h200-gradients}
mkdir -p "$OUT"
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
# Prepend: a caller may have put carried wheels (gmpy2, say) on the path.
export PYTHONPATH=/tmp/fc${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
cd "$ROOT"
python3 -m flashcheck.harness.cli env
KERNELS=()
for k in triton sdpa-flash sdpa-efficient sdpa-cudnn sdpa-math flex naive-torch; do
    KERNELS+=(--kernel "$k")
done
timeout "${LIMIT:-540}" python3 -m flashcheck.harness.cli report --preset gpu --part gradients \
    --name "$NAME" "${KERNELS[@]}" --timeout 120
status=$?
echo "flashcheck report exit status: $status"
tar -C reports -czf "$OUT/$NAME.tgz" "$NAME"
