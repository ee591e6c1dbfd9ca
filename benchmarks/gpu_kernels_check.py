"""GPU check of the Triton kernel: correctness grid against the oracle, then a first speed figure.

    python benchmarks/gpu_kernels_check.py          # on a machine with a CUDA GPU

1. For fp16, bf16, fp32 (IEEE dots) and fp32 with tf32 dots, on a grid with ragged lengths,
   Nq != Nk both ways, causal (with fully masked rows), sliding windows, GQA/MQA and odd head
   dims: the kernel's max floored-ULP error on sampled rows against the oracle, the same-
   precision naive (torch) error on the same rows, and the SPEC 3.4 empirical verdict
   (kernel ≤ 2 × naive + 1 ulp of W).
2. Forward TFLOP/s at bf16, d = 128, N = 4096, B·N = 16384, 16 heads, causal and not: the Triton
   kernel and torch SDPA's flash backend in the same run (CUDA events, 10 warm-up runs, median
   of 30), 4·N²·d FLOPs per head, halved for causal.
Prints the tables last.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.harness.bench.timing import time_cuda
from flashcheck.harness.cli import environment
from flashcheck.harness.core.formats import BF16, FP16, FP32
from flashcheck.harness.judging.metrics import floored_ulp_error
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_torch
from flashcheck.kernels.triton_flash import flash_attention

GRID = [
    # (B, Hq, Hk, Nq, Nk, d, dv, causal, window)
    (2, 4, 2, 33, 47, 40, 40, True, None),
    (1, 2, 1, 300, 117, 72, 72, True, None),
    (1, 2, 2, 129, 1025, 59, 59, False, (64, 16)),
    (1, 3, 1, 1023, 1023, 111, 111, True, None),
    (2, 8, 8, 1000, 3000, 128, 128, False, None),
    (1, 4, 2, 513, 2049, 256, 256, True, None),
    (1, 2, 2, 64, 4096, 96, 64, False, None),
]
DTYPES = [
    ("fp16", torch.float16, FP16, False),
    ("bf16", torch.bfloat16, BF16, False),
    ("fp32", torch.float32, FP32, False),
    ("fp32+tf32", torch.float32, FP32, True),
]


def check(seed: int = 0) -> list[tuple]:
    rows_out = []
    for name, dt, fmt, tf32 in DTYPES:
        for shape in GRID:
            b, hq, hk, nq, nk, d, dv, causal, window = shape
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(b, hq, nq, d, generator=g).to(dt)
            k = torch.randn(b, hk, nk, d, generator=g).to(dt)
            v = torch.randn(b, hk, nk, dv, generator=g).to(dt)
            rows = np.unique(np.linspace(0, nq - 1, min(nq, 24)).astype(int))
            o, lse = flash_attention(
                q.cuda(), k.cuda(), v.cuda(), causal=causal, window=window, allow_tf32=tf32
            )
            # the same-precision reference of the same arithmetic class: tf32 GEMMs for tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            n, _ = naive_torch(q.cuda(), k.cuda(), v.cuda(), causal=causal, window=window)
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.cuda.synchronize()
            ref = oracle(q, k, v, causal=causal, window=window, rows=rows)
            ok_nan = not torch.isnan(o).any().item()
            o_r = o[:, :, rows].double().cpu().numpy()
            n_r = n[:, :, rows].double().cpu().numpy()
            e = floored_ulp_error(o_r, ref.o.hi, ref.o.lo, ref.o.floor, fmt).max()
            en = floored_ulp_error(n_r, ref.o.hi, ref.o.lo, ref.o.floor, fmt).max()
            live = np.isfinite(ref.lse.hi)
            lse_r = lse[:, :, rows].cpu().numpy()
            lse_ok = np.array_equal(np.isneginf(lse_r), ~live)
            lse_err = float(np.max(np.abs(lse_r[live] - ref.lse.hi[live]))) if live.any() else 0.0
            verdict = "PASS" if (ok_nan and lse_ok and e <= 2 * en + 1.0) else "FAIL"
            rows_out.append((name, shape, e, en, lse_err, verdict))
            print(
                f"{name} {shape}: err {e:.3f} naive {en:.3f} lse {lse_err:.2e} {verdict}",
                flush=True,
            )
    return rows_out


def timed(fn, warmup: int = 10, reps: int = 30) -> float:
    """Median seconds of ``fn()`` (CUDA events; ``flashcheck.harness.bench.timing``)."""
    return time_cuda(fn, [()], warmup=warmup, reps=reps).median_ms / 1e3


def speed() -> list[tuple]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    n, d, h = 4096, 128, 16
    b = 16384 // n
    for causal in (False, True):
        qs = [torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        ks = [torch.randn_like(qs[0]) for _ in range(3)]
        vs = [torch.randn_like(qs[0]) for _ in range(3)]
        it = [0]

        def ours(qs=qs, ks=ks, vs=vs, it=it, causal=causal):
            i = it[0] = (it[0] + 1) % 3  # rotate inputs so caches do not flatter
            flash_attention(qs[i], ks[i], vs[i], causal=causal)

        def sdpa(qs=qs, ks=ks, vs=vs, it=it, causal=causal):
            i = it[0] = (it[0] + 1) % 3
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(
                    qs[i], ks[i], vs[i], is_causal=causal
                )

        flops = 4 * n * n * d * b * h / (2 if causal else 1)
        t_ours, t_sdpa = timed(ours), timed(sdpa)
        out.append((causal, flops / t_ours / 1e12, flops / t_sdpa / 1e12))
    return out


def main() -> int:
    env = environment()
    env["gpu"] = torch.cuda.get_device_name()
    print("environment:", ", ".join(f"{k} {v}" for k, v in env.items()))
    res = check()
    sp = speed()
    print(
        "\n| dtype | (B, Hq, Hk, Nq, Nk, d, dv, causal, window) | max floored ulp (Triton) "
        "| max floored ulp (naive same precision) | max abs LSE err | verdict |"
    )
    print("|---|---|---|---|---|---|")
    for name, shape, e, en, le, verdict in res:
        print(f"| {name} | {shape} | {e:.3f} | {en:.3f} | {le:.2e} | {verdict} |")
    print("\n| bf16, d=128, N=4096, B=4, H=16 | Triton TFLOP/s | SDPA flash TFLOP/s | ratio |")
    print("|---|---|---|---|")
    for causal, ours, sdpa in sp:
        print(f"| causal={causal} | {ours:.0f} | {sdpa:.0f} | {ours / sdpa:.2f} |")
    return 0 if all(r[-1] == "PASS" for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
