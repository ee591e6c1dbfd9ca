"""One certified tensor: the oracle's answer for one output (O, LSE, dQ, dK or dV).

Every element of the exact result ``y`` is given as a double-double ``hi + lo`` with a certified
bound ``err ≥ |hi + lo − y|``, the floor scale ``W`` of the floored-ULP error
(:mod:`flashcheck.harness.judging.metrics`), ``y`` correctly rounded into the target format, and
whether the bound decides that rounding (``certified``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["FIELDS", "CertifiedTensor"]

FIELDS = ("hi", "lo", "err", "floor", "rounded", "certified")


@dataclass(frozen=True)
class CertifiedTensor:
    """The exact values of one output tensor, all arrays of one shape.

    ``hi``, ``lo``: the value as a double-double (``hi`` is the nearest double of ``hi + lo``);
    ``err``: a certified bound on ``|hi + lo − exact|``; ``floor``: the floor scale ``W``
    (``Σ_j p_j |v_jc|`` for O, ``Σ_j p_j |s_j|`` for LSE, docs/oracle.md for the gradients);
    ``rounded``: the exact value correctly rounded (nearest-even) into the target format;
    ``certified``: True where ``err`` is within the accuracy target and decides ``rounded``.
    NaN inputs give ``hi = rounded = NaN``, ``lo = err = floor = 0``, ``certified = True``.
    """

    hi: np.ndarray
    lo: np.ndarray
    err: np.ndarray
    floor: np.ndarray
    rounded: np.ndarray
    certified: np.ndarray

    def __post_init__(self) -> None:
        shapes = {np.shape(getattr(self, f)) for f in FIELDS}
        if len(shapes) != 1:
            raise ValueError(f"the fields of a CertifiedTensor must share one shape, got {shapes}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.hi.shape

    @classmethod
    def from_fields(cls, arrays: dict[str, Any], prefix: str = "") -> CertifiedTensor:
        """The tensor of ``arrays[prefix + field]`` for every field (``prefix`` such as ``"o_"``,
        the oracle paths' working names)."""
        return cls(**{f: arrays[prefix + f] for f in FIELDS})

    def take(self, index: Any, axis: int) -> CertifiedTensor:
        """The tensor restricted to ``index`` along ``axis`` (every field alike)."""
        return CertifiedTensor(**{f: np.take(getattr(self, f), index, axis=axis) for f in FIELDS})
