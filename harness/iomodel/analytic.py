"""Closed-form roofline arithmetic for one attention head, in bytes and FLOPs.

- FLOPs: ``4·N²·d`` (two matmuls of ``2·N²·d``), halved when causal.
- Naive bytes: S written, read by softmax, P written, read by P·V: ``4·N²`` elements, plus Q, K,
  V read and O written (``4·N·d``).
- Flash bytes: ``N·d·(3 + 2·N/B_c)`` elements (the classic count: Q read and O written once per
  query block, K and V re-read once per query block of ``B_c`` rows; "3" counts Q, O and one
  pass of overhead as the seed does).
- Arithmetic intensity = FLOPs / bytes; ridge point = peak FLOP/s / bandwidth: a kernel whose
  intensity is below the ridge is memory-bound on that machine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Roofline",
    "attention_flops",
    "flash_bytes",
    "flash_fa2_bytes",
    "intensity",
    "naive_bytes",
]


def attention_flops(n: int, d: int, *, causal: bool = False) -> float:
    return 4.0 * n * n * d / (2 if causal else 1)


def naive_bytes(n: int, d: int, *, bytes_per_element: int = 2) -> float:
    return (4.0 * n * n + 4.0 * n * d) * bytes_per_element


def flash_bytes(n: int, d: int, *, block: int = 64, bytes_per_element: int = 2) -> float:
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    return n * d * (3 + 2 * n / block) * bytes_per_element


def intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved."""
    return flops / nbytes


@dataclass(frozen=True)
class Roofline:
    """A machine's two ceilings: ``peak_flops`` (FLOP/s) and ``bandwidth`` (bytes/s)."""

    name: str
    peak_flops: float
    bandwidth: float

    @property
    def ridge(self) -> float:
        """Intensity (FLOPs/byte) where the memory and compute ceilings meet."""
        return self.peak_flops / self.bandwidth

    def attainable(self, ai: float) -> float:
        """Roofline bound on FLOP/s at intensity ``ai``: ``min(peak, ai·bandwidth)``."""
        return min(self.peak_flops, ai * self.bandwidth)


def flash_fa2_bytes(
    n: int, d: int, *, block_m: int, bytes_per_element: int = 2, lse_bytes: int = 4
) -> float:
    """DRAM bytes of a Q-outer (FlashAttention-2) forward with query blocks of ``block_m``
    rows and no cache reuse: Q read and O written once, K and V read once per query block,
    plus the fp32 LSE."""
    if block_m < 1:
        raise ValueError(f"block_m must be >= 1, got {block_m}")
    blocks = -(-n // block_m)
    return (2 * n * d + 2 * n * d * blocks) * bytes_per_element + lse_bytes * n
