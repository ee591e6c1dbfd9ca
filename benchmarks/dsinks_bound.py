"""The dσ bound of a bf16 case whose rows the sinks dominate, beside |dσ| and the error of a
sign-flipped dσ, per head.

    python benchmarks/dsinks_bound.py

The case is a user's (randn, B = 2, Hq = 4, Hk = 2, Nq = 68, Nk = 32, d = 16, causal, sinks
6.3 to 7.8, dO from the case's hash). A kernel with dσ's sign flipped errs by 2·|dσ|; the last
column is that error over the bound of class ``unknown`` (above 1: caught). Run it on a
revision before and after a change of the sink's terms to compare them.
"""

from __future__ import annotations

import numpy as np

from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.judging.gradient_bounds import gradient_bounds
from flashcheck.harness.oracle.evaluate import oracle


def main() -> None:
    case = make_case(Recipe("bf16", "randn", 2, 4, 2, 68, 32, 16, 16, seed=0, causal=True))
    sinks = np.array([6.3, 7.0, 7.4, 7.8], np.float32)
    do = case.grad_output()
    ref = oracle(case.q, case.k, case.v, do=do, causal=True, sinks=sinks)
    exact = ref.dsinks.hi
    print("| head | dσ | bound (naive) | bound (unknown) | sign flip / bound (unknown) |")
    print("|---|---|---|---|---|")
    opts = {"causal": True, "sinks": sinks}
    naive = gradient_bounds(case.q, case.k, case.v, do, arithmetic="naive", **opts)
    unknown = gradient_bounds(case.q, case.k, case.v, do, arithmetic="unknown", **opts)
    for h in range(len(sinks)):
        b_n, b_u = float(naive["dsinks"].det[h]), float(unknown["dsinks"].det[h])
        print(f"| {h} | {exact[h]:+.4f} | {b_n:.4f} | {b_u:.4f} | {2 * abs(exact[h]) / b_u:.2f} |")


if __name__ == "__main__":
    main()
