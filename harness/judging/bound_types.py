"""The record of a kernel's a-priori bounds (:func:`~.bounds.error_bounds`): one
:class:`~.roundoff.TensorBounds` per output, with the class and format they are for."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.formats import Format
from .roundoff import TensorBounds

__all__ = ["Bounds"]


@dataclass
class Bounds:
    """Absolute error bounds for the requested rows: ``o`` ``(B, Hq, R, dv)`` and ``lse``
    ``(B, Hq, R)``, each a :class:`TensorBounds` (``bounds["o"].det``, ``bounds.lse.prob``).

    Rows that keep no key have bound 0 (the result must be exactly ``O = 0``, ``LSE = −inf``).
    ``rescales`` is the number of running-max increases the bound allowed for, per row.
    ``parts``: for class ``unknown``, the bounds of every class that applies to the input
    format; the envelope is the largest of those at or above the precision floor.
    """

    arithmetic: str
    fmt: Format
    lam: float
    key_block: int | None
    tensors: dict[str, TensorBounds]
    rescales: np.ndarray
    parts: dict[str, Bounds] = field(default_factory=dict)

    def __getitem__(self, name: str) -> TensorBounds:
        return self.tensors[name]

    @property
    def o(self) -> TensorBounds:
        return self.tensors["o"]

    @property
    def lse(self) -> TensorBounds:
        return self.tensors["lse"]
