"""The forward's launch table against other tiles and the Triton tutorial, on one CUDA GPU.

    python benchmarks/gpu_tile_race.py [--reps 30] [--sizes 4096,16384,1024]
        [--cases fp16:128:1,fp16:64:0,fp16:64:1] [--tutorial MODULE:FUNCTION] [--json FILE]
        [--candidates tiles|none] [--peers] [--control]

Per shape (dtype, d, causal, N; H = 16, B·N = 16K, N(0, 1) inputs): the table's configuration
(``own``, kernels/triton_flash.py's ``launch_config``), each candidate of :data:`CANDIDATES`
for that head dim and causality (none with ``--candidates none``), with ``--tutorial`` the
Triton tutorial's forward (fp16), with ``--peers`` SDPA's flash and cuDNN backends and with
``--control`` the table's configuration a second time (its ratio to itself is the method's
bias), all timed interleaved (CUDA events, medians of ``--reps`` rounds after warm-up). Every
output is checked against fp64 attention at 256 query rows of every head (O in floored ulps of
the input format), and this kernel's against the table's bit for bit ("other bits" in the
table where they differ). Prints each shape's ratios as it goes and a table last: time over
``own``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
from pathlib import Path

from flashcheck.kernels.triton_flash import LaunchConfig as C

# Candidates by (head-dim bucket, causal): the tutorial's H200 picks and their neighbours.
CANDIDATES = {
    (128, False): {
        "128x64 w4 s2 tma": C(128, 64, 4, 2, tma=True),
        "128x64 w4 s3 tma": C(128, 64, 4, 3, tma=True),
        "256x64 w16 s3": C(256, 64, 16, 3),
    },
    (128, True): {
        "128x64 w4 s2 tma": C(128, 64, 4, 2, tma=True),
        "128x64 w4 s3 tma": C(128, 64, 4, 3, tma=True),
        "128x128 w8 s2 tma": C(128, 128, 8, 2, tma=True),
    },
    (64, False): {
        "128x64 w4 s3 tma": C(128, 64, 4, 3, tma=True),
        "128x64 w4 s2 tma": C(128, 64, 4, 2, tma=True),
        "128x64 w4 s3": C(128, 64, 4, 3),
        "128x128 w8 s3 tma": C(128, 128, 8, 3, tma=True),
    },
    (64, True): {
        "64x64 w4 s2 tma": C(64, 64, 4, 2, tma=True),
        "64x64 w4 s3 tma": C(64, 64, 4, 3, tma=True),
        "128x64 w4 s3 tma": C(128, 64, 4, 3, tma=True),
        "128x64 w4 s2 tma": C(128, 64, 4, 2, tma=True),
        "128x64 w4 s3": C(128, 64, 4, 3),
        "128x128 w8 s3 tma": C(128, 128, 8, 3, tma=True),
    },
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sizes", default="4096,16384,1024")
    ap.add_argument("--cases", default="fp16:128:1,fp16:64:0,fp16:64:1")
    ap.add_argument("--tutorial", default="", help="MODULE:FUNCTION of the tutorial's forward")
    ap.add_argument("--json", default="")
    ap.add_argument(
        "--candidates", choices=["tiles", "none"], default="tiles",
        help="the tile candidates, or none (the table's configuration and its peers)",
    )  # fmt: skip
    ap.add_argument(
        "--peers", action="store_true", help="also time SDPA's flash and cuDNN backends in turn"
    )
    ap.add_argument(
        "--control", action="store_true",
        help="time the table's configuration twice: its ratio to itself shows the method's bias",
    )  # fmt: skip
    args = ap.parse_args(argv)
    import torch

    tut = None
    if args.tutorial:
        mod, fn = args.tutorial.split(":")
        tut = getattr(importlib.import_module(mod), fn)
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16}
    shapes = [
        (dts[c.split(":")[0]], int(c.split(":")[1]), c.split(":")[2] == "1", int(n))
        for n in args.sizes.split(",")
        for c in args.cases.split(",")
    ]
    rows: list[dict] = []
    try:
        for shape in shapes:
            rows.append(race(shape, args.reps, tut, args.candidates, args.peers, args.control))
            r = rows[-1]
            print(json.dumps(r), flush=True)
    except KeyboardInterrupt:
        print("interrupted: the table holds the shapes measured so far", flush=True)
    print("\n| dtype, d | causal | N | own tile | own TFLOP/s | time over own (candidates) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        own = r["ms"]["own"]
        others = "; ".join(
            f"{k} {t / own:.3f} ({r['ulps'][k]:.2f} ulps"
            + ("" if r["same_bits_as_own"][k] or k.startswith(("sdpa", "tut")) else ", other bits")
            + ")"
            for k, t in r["ms"].items()
            if k != "own"
        )
        print(
            f"| {r['dtype']}, {r['d']} | {'yes' if r['causal'] else 'no'} | {r['n']} | "
            f"{r['tile']} | {r['own_tflops']:.0f} | {others} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def race(
    shape, reps: int, tut, candidates: str = "tiles", peers: bool = False, control: bool = False
) -> dict:
    import torch

    from flashcheck.harness.bench.timing import time_interleaved
    from flashcheck.kernels import triton_flash as tf

    dtype, d, causal, n = shape
    b, h = max(1, 16384 // n), 16
    g = torch.Generator(device="cuda").manual_seed(n + d)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    own = tf.launch_config(q, k, v, causal=causal)
    scale = 1.0 / math.sqrt(d)

    def run(cfg):
        return tf.launch(
            q, k, v, causal=causal, window=None, scale=scale, allow_tf32=False, config=cfg
        )[0]

    variants = {"own": lambda: run(own)}
    if control:
        variants["own again"] = lambda: run(own)
    key = (64 if d <= 64 else 128, causal)
    pool = {} if candidates == "none" else dict(CANDIDATES[key])
    for name, cfg in pool.items():
        variants[name] = lambda cfg=cfg: run(cfg)
    if peers:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        for name, backend in (("sdpa-flash", SDPBackend.FLASH_ATTENTION),
                              ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION)):  # fmt: skip

            def call(backend=backend):
                with sdpa_kernel([backend]):
                    return sdpa(q, k, v, is_causal=causal, scale=scale)

            variants[name] = call
    if tut is not None and dtype == torch.float16:
        variants["tutorial"] = lambda: tut(q, k, v, causal=causal)
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(n))[:256].sort().values
    rows = rows.to("cuda")
    s = q[:, :, rows].double() @ k.double().transpose(-1, -2) * scale
    if causal:
        cols = torch.arange(n, device="cuda")
        s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))
    p = torch.softmax(s, -1)
    o_ref, w = p @ v.double(), p @ v.double().abs()
    bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(o_ref.abs(), w).clamp_min(1e-30))) - bits)
    ulps, same = {}, {}
    first = variants["own"]()
    for name, f in variants.items():
        out = f()
        ulps[name] = ((out[:, :, rows].double() - o_ref).abs() / ulp).max().item()
        same[name] = bool(torch.equal(out, first))
    ms = time_interleaved(list(variants.values()), reps=reps)
    flops = 4 * b * h * n * n * d / (2 if causal else 1)
    return {
        "dtype": str(dtype).split(".")[-1], "d": d, "causal": causal, "n": n,
        "tile": f"{own.block_m}x{own.block_n} w{own.warps} s{own.stages}"
        + (" tma" if own.tma else ""),
        "own_tflops": flops / ms[0] / 1e9, "ms": dict(zip(variants, ms, strict=True)),
        "ulps": ulps, "same_bits_as_own": same,
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
