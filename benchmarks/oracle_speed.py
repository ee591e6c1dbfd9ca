"""Oracle speed on this machine: fast mode vs strict mode vs a plain mpmath baseline.

    python benchmarks/oracle_speed.py            # the three SPEC 3.2 cases, ~3 minutes
    python benchmarks/oracle_speed.py --quick    # smaller sample of strict/baseline rows

For each case it times, on one head of fp16 N(0,1) inputs:

- fast: the whole problem (all requested rows), wall clock, best of ``--repeat`` runs;
- strict: ``--strict-rows`` rows, scaled by the row count (rows are independent);
- baseline: SPEC 3.2's reference cost, a straightforward all-mpmath evaluation at 113 bits
  (``mp.fdot`` scores, ``mp.exp``, ``mp.fsum``, ``mp.fdot`` for P·V), timed on a few rows and
  scaled likewise.

and prints a markdown table (last) with the ratios baseline/fast and strict/fast and the
SPEC goals. Every number in benchmarks/RESULTS.md comes from this script.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import mpmath
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.harness.cli import environment
from flashcheck.harness.oracle.evaluate import oracle

CASES = [
    # (label, Nq, Nk, d, sampled rows or None, goal seconds for fast)
    ("Nq=Nk=256, d=64", 256, 256, 64, None, 0.1),
    ("Nq=Nk=1024, d=128", 1024, 1024, 128, None, 1.5),
    ("64 rows of Nk=32768, d=128", 32768, 32768, 128, 64, 5.0),
]


def to_mp(k, v, prec: int = 113):
    """K rows and V columns as mpmath numbers, converted once (not part of the timed work)."""
    with mpmath.workprec(prec):
        kmp = [[mpmath.mpf(float(x)) for x in kj] for kj in k]
        vmp = [[mpmath.mpf(float(x)) for x in v[:, c]] for c in range(v.shape[1])]
    return kmp, vmp


def baseline_row(q_row, kmp, vmp, prec: int = 113) -> list:
    """One output row, every operation in mpmath at ``prec`` bits (the SPEC's baseline)."""
    with mpmath.workprec(prec):
        scale = 1 / mpmath.sqrt(len(q_row))
        qi = [mpmath.mpf(float(x)) for x in q_row]
        s = [mpmath.fdot(qi, kj) * scale for kj in kmp]
        m = max(s)
        e = [mpmath.exp(x - m) for x in s]
        total = mpmath.fsum(e)
        return [mpmath.fdot(e, col) / total for col in vmp]


def run_case(label, nq, nk, d, sampled, strict_rows, base_rows, repeat, rng):
    q = rng.standard_normal((1, 1, nq, d)).astype(np.float16)
    k = rng.standard_normal((1, 1, nk, d)).astype(np.float16)
    v = rng.standard_normal((1, 1, nk, d)).astype(np.float16)
    rows = None if sampled is None else np.sort(rng.choice(nq, size=sampled, replace=False))
    n_rows = nq if rows is None else len(rows)
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        res = oracle(q, k, v, rows=rows)
        best = min(best, time.perf_counter() - t)
    fallback = res.stats["fallback_elements"]
    srows = rng.choice(nq, size=strict_rows, replace=False)
    t = time.perf_counter()
    oracle(q, k, v, rows=srows, mode="strict")
    strict_row = (time.perf_counter() - t) / strict_rows
    brow = rng.choice(nq, size=base_rows, replace=False)
    kmp, vmp = to_mp(k[0, 0].astype(np.float64), v[0, 0].astype(np.float64))
    t = time.perf_counter()
    for i in brow:
        baseline_row(q[0, 0, i].astype(np.float64), kmp, vmp)
    base_row = (time.perf_counter() - t) / base_rows
    return {
        "label": label,
        "rows": n_rows,
        "fast_s": best,
        "fast_row_ms": 1e3 * best / n_rows,
        "strict_row_s": strict_row,
        "strict_s": strict_row * n_rows,
        "base_row_s": base_row,
        "base_s": base_row * n_rows,
        "per_nnd_us": 1e6 * base_row / (nk * d),
        "fallback": fallback,
        "certified": float(res.o.certified.mean()),
        "bound_max": float(np.max(res.o.err / res.o.floor) * 2.0**100),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 strict row and 1 baseline row")
    ap.add_argument("--repeat", type=int, default=3, help="fast-mode runs per case (best kept)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    env = environment()
    print("environment:", ", ".join(f"{k} {v}" for k, v in env.items()))
    results = []
    for label, nq, nk, d, sampled, goal in CASES:
        small = nk >= 32768 or args.quick
        r = run_case(
            label,
            nq,
            nk,
            d,
            sampled,
            strict_rows=1 if small else 2,
            base_rows=1 if small else 3,
            repeat=args.repeat,
            rng=rng,
        )
        r["goal"] = goal
        results.append(r)
        print(f"done: {label} fast {r['fast_s']:.3f} s", flush=True)
    print()
    print(
        "| case | rows | fast (s) | fast per row (ms) | strict per row (s) | strict est. (s) "
        "| baseline per row (s) | baseline est. (s) | baseline µs per Nk·d | baseline/fast "
        "| strict/fast | fast goal | fallbacks | max err/(2^-100 W) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['label']} | {r['rows']} | {r['fast_s']:.3f} | {r['fast_row_ms']:.2f} "
            f"| {r['strict_row_s']:.3f} | {r['strict_s']:.0f} | {r['base_row_s']:.3f} "
            f"| {r['base_s']:.1f} | {r['per_nnd_us']:.2f} | {r['base_s'] / r['fast_s']:.0f}× "
            f"| {r['strict_s'] / r['fast_s']:.0f}× | ≤ {r['goal']} s "
            f"{'met' if r['fast_s'] <= r['goal'] else 'MISSED'} | {r['fallback']} "
            f"| {r['bound_max']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
