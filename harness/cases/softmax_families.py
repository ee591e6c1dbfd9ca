"""Adversarial soft-caps and sinks for a case (docs/properties.md, "Soft-capping and sinks").

The option is set relative to the case's own scores, so that it bites: a cap of a fraction or a
small multiple of the largest score magnitude (``0.02``: every row flattened to near-uniform
weights; ``0.3``, ``1``: scores around the cap; ``4``: a cap the scores barely reach), and per
query head a sink at the heads' largest row maximum plus an offset (``−40``: invisible; ``−3``,
``0``, ``3``: among the scores; ``40``: the sink takes almost all the weight, O ≈ 0).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .case import Case

__all__ = ["CAP_FACTORS", "SINK_OFFSETS", "with_softmax_options"]

CAP_FACTORS = (0.02, 0.3, 1.0, 4.0)
SINK_OFFSETS = (-40.0, -3.0, 0.0, 3.0, 40.0)


def _scores(case: Case) -> np.ndarray:
    """``scale·q·kᵀ`` per (batch, query head) in float64, non-finite inputs as 0."""
    *_, d, _ = case.shape
    tau = case.scale if case.scale is not None else 1 / math.sqrt(d)
    q = np.nan_to_num(case.q.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    k = np.nan_to_num(case.k.astype(np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    return tau * (q @ np.swapaxes(k, -1, -2))


def with_softmax_options(
    case: Case, *, cap_factor: float | None = None, sink_offset: float | None = None
) -> Case:
    """``case`` with ``softcap = cap_factor·max|s|`` (at least ``2^-10``, as a float) and/or
    ``sinks[h] = max_{b,i,j} s_bhij + sink_offset`` (float32), ``None`` leaving an option off."""
    s = _scores(case)
    softcap = None
    if cap_factor is not None:
        top = float(np.abs(s).max(initial=0.0))
        softcap = max(cap_factor * top, 2.0**-10)
    sinks = None
    if sink_offset is not None:
        per_head = s.max(axis=(0, 2, 3), initial=0.0) if s.size else np.zeros(case.q.shape[1])
        sinks = (per_head + sink_offset).astype(np.float32)
    return replace(case, softcap=softcap, sinks=sinks)
