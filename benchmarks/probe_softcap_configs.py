"""Which launch configuration suits the soft-capped forward with the approximate tanh, on one
Hopper GPU (a probe for the option's cost, issue "soft-capping and sinks").

    python benchmarks/probe_softcap_configs.py [--reps 20] [--shapes 4096:0,16384:0,16384:1]
        [--only 'NAME;NAME']

bf16, d = 128, H = 16, B·N = 16K. Per shape (N:causal): the plain forward with its own
configuration (the tables of kernels/triton_flash.py), then the capped forward (cap 2.0,
``approx_tanh=True``) with that configuration and with each candidate of :data:`CANDIDATES`,
all interleaved (CUDA events, medians). Prints each candidate's time over the plain one as it
goes, and a table last. A candidate that fails to compile or run is listed with its error.
Outputs are not checked here (benchmarks/gpu_softcap_approx.py checks the default's).
"""

from __future__ import annotations

import argparse
from functools import partial

from flashcheck.harness.bench.timing import time_interleaved
from flashcheck.kernels.triton_flash import LaunchConfig as C
from flashcheck.kernels.triton_flash import launch, launch_config

CANDIDATES = {
    "128x64 w8 s3": C(128, 64, 8, 3),
    "128x64 w8 s2": C(128, 64, 8, 2),
    "128x128 w8 s3": C(128, 128, 8, 3),
    "256x64 w8 s3": C(256, 64, 8, 3),
    "256x64 w16 s3": C(256, 64, 16, 3),
    "128x64 w8 s3 tma pre": C(128, 64, 8, 3, tma=True, prefetch=True),
    "128x128 w8 s3 tma": C(128, 128, 8, 3, tma=True),
    "128x64 w8 s2 r128": C(128, 64, 8, 2, maxnreg=128),
    "64x64 w4 s3 tma": C(64, 64, 4, 3, tma=True),
    "128x64 w4 s3 tma": C(128, 64, 4, 3, tma=True),
    "128x64 w8 s3 tma": C(128, 64, 8, 3, tma=True),
    "128x128 w8 s2 tma": C(128, 128, 8, 2, tma=True),
    "128x64 w8 s2 tma r128": C(128, 64, 8, 2, tma=True, maxnreg=128),
    "64x64 w4 s4 tma": C(64, 64, 4, 4, tma=True),
    "64x128 w4 s2 tma": C(64, 128, 4, 2, tma=True),
    "64x64 w4 s3": C(64, 64, 4, 3),
    "64x64 w4 s3 tma r168": C(64, 64, 4, 3, tma=True, maxnreg=168),
    "64x64 w4 s2 tma": C(64, 64, 4, 2, tma=True),
    "64x128 w4 s3 tma": C(64, 128, 4, 3, tma=True),
}


def bench_inputs(n: int, count: int) -> list:
    """``count`` bf16 tensors of shape (B, 16, n, 128), B·n = 16K, N(0, 1), seeded by n."""
    import torch

    b, h, d = max(1, 16384 // n), 16, 128
    g = torch.Generator(device="cuda").manual_seed(n)
    return [
        torch.randn(b, h, n, d, device="cuda", generator=g, dtype=torch.bfloat16)
        for _ in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="4096:0,16384:0,16384:1")
    ap.add_argument(
        "--only", default="", help="candidates to try, by name: 'NAME;NAME' (default: all)"
    )
    args = ap.parse_args(argv)
    import torch

    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for spec in args.shapes.split(","):
        n, causal = int(spec.split(":")[0]), spec.split(":")[1] == "1"
        q, k, v = bench_inputs(n, 3)
        d = q.shape[-1]
        opts = {"causal": causal, "window": None, "scale": d**-0.5, "allow_tf32": False}
        own = launch_config(q, k, v, causal=causal)
        fns = [partial(launch, q, k, v, **opts)]
        names = []
        picked = {k: c for k, c in CANDIDATES.items() if not args.only or k in args.only.split(";")}
        for name, cfg in {"own": own, **picked}.items():
            try:
                launch(q, k, v, **opts, config=cfg, softcap=2.0, approx_tanh=True)
                torch.cuda.synchronize()
            except Exception as exc:  # a candidate that does not compile is reported
                print(f"N={n} causal={causal} {name}: {type(exc).__name__}: {exc}", flush=True)
                continue
            names.append(name)
            fns.append(partial(launch, q, k, v, **opts, config=cfg, softcap=2.0, approx_tanh=True))
        ms = time_interleaved(fns, reps=args.reps)
        for name, t in zip(names, ms[1:], strict=True):
            rows.append((n, causal, name, ms[0], t))
            print(f"N={n} causal={causal} {name}: capped/plain {t / ms[0]:.3f}", flush=True)
    print("\n| N | causal | capped config | plain ms | capped ms | capped/plain |")
    print("|---|---|---|---|---|---|")
    for n, causal, name, p, t in rows:
        print(f"| {n} | {'yes' if causal else 'no'} | {name} | {p:.3f} | {t:.3f} | {t / p:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
