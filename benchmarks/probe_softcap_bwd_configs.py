"""Which backward tiles suit the soft-capped backward with the approximate tanh, on one Hopper
GPU (a probe for the option's cost, issue "soft-capping and sinks").

    python benchmarks/probe_softcap_bwd_configs.py [--reps 15] [--shapes 4096:0,16384:0,16384:1]

bf16, d = 128, H = 16, B·N = 16K. Per shape (N:causal): the plain deterministic backward with
its own tiles, then the capped one (cap 2.0, ``approx_tanh=True``) with those tiles and with
each candidate of :data:`CANDIDATES`, interleaved (CUDA events, medians); the forward's O and
LSE come from one call each. Prints capped / plain per candidate, a table last. Gradients are
not checked here (benchmarks/gpu_softcap_approx.py checks the default's forward; the GPU tests
the backward's).
"""

from __future__ import annotations

import argparse
from functools import partial

from probe_softcap_configs import bench_inputs  # the same shapes and inputs as the forward's

from flashcheck.harness.bench.timing import time_interleaved
from flashcheck.kernels.triton_flash import flash_attention
from flashcheck.kernels.triton_flash_bwd import BackwardConfig as B
from flashcheck.kernels.triton_flash_bwd import backward_config, launch_backward

CANDIDATES = {
    "32x64 w8 s3 / dq 128x32 w8": B(32, 64, 8, 3, True, 128, 32, 8, 3),
    "64x64 w4 s3 / dq 128x64 w4": B(64, 64, 4, 3, True, 128, 64, 4, 3),
    "32x128 w8 s3 / dq 128x32 w8": B(32, 128, 8, 3, True, 128, 32, 8, 3),
    "64x128 w8 s2 / dq 128x64 w8 s2": B(64, 128, 8, 2, True, 128, 64, 8, 2),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--shapes", default="4096:0,16384:0,16384:1")
    args = ap.parse_args(argv)
    import torch

    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for spec in args.shapes.split(","):
        n, causal = int(spec.split(":")[0]), spec.split(":")[1] == "1"
        q, k, v, do = bench_inputs(n, 4)
        d = q.shape[-1]
        opts = {"causal": causal, "window": None, "scale": d**-0.5, "allow_tf32": False}
        o, lse = flash_attention(q, k, v, causal=causal)
        oc, lsec = flash_attention(q, k, v, causal=causal, softcap=2.0, approx_tanh=True)
        fns = [partial(launch_backward, q, k, v, o, lse, do, **opts)]
        names = []
        cap = {"softcap": 2.0, "approx_tanh": True}
        for name, cfg in {"own": backward_config(d, d, 2), **CANDIDATES}.items():
            fn = partial(launch_backward, q, k, v, oc, lsec, do, **opts, config=cfg, **cap)
            try:
                fn()
                torch.cuda.synchronize()
            except Exception as exc:  # a candidate that does not compile is reported
                print(f"N={n} causal={causal} {name}: {type(exc).__name__}: {exc}", flush=True)
                continue
            names.append(name)
            fns.append(fn)
        ms = time_interleaved(fns, reps=args.reps)
        for name, t in zip(names, ms[1:], strict=True):
            rows.append((n, causal, name, ms[0], t))
            print(f"N={n} causal={causal} {name}: capped/plain {t / ms[0]:.3f}", flush=True)
    print("\n| N | causal | capped backward tiles | plain ms | capped ms | capped/plain |")
    print("|---|---|---|---|---|---|")
    for n, causal, name, p, t in rows:
        print(f"| {n} | {'yes' if causal else 'no'} | {name} | {p:.3f} | {t:.3f} | {t / p:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
