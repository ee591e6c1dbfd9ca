"""Reproduce the process pool's reader waiting for ever after its workers are killed mid-send
(the second cause of slow Ctrl-C exits, benchmarks/RESULTS.md), and show that closing this
process's end of the result pipe's writer (what ``Executor.close(interrupted=True)`` does) ends
the wait.

    python benchmarks/pool_reader_hang.py [--repeat 4]

Each trial starts a 2-process spawn pool whose tasks return 160 MB arrays, kills the workers
while they send, shuts the pool down without waiting, and reports whether its reader thread is
still alive 5 s later, without and with the writer closed. Python 3.11-3.13 (3.14's
``kill_workers`` is the public way).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

_TRIAL = """
import concurrent.futures as cf, multiprocessing as mp, os, sys, time
import numpy as np

def big(n):
    return np.ones(n)

if __name__ == "__main__":
    release, delay = sys.argv[1] == "1", float(sys.argv[2])
    pool = cf.ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"))
    results = pool._result_queue
    futures = [pool.submit(big, 20_000_000) for _ in range(6)]
    time.sleep(delay)
    for p in list(pool._processes.values()):
        p.kill()
    reader = pool._executor_manager_thread
    pool.shutdown(wait=False, cancel_futures=True)
    if release:
        results._writer.close()
    reader.join(5)
    print("stuck" if reader.is_alive() else "ended", flush=True)
    os._exit(0)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=4, help="trials per variant (default 4)")
    args = ap.parse_args(argv)
    delays = [1.0 + 0.25 * i for i in range(args.repeat)]
    print("| kill after (s) | writer left open | writer closed |\n|---|---|---|")
    for d in delays:
        row = []
        for release in ("0", "1"):
            out = subprocess.run(
                [sys.executable, "-c", _TRIAL, release, str(d)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            row.append(out.stdout.strip() or "?")
        print(f"| {d:g} | {row[0]} | {row[1]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
