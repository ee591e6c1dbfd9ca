"""Error metrics of a kernel's output against the oracle (docs/error-bounds.md §1).

All metrics take the kernel's output ``ŷ`` (any float array; its values are compared exactly)
and the oracle's exact value ``y`` (a double-double ``hi + lo``):

- floored ULP error ``E = |ŷ − y| / max(ulp_F(y), ulp_F(W))`` with the floor scale ``W``
  supplied by the oracle (``W_c = Σ_j p_j |v_jc|`` for O). A correctly rounded result scores
  ≤ 0.5; the floor keeps outputs that cancel to almost 0 from exploding the ratio.
- integer ULP distance of ``ŷ`` to the correctly rounded ``RN_F(y)`` (ordered-integer mapping);
- normwise relative error ``‖Ŷ − Y‖₂ / ‖Y‖₂``, RMSE and max absolute error over finite pairs;
- NaN/Inf mismatches, counted separately and never averaged into the numbers above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import Format, ulp, ulp_distance
from ..core.semantics import as_exact_array

__all__ = [
    "ULP_EDGES",
    "ErrorSummary",
    "floored_ulp_error",
    "floored_ulp_scale",
    "nonfinite_mismatch",
    "summarize",
    "ulp_error_int",
    "ulp_histogram",
]

# Histogram of per-element floored-ULP errors: [0, 2^-6), [2^-6, 2^-5), ..., [2^24, inf).
ULP_EDGES = (0.0, *(2.0**e for e in range(-6, 25)), float("inf"))


def _host(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray) and x.dtype == np.float64:
        return x
    if type(x).__module__.startswith("torch") or isinstance(x, np.ndarray):
        try:
            return as_exact_array(x, "output")[0]
        except TypeError:
            return np.asarray(x, dtype=np.float64)
    return np.asarray(x, dtype=np.float64)


def nonfinite_mismatch(y_hat: Any, y: Any) -> np.ndarray:
    """True where exactly one of ``ŷ`` and ``y`` is NaN, or where they are not the same
    infinity / not both finite (a finite vs ±inf pair, or +inf vs −inf)."""
    a, b = _host(y_hat), _host(y)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    inf_pair = (np.isinf(a) | np.isinf(b)) & ~(nan_a | nan_b)
    return (nan_a != nan_b) | (inf_pair & (a != b))


def floored_ulp_error(y_hat: Any, y_hi: Any, y_lo: Any, floor: Any, fmt: Format) -> np.ndarray:
    """``|ŷ − y| / max(ulp_F(y), ulp_F(W))`` elementwise; NaN where a NaN/Inf is involved.

    ``ŷ − (hi + lo)`` is formed as ``(ŷ − hi) − lo``: ``ŷ − hi`` is exact whenever the two are
    within a factor of two (Sterbenz), which covers every error that matters here.
    """
    a, hi, lo = _host(y_hat), _host(y_hi), _host(y_lo)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs((a - hi) - lo)
        e = diff / floored_ulp_scale(hi, lo, floor, fmt)
    return np.where(np.isfinite(a) & np.isfinite(hi), e, np.nan)


def floored_ulp_scale(y_hi: Any, y_lo: Any, floor: Any, fmt: Format) -> np.ndarray:
    """The floored ulp ``max(ulp_F(y), ulp_F(W))`` of each element: the unit of
    :func:`floored_ulp_error` (positive everywhere: ``ulp_F`` is at least the smallest
    subnormal of ``F``)."""
    hi, lo, w = _host(y_hi), _host(y_lo), _host(floor)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.maximum(ulp(hi, fmt, lo), ulp(w, fmt))


def ulp_error_int(y_hat: Any, y_rounded: Any, fmt: Format) -> np.ndarray:
    """Integer ULP distance of ``ŷ`` to the correctly rounded ``RN_F(y)``; −1 where either is
    NaN (those pairs belong to the mismatch category). ``ŷ`` must hold values of ``fmt``."""
    a, r = _host(y_hat), _host(y_rounded)
    bad = np.isnan(a) | np.isnan(r)
    out = ulp_distance(np.where(bad, 0.0, a), np.where(bad, 0.0, r), fmt)
    return np.where(bad, -1, out)


@dataclass(frozen=True)
class ErrorSummary:
    """Scalar summary of one output tensor against the oracle."""

    max_floored_ulp: float
    median_floored_ulp: float
    max_ulp_int: int
    normwise_rel: float
    rmse: float
    max_abs: float
    nonfinite_mismatches: int
    count: int


def summarize(
    y_hat: Any,
    oracle_hi: Any,
    oracle_lo: Any,
    floor: Any,
    rounded: Any,
    fmt: Format,
    *,
    floored: np.ndarray | None = None,
) -> ErrorSummary:
    """All the metrics above for one output; finite pairs only, mismatches counted apart.
    ``floored``: the elementwise :func:`floored_ulp_error` if already computed (its values at
    pairs that are not both finite are ignored)."""
    a, hi, lo = _host(y_hat), _host(oracle_hi), _host(oracle_lo)
    mism = nonfinite_mismatch(a, hi)
    fin = np.isfinite(a) & np.isfinite(hi)
    if floored is None:
        floored = floored_ulp_error(a, hi, lo, floor, fmt)
    e = floored[fin]
    ints = ulp_error_int(np.where(fin, a, 0.0), np.where(fin, rounded, 0.0), fmt)[fin]
    with np.errstate(invalid="ignore"):  # inf − inf in pairs that `fin` drops
        d = ((a - hi) - lo)[fin]
    ref = hi[fin]
    norm = float(np.linalg.norm(ref))
    return ErrorSummary(
        max_floored_ulp=float(e.max()) if e.size else 0.0,
        median_floored_ulp=float(np.median(e)) if e.size else 0.0,
        max_ulp_int=int(ints.max()) if ints.size else 0,
        normwise_rel=float(np.linalg.norm(d) / norm) if norm > 0 else float(np.linalg.norm(d)),
        rmse=float(np.sqrt(np.mean(d * d))) if d.size else 0.0,
        max_abs=float(np.max(np.abs(d))) if d.size else 0.0,
        nonfinite_mismatches=int(mism.sum()),
        count=int(a.size),
    )


def ulp_histogram(e: np.ndarray) -> list[int]:
    """Counts of finite per-element errors ``e`` in the bins of :data:`ULP_EDGES`."""
    e = e[np.isfinite(e)]
    counts, _ = np.histogram(e, bins=np.array(ULP_EDGES))
    return [int(c) for c in counts]
