"""What both oracle paths share: the accuracy contract and the scale (see
flashcheck.harness.oracle.evaluate)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpmath
import numpy as np
from mpmath import iv

from ..core.formats import Format, round_to_format, ulp
from ..core.semantics import AttentionProblem
from . import exact as ex

ACCURACY_BITS = 100
MIN_PREC = 110  # below this, a working precision cannot deliver ACCURACY_BITS
SLACK = 1.0 + 2.0**-30  # absorbs second-order terms and the rounding of bound arithmetic

# ---------------------------------------------------------------------------------------------
# Scale


@dataclass(frozen=True)
class Scale:
    mp: mpmath.mpf  # the scale to 300 bits (exact when the scale is a double)
    hi: float
    lo: float
    err: float  # bound on |scale − hi − lo|
    given: float | None
    d: int

    def interval(self) -> Any:
        if self.given is not None:
            return iv.mpf(self.given)
        return 1 / iv.sqrt(iv.mpf(self.d))


def scale_of(problem: AttentionProblem) -> Scale:
    d = problem.q.shape[-1]
    with mpmath.mp.workprec(300):
        if problem.scale is not None:
            val = mpmath.mpf(problem.scale)
            return Scale(val, problem.scale, 0.0, 0.0, problem.scale, d)
        val = 1 / mpmath.sqrt(d)
        hi, lo = ex.dd_from_mpf(val)
        # The dd's actual distance to the 300-bit value, plus that value's own error.
        err = float(
            abs(val - hi - lo) * (1 + mpmath.mpf(2) ** -40) + abs(val) * mpmath.mpf(2) ** -290
        )
    return Scale(val, hi, lo, err, None, d)


def finite_or_zero(a: np.ndarray) -> np.ndarray:
    """``a`` with NaN and ±inf replaced by 0: the values the oracle's reductions read where a
    masked key or a non-finite input would otherwise poison a sum the mask removes anyway."""
    return np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)


def target(floor: np.ndarray, fmt: Format) -> np.ndarray:
    return np.maximum(
        np.ldexp(floor, -ACCURACY_BITS) * (1 - 2.0**-30), fmt.min_subnormal * 2.0**-ACCURACY_BITS
    )


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
