"""What soft-capping and sinks add to the forward bounds (docs/error-bounds.md, "Soft-capping
and sinks").

Soft-cap ``c``: a kernel forms ``y = c·tanh(s/c)`` from its computed score ``ŝ``. The map has
slope ``1 − tanh² ≤ 1``, so every error of ``ŝ`` reaches ``y`` at most unchanged (the bound
keeps the raw scores' terms as they are); the new roundings are that of ``s/c`` (its quotient
or the constant ``scale/c``: ``2·u32·|s|``, again through a slope ≤ 1), of tanh itself
(``RHO_TANH·|tanh|``, times ``c``: ``RHO_TANH·|y|``) and of the product by ``c`` (or by
``c·log2 e``: ``2·u32·|y|``). The naive class stores its scores in the input format before the
cap: ``u_F·|s|``. The softmax terms then use ``y`` in place of ``s``.

Sink ``σ``: an extra logit with no value row. The bounds treat it as a first key with score
``σ`` (a kernel starts its running max there), a zero value row and no dot product: its own
error is the rounding of ``σ·log2 e`` and of its ``exp``, which the per-key terms of the
classes already charge to every logit (``u32·|σ|``, ``RHO_EXP``).
"""

from __future__ import annotations

import numpy as np

from .roundoff import HALF_SUB32, RHO_TANH, U32

__all__ = ["SinkTerms", "cap_scores", "cap_slope", "sink_keep", "with_sink"]


def with_sink(
    k: np.ndarray, v: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``k``, ``v`` with a zero first row and ``keep`` with a first column of True: the sink's
    slot (its score is set by :func:`cap_scores`)."""
    k1 = np.concatenate([np.zeros((1, k.shape[1])), k])
    v1 = np.concatenate([np.zeros((1, v.shape[1])), v])
    return k1, v1, sink_keep(keep)


def sink_keep(keep: np.ndarray) -> np.ndarray:
    """``keep`` with the sink's slot first: every row keeps it."""
    return np.concatenate([np.ones((keep.shape[0], 1), dtype=bool), keep], axis=1)


def cap_scores(
    s: np.ndarray,
    a: np.ndarray,
    *,
    cap: float | None,
    sink: float | None,
    u_store: float,
    rho: float = RHO_TANH,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logits the softmax sees, their dot-product size and the options' own rounding.

    ``s``, ``a``: the scores ``τ·q·k`` and ``|τ|·|q|·|k|`` (with the sink's slot first when
    ``sink`` is given); ``u_store``: the unit roundoff the scores are stored in before the cap
    (the naive class's input format; 0 for the classes that cap fp32 scores); ``rho``: the
    tanh's relative error (``TANH_ERRORS`` of :mod:`.roundoff`). Returns ``(y, a,
    extra)``: the capped scores (the sink's slot holds ``σ``, its ``a`` is 0), and the extra
    absolute logit error per key, in nats."""
    extra = np.zeros_like(s)
    y = s
    if cap is not None:
        y = cap * np.tanh(s / cap)
        extra = (rho + 2 * U32) * np.abs(y) + (2 * U32 + u_store) * np.abs(s)
    if sink is not None:
        y = y.copy()
        a = a.copy()
        y[:, 0], a[:, 0], extra[:, 0] = sink, 0.0, 0.0
    return y, a, extra


def cap_slope(s_raw, score_err, cap: float, *, keep, sink, rho: float = RHO_TANH):
    """Bounds on the slope ``g = 1 − tanh²(s/c)`` a kernel recomputes for the backward: ``g_hi``,
    the largest exact slope within the score's error ``score_err`` (the slope falls with
    ``|s|``), and ``e_g ≥ |ĝ − g|`` for ``ĝ = fl(1 − fl(t̂²))``, ``t̂`` the kernel's tanh
    (its argument off by ``score_err/c``, its own error ``rho·|t|``)."""
    z = np.abs(s_raw) / cap
    dz = score_err / cap
    g_hi = 1.0 - np.tanh(np.maximum(z - dz, 0.0)) ** 2
    th = np.tanh(z)
    dth = g_hi * dz + rho * th
    e_g = (2 * th + dth) * dth * (1 + 2 * U32) + U32 * (th + dth) ** 2 + U32
    g_hi, e_g = np.where(keep, g_hi, 0.0), np.where(keep, e_g, 0.0)
    if sink is not None:  # the sink's slot is not capped
        g_hi[:, 0], e_g[:, 0] = 1.0, 0.0
    return g_hi, e_g


class SinkTerms:
    """The rows' terms of ``dσ_h = −Σ_i P_iσ·D_i`` for one query head, summed over chunks and
    batches: per row ``|P̂σ − Pσ|·(|D| + e_D) + Pσ·e_D`` and the product's rounding (linear
    part, with ``2^-150`` absolute for products below fp32's normal range), and ``|P̂σ·D̂|``
    (the magnitudes an fp32 sum of the rows rounds)."""

    def __init__(self) -> None:
        self.lin = {True: 0.0, False: 0.0}
        self.mag = {True: 0.0, False: 0.0}
        self.rows = 0

    def add(self, det: bool, *, p, err_p, d, e_d, has) -> None:
        d_plus = np.abs(d) + e_d
        # the product P̂σ·D̂ rounds (relative u32, or on fp32's subnormal grid: 2^-150 absolute)
        lin = err_p * d_plus + p * e_d + U32 * (p + err_p) * d_plus + HALF_SUB32
        self.lin[det] += float(np.sum(np.where(has, lin, 0.0)))
        self.mag[det] += float(np.sum(np.where(has, (p + err_p) * d_plus * (1 + U32), 0.0)))
        if det:
            self.rows += int(np.sum(has))

    def bound(self, det: bool, acc) -> float:
        """The bound, ``acc(n, det)`` the accumulation constant of a sum of ``n`` terms."""
        # each addition of the fp32 sum may also round on the subnormal grid (2^-150 absolute)
        return self.lin[det] + float(acc(self.rows, det)) * self.mag[det] + self.rows * HALF_SUB32
