"""Judging a kernel's gradients against the oracle, the gradient bounds and the naive backward.

Each gradient tensor (``dq``, ``dk``, ``dv``) gets a verdict by the forward's rules
(:mod:`flashcheck.harness.judging.verdict`, SPEC 3.4 and 3.7):

- **FAIL-HARD** when an element exceeds its deterministic bound (class ``unknown``: the loosest
  bound of every known class) or is NaN/Inf where the oracle is finite: the NaN gradients of
  fully masked rows and of lengths off a kernel's block grid are caught here;
- **FAIL** when an element's floored-ULP error (against the gradient's floor, docs/oracle.md §7)
  exceeds ``max(2·E_naive + 1, probabilistic bound)``, ``E_naive`` being the largest floored-ULP
  error of the same-precision naive backward on the same case;
- **PASS** otherwise. The case's gradient verdict is the worst of the three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import ulp
from ..oracle.evaluate import OracleResult
from .metrics import floored_ulp_error
from .verdict import EMPIRICAL_FACTOR, EMPIRICAL_FLOOR, ORDER

__all__ = ["GRADIENT_LABELS", "GradientVerdict", "gradient_errors", "judge_gradients"]

GRADIENT_LABELS = {"dq": "dQ", "dk": "dK", "dv": "dV"}


@dataclass
class GradientVerdict:
    """The outcome for one gradient tensor of one case, with the numbers behind it."""

    name: str  # "dq", "dk" or "dv"
    verdict: str
    reasons: list[str]
    max_ulp: float  # max floored-ULP error (NaN/inf: the kernel returned NaN/±Inf there)
    det_util: float  # max |err| / deterministic bound (nan without bounds)
    prob_util: float
    naive_ulp: float  # E_naive (nan without a naive reference)
    naive_ratio: float
    worst: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{GRADIENT_LABELS[self.name]} {self.verdict}: max {self.max_ulp:.3g} floored ulp, "
            f"det-bound utilization {self.det_util:.3g}, naive {self.naive_ulp:.3g} ulp "
            f"(ratio {self.naive_ratio:.3g})"
        )

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for key in ("max_ulp", "det_util", "prob_util", "naive_ulp", "naive_ratio"):
            if not math.isfinite(out[key]):
                out[key] = repr(out[key])
        return out


def _ref(ref: OracleResult, name: str) -> tuple[np.ndarray, ...]:
    t = ref[name]
    return t.hi, t.lo, t.floor


def gradient_errors(grads: dict[str, np.ndarray], ref: OracleResult) -> dict[str, float]:
    """The largest floored-ULP error of each gradient where both it and the oracle are finite
    (``E_naive`` when ``grads`` are the naive backward's)."""
    out = {}
    for name, y in grads.items():
        hi, lo, floor = _ref(ref, name)
        e = floored_ulp_error(y, hi, lo, floor, ref.fmt)
        e = e[np.isfinite(e)]
        out[name] = float(e.max()) if e.size else 0.0
    return out


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(den > 0, num / den, np.where(num > 0, np.inf, 0.0))


def _judge_one(name, y, ref, det, prob, naive_ulp, worst) -> GradientVerdict:
    label = GRADIENT_LABELS[name]
    hi, lo, floor = _ref(ref, name)
    fmt = ref.fmt
    reasons: list[str] = []
    level = "PASS"

    def flag(new: str, why: str) -> None:
        nonlocal level
        reasons.append(f"{new}: {why}")
        if ORDER[new] > ORDER[level]:
            level = new

    fin_ref = np.isfinite(hi)
    bad = fin_ref & ~np.isfinite(y)
    if bad.any():
        flag("FAIL-HARD", f"{int(bad.sum())} {label} elements NaN/Inf where the oracle is finite")
    ok = fin_ref & np.isfinite(y)
    e = np.where(ok, floored_ulp_error(y, hi, lo, floor, fmt), 0.0)
    with np.errstate(invalid="ignore"):
        err = np.where(ok, np.abs((y - hi) - lo), 0.0)
    max_ulp = float(e.max()) if e.size else 0.0
    if bad.any():
        max_ulp = math.nan if np.isnan(y[bad]).any() else math.inf
        e = np.where(bad, np.inf, e)
    det_util = prob_util = math.nan
    rank = e
    if det is not None:
        u_det = np.where(ok, _ratio(err, det), 0.0)
        det_util = float(u_det.max()) if u_det.size else 0.0
        prob_util = float(np.where(ok, _ratio(err, prob), 0.0).max()) if u_det.size else 0.0
        rank = np.where(bad, np.inf, u_det)
        over = u_det > 1
        if over.any():
            flag(
                "FAIL-HARD",
                f"{int(over.sum())} {label} elements exceed the deterministic "
                f"bound (max utilization {det_util:.3g})",
            )
    ratio = math.nan
    if naive_ulp is not None:
        ratio = max_ulp / naive_ulp if naive_ulp > 0 else (0.0 if max_ulp == 0 else math.inf)
        limit = EMPIRICAL_FACTOR * naive_ulp + EMPIRICAL_FLOOR
        if prob is not None:
            den = np.maximum(ulp(hi, fmt, lo), ulp(floor, fmt))
            limit = np.maximum(limit, _ratio(prob, den))
        over = e > limit
        if over.any():
            flag(
                "FAIL",
                f"{int(over.sum())} {label} elements above max(2·naive + 1 ulp, "
                f"probabilistic bound) (max {max_ulp:.3g} ulp vs naive "
                f"{naive_ulp:.3g})",
            )
    elif prob is not None:
        over = err > prob
        if over.any():
            flag("FAIL", f"{int(over.sum())} {label} elements above the probabilistic bound")
    rows = []
    for flat in np.argsort(-rank, axis=None, kind="stable")[:worst]:
        idx = np.unravel_index(flat, e.shape)
        nonfinite = math.nan if np.isnan(y[idx]) else math.inf
        row = {
            "index": [int(i) for i in idx],
            "kernel": float(y[idx]),
            "oracle": float(hi[idx]),
            "oracle_lo": float(lo[idx]),
            "floor": float(floor[idx]),
            "abs_err": float(err[idx]) if not bad[idx] else nonfinite,
            "floored_ulp": float(e[idx]) if not bad[idx] else nonfinite,
        }
        if det is not None:
            row["det_bound"] = float(det[idx])
            row["prob_bound"] = float(prob[idx])
        rows.append(row)
    return GradientVerdict(
        name=name,
        verdict=level,
        reasons=reasons,
        max_ulp=max_ulp,
        det_util=det_util,
        prob_util=prob_util,
        naive_ulp=math.nan if naive_ulp is None else float(naive_ulp),
        naive_ratio=ratio,
        worst=rows,
    )


def judge_gradients(
    grads: dict[str, np.ndarray],
    ref: OracleResult,
    bounds: Any | None,
    *,
    naive: dict[str, float] | None,
    worst: int = 5,
) -> dict[str, GradientVerdict]:
    """Verdicts for the kernel gradients ``grads`` (``{"dq": ..., "dk": ..., "dv": ...}``,
    float64 copies) against the oracle ``ref`` (computed with ``do=``), the gradient bounds
    (:class:`flashcheck.harness.judging.gradient_bounds.GradientBounds`, or ``None``) and the
    naive backward's errors (:func:`gradient_errors`, or ``None``)."""
    out = {}
    for name, y in grads.items():
        det = None if bounds is None else getattr(bounds, f"{name}_det")
        prob = None if bounds is None else getattr(bounds, f"{name}_prob")
        n_ulp = None if naive is None else naive[name]
        out[name] = _judge_one(name, np.asarray(y, np.float64), ref, det, prob, n_ulp, worst)
    return out
