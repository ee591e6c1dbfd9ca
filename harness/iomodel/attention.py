"""Standard and flash attention traced through the simulator (one head, ``N×d`` inputs).

``standard_attention``: S = Q·Kᵀ and P = softmax(S) are materialised in HBM (the tensor API).

``flash_attention``: S and P never reach HBM; each ``B×B`` score tile is computed, soft-maxed
(5 ops per element) and multiplied by V in SRAM, so the matmul and softmax FLOPs equal standard
attention's. The online softmax carries, for each query row, an output accumulator ``O_i``
(``d`` floats) and its running max ``m_i`` and sum ``l_i``. With ``T = ⌈N/B⌉`` blocks, the
two loop orders move (in floats):

- ``"fa2"`` (FlashAttention-2, the default): query blocks outer. ``Q_i``, ``O_i``, ``m_i``,
  ``l_i`` stay in SRAM for the whole K/V loop and ``O_i`` is written once; K and V are re-read
  for every query block: reads ``N·d·(1 + 2T)``, writes ``N·d``.
- ``"fa1"`` (FlashAttention-1): K/V blocks outer. ``K_j, V_j`` are read once, but every ``O_i``
  is updated by every K/V block and all ``N`` rows of state cannot stay in SRAM, so after each
  K/V block ``O_i, m_i, l_i`` go to HBM and come back for the next: reads
  ``N·d·(1 + 2T) + 2N·(T − 1)``, writes ``T·N·d + 2N·(T − 1)`` (the first pass reads no state,
  the last writes the normalised O only).

Both keep the same working set in SRAM: ``Q_i, K_j, V_j, O_i`` (``4·B·d``), the score tile
(``B²``) and ``m_i, l_i`` (``2·B``). A block whose working set exceeds the SRAM is refused.
"""

from __future__ import annotations

import math

from .gpu import GPUSpec
from .profiler import Profiler
from .tensor import SOFTMAX_OPS, Tensor

__all__ = [
    "SCHEDULES",
    "BlockTooLarge",
    "flash_attention",
    "flash_working_set",
    "largest_flash_block",
    "standard_attention",
]

SCHEDULES = ("fa2", "fa1")


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


class BlockTooLarge(ValueError):
    """A flash block whose tile does not fit in the GPU's SRAM; ``largest`` is the largest
    block that fits (0: none, the head dimension is too large)."""

    def __init__(self, message: str, largest: int):
        super().__init__(message)
        self.largest = largest


def flash_working_set(block: int, d: int) -> int:
    """Floats in SRAM for one tile: ``B² + (4·d + 2)·B`` (Q, K, V, O blocks, the B×B score
    tile, overwritten in place by P, and the running max and sum of each query row)."""
    return block * block + (4 * d + 2) * block


def largest_flash_block(spec: GPUSpec, d: int) -> int:
    """Largest ``B`` with ``flash_working_set(B, d) ≤ spec.sram_size`` (0 if none fits)."""
    a = 4 * d + 2
    b = max(0, int((-a + math.sqrt(a * a + 4 * spec.sram_size)) / 2))
    # the square root is rounded: step to the exact integer boundary
    while b > 0 and flash_working_set(b, d) > spec.sram_size:
        b -= 1
    while flash_working_set(b + 1, d) <= spec.sram_size:
        b += 1
    return b


def flash_attention(
    prof: Profiler, n: int, d: int, block_size: int = 64, *, schedule: str = "fa2"
) -> None:
    """Trace one head's flash forward with ``B = min(block_size, n)``-row tiles in the loop
    order ``schedule`` (module docstring: ``N·d·(2 + 2T)`` floats of HBM traffic for "fa2",
    ``N·d·(1 + 3T) + 4N·(T − 1)`` for "fa1"). Raises :class:`BlockTooLarge` when the tile,
    ``B² + (4·d + 2)·B`` floats, exceeds ``prof.spec.sram_size``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    b = min(block_size, n)  # a block longer than the sequence is the whole sequence
    need = flash_working_set(b, d)
    if need > prof.spec.sram_size:
        fits = largest_flash_block(prof.spec, d)
        max_d = (prof.spec.sram_size - 3) // 4  # B = 1: 1 + 4·d + 2 floats
        fix = f"use a block of at most {fits}" if fits else f"no block fits; use d <= {max_d}"
        rows = f" ({n} rows, the whole sequence)" if block_size > n else ""
        raise BlockTooLarge(
            f"block {block_size}{rows} at d={d} needs {need:,} floats of SRAM per tile, more "
            f"than the {prof.spec.sram_size:,} of {prof.spec.name}: {fix}",
            fits,
        )
    for name in ("Q", "K", "V", "O"):
        prof.allocate_hbm(n * d, name)
    if schedule == "fa2":
        _q_outer(prof, n, d, b)
    else:
        if b < n:  # between passes the row statistics live in HBM
            prof.allocate_hbm(2 * n, "m, l")
        _kv_outer(prof, n, d, b)


def _tile(prof: Profiler, qs: int, kv: int, d: int) -> None:
    prof.sram_push(qs * kv, "S tile")
    prof.matmul(qs, kv, d, "S = Q_i K_jᵀ")
    prof.elementwise(qs * kv, SOFTMAX_OPS, "softmax")
    prof.matmul(qs, d, kv, "O_i += P V_j")
    prof.sram_pop(qs * kv, "S tile")


def _q_outer(prof: Profiler, n: int, d: int, b: int) -> None:
    for i0 in range(0, n, b):
        qs = min(b, n - i0)
        rows = f"[{i0}:{i0 + qs}]"
        prof.load_from_hbm(qs * d, f"Q{rows}")
        state = 2 * qs * d + 2 * qs  # Q_i, O_i, m_i, l_i, resident for the whole K/V loop
        prof.sram_push(state, f"Q, O, m, l{rows}")
        for j0 in range(0, n, b):
            kv = min(b, n - j0)
            prof.load_from_hbm(kv * d, f"K[{j0}:{j0 + kv}]")
            prof.load_from_hbm(kv * d, f"V[{j0}:{j0 + kv}]")
            prof.sram_push(2 * kv * d, "K_j, V_j")
            _tile(prof, qs, kv, d)
            prof.sram_pop(2 * kv * d, "K_j, V_j")
        prof.store_to_hbm(qs * d, f"O{rows}")
        prof.sram_pop(state, f"Q, O, m, l{rows}")


def _kv_outer(prof: Profiler, n: int, d: int, b: int) -> None:
    for j0 in range(0, n, b):
        kv = min(b, n - j0)
        first, last = j0 == 0, j0 + kv >= n
        prof.load_from_hbm(kv * d, f"K[{j0}:{j0 + kv}]")
        prof.load_from_hbm(kv * d, f"V[{j0}:{j0 + kv}]")
        prof.sram_push(2 * kv * d, "K_j, V_j")
        for i0 in range(0, n, b):
            qs = min(b, n - i0)
            rows = f"[{i0}:{i0 + qs}]"
            state = 2 * qs * d + 2 * qs  # Q_i, O_i, m_i, l_i
            prof.load_from_hbm(qs * d, f"Q{rows}")
            if not first:  # the first pass starts the accumulators on chip
                prof.load_from_hbm(qs * d, f"O{rows}")
                prof.load_from_hbm(2 * qs, f"m, l{rows}")
            prof.sram_push(state, f"Q, O, m, l{rows}")
            _tile(prof, qs, kv, d)
            prof.store_to_hbm(qs * d, f"O{rows}")
            if not last:  # only the next pass needs them
                prof.store_to_hbm(2 * qs, f"m, l{rows}")
            prof.sram_pop(state, f"Q, O, m, l{rows}")
        prof.sram_pop(2 * kv * d, "K_j, V_j")
