"""The forward's default tile per key count, checked on shapes the bench grid does not reach:
causal, bf16, ragged lengths (Nq ≠ Nk, neither a multiple of a tile), grouped heads, d = 96 and
128, on one CUDA GPU. Prints each shape's launch configuration and, at every 7th query row,
O's largest error in floored bf16 ulps and LSE's largest absolute error against float64
attention on the same inputs, and the NaN count.

    python benchmarks/gpu_causal_ragged_check.py
"""

from __future__ import annotations

import math

# (Nq, Nk, d, query heads, key/value heads)
SHAPES = [(3000, 3000, 128, 4, 2), (2500, 4100, 96, 4, 4), (4096, 8000, 128, 2, 1),
          (8192, 8192, 128, 2, 2)]  # fmt: skip


def main() -> int:
    import torch

    from flashcheck.kernels import triton_flash as tf

    g = torch.Generator(device="cuda").manual_seed(1)
    for nq, nk, d, hq, hk in SHAPES:
        q = torch.randn(1, hq, nq, d, device="cuda", generator=g).bfloat16()
        k = torch.randn(1, hk, nk, d, device="cuda", generator=g).bfloat16()
        v = torch.randn(1, hk, nk, d, device="cuda", generator=g).bfloat16()
        print(nq, nk, d, tf.launch_config(q, k, v, causal=True))
        o, lse = tf.flash_attention(q, k, v, causal=True)
        rows = torch.arange(0, nq, 7, device="cuda")
        kk = k.repeat_interleave(hq // hk, 1).double()
        vv = v.repeat_interleave(hq // hk, 1).double()
        s = q[:, :, rows].double() @ kk.transpose(-1, -2) / math.sqrt(d)
        cols = torch.arange(nk, device="cuda")
        s = s.masked_fill(cols[None, :] > rows[:, None] + nk - nq, float("-inf"))
        p = torch.softmax(s, -1)
        ref, w = p @ vv, p @ vv.abs()
        ulp = torch.exp2(torch.floor(torch.log2(torch.maximum(ref.abs(), w).clamp_min(1e-30))) - 7)
        e = ((o[:, :, rows].double() - ref).abs() / ulp).max().item()
        le = (lse[:, :, rows].double() - torch.logsumexp(s, -1)).abs().max().item()
        print(
            f"  O max error {e:.2f} ulps, LSE max abs error {le:.2e}, NaN {o.isnan().sum().item()}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
