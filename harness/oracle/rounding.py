"""Correct rounding of a certified value: ``hi + lo ± err`` into a target format, decided only
when every value within the bound rounds alike (the oracle's ``rounded`` and ``certified``)."""

from __future__ import annotations

import numpy as np

from ..core.formats import Format, round_to_format, ulp

__all__ = ["decide"]


def decide(hi: np.ndarray, lo: np.ndarray, err: np.ndarray, fmt: Format):
    """Correctly rounded value of ``hi + lo ± err`` in ``fmt`` and whether it is decided."""
    b = err + np.abs(lo)
    with np.errstate(invalid="ignore", over="ignore"):
        lo_end = np.nextafter(hi - b, -np.inf)
        hi_end = np.nextafter(hi + b, np.inf)
    r_lo = round_to_format(lo_end, fmt)
    r_hi = round_to_format(hi_end, fmt)
    decided = (r_lo == r_hi) | ~np.isfinite(hi)  # ±inf (LSE of a masked row) and NaN are exact
    best = round_to_format(hi, fmt)
    # hi exactly on a midpoint of fmt: the sign of lo decides (|lo| < half a double ulp of hi,
    # so no other rounding boundary lies between hi and hi + lo).
    with np.errstate(invalid="ignore"):
        half = ulp(hi, fmt) / 2
        tie = np.isfinite(hi) & (np.abs(hi - best) == half) & (lo != 0)
    if np.any(tie):
        toward = round_to_format(hi + np.sign(lo) * half, fmt)
        best = np.where(tie, toward, best)
    return np.where(np.isfinite(hi), np.where(decided, r_lo, best), hi), decided
