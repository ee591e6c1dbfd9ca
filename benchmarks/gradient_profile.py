"""Where the time of a campaign's gradient part goes, case by case (run it before shrinking or
parallelising that part).

For each gradient case of a preset and dtype, and each kernel: the case as fitted to the
kernel's contract, the reference work for it (gradient oracle, naive backward, every class's
gradient bounds; once per distinct fitted case) and the kernel's backward, first call (compiles
included) and second call. Prints one table; stops starting new cases after ``--budget``
seconds.

    python benchmarks/gradient_profile.py --preset gpu --dtype fp16 \\
        --kernel sdpa-flash --kernel naive-torch --device cuda
"""

from __future__ import annotations

import argparse
import time

from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.campaign.executor import compute_gradient_reference
from flashcheck.harness.campaign.plan import PRESETS, fit_recipe, gradient_items
from flashcheck.harness.cases.families import make_case


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="gpu", choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--kernel", action="append", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=300.0, help="seconds")
    args = ap.parse_args()
    kernels = {s: resolve(s) for s in args.kernel}
    t_start = time.perf_counter()
    refs: dict = {}
    rows = []
    for item in gradient_items(PRESETS[args.preset], args.dtype, args.seed):
        if time.perf_counter() - t_start > args.budget:
            print(f"budget of {args.budget:.0f} s spent: later cases not profiled", flush=True)
            break
        for spec, kern in kernels.items():
            recipe = fit_recipe(item.recipe, kern)
            case = make_case(recipe)
            shape = f"{recipe.b}x{recipe.hq}/{recipe.hk} {recipe.nq}x{recipe.nk} d={recipe.d}"
            if recipe not in refs:
                t0 = time.perf_counter()
                ref = compute_gradient_reference(recipe)
                refs[recipe] = (time.perf_counter() - t0, ref.seconds)
            ref_total, oracle_s = refs[recipe]
            why = kern.backward_supports(case, args.device)
            calls = []
            if why is None:
                for _ in range(2):
                    t0 = time.perf_counter()
                    try:
                        kern.run_backward(case, args.device)
                    except Exception as exc:  # a profile reports the error and goes on
                        why = f"{type(exc).__name__}: {str(exc)[:60]}"
                        break
                    calls.append(time.perf_counter() - t0)
            rows.append((item.tag, spec, shape, ref_total, oracle_s, calls, why))
            first = f"{calls[0]:.2f}" if calls else "-"
            second = f"{calls[1]:.3f}" if len(calls) > 1 else "-"
            print(
                f"{item.tag:16} {spec:15} {shape:26} reference {ref_total:6.1f} s "
                f"(oracle {oracle_s:5.1f}) backward {first} / {second} s"
                + (f"  [{why}]" if why else ""),
                flush=True,
            )
    print("\n| case | kernel | shape | reference s | oracle s | backward 1st s | 2nd s |")
    print("|---|---|---|---|---|---|---|")
    for tag, spec, shape, ref_total, oracle_s, calls, why in rows:
        first = f"{calls[0]:.2f}" if calls else (why or "-")
        second = f"{calls[1]:.3f}" if len(calls) > 1 else "-"
        print(
            f"| {tag} | {spec} | {shape} | {ref_total:.1f} | {oracle_s:.1f} | {first} | {second} |"
        )
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
