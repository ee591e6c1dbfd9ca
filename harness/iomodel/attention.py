"""Standard and flash attention traced through the simulator (one head, ``N×d`` inputs).

``standard_attention``: S = Q·Kᵀ and P = softmax(S) are materialised in HBM (the tensor API).
``flash_attention``: FlashAttention-1's schedule: K/V blocks outer, Q blocks inner, each
``B×B`` score tile computed, soft-maxed (5 ops per element) and multiplied by V in SRAM, O
written once. S and P never reach HBM; the FLOPs are the same as standard attention's.
"""

from __future__ import annotations

from .profiler import Profiler
from .tensor import SOFTMAX_OPS, Tensor

__all__ = ["flash_attention", "standard_attention"]


def standard_attention(prof: Profiler, n: int, d: int) -> Tensor:
    q = Tensor((n, d), "Q", prof)
    k = Tensor((n, d), "K", prof)
    v = Tensor((n, d), "V", prof)
    s = q @ k.T
    p = s.softmax("P")
    s.free()
    o = p @ v
    p.free()
    return o


def flash_attention(prof: Profiler, n: int, d: int, block_size: int = 64) -> None:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    for name in ("Q", "K", "V", "O"):
        prof.allocate_hbm(n * d, name)
    b = block_size
    for j0 in range(0, n, b):
        kv = min(b, n - j0)
        prof.load_from_hbm(kv * d, f"K[{j0}:{j0 + kv}]")
        prof.load_from_hbm(kv * d, f"V[{j0}:{j0 + kv}]")
        for i0 in range(0, n, b):
            qs = min(b, n - i0)
            prof.load_from_hbm(qs * d, f"Q[{i0}:{i0 + qs}]")
            tile = qs * d + 2 * kv * d + qs * kv + qs * d  # Q, K, V, S and O blocks
            prof.sram_push(tile, "tile")
            prof.matmul(qs, kv, d, "S = Q_i K_jᵀ")
            prof.elementwise(qs * kv, SOFTMAX_OPS, "softmax")
            prof.matmul(qs, d, kv, "O_i += P V_j")
            prof.sram_pop(tile, "tile")
    prof.store_to_hbm(n * d, "O")
