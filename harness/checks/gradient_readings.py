"""A reading of failing gradients that needs a second exact answer: the gradients of the same
inputs and ``dO`` with one of the case's masks dropped. A backward (or the forward that
autograd differentiates) that does not apply ``causal``, a window or an explicit mask matches
those within its bounds. The readings that need nothing beyond the exact gradients are in
:mod:`flashcheck.harness.judging.gradient_diagnosis`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..cases.case import Case
from ..judging.diagnosis import CONSISTENT
from ..judging.gradient_bounds import GradientBounds
from ..oracle.evaluate import problem_oracle

__all__ = ["MAX_READING_ELEMENTS", "mask_readings"]

# The readings run one more gradient oracle per mask: only where that costs little (scores
# B·Hq·Nq·Nk), so that a campaign full of failures is not slowed down by them.
MAX_READING_ELEMENTS = 1 << 16
_NAMES = ("dq", "dk", "dv")


def _fits(y: np.ndarray, exact: np.ndarray, det: np.ndarray) -> bool:
    y = np.asarray(y, np.float64)
    if not (np.isfinite(y).all() and np.isfinite(exact).all()):
        return False
    return bool((np.abs(y - exact) <= np.broadcast_to(det, exact.shape)).all())


def mask_readings(
    case: Case, grads: dict[str, Any], bounds_of: Callable[[Case], GradientBounds]
) -> list[str]:
    """Each mask of ``case`` whose removal explains the kernel's gradients ``grads`` (``dq``,
    ``dk``, ``dv`` as exact arrays): all three within the kernel's bounds (``bounds_of`` the
    case without that mask) of the exact gradients without it. Empty for a case without a
    mask or too large to read."""
    b, hq, _, nq, nk, _, _ = case.shape
    if b * hq * nq * nk > MAX_READING_ELEMENTS:
        return []
    alternatives = []
    if case.causal:
        alternatives.append(("causal=True ignored", {"causal": False}))
    if case.window is not None:
        alternatives.append(("the window ignored", {"window": None}))
    if case.mask is not None:
        alternatives.append(("the mask ignored", {"mask": None}))
    do = case.grad_output()
    found = []
    for label, change in alternatives:
        # The bounds of the unmasked case: the masked one's are 0 where the mask stops all
        # gradient (a row keeping one key has dQ = 0), which no unmasked gradient fits.
        alt = replace(case, **change)
        ref = problem_oracle(alt.problem, do=do)
        bounds = bounds_of(alt)
        if all(_fits(grads[n], getattr(ref, n).hi, bounds[n].det) for n in _NAMES):
            found.append(
                f"{CONSISTENT}{label}: dQ, dK and dV match the exact gradients without it "
                "within their bounds (the backward, or the forward autograd differentiates, "
                "does not apply it)"
            )
    return found
