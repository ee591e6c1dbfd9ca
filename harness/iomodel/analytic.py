"""Closed-form roofline arithmetic for one attention head, in bytes and FLOPs.

- FLOPs: ``4·N²·d`` (two matmuls of ``2·N²·d``), halved when causal.
- Naive bytes: S written, read by softmax, P written, read by P·V: ``4·N²`` elements, plus Q, K,
  V read and O written (``4·N·d``).
- Flash bytes, with ``T = ⌈N/B⌉`` blocks, no cache reuse and no LSE written: ``N·d·(2 + 2T)``
  elements for FlashAttention-2's loop (query blocks outer: Q read and O written once, K and V
  read once per query block), ``N·d·(1 + 3T) + 4N·(T − 1)`` for FlashAttention-1's (K/V blocks
  outer: K and V read once, Q read once per K/V block, and O with its running row max and sum
  written after every K/V block and read back before the next). These are exactly the HBM
  traffic of ``flash_attention`` with the same schedule.
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


def flash_bytes(
    n: int, d: int, *, block: int = 64, schedule: str = "fa2", bytes_per_element: int = 2
) -> float:
    """HBM bytes of a flash forward with ``block``-row tiles, ``T = ⌈N/B⌉``:
    ``N·d·(2 + 2T)`` elements for ``schedule="fa2"`` (query blocks outer),
    ``N·d·(1 + 3T) + 4N·(T − 1)`` for ``"fa1"`` (K/V blocks outer; O, m and l round trips)."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    t = -(-n // block)
    if schedule == "fa2":
        elements = n * d * (2 + 2 * t)
    elif schedule == "fa1":
        elements = n * d * (1 + 3 * t) + 4 * n * (t - 1)
    else:
        raise ValueError(f'schedule must be "fa2" or "fa1", got {schedule!r}')
    return float(elements * bytes_per_element)


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
    rows and no cache reuse: ``flash_bytes(schedule="fa2")`` plus the LSE real kernels write
    (``lse_bytes`` per row, fp32 by default)."""
    if block_m < 1:
        raise ValueError(f"block_m must be >= 1, got {block_m}")
    return flash_bytes(n, d, block=block_m, bytes_per_element=bytes_per_element) + lse_bytes * n
