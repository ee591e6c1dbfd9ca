"""The oracle of the split-KV merge (``op="combine"``): exact, certified, correctly rounded.

A kernel that splits the keys of a row into ``S`` chunks computes, per chunk ``s``, a partial
output ``o_s`` (normalized within the chunk) and its log-sum-exp ``lse_s``, then merges them::

    LSE = log Σ_s exp(lse_s),        O_c = Σ_s exp(lse_s − LSE) · o_sc

over the splits with ``lse_s > −inf``: a split whose ``lse`` is ``−inf`` holds no key and
contributes nothing (its ``o`` is not read). A row whose splits are all ``−inf`` gives
``O = 0`` and ``LSE = −inf``. The partials are taken as exact binary values.

Non-finite partials: an ``lse_s`` that is NaN or ``+inf`` makes the row's ``O`` and ``LSE``
NaN; a non-finite ``o_sc`` of a contributing split makes ``O_c`` NaN.

Every row is evaluated in interval arithmetic (mpmath.iv), shifted by ``m = max_s lse_s`` so
no exponential overflows (``w_s = exp(lse_s − m)``, ``Z = Σ w_s``, ``LSE = m + log Z``,
``O_c = Σ w_s o_sc / Z``), at 128 bits first and at doubled precision while an element's
interval is too wide for the 100-bit target or straddles a rounding boundary (Ziv). Floors:
``Σ_s p_s |o_sc|`` for ``O_c`` and ``Σ_s p_s |lse_s|`` for LSE, with ``p_s = w_s / Z``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np
from mpmath import iv

from ..core.formats import Format, format_of, round_mpf, round_to_format
from ..core.semantics import as_exact_array
from .common import MIN_PREC, target
from .strict import interval_to_dd, iv_prec, mpf_of
from .tensor import FIELDS, CertifiedTensor

__all__ = ["CombineResult", "combine_oracle"]


@dataclass
class CombineResult:
    """The merged ``o`` ``(..., dv)`` and ``lse`` ``(...)``, each a :class:`CertifiedTensor`
    (the partials' shapes without the split axis), rounded into ``fmt``."""

    fmt: Format
    tensors: dict[str, CertifiedTensor]
    stats: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> CertifiedTensor:
        """The tensor ``name`` (``"o"`` or ``"lse"``)."""
        if name not in self.tensors:
            raise KeyError(f"{name!r} was not computed; the oracle holds {sorted(self.tensors)}")
        return self.tensors[name]

    @property
    def o(self) -> CertifiedTensor:
        return self.tensors["o"]

    @property
    def lse(self) -> CertifiedTensor:
        return self.tensors["lse"]


def _rounded(lo: mpmath.mpf, hi: mpmath.mpf, w: float, fmt: Format) -> tuple[float, bool]:
    """The interval ``[lo, hi]`` rounded into ``fmt`` and whether it is certified: both ends
    round alike and the interval's width meets the accuracy target of the floor ``w``."""
    dh, _, err = interval_to_dd(lo, hi)
    decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
    ok = decided and err <= float(target(np.array(w), fmt))
    return (round_mpf(lo, fmt) if decided else float(round_to_format(dh, fmt))), ok


def _row(lse: np.ndarray, o: np.ndarray, prec: int):
    """Intervals of ``O_c`` and ``LSE`` of one row with at least one live split, and floors."""
    with iv_prec(prec):
        m = iv.mpf(float(lse.max()))
        w = [iv.exp(iv.mpf(float(x)) - m) for x in lse]
        z = sum(w[1:], w[0])
        out_lse = m + iv.log(z)
        outs = [
            sum((w[s] * iv.mpf(float(o[s, c])) for s in range(len(w))), iv.mpf(0)) / z
            for c in range(o.shape[1])
        ]
    p = np.array([float(mpf_of(x._mpi_[0])) for x in w]) / float(mpf_of(z._mpi_[0]))
    floors = p @ np.abs(o), float(p @ np.abs(lse))
    return outs, out_lse, floors


def _check(out_partial: Any, lse_partial: Any) -> tuple[np.ndarray, np.ndarray, Format]:
    o, fmt = as_exact_array(out_partial, "out_partial")
    lse, _ = as_exact_array(lse_partial, "lse_partial")
    if o.ndim < 2 or o.shape[0] < 1:
        raise ValueError(
            f"out_partial must be (S, ..., dv) with S >= 1 splits, got shape {o.shape}"
        )
    if lse.shape != o.shape[:-1]:
        raise ValueError(
            f"lse_partial must be (S, ...) = {o.shape[:-1]}, out_partial's shape without its "
            f"last axis, got {lse.shape}"
        )
    return o, lse, fmt


def combine_oracle(
    out_partial: Any,
    lse_partial: Any,
    *,
    fmt: Any = None,
    prec: int = 128,
    max_prec: int = 4096,
) -> CombineResult:
    """The exact merge of split-KV partials (module docstring), certified per element.

    Args:
        out_partial: ``(S, ..., dv)`` partial outputs, fp32 (or fp16/bf16), numpy or torch.
        lse_partial: ``(S, ...)`` their natural-log LSE, ``−inf`` for an empty split.
        fmt: format of the correctly rounded results (default: ``out_partial``'s).
        prec, max_prec: the interval precision to start at and to stop escalating at (bits).
    """
    o_all, lse_all, in_fmt = _check(out_partial, lse_partial)
    target_fmt = in_fmt if fmt is None else format_of(fmt)
    if not target_fmt.storage:
        raise ValueError(f"{target_fmt.name} has no storage format to round results into")
    if not isinstance(prec, int) or prec < MIN_PREC:
        raise ValueError(f"prec={prec!r} is too low for a 100-bit answer; use prec >= {MIN_PREC}")
    if not isinstance(max_prec, int) or max_prec < prec:
        raise ValueError(f"max_prec ({max_prec!r}) must be an int >= prec ({prec})")
    t0 = time.perf_counter()
    n_split, dv = o_all.shape[0], o_all.shape[-1]
    lead = o_all.shape[1:-1]
    o_rows = o_all.reshape(n_split, -1, dv)
    lse_rows = lse_all.reshape(n_split, -1)
    n_rows = lse_rows.shape[1]
    res = {f"o_{f}": np.zeros((n_rows, dv)) for f in FIELDS[:-1]}
    res.update({f"lse_{f}": np.zeros(n_rows) for f in FIELDS[:-1]})
    res["o_certified"] = np.ones((n_rows, dv), dtype=bool)
    res["lse_certified"] = np.ones(n_rows, dtype=bool)
    stats = {"strict_evaluations": 0, "max_prec_used": 0}
    for r in range(n_rows):
        _fill_row(lse_rows[:, r], o_rows[:, r], r, res, target_fmt, prec, max_prec, stats)
    stats["seconds"] = time.perf_counter() - t0
    tensors = {
        "o": CertifiedTensor(**{f: res[f"o_{f}"].reshape(*lead, dv) for f in FIELDS}),
        "lse": CertifiedTensor(**{f: res[f"lse_{f}"].reshape(lead) for f in FIELDS}),
    }
    return CombineResult(target_fmt, tensors, stats)


def _fill_row(lse, o, r, res, fmt, prec, max_prec, stats) -> None:
    """One row of the merge, in place: the NaN rule, the empty row, or the interval evaluation
    with Ziv escalation."""
    if np.isnan(lse).any() or np.isposinf(lse).any():
        for name in ("o_hi", "o_rounded"):
            res[name][r] = np.nan
        res["lse_hi"][r] = res["lse_rounded"][r] = np.nan
        return
    live = lse > -np.inf
    if not live.any():
        res["lse_hi"][r] = res["lse_rounded"][r] = -np.inf
        return
    lse, o = lse[live], o[live]
    bad = ~np.isfinite(o).all(axis=0)  # O_c that a non-finite partial poisons
    o = np.where(np.isfinite(o), o, 0.0)
    p = prec
    while True:
        stats["strict_evaluations"] += 1
        stats["max_prec_used"] = max(stats["max_prec_used"], p)
        outs, out_lse, (o_floor, lse_floor) = _row(lse, o, p)
        ok_all = True
        for c, x in enumerate(outs):
            lo, hi = mpf_of(x._mpi_[0]), mpf_of(x._mpi_[1])
            res["o_rounded"][r, c], ok = _rounded(lo, hi, o_floor[c], fmt)
            res["o_hi"][r, c], res["o_lo"][r, c], res["o_err"][r, c] = interval_to_dd(lo, hi)
            res["o_floor"][r, c] = o_floor[c]
            res["o_certified"][r, c] = ok
            ok_all &= ok or bool(bad[c])
        lo, hi = mpf_of(out_lse._mpi_[0]), mpf_of(out_lse._mpi_[1])
        res["lse_hi"][r], res["lse_lo"][r], res["lse_err"][r] = interval_to_dd(lo, hi)
        res["lse_floor"][r] = lse_floor
        scale = max(lse_floor, abs(res["lse_hi"][r]))
        res["lse_rounded"][r], ok = _rounded(lo, hi, scale, fmt)
        res["lse_certified"][r] = ok
        if (ok_all and ok) or p >= max_prec:
            break
        p = min(2 * p, max_prec)
    for name, val in (("o_hi", np.nan), ("o_rounded", np.nan), ("o_lo", 0.0), ("o_err", 0.0)):
        res[name][r, bad] = val
    res["o_floor"][r, bad] = 0.0
    res["o_certified"][r, bad] = True
