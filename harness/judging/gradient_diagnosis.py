"""A diagnosis of failing gradients: two readings that need nothing beyond the kernel's
gradient, the exact one and its bound.

- **Nonzero where nothing may flow.** An element whose exact gradient is 0 and whose bound is
  0 (no term reaches it: a row that keeps no key, a key that no row keeps) can only be
  nonzero if the backward lets gradient through where the forward's mask stops it.
- **A constant factor.** A gradient that is ``c`` times the exact one everywhere, within ``c``
  times its bound, with ``c`` clearly not 1: a scale applied once too often or too few times
  (``1/scale`` or ``scale``, a ``log 2`` of base-2 exponents, ...).

Each reading speaks only where it explains the failure: the constant factor only where the
gradient, unscaled, fails its bound and, scaled, holds it.
"""

from __future__ import annotations

import numpy as np

from .diagnosis import CONSISTENT
from .tensor_verdict import LABELS

__all__ = ["diagnose_gradient"]

_MIN_ELEMENTS = 8  # nonzero exact elements a constant factor must hold over


def diagnose_gradient(name: str, y: np.ndarray, exact: np.ndarray, det: np.ndarray) -> list[str]:
    """The common mistakes the kernel's gradient ``y`` (``name``: ``"dq"``, ``"dk"``,
    ``"dv"``) is consistent with, against the exact gradient ``exact`` and its deterministic
    bound ``det`` (arrays of one shape)."""
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
    # A factor read off a handful of elements is no evidence: any ratio fits one element.
    if both.all() and np.count_nonzero(x) >= _MIN_ELEMENTS:
        c = float(np.dot(y.ravel(), x.ravel()) / np.dot(x.ravel(), x.ravel()))
        if c > 0 and not 0.99 <= c <= 1.01:
            over = np.abs(y - x) > det
            held = np.abs(y - c * x) <= max(c, 1.0) * det
            if over.any() and held.all():
                found.append(
                    f"{CONSISTENT}{label} off by a constant factor: the kernel's is {c:.4g} × "
                    "the exact one everywhere (a scale applied once too often or too few "
                    f"times{'; 1/c = ' + format(1 / c, '.4g') if c > 1 else ''})"
                )
    return found
