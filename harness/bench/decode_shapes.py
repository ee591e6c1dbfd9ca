"""The shapes of the decode benchmark (``flashcheck bench --decode``) and what they move.

A decode shape is a batch of ``b`` sequences, each with ``nq`` new queries (decode: 1; a few
for speculative decoding) against its own KV cache of ``lengths[i]`` keys, held in pages of
``page`` slots. Heads are those of a grouped-query model (32 query heads on 8 key/value heads,
``d = 128``), bf16. Ragged batches draw their lengths, from a seed, between a quarter of the
longest and the longest (the longest always present), so padding to the longest costs what it
costs in a real batch.

The figure of merit of decode is bandwidth: every key and value row a sequence owns must be
read once, ``Σ_i lengths[i] · Hk · (d + dv) · itemsize`` bytes (:func:`kv_bytes`), and little
else (the queries and outputs are ``b·nq·Hq·(d + dv)`` elements). Bandwidth is that count over
the median time, compared with the device copy bandwidth measured in the same run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["DECODE_SHAPES", "QUICK_SHAPES", "DecodeShape", "kv_bytes", "lengths_of"]

_ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class DecodeShape:
    """One decode configuration (module docstring); ``ragged``: lengths drawn from
    ``[nk/4, nk]`` instead of all ``nk``."""

    b: int
    nk: int
    page: int
    ragged: bool = False
    nq: int = 1
    causal: bool = False
    hq: int = 32
    hk: int = 8
    d: int = 128
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if min(self.b, self.nk, self.page, self.nq, self.hq, self.hk, self.d) < 1:
            raise ValueError(f"every size of a decode shape must be >= 1, got {self}")
        if self.hq % self.hk:
            raise ValueError(f"hq ({self.hq}) must be a multiple of hk ({self.hk})")
        if self.dtype not in _ITEMSIZE:
            raise ValueError(f"dtype must be one of {sorted(_ITEMSIZE)}, got {self.dtype!r}")

    @property
    def key(self) -> str:
        """A stable name: ``b8-nk32768r-p16-q1-bf16`` (``r``: ragged, ``c``: causal)."""
        tag = ("r" if self.ragged else "") + ("c" if self.causal else "")
        heads = "" if (self.hq, self.hk, self.d) == (32, 8, 128) else f"-h{self.hq}x{self.hk}"
        return f"b{self.b}-nk{self.nk}{tag}-p{self.page}-q{self.nq}{heads}-d{self.d}-{self.dtype}"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]


def lengths_of(shape: DecodeShape, *, seed: int = 0) -> list[int]:
    """The cache length of every sequence: all ``nk``, or (ragged) seeded draws from
    ``[nk/4, nk]`` with the last sequence at ``nk``."""
    if not shape.ragged:
        return [shape.nk] * shape.b
    rng = np.random.default_rng(seed)
    low = max(1, shape.nk // 4)
    drawn = rng.integers(low, shape.nk + 1, size=shape.b).tolist()
    drawn[-1] = shape.nk
    return [int(n) for n in drawn]


def kv_bytes(shape: DecodeShape, lengths: list[int]) -> int:
    """Bytes of K and V a decode step must read: every owned key and value row once."""
    if len(lengths) != shape.b:
        raise ValueError(f"one length per sequence: {shape.b} expected, got {len(lengths)}")
    return sum(lengths) * shape.hk * 2 * shape.d * shape.itemsize


# Batch 1 from a short to a 128K context; batches of 8 to 64 with ragged lengths; one
# speculative-decoding shape (4 causal queries per sequence). About 6 GB of cache at most.
DECODE_SHAPES: tuple[DecodeShape, ...] = (
    DecodeShape(1, 1024, 16),
    DecodeShape(1, 8192, 16),
    DecodeShape(1, 32768, 16),
    DecodeShape(1, 131072, 16),
    DecodeShape(1, 131072, 256),
    DecodeShape(8, 32768, 16, ragged=True),
    DecodeShape(8, 8192, 16, ragged=True, nq=4, causal=True),
    DecodeShape(64, 1024, 16, ragged=True),
    DecodeShape(64, 8192, 16, ragged=True),
    DecodeShape(64, 8192, 256, ragged=True),
)

QUICK_SHAPES: tuple[DecodeShape, ...] = (
    DecodeShape(1, 8192, 16),
    DecodeShape(16, 4096, 16, ragged=True),
)
