"""Error bounds of the split-KV merge (``op="combine"``), docs/error-bounds.md "The split-KV merge".

A merge kernel reads partials ``o_s`` (``(S, ..., dv)``, fp32 or the input format: taken as
the exact values they are) and ``lse_s`` (fp32) and computes, in an accumulation format of unit
roundoff ``u`` (fp32: 2⁻²⁴), with ``m = max_s lse_s`` and ``x_s = lse_s − m ≤ 0``::

    w_s = exp(x_s),  Z = Σ_s w_s,  O_c = Σ_s w_s·o_sc / Z,  LSE = m + log Z

then rounds ``O`` once into the output format (the one the kernel returns ``O`` in: unit
roundoff ``u_o``, smallest subnormal ``σ_o``). With the exact weights
``p_s = exp(lse_s − LSE)``, ``W_c = Σ_s p_s·|o_sc|`` (the oracle's floor) and
``A_c = Σ_s p_s·|o_sc|·|x_s|``, every such merge satisfies, to first order::

    |LSE^ − LSE| ≤ e_L = u·(2S + 4 + 2·(|LSE| + |m|))
    |Ô_c − O_c|  ≤ u·(2·A_c + (3S + 6)·W_c) + (e_L + 2u·log S)·W_c + u_o·W_c + σ_o/2

FlashAttention's combine kernels form the weights from the merged LSE instead,
``w_s = exp(lse_s − LSE^)`` with ``LSE^`` rounded (and no division): every weight then carries
the LSE's error ``e_L`` (the bound on ``|LSE^ − LSE|`` above) as a common relative factor, and
the subtraction ``lse_s − LSE^`` (of magnitude ``≤ |x_s| + log S``) and its ``log₂ e`` scaling
add ``u·log S`` each. The class covers both forms, so ``O``'s bound gains ``(e_L + 2u·log S)·W_c``
(at ``|LSE|`` in the hundreds in fp32, about ``10⁻⁴·W_c``: the rounding of a large LSE is
the error of that form).

(the ``2`` on ``A_c``: the subtraction ``lse_s − m`` and a scaling by ``log₂ e`` for an
``exp2``-based kernel, each ``u·|x_s|`` in the exponent; ``3S + 6``: one rounding of each
``exp``, ``S − 1`` of each sum, of each product and of the division or the reciprocal and its
product, ``Z ≥ 1`` because the largest weight is exactly 1, and ``Σ_s p_s|x_s| ≤ S/e``; the LSE:
``log Z`` from ``Z``'s relative error, its own rounding, and the final ``m + ·`` with an
optional ``ln 2`` scaling). Higher-order terms are covered by a factor 1.01 (``S·u ≪ 1``).
Rows whose splits are all empty must be exact (``O = 0``, ``LSE = −inf``): bound 0. There is
no probabilistic analysis of the merge: its probabilistic bound is the deterministic one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import FP32, Format
from .roundoff import TensorBounds

__all__ = ["MERGE_CLASS", "MergeBounds", "merge_bounds"]

MERGE_CLASS = "merge-fp32"
_HIGHER_ORDER = 1.01


@dataclass
class MergeBounds:
    """Absolute bounds of a merge's ``o`` ``(..., dv)`` and ``lse`` ``(...)`` (the partials'
    shapes without the split axis), each a :class:`TensorBounds`."""

    arithmetic: str
    fmt: Format
    tensors: dict[str, TensorBounds]

    def __getitem__(self, name: str) -> TensorBounds:
        return self.tensors[name]

    @property
    def o(self) -> TensorBounds:
        return self.tensors["o"]

    @property
    def lse(self) -> TensorBounds:
        return self.tensors["lse"]


def merge_bounds(
    out_partial: Any, lse_partial: Any, lse_exact: np.ndarray, *, fmt: Format, accum: Format = FP32
) -> MergeBounds:
    """The bounds of the module docstring for partials ``out_partial (S, ..., dv)`` and
    ``lse_partial (S, ...)`` (exact float arrays), the exact merged LSE ``lse_exact (...)``
    (the oracle's), the output format ``fmt`` and the accumulation format ``accum``."""
    o = np.asarray(out_partial, dtype=np.float64)
    lse = np.asarray(lse_partial, dtype=np.float64)
    n_split = o.shape[0]
    u, u_o = accum.u, fmt.u
    live = np.isfinite(lse_exact)
    with np.errstate(invalid="ignore", over="ignore"):
        keep = np.isfinite(lse)  # −inf splits contribute nothing; NaN rows are NaN anyway
        m = np.where(keep, lse, -np.inf).max(axis=0)
        m_safe = np.where(live, m, 0.0)
        x = np.where(keep, np.abs(lse - m_safe), 0.0)
        p = np.where(
            keep & live, np.exp(np.where(keep, lse, 0.0) - np.where(live, lse_exact, 0)), 0
        )
        a_o = np.abs(np.where(keep[..., None], o, 0.0))
    w = np.einsum("s...,s...c->...c", p, a_o)
    a = np.einsum("s...,s...c->...c", p * x, a_o)
    # The final rounding: relative u_o above the output format's normal range, at most half
    # its smallest subnormal below it.
    lse_err = u * (2 * n_split + 4 + 2 * (np.abs(np.where(live, lse_exact, 0.0)) + np.abs(m_safe)))
    # Weights taken from the rounded LSE (FlashAttention's form): its error is common to all.
    from_lse = (lse_err + 2 * u * np.log(max(n_split, 1)))[..., None] * w
    det_o = u * (2 * a + (3 * n_split + 6) * w) + u_o * w + from_lse
    det_o = _HIGHER_ORDER * det_o + fmt.min_subnormal / 2
    det_o = np.where(live[..., None], det_o, 0.0)
    det_l = np.where(live, _HIGHER_ORDER * lse_err, 0.0)
    tensors = {"o": TensorBounds(det_o, det_o.copy()), "lse": TensorBounds(det_l, det_l.copy())}
    return MergeBounds(MERGE_CLASS, fmt, tensors)
