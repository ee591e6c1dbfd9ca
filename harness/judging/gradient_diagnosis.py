"""A diagnosis of failing gradients: two readings that need nothing beyond the kernel's
gradient, the exact one and its bound.

- **Nonzero where nothing may flow.** An element whose exact gradient is 0 and whose bound is
  0 (no term reaches it: a row that keeps no key, a key that no row keeps) can only be
  nonzero if the backward lets gradient through where the forward's mask stops it.
- **A constant factor.** A gradient that is ``c`` times the exact one everywhere, within ``|c|``
  times its bound, with ``c`` clearly not 1: a scale applied once too often or too few times
  (``1/scale`` or ``scale``, a ``log 2`` of base-2 exponents, ...), or, with ``c = −1``, a sign
  flipped (``dP − D`` as ``D − dP``, ``dσ = +Σ Pσ·D``, ...).

Each reading speaks only where it explains the failure: the constant factor only where the
gradient, unscaled, fails its bound and, scaled, holds it, over enough elements to tell a
factor from chance (dσ has one per query head: see ``_CLOSE``).
"""

from __future__ import annotations

import numpy as np

from .diagnosis import CONSISTENT
from .tensor_verdict import LABELS

__all__ = ["diagnose_gradient"]

_MIN_ELEMENTS = 8  # nonzero exact elements a constant factor must hold over within the bound
# Fewer elements (dσ has one per query head) still show a factor if it fits each of them far
# more closely than the bound demands. An unrelated value lands within a relative distance
# ``t`` of the ratio fitted to the others by a chance of about 2t, so n elements fit by about
# (2t)^(n−1): with 2^-5 that is 0.4% for 3 elements and 2·10⁻⁴ for 4, and 2^-5 leaves room
# for a low-precision kernel's own error (a bf16 backward's dσ is off by up to 2% of |dσ|,
# where its bound allows 200%). Two elements need 2^-8, a chance of about 0.8% (fp32 and
# fp16 kernels fit that; bf16 ones may not). One element fits any ratio and is never enough.
_CLOSE = 2.0**-5
_CLOSE_TWO = 2.0**-8


def diagnose_gradient(name: str, y: np.ndarray, exact: np.ndarray, det: np.ndarray) -> list[str]:
    """The common mistakes the kernel's gradient ``y`` (``name``: ``"dq"``, ``"dk"``, ``"dv"``,
    ``"dsinks"``) is consistent with, against the exact gradient ``exact`` and its
    deterministic bound ``det`` (arrays of one shape)."""
    label = LABELS[name]
    y = np.asarray(y, np.float64)
    x = np.asarray(exact, np.float64)
    det = np.broadcast_to(np.asarray(det, np.float64), x.shape)
    found = []
    both = np.isfinite(y) & np.isfinite(x)
    leak = both & (x == 0) & (det == 0) & (y != 0)
    if leak.any():
        n = int(leak.sum())
        found.append(
            f"{CONSISTENT}gradient flowing where the mask lets none through: {label} is nonzero "
            f"in {n} element{'s' * (n != 1)} whose exact value is 0 with no term to reach them "
            "(a mask, or rows that keep no key, not applied in the backward, or in the "
            "forward that autograd differentiates)"
        )
    nonzero = both & (x != 0)
    if both.all() and nonzero.sum() >= 2:
        c = float(np.dot(y.ravel(), x.ravel()) / np.dot(x.ravel(), x.ravel()))
        # −1 is as clear a factor as 2: only values near 1 (the exact gradient) and 0 (no
        # gradient at all, which no factor explains) say nothing.
        if c != 0 and not 0.99 <= c <= 1.01:
            over = np.abs(y - x) > det
            held = np.abs(y - c * x) <= max(abs(c), 1.0) * det
            t = _CLOSE_TWO if nonzero.sum() == 2 else _CLOSE
            close = np.abs(y - c * x)[nonzero] <= t * np.abs(c * x)[nonzero]
            enough = nonzero.sum() >= _MIN_ELEMENTS or close.all()
            if over.any() and held.all() and enough:
                found.append(f"{CONSISTENT}{label} off by a constant factor: {_factor_text(c)}")
    return found


def _factor_text(c: float) -> str:
    """What a factor ``c`` says about the kernel's gradient, signs in words."""
    if -1.01 <= c <= -0.99:
        return "the kernel's is −1 × the exact one everywhere: a sign flipped"
    number = format(c, ".4g").replace("-", "−")
    inverse = format(1 / c, ".4g").replace("-", "−")
    what = "a scale applied once too often or too few times"
    if c < 0:
        what = f"a sign flipped, and {what}"
    return (
        f"the kernel's is {number} × the exact one everywhere ({what}"
        f"{'; 1/c = ' + inverse if abs(c) > 1 else ''})"
    )
