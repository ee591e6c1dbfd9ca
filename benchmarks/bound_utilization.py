"""How tight are the a-priori bounds? Utilization = measured error / bound, per arithmetic
class, dtype and input family, for the exactly emulated kernels (numpy recurrence with the
flash policy, FA1 variant, naive same-precision) on random recipes of the property suite.

    python benchmarks/bound_utilization.py [--cases 40] [--seed 0]

Prints a markdown table: the max and median over cases of each case's max utilization of the
deterministic and the probabilistic bound (a value above 1 would be a violation).
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np

from flashcheck.harness.adapters.adapter import score_magnitude
from flashcheck.harness.judging.bounds import error_bounds
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_numpy
from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention
from flashcheck.properties.strategies import FAMILIES, Recipe, make_case

KINDS = {"flash": ("fa2", 16), "flash-fa1": ("fa1", 5), "naive": (None, None)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=40, help="random cases per dtype and family")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    stats = defaultdict(list)
    fams = [f for f in FAMILIES if f != "nonfinite"]
    for dtype in ("fp16", "bf16", "fp32"):
        for fam in fams:
            for _ in range(args.cases):
                nq, nk = int(rng.integers(1, 80)), int(rng.integers(1, 160))
                d = int(rng.choice([8, 16, 40, 64, 111]))
                mag = (
                    float(rng.choice([2.0, 10.0, 30.0, 1e3, 6e4]))
                    if fam == "huge_logits"
                    else float(rng.choice([1.0, 10.0, 30.0]))
                )
                rec = Recipe(
                    dtype,
                    fam,
                    1,
                    1,
                    1,
                    nq,
                    nk,
                    d,
                    int(rng.integers(1, 9)),
                    int(rng.integers(2**32)),
                    causal=bool(rng.random() < 0.3),
                    magnitude=mag,
                )
                case = make_case(rec)
                ref = oracle(case.q, case.k, case.v, **case.options())
                for kind, (variant, blk) in KINDS.items():
                    if kind == "naive":
                        if dtype == "fp16" and score_magnitude(case) >= 65504:
                            continue
                        o, _ = naive_numpy(case.q, case.k, case.v, **case.options())
                    else:
                        o, _ = online_attention(
                            case.q,
                            case.k,
                            case.v,
                            variant=variant,
                            policy=PrecisionPolicy.flash(dtype),
                            block_k=blk,
                            **case.options(),
                        )
                    b = error_bounds(
                        case.q, case.k, case.v, arithmetic=kind, key_block=blk, **case.options()
                    )
                    err = np.abs((o.astype(np.float64) - ref.o.hi) - ref.o.lo)
                    pos = b.o.det > 0
                    ud = float((err[pos] / b.o.det[pos]).max(initial=0.0))
                    up = float((err[pos] / b.o.prob[pos]).max(initial=0.0))
                    stats[(kind, dtype, fam)].append((ud, up))
    print("| class | dtype | family | cases | det util max | det util median | prob util max |")
    print("|---|---|---|---|---|---|---|")
    for (kind, dtype, fam), vals in sorted(stats.items()):
        a = np.array(vals)
        print(
            f"| {kind} | {dtype} | {fam} | {len(a)} | {a[:, 0].max():.3g} | "
            f"{np.median(a[:, 0]):.3g} | {a[:, 1].max():.3g} |"
        )
    allv = np.array([v for vals in stats.values() for v in vals])
    print(
        f"\noverall: {len(allv)} kernel runs, max det utilization {allv[:, 0].max():.3g}, "
        f"max prob utilization {allv[:, 1].max():.3g}"
    )


if __name__ == "__main__":
    main()
