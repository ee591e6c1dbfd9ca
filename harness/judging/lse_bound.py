"""The bound on ``|LSÊ − LSE|`` of a row (docs/error-bounds.md, "LSE")."""

from __future__ import annotations

import math

import numpy as np

from .roundoff import SAFETY

__all__ = ["lse_bound"]


def lse_bound(p, delta, lse, ell, n_sum, u, n_keep):
    """``|LSÊ − LSE|``: the kernel takes the log-sum-exp of perturbed logits (uncentred: a
    common shift moves LSE), sums positive terms (relative ``n·u``), takes one log and one add,
    multiplies by ln 2 and stores in fp32."""
    # log Σ p_j e^{δ_j}, shifted by max δ: δ can exceed 700 nats for huge fp32 logits.
    dmax = np.where(p > 0, delta, 0.0).max(axis=1, initial=0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.exp(np.minimum(delta - dmax[:, None], 0.0)), 0.0)
        lam_l = dmax + np.log(np.maximum(terms.sum(axis=1), 1e-300))
    lam_l = np.maximum(lam_l, 0.0)
    g = np.minimum(np.asarray(n_sum, dtype=np.float64) * u, 0.5)
    sum_err = -np.log1p(-g)
    log_l = np.log(ell)
    log_err = 4 * u * (1 + log_l / math.log(2)) * math.log(2)
    lse_plus = np.abs(np.where(np.isfinite(lse), lse, 0.0)) + lam_l + sum_err + log_err
    total = lam_l + sum_err + log_err + 4 * u * lse_plus + u * log_l
    return np.where(n_keep > 0, total * (1 + SAFETY * u), 0.0)
