#!/usr/bin/env bash
# The one-GPU campaign's phase timeline with its serial parts overlapped ("after": this tree)
# and switched back off ("before": a copy of this tree with benchmarks/experiments/
# serial_before.patch applied), one after the other on the same machine (device tool, one GPU):
#   bash benchmarks/gpu_campaign_before_after.sh
# The patch leaves the results bit for bit as they are and switches off: each search generation
# drawn ahead of the others, the workers and the reference pool started before set-up, the case
# files' re-runs submitted together, the workers stopped together while the report renders, and
# the reference processes' nice +10. The phase timeline itself is the same in both trees.
#
# Campaign: the flags of gpu_campaign_phases.sh (gpu preset, fp16, one kernel worker, a
# reference process per core, empty Triton and TorchInductor caches per run, rendering
# included) on fewer kernels, so that both runs fit one device command of about 4 minutes.
# The full list takes ~330-400 s per run, of which the triton kernel's calls and compiles
# 225-265 s and recurrence-fa1's pure-Python forward 41-47 s; both are left out (KERNELS="..."
# to change the list). The rest (CPU recurrence and numpy, torch, the four SDPA back-ends, a
# user kernel; no compiling kernel) runs the same parts, search, case files and references:
# 64-71 s of its kernel work in the last full one-GPU runs, ~20 s with no kernel busy, plus
# rendering: about 95 s per run. With triton, a run would take ~250 s, more than the two runs'
# share of the command.
# A smoke campaign first (cut after WARMUP_LIMIT=15 s, its results dropped; WARMUP=0 skips it)
# reads torch, CUDA and cuDNN from disk once: on a fresh machine the first campaign ran 55 %
# slower than the next, which would count against "after", run first. Each run is cut (SIGINT:
# its results so far are kept, without a timeline) after RUN_LIMIT seconds (default 125), so
# the whole script stays under ~270 s: ~5 s set-up, <= 15 s warm-up, 2 x <= 125 s.
# PRESET=smoke KERNELS=naive-numpy WARMUP=0 (and a stub nvidia-smi on PATH) runs every step
# on a CPU machine in seconds; FC, FCB, UK move the staged trees and the user kernel's folder.
# Writes to $OUT: after.jsonl, before.jsonl (the results files, phase timelines included),
# after.txt, before.txt (each run's output, its phase table last), *.stderr, compare.md (the
# side-by-side of both runs, also printed last: phases, kernel work per kernel, and whether the
# results are the same record for record).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/flashcheck-out}
PATCH="$ROOT/benchmarks/experiments/serial_before.patch"
FC=${FC:-/tmp/fc} FCB=${FCB:-/tmp/fcb} UK=${UK:-/tmp/uk}  # staged trees, user kernel folder
mkdir -p "$OUT"

# "after": this tree as it is. "before": a real copy (the staged folders are symlinks into this
# tree, which a patch applied through them would change), then the patch.
python3 "$ROOT/benchmarks/source_tree.py" "$FC" >/dev/null
rm -rf "$FCB"
mkdir -p "$FCB/flashcheck"
cp -rL "$FC/flashcheck/." "$FCB/flashcheck/"
find "$FCB" -name __pycache__ -prune -exec rm -rf {} +
if command -v patch >/dev/null; then
    apply() { patch -d "$FCB/flashcheck" -p1 --batch --forward --quiet "$@" < "$PATCH"; }
    CHECK=--dry-run
else
    apply() { (cd "$FCB/flashcheck" && git apply -p1 "$@" "$PATCH"); }
    CHECK=--check
fi
if ! apply "$CHECK" || ! apply; then
    echo "refused: $PATCH does not apply to this tree (made for main at 09a67a7: rebase it" \
        "onto this tree's harness/campaign first)" >&2
    exit 2
fi
SCHED=flashcheck/harness/campaign/scheduling.py
if ! grep -q "switched off" "$FCB/$SCHED" || grep -q "switched off" "$FC/$SCHED"; then
    echo "refused: $FCB must hold the patched tree and $FC this one (is this tree patched?)" >&2
    exit 2
fi

export PYTHONUNBUFFERED=1
mkdir -p "$UK" && cp "$ROOT/tests/user/user_kernels.py" "$UK"/ && cd "$UK"
nvidia-smi --query-gpu=name --format=csv,noheader
read -r -a KERNEL_LIST <<< "${KERNELS:-recurrence-fa2 naive-numpy naive-torch sdpa-math sdpa-flash sdpa-efficient sdpa-cudnn user_kernels:textbook}"
PICK=()
for k in "${KERNEL_LIST[@]}"; do
    PICK+=(--kernel "$k")
done

campaign() {  # campaign NAME PYTHONPATH LIMIT FLAGS...: a fresh process, empty compile caches
    local name=$1 path=$2 limit=$3 caches run rc=0
    shift 3
    caches=$(mktemp -d)
    run=$(mktemp -d)
    TRITON_CACHE_DIR="$caches/triton" TORCHINDUCTOR_CACHE_DIR="$caches/inductor" \
        PYTHONPATH="$path" timeout -k 15 -s INT "$limit" \
        python3 -m flashcheck.harness.cli report --name "$name" --out "$run" "${PICK[@]}" \
        --dtype fp16 --kernel-workers 1 --fail-on never "$@" \
        2>"$OUT/$name.stderr" >"$OUT/$name.txt" || rc=$?
    if [ -f "$run/$name/results.jsonl" ]; then
        cp "$run/$name/results.jsonl" "$OUT/$name.jsonl"
    fi
    rm -rf "$caches" "$run"
    echo "$name: exit $rc"
    grep -E "^wall |^kernel work per kernel worker|^longest stretches" "$OUT/$name.txt" || true
}

PYTHONPATH="$FC" python3 -m flashcheck.harness.cli env
if [ "${WARMUP:-1}" = 1 ]; then
    campaign warmup "$FC" "${WARMUP_LIMIT:-15}" --preset smoke --no-render
    rm -f "$OUT/warmup.jsonl"
fi
FLAGS=(--preset "${PRESET:-gpu}" --workers "$(nproc)" --profile-phases)
campaign after "$FC" "${RUN_LIMIT:-125}" "${FLAGS[@]}"
campaign before "$FCB" "${RUN_LIMIT:-125}" "${FLAGS[@]}"
cd "$ROOT"
PYTHONPATH="$FC" python3 benchmarks/campaign_speed.py --compare "$OUT/after.jsonl" \
    "$OUT/before.jsonl" | tee "$OUT/compare.md"
