# Sourced by the gpu_campaign_*.sh scripts (needs ROOT set): stages this checkout as an
# importable package in /tmp/fc (the GPU machine cannot pip install it), copies the user kernels
# to /tmp/uk and runs from there, prints the versions, and sets KERNELS to the scaling
# campaign's kernels: every built-in one that runs on the GPU machine except flex
# (FlexAttention compiles once per shape, about 3 s each, which alone would take one run past
# the device's 10-minute command limit), plus one user kernel.
python3 "$ROOT/benchmarks/source_tree.py" /tmp/fc >/dev/null
export PYTHONPATH=/tmp/fc PYTHONUNBUFFERED=1
mkdir -p /tmp/uk && cp "$ROOT/tests/user/user_kernels.py" /tmp/uk/ && cd /tmp/uk
python3 -m flashcheck.harness.cli env
KERNELS=()
for k in recurrence-fa2 recurrence-fa1 naive-numpy naive-torch triton sdpa-math sdpa-flash \
         sdpa-efficient sdpa-cudnn user_kernels:textbook; do
    KERNELS+=(--kernel "$k")
done
