"""The forward on tensors that rule TMA out (Q rows one element into a wider buffer), at
shapes whose table entries are TMA tiles: prints the fallback configuration and the largest
difference from float64 SDPA. One CUDA GPU: python benchmarks/gpu_tma_fallback.py"""

import torch

from flashcheck.kernels import triton_flash as tf

for d, causal in ((64, True), (128, False)):
    n, h = 4096, 4
    base = torch.randn(1, h, n, d + 1, device="cuda", dtype=torch.float16)
    q = base[..., 1:]  # rows of d elements starting one element in: not 16-byte aligned
    k = torch.randn(1, h, n, d, device="cuda", dtype=torch.float16)
    v = torch.randn(1, h, n, d, device="cuda", dtype=torch.float16)
    cfg = tf.launch_config(q, k, v, causal=causal)
    o, lse = tf.launch(q, k, v, causal=causal, window=None, scale=d**-0.5, allow_tf32=False)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=causal
    )
    print(d, causal, cfg, "max |o - ref| =", (o.double() - ref).abs().max().item())
