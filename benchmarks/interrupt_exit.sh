#!/usr/bin/env bash
# How long `flashcheck report` takes to exit after `timeout -s INT` (which signals the process,
# then its process group) at T seconds into a CPU campaign, for T in the list; one line each:
# the seconds past T, the exit status timeout saw, the results kept.
#
#   bash benchmarks/interrupt_exit.sh [FLASHCHECK] [T ...]
#
# FLASHCHECK: the command to run (default: flashcheck on PATH), e.g. an older install's
# .tox/py311/bin/flashcheck. Runs in a temporary folder with tests/user/user_kernels.py.
set -u
HERE=$(cd "$(dirname "$0")/.." && pwd)
FC=${1:-flashcheck}
shift || true
TIMES=${*:-5 6 7 8 9 10 11 12 13 14 15 16 17}
WORK=$(mktemp -d)
cp "$HERE/tests/user/user_kernels.py" "$WORK/"
cd "$WORK" || exit 2
printf "| T (s) | exit after T (s) | status | results kept |\n|---|---|---|---|\n"
for t in $TIMES; do
    rm -rf reports
    s=$(date +%s.%N)
    TRITON_INTERPRET=1 timeout -k 60 -s INT "$t" "$FC" report --kernel user_kernels:textbook \
        --name i > out.log 2>&1
    rc=$?
    e=$(date +%s.%N)
    kept=$(grep -o "interrupted: [0-9]* results" out.log | grep -o "[0-9]*" || echo "-")
    printf "| %s | %.2f | %s | %s |\n" "$t" "$(echo "$e - $s - $t" | bc)" "$rc" "$kept"
done
rm -rf "$WORK"
