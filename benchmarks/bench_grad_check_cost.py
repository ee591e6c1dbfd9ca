"""What the backward benchmark's gradient check costs on the CPU, per piece, at one N.

    PYTHONPATH=/tmp/fc python benchmarks/bench_grad_check_cost.py --n 1024 --n 4096

One head, d = 128, bf16, non-causal, seeded normal inputs. Prints seconds (and the peak
resident memory of the process so far) for: the certified oracle's dQ on 12 sampled rows (the
sub-problem with an explicit mask that :mod:`flashcheck.harness.bench.grad_check` builds); the
certified oracle's dK, dV on 12 sampled keys (every query row); the gradient bounds of the
``flash`` and ``unknown`` classes on the whole head; and the float64 reference of dK, dV on
the same keys (on the CPU here; the benchmark runs it on its GPU). These numbers set
``grad_check.ORACLE_MAX_N``.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np


def main() -> None:
    import ml_dtypes
    import torch

    from flashcheck.harness.bench.check import sample_rows
    from flashcheck.harness.bench.grad_check import fp64_key_gradients
    from flashcheck.harness.judging.gradient_bounds import gradient_bounds
    from flashcheck.harness.oracle.evaluate import oracle
    from flashcheck.kernels.recurrence import keep_mask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, action="append", help="sequence length (repeatable)")
    ap.add_argument("--d", type=int, default=128)
    args = ap.parse_args()
    print("| N | piece | seconds | peak RSS (GiB) |\n|---|---|---|---|")
    for n in args.n or [1024]:
        g = torch.Generator().manual_seed(0)
        ts = [torch.randn(1, 1, n, args.d, generator=g).to(torch.bfloat16) for _ in range(4)]
        q, k, v, do = (t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) for t in ts)
        rows, keys = sample_rows(n, seed=0), sample_rows(n, seed=1)
        keep = keep_mask(n, n, rows, np.arange(n), False, None, None)[None, None]
        pieces = [
            (
                "oracle dQ, 12 rows",
                oracle,
                (q[:, :, rows], k, v),
                {"mask": keep, "do": do[:, :, rows], "keys": np.arange(0)},
            ),
            (
                "oracle dK/dV, 12 keys",
                oracle,
                (q, k, v),
                {"do": do, "rows": rows[:1], "keys": keys},
            ),
            ("bounds flash, one head", gradient_bounds, (q, k, v, do), {"arithmetic": "flash"}),
            ("bounds unknown, one head", gradient_bounds, (q, k, v, do), {"arithmetic": "unknown"}),
            (
                "float64 dK/dV, 12 keys (CPU)",
                fp64_key_gradients,
                tuple(t[0, 0] for t in ts),
                {"causal": False, "keys": keys},
            ),
        ]
        for name, fn, fargs, kwargs in pieces:
            t0 = time.perf_counter()
            fn(*fargs, **kwargs)
            dt = time.perf_counter() - t0
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
            print(f"| {n} | {name} | {dt:.2f} | {rss:.1f} |", flush=True)


if __name__ == "__main__":
    main()
