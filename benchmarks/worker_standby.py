"""How long a kernel worker's next call waits after a CUDA error replaced its child process,
with and without a standby child (``KernelWorker(standby=True)``, what a campaign's GPU
workers use).

    python benchmarks/worker_standby.py [--repeat 5] [--between 4]

A kernel that raises "CUDA error: misaligned address" (as SDPA's back-ends do on some of the
campaign's structural cases) makes the worker replace its child; the next call, a built-in
kernel on a tiny case, is timed. ``--between`` seconds of other work come between two faults,
the time a standby child has to finish its imports. Runs on the CPU (``--device cuda`` calls
the built-in kernel on the GPU). Prints the median and every time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

FAULTY = """
def kernel(q, k, v, *, causal=False):
    raise RuntimeError("CUDA error: misaligned address")
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--between", type=float, default=4.0)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # as in a campaign: the child imports torch at start
    from flashcheck.harness.adapters.registry import resolve
    from flashcheck.harness.adapters.worker import KernelRef, KernelWorker
    from flashcheck.harness.cases.families import Recipe, make_case

    tmp = Path(tempfile.mkdtemp(prefix="standby-"))
    (tmp / "standby_faulty.py").write_text(FAULTY)
    sys.path.insert(0, str(tmp))  # spawned children take this process's sys.path
    case = make_case(Recipe("fp32", "randn", 1, 1, 1, 16, 16, 16, 16, seed=1))
    good_spec = "naive-torch" if args.device == "cuda" else "naive-numpy"
    good = KernelRef.of(resolve(good_spec), good_spec)
    bad = KernelRef.of(resolve("standby_faulty:kernel"), "standby_faulty:kernel")
    for standby in (False, True):
        times = []
        with KernelWorker(timeout=120, standby=standby) as worker:
            worker.run(good, case, args.device)
            for _ in range(args.repeat):
                time.sleep(args.between)
                assert not worker.run(bad, case, args.device).ok
                t0 = time.perf_counter()
                out = worker.run(good, case, args.device)
                times.append(time.perf_counter() - t0)
                assert out.ok, out
        each = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"standby={standby}: the call after a CUDA error took median "
            f"{statistics.median(times):.2f} s ({each})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
