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

from .roundoff import RHO_TANH, U32

__all__ = ["cap_scores", "with_sink"]


def with_sink(
    k: np.ndarray, v: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``k``, ``v`` with a zero first row and ``keep`` with a first column of True: the sink's
    slot (its score is set by :func:`cap_scores`)."""
    k1 = np.concatenate([np.zeros((1, k.shape[1])), k])
    v1 = np.concatenate([np.zeros((1, v.shape[1])), v])
    keep1 = np.concatenate([np.ones((keep.shape[0], 1), dtype=bool), keep], axis=1)
    return k1, v1, keep1


def cap_scores(
    s: np.ndarray, a: np.ndarray, *, cap: float | None, sink: float | None, u_store: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logits the softmax sees, their dot-product size and the options' own rounding.

    ``s``, ``a``: the scores ``τ·q·k`` and ``|τ|·|q|·|k|`` (with the sink's slot first when
    ``sink`` is given); ``u_store``: the unit roundoff the scores are stored in before the cap
    (the naive class's input format; 0 for the classes that cap fp32 scores). Returns ``(y, a,
    extra)``: the capped scores (the sink's slot holds ``σ``, its ``a`` is 0), and the extra
    absolute logit error per key, in nats."""
    extra = np.zeros_like(s)
    y = s
    if cap is not None:
        y = cap * np.tanh(s / cap)
        extra = (RHO_TANH + 2 * U32) * np.abs(y) + (2 * U32 + u_store) * np.abs(s)
    if sink is not None:
        y = y.copy()
        a = a.copy()
        y[:, 0], a[:, 0], extra[:, 0] = sink, 0.0, 0.0
    return y, a, extra
