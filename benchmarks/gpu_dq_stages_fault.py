"""Which backward tiles with TMA-descriptor loads fault on one Hopper GPU, one process each.

    python benchmarks/gpu_dq_stages_fault.py [--n 4096] [--only NAME]

On an H200 (Triton 3.6) the dQ kernel with descriptor loads at two pipeline stages stopped the
process with "unspecified launch failure" at some tiles (benchmarks/RESULTS.md). A fault
poisons the CUDA context, so every variant runs in a child process (``CUDA_LAUNCH_BLOCKING=1``,
so the failing launch is the one reported) and the parent prints one line per variant: ok and
whether dQ, dK, dV are bitwise those of the pointer loads at the same tiles, or the error's
last line. The launcher refuses the faulting class (``check_config``); this probe lifts that
refusal. bf16, d = 128, H = 16, B·N = 16K (the probes' inputs). A variant is
``dq|dkdv:m,n,warps,stages[:split=0][:cap][:causal]``; the other kernel keeps the tile that
``backward_config(..., tma=True)`` picks.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

VARIANTS = [
    "dq:64,32,4,2",
    "dq:64,32,4,2:split=0",
    "dq:64,32,4,2:causal",
    "dq:64,64,4,2",
    "dq:64,64,4,2:cap",
    "dq:64,64,4,2:split=0:cap",
    "dq:128,32,4,2",
    "dq:64,32,4,3",
    "dq:128,64,8,2",
    "dkdv:64,64,4,2",
    "dkdv:64,64,4,2:cap:causal",
    "dkdv:64,32,4,2",
]


def child(variant: str, n: int) -> int:
    import torch
    from probe_softcap_configs import bench_inputs

    from flashcheck.kernels import triton_flash_bwd as fb
    from flashcheck.kernels.triton_flash import flash_attention

    # The launcher refuses the configs that faulted here (check_config); this probe is what
    # found them, so it lifts the refusal to run them again.
    fb.check_config = lambda cfg, *, fused: None
    kernel, tile, *flags = variant.split(":")
    m, bn, w, s = (int(x) for x in tile.split(","))
    cap = 2.0 if "cap" in flags else None
    causal = "causal" in flags
    q, k, v, do = bench_inputs(n, 4)
    o, lse = flash_attention(q, k, v, causal=causal, softcap=cap, approx_tanh=cap is not None)
    cfg = fb.backward_config(128, 128, 2, approx_cap=cap is not None, causal=causal, tma=True)
    if kernel == "dq":
        cfg = cfg._replace(dq_block_m=m, dq_block_n=bn, dq_warps=w, dq_stages=s)
    else:
        cfg = cfg._replace(block_m=m, block_n=bn, warps=w, stages=s)
    if "split=0" in flags:
        cfg = cfg._replace(split=False)

    def grads(c):
        out = fb.launch_backward(
            q, k, v, o, lse, do, causal=causal, window=None, scale=128**-0.5,
            allow_tf32=False, config=c, softcap=cap, approx_tanh=cap is not None,
        )  # fmt: skip
        torch.cuda.synchronize()
        return out

    ref = grads(cfg._replace(tma=False))
    got = grads(cfg)
    same = all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    print(f"ok, {'same bits as the pointer loads' if same else 'DIFFERENT bits'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--only", default="", help="one variant (runs it in this process)")
    args = ap.parse_args(argv)
    if args.only:
        return child(args.only, args.n)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    rows = []
    for variant in VARIANTS:
        run = subprocess.run(
            [sys.executable, __file__, "--n", str(args.n), "--only", variant],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        lines = [x for x in (run.stdout + run.stderr).splitlines() if "CUDAEvent" not in x]
        what = lines[-1] if lines else "(no output)"
        rows.append(f"| {variant} | {'ok' if run.returncode == 0 else 'FAIL'} | {what[:110]} |")
        print(rows[-1], flush=True)
    print(f"\nN = {args.n}\n| variant | run | last line |\n|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
