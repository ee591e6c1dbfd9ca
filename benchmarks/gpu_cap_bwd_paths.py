"""The soft-capped backward on its two paths, on one CUDA GPU: the bitwise reproducible two-kernel
path (``deterministic=True``, the default, what ``flashcheck bench`` times as ``triton``) and
the fused one (``deterministic=False``: dQ by fp32 atomic adds inside the dK/dV program), plain
and capped, side by side.

    python benchmarks/gpu_cap_bwd_paths.py [--reps 20] [--sizes 4096,16384]

bf16, d = 128, H = 16, B·N = 16K, cap 2 with ``approx_tanh=True``. Per shape (N, causal) the
four backwards (plain and capped, each on both paths) are timed interleaved (CUDA events around
``flash_attention_backward``, medians, order shuffled each round). The fused path computes the
tanh once per score where the two kernels compute it twice; the question is whether that pays
for its atomic adds and its fifth product when capped (plain it ran 15-35 % slower). Each
fused result is compared with the two-kernel one of the same variant (largest difference over
the largest magnitude, per gradient): the two-kernel path is the one the bench checks against
the oracle. Prints a table last.

Prediction (before the first GPU run): capped fused / capped two-kernel 1.00-1.15, so not a
way to the 10 % goal.
"""

from __future__ import annotations

import argparse
from functools import partial

from probe_softcap_configs import bench_inputs  # the shapes and inputs of the other probes

from flashcheck.harness.bench.timing import time_interleaved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--sizes", default="4096,16384")
    args = ap.parse_args(argv)
    import torch

    from flashcheck.kernels.triton_flash import flash_attention
    from flashcheck.kernels.triton_flash_bwd import flash_attention_backward

    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        q, k, v, do = bench_inputs(n, 4)
        for causal in (False, True):
            fns, outs = {}, {}
            for cap in (None, 2.0):
                opts = {"causal": causal, "softcap": cap, "approx_tanh": cap is not None}
                o, lse = flash_attention(q, k, v, **opts)
                for det in (True, False):
                    name = f"{'capped' if cap else 'plain'} {'two-kernel' if det else 'fused'}"
                    fns[name] = partial(
                        flash_attention_backward, q, k, v, o, lse, do, **opts, deterministic=det
                    )
                    outs[name] = fns[name]()
            diffs = {}
            for var in ("plain", "capped"):
                a, f = outs[f"{var} two-kernel"], outs[f"{var} fused"]
                diffs[var] = [
                    ((x.float() - y.float()).abs().max() / x.float().abs().max()).item()
                    for x, y in zip(a, f, strict=True)
                ]
            ms = dict(zip(fns, time_interleaved(list(fns.values()), reps=args.reps), strict=True))
            rows.append((n, causal, ms))
            print(
                f"N={n} causal={causal} "
                + ", ".join(f"{k} {t:.3f} ms" for k, t in ms.items())
                + "; fused vs two-kernel dQ/dK/dV: "
                + "; ".join(f"{k} " + "/".join(f"{x:.1e}" for x in v) for k, v in diffs.items()),
                flush=True,
            )
    print(
        "\n| N | causal | plain two-kernel ms | plain fused / two-kernel | capped two-kernel / "
        "plain two-kernel | capped fused / capped two-kernel | capped fused / plain fused |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, causal, ms in rows:
        p2, pf = ms["plain two-kernel"], ms["plain fused"]
        c2, cf = ms["capped two-kernel"], ms["capped fused"]
        print(
            f"| {n} | {'yes' if causal else 'no'} | {p2:.3f} | {pf / p2:.3f} | {c2 / p2:.3f} "
            f"| {cf / c2:.3f} | {cf / pf:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
