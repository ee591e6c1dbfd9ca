"""The machine's measured ceilings, taken in the same run as the benchmark they scale.

- dense bf16 matmul ``8192 × 8192 × 8192`` (``2·n³`` FLOPs): the tensor-core rate a kernel
  can hope for (the datasheet's 989 TFLOP/s on an H100 SXM is not reached by cuBLAS either);
- device-to-device copy of 1 GiB (read + write = 2 GiB moved): the HBM bandwidth.
"""

from __future__ import annotations

from typing import Any

from .timing import time_cuda

__all__ = ["measure_ceilings"]


def measure_ceilings(*, matmul_n: int = 8192, copy_bytes: int = 2**30) -> dict[str, Any]:
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(matmul_n, matmul_n, device="cuda", dtype=torch.bfloat16, generator=g)
    t_mm = time_cuda(torch.matmul, [(a, b)], warmup=3, reps=20)
    del a, b
    x = torch.empty(copy_bytes // 4, device="cuda", dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    t_cp = time_cuda(lambda src, dst: dst.copy_(src), [(x, y)], warmup=3, reps=20)
    del x, y
    torch.cuda.empty_cache()
    return {
        "matmul_bf16_tflops": 2.0 * matmul_n**3 / t_mm.median_ms / 1e9,
        "matmul_n": matmul_n,
        "copy_tbs": 2.0 * copy_bytes / t_cp.median_ms / 1e9,
        "copy_bytes": copy_bytes,
    }
