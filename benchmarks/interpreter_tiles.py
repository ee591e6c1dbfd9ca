"""Seconds the Triton interpreter takes for the first report cases, by tile size.

    TRITON_INTERPRET=1 python benchmarks/interpreter_tiles.py [--cases 8]

Runs the Triton kernel (CPU, under the interpreter) on the first ``--cases`` fp16 grid cases of
the ``cpu`` report preset with each launch configuration and prints one line per tile size:
what chose the interpreter's default tiles (kernels/triton_flash.py, ``portable_config``).
"""

from __future__ import annotations

import argparse
import os
import time

from flashcheck.harness.campaign.plan import PRESETS, plan_items
from flashcheck.harness.cases.families import make_case
from flashcheck.kernels.triton_flash import LaunchConfig, launch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        raise SystemExit("set TRITON_INTERPRET=1: this measures the CPU interpreter")
    items = [it for it in plan_items(PRESETS["cpu"], ["fp16"], 0) if it.part == "grid"]
    cases = [make_case(it.recipe) for it in items[: args.cases]]
    print("| BLOCK_M x BLOCK_N | seconds |\n|---|---|")
    for bm, bn in ((16, 16), (32, 32), (64, 32), (64, 64)):
        cfg = LaunchConfig(bm, bn, 4, 1)
        t0 = time.perf_counter()
        for c in cases:
            q, k, v = c.to_torch()
            scale = c.scale if c.scale is not None else c.shape[5] ** -0.5
            win = None if c.window is None else tuple(-1 if x is None else x for x in c.window)
            launch(q, k, v, causal=c.causal, window=win, scale=scale, allow_tf32=False, config=cfg)
        print(f"| {bm} x {bn} | {time.perf_counter() - t0:.2f} |")


if __name__ == "__main__":
    main()
