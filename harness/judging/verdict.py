"""Judging one kernel output against the oracle, the bounds and the naive baseline (SPEC 3.4).

Per case:

- **FAIL-HARD** when any output element exceeds its deterministic bound, when the kernel returns
  NaN/Inf where the oracle is finite, or when a row that keeps no key is not exactly ``O = 0``,
  ``LSE = −inf``;
- **FAIL** when an element's floored-ULP error exceeds
  ``max(2·E_naive + 1, probabilistic bound)``, where ``E_naive`` is the largest floored-ULP
  error of the same-precision naive baseline on the same case (FlashAttention's "at most twice
  the baseline's error" rule, with a floor of one floored ulp) and the probabilistic bound is
  expressed in the same floored ulps;
- **PASS** otherwise.

The same rules apply to LSE (absolute errors; floor: one fp32 ulp of |LSE|). Kernels of
arithmetic ``"unknown"`` are judged against the loosest bound of every known class
(:func:`flashcheck.harness.judging.bounds.error_bounds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import FP32, Format, ulp
from ..oracle.evaluate import OracleResult
from .bounds import Bounds
from .metrics import ErrorSummary, floored_ulp_error, summarize

__all__ = ["CONVENTION", "EMPIRICAL_FACTOR", "EMPIRICAL_FLOOR", "Verdict", "judge", "naive_error"]

# Reasons that start with this are a departure from flashcheck's conventions rather than a
# numerical error; reports label them so.
CONVENTION = "convention difference: "
EMPIRICAL_FACTOR = 2.0
EMPIRICAL_FLOOR = 1.0  # floored ulps: anything within one ulp of W_c is never a FAIL
ORDER = {"PASS": 0, "FAIL": 1, "FAIL-HARD": 2}


@dataclass
class Verdict:
    """The outcome for one case, with the numbers behind it."""

    verdict: str
    reasons: list[str]
    summary: ErrorSummary
    max_ulp: float  # max floored-ULP error of O where the oracle is finite (NaN/inf: the kernel
    # returned NaN/±Inf there)
    det_util: float  # max |err| / deterministic bound (nan without bounds)
    prob_util: float
    naive_ulp: float  # E_naive (nan if no naive reference)
    naive_ratio: float  # max_ulp / E_naive
    lse_err: float  # max |LSE error| (nan without LSE)
    lse_det_util: float
    worst: list[dict[str, Any]] = field(default_factory=list)

    def line(self) -> str:
        return (
            f"{self.verdict}: max {self.max_ulp:.3g} floored ulp, det-bound utilization "
            f"{self.det_util:.3g}, prob-bound utilization {self.prob_util:.3g}, naive "
            f"{self.naive_ulp:.3g} ulp (ratio {self.naive_ratio:.3g}), LSE err {self.lse_err:.3g}"
        )

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "summary"}
        out["summary"] = dict(self.summary.__dict__)
        return _jsonable(out)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return repr(x)
    return x


def _nonfinite_error(value: float) -> float:
    """The error of a NaN (NaN) or ±Inf (inf) output where the exact result is finite."""
    return math.nan if math.isnan(value) else math.inf


def naive_error(o_naive: np.ndarray, ref: OracleResult) -> float:
    """``E_naive``: the naive baseline's largest floored-ULP error where both are finite."""
    e = floored_ulp_error(o_naive, ref.o.hi, ref.o.lo, ref.o.floor, ref.fmt)
    e = e[np.isfinite(e)]
    return float(e.max()) if e.size else 0.0


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, num / den, np.where(num > 0, np.inf, 0.0))
    return r


def judge(
    o: np.ndarray,
    lse: np.ndarray | None,
    ref: OracleResult,
    bounds: Bounds | None,
    *,
    naive_ulp: float | None,
    naive_lse_err: float | None = None,
    worst: int = 5,
) -> Verdict:
    """Verdict for kernel outputs ``o`` (float64 copy) and ``lse`` against the oracle ``ref``."""
    fmt: Format = ref.fmt
    reasons: list[str] = []
    level = "PASS"

    def flag(new: str, why: str) -> None:
        nonlocal level
        reasons.append(f"{new}: {why}")
        if ORDER[new] > ORDER[level]:
            level = new

    summary = summarize(o, ref.o.hi, ref.o.lo, ref.o.floor, ref.o.rounded, fmt)
    fin_ref = np.isfinite(ref.o.hi)
    bad = fin_ref & ~np.isfinite(o)
    masked_rows = np.isneginf(ref.lse.hi)
    in_masked = masked_rows[..., None] & np.ones_like(bad)
    if (bad & ~in_masked).any():
        n_bad = int((bad & ~in_masked).sum())
        flag("FAIL-HARD", f"{n_bad} O elements NaN/Inf where the oracle is finite")
    nan_rows = masked_rows & np.isnan(o).all(axis=-1)
    if nan_rows.any():
        # PyTorch's SDPA gives NaN here; SPEC 3.1 asks for O = 0, LSE = -inf.
        flag(
            "FAIL-HARD",
            f"{CONVENTION}{int(nan_rows.sum())} fully masked rows give NaN, not "
            "O = 0 (flashcheck's contract, as FlashAttention)",
        )
    nz = masked_rows & (o != 0).any(axis=-1) & ~nan_rows
    if nz.any():
        flag("FAIL-HARD", f"{int(nz.sum())} fully masked rows with O != 0")

    e = floored_ulp_error(o, ref.o.hi, ref.o.lo, ref.o.floor, fmt)
    ok = fin_ref & np.isfinite(o)
    with np.errstate(invalid="ignore"):
        err = np.where(ok, np.abs((o - ref.o.hi) - ref.o.lo), 0.0)
    den = np.maximum(ulp(ref.o.hi, fmt, ref.o.lo), ulp(ref.o.floor, fmt))
    e = np.where(ok, e, 0.0)
    max_ulp = float(e.max()) if e.size else 0.0
    if bad.any():
        # A NaN or ±Inf where the exact result is finite has no finite error: never report it
        # as a small one (tables, figures and replay show NaN, and list these elements first).
        max_ulp = math.nan if np.isnan(o[bad]).any() else math.inf
        e = np.where(bad, np.inf, e)

    det_util = prob_util = float("nan")
    util = np.zeros_like(e)
    if bounds is not None:
        u_det = np.where(ok, _ratio(err, bounds.o_det), 0.0)
        u_prob = np.where(ok, _ratio(err, bounds.o_prob), 0.0)
        det_util = float(u_det.max()) if u_det.size else 0.0
        prob_util = float(u_prob.max()) if u_prob.size else 0.0
        util = u_det
        over = u_det > 1
        if over.any():
            flag(
                "FAIL-HARD",
                f"{int(over.sum())} O elements exceed the deterministic bound "
                f"(max utilization {det_util:.3g})",
            )
    n_ulp = float("nan") if naive_ulp is None else float(naive_ulp)
    ratio = float("nan")
    if naive_ulp is not None:
        ratio = max_ulp / naive_ulp if naive_ulp > 0 else (0.0 if max_ulp == 0 else np.inf)
        limit = EMPIRICAL_FACTOR * naive_ulp + EMPIRICAL_FLOOR
        if bounds is not None:
            limit = np.maximum(limit, _ratio(bounds.o_prob, den))
        over = e > limit
        if over.any():
            flag(
                "FAIL",
                f"{int(over.sum())} O elements above max(2·naive + 1 ulp, probabilistic bound) "
                f"(max {max_ulp:.3g} ulp vs naive {naive_ulp:.3g})",
            )
    elif bounds is not None:
        over = err > bounds.o_prob
        if over.any():
            flag("FAIL", f"{int(over.sum())} O elements above the probabilistic bound")

    lse_err = lse_util = float("nan")
    if lse is not None:
        lse = np.asarray(lse, dtype=np.float64)
        fin_l = np.isfinite(ref.lse.hi)
        bad_l = (fin_l & ~np.isfinite(lse)) | (masked_rows & ~np.isneginf(lse))
        if bad_l.any():
            flag(
                "FAIL-HARD",
                f"{int(bad_l.sum())} LSE values wrong in finiteness (masked rows "
                "must give -inf, others finite)",
            )
        okl = fin_l & np.isfinite(lse)
        with np.errstate(invalid="ignore"):
            lerr = np.where(okl, np.abs((lse - ref.lse.hi) - ref.lse.lo), 0.0)
        lse_err = float(lerr.max()) if lerr.size else 0.0
        if bad_l.any():  # a wrong -inf/NaN/inf has no finite error: never shown as a small one
            lse_err = math.inf
        floor = ulp(np.where(okl, ref.lse.hi, 0.0), FP32)
        if bounds is not None:
            lu = np.where(okl, _ratio(lerr, bounds.lse_det), 0.0)
            lse_util = float(lu.max()) if lu.size else 0.0
            if (lu > 1).any():
                flag("FAIL-HARD", f"LSE exceeds its deterministic bound (max util {lse_util:.3g})")
        if naive_lse_err is not None:
            lim = EMPIRICAL_FACTOR * naive_lse_err + floor
            if bounds is not None:
                lim = np.maximum(lim, bounds.lse_prob)
            if (lerr > lim).any():
                flag("FAIL", f"LSE error {lse_err:.3g} above max(2·naive + ulp, prob bound)")

    rank = np.where(bad, np.inf, util if bounds is not None else e)
    order = np.argsort(-rank, axis=None, kind="stable")[:worst]
    worst_list = []
    for flat in order:
        idx = np.unravel_index(flat, e.shape)
        row = {
            "index": [int(i) for i in idx],
            "kernel": float(o[idx]),
            "oracle": float(ref.o.hi[idx]),
            "oracle_lo": float(ref.o.lo[idx]),
            "floor_W": float(ref.o.floor[idx]),
            "abs_err": float(err[idx]) if not bad[idx] else _nonfinite_error(o[idx]),
            "floored_ulp": float(e[idx]) if not bad[idx] else _nonfinite_error(o[idx]),
        }
        if bounds is not None:
            row["det_bound"] = float(bounds.o_det[idx])
            row["prob_bound"] = float(bounds.o_prob[idx])
        worst_list.append(row)
    return Verdict(
        verdict=level,
        reasons=reasons,
        summary=summary,
        max_ulp=max_ulp,
        det_util=det_util,
        prob_util=prob_util,
        naive_ulp=n_ulp,
        naive_ratio=ratio,
        lse_err=lse_err,
        lse_det_util=lse_util,
        worst=worst_list,
    )
