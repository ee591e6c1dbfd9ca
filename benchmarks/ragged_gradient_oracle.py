"""How much of a ragged campaign's gradient oracle its fast path certifies, per sequence.

    python benchmarks/ragged_gradient_oracle.py                    # one-long, gpu preset, fp32
    python benchmarks/ragged_gradient_oracle.py --dtype fp16 --dtype bf16 --family block-edges
    python benchmarks/ragged_gradient_oracle.py --strict           # also run the strict path

For each varlen case of the chosen families (the campaign's cases: same preset and seed), each
sequence whose gradients the campaign judges gets the gradient oracle of its dO. The table
gives per sequence its lengths, the gradient elements the fast path could not certify (they go
to the strict path) and the seconds taken. Without ``--strict`` the strict path is replaced by
a no-op, so the count comes without its cost (which can be many minutes: 22 for the gpu
preset's fp32 one-long sequence before the oracle's triple-double argument); the rounded
values are then not all certified, and only the counts and the fast path's time mean
anything.
"""

from __future__ import annotations

import argparse
import time

from flashcheck.harness.cases.ragged_families import family_cases
from flashcheck.harness.checks.accuracy import gradient_oracle
from flashcheck.harness.checks.ragged_gradients import gradient_sequences
from flashcheck.harness.oracle import evaluate


def _no_strict(*args, **kwargs) -> None:
    """Stands in for the strict path: the fast path's undecided elements stay undecided."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpu", choices=("cpu", "gpu", "smoke"))
    ap.add_argument("--dtype", action="append", choices=("fp16", "bf16", "fp32"))
    ap.add_argument("--family", action="append", help="varlen family (default: one-long)")
    ap.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    ap.add_argument("--d", type=int, default=128, help="head dim (triton-varlen's: 128)")
    ap.add_argument("--strict", action="store_true", help="run the strict path too")
    args = ap.parse_args()
    if not args.strict:
        evaluate.strict_group = _no_strict
    families = set(args.family or ["one-long"])
    print("| dtype | family | sequence | Nq x Nk | elements | to the strict path | seconds |")
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtype or ["fp32"]:
        cases = family_cases("varlen", dtype, seed=args.seed, preset=args.preset, d=args.d)
        for case in (c for c in cases if c.family in families):
            for b, seq in gradient_sequences(case).items():
                t0 = time.perf_counter()
                ref = gradient_oracle(seq)
                secs = time.perf_counter() - t0
                size = sum(getattr(ref, g).rounded.size for g in ("dq", "dk", "dv"))
                nq, nk = case.lengths(b)
                strict = ref.stats["fallback_elements"]
                print(
                    f"| {dtype} | {case.family} | {b} | {nq} x {nk} | {size} | {strict} | "
                    f"{secs:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
