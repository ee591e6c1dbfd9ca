"""The soft-capped forward with the cap's product fused into the exponent against the unfused
form, on one CUDA GPU (issue "soft-capping and sinks": capped / plain within 10 %).

    python benchmarks/gpu_cap_fma.py [--reps 30] [--sizes 1024,4096,16384] [--cap 2.0]

bf16, d = 128, H = 16, B·N = 16K, ``approx_tanh=True``. Per shape (N, causal), interleaved
(CUDA events, medians, order shuffled each round): the plain forward on its own tile; the
capped forward fused (caps up to ``CAP_FMA_MAX``, the default) and unfused (the form caps above
it take, forced here by lowering ``CAP_FMA_MAX`` around the launch) on the capped tile; and
fused on the plain forward's tile. Both capped outputs are checked against float64 attention
on 256 rows of every head (floored bf16 ulps of O, LSE's relative error). Prints each shape as
it goes and a table of times over the plain forward last.

Prediction (written before the first GPU run, from the sm_90 SASS of Triton 3.6 on the CPU
machine, ``python benchmarks/ptx_count.py --sass --softcap yes --approx-tanh --tile
64,64,4,3,tma`` with and without ``--no-cap-fma``): the capped key loop goes from 13.88 to
13.00 instructions a score (plain 11.94), so the capped forward from 1.10–1.11× plain to about
1.06–1.08× without a mask at N ≥ 4K, and 2–4 % faster than the unfused form everywhere.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_softcap_speed import check_capped
from probe_softcap_configs import bench_inputs  # the shapes and inputs of the other probes

from flashcheck.harness.bench.timing import time_interleaved
from flashcheck.kernels import triton_flash as tf

ON_PLAIN = "fused, plain's tile"


def unfused(fn):
    """``fn`` run with the fusion off (every cap above ``CAP_FMA_MAX``)."""

    def run():
        keep = tf.CAP_FMA_MAX
        tf.CAP_FMA_MAX = 0.0
        try:
            return fn()
        finally:
            tf.CAP_FMA_MAX = keep

    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sizes", default="1024,4096,16384")
    ap.add_argument("--cap", type=float, default=2.0)
    args = ap.parse_args(argv)
    import torch

    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    rows, failed = [], 0
    for n in (int(x) for x in args.sizes.split(",")):
        q, k, v = bench_inputs(n, 3)
        d = q.shape[-1]
        for causal in (False, True):
            opts = {"causal": causal, "window": None, "scale": d**-0.5, "allow_tf32": False}
            cap = {"softcap": args.cap, "approx_tanh": True}
            plain_cfg = tf.launch_config(q, k, v, causal=causal)
            fns = {
                "plain": partial(tf.launch, q, k, v, **opts),
                "fused": partial(tf.launch, q, k, v, **opts, **cap),
                "unfused": unfused(partial(tf.launch, q, k, v, **opts, **cap)),
                ON_PLAIN: partial(tf.launch, q, k, v, **opts, **cap, config=plain_cfg),
            }
            check_rows = torch.randperm(n, generator=torch.Generator().manual_seed(n))[:256]
            errs = {}
            for name in ("fused", "unfused", ON_PLAIN):
                out = fns[name]()
                regs = tf.last_compiled()
                ulps, lse_err = check_capped(out, q, k, v, args.cap, causal, check_rows.cuda())
                errs[name] = (ulps, lse_err, regs.n_regs, regs.n_spills)
                failed += ulps > 2 or lse_err > 1e-4 or not torch.isfinite(out[0]).all().item()
            ms = dict(zip(fns, time_interleaved(list(fns.values()), reps=args.reps), strict=True))
            rows.append((n, causal, ms))
            line = (
                f"N={n} causal={causal} plain {ms['plain']:.3f} ms; over plain: "
                + ", ".join(f"{k} {t / ms['plain']:.3f}" for k, t in ms.items() if k != "plain")
                + "; O ulps / LSE err / regs / spills: "
                + ", ".join(
                    f"{k} {e[0]:.2f} / {e[1]:.1e} / {e[2]} / {e[3]}" for k, e in errs.items()
                )
            )
            print(line, flush=True)
    print("\n| N | causal | plain ms | fused / plain | unfused / plain | fused / unfused "
          "| fused on plain's tile / plain |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for n, causal, ms in rows:
        p = ms["plain"]
        print(
            f"| {n} | {'yes' if causal else 'no'} | {p:.3f} | {ms['fused'] / p:.3f} "
            f"| {ms['unfused'] / p:.3f} | {ms['fused'] / ms['unfused']:.3f} "
            f"| {ms[ON_PLAIN] / p:.3f} |"
        )
    print(f"\noutputs outside 2 floored ulps / 1e-4 LSE: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
