"""What a campaign's result record holds: statuses, the failure margin that steers the search,
the metrics of a judged case and its fit to every arithmetic class.

One record per kernel and case, appended to ``results.jsonl``
(:mod:`flashcheck.harness.core.resultlog`); the renderer and the gate read nothing else.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..adapters.outcome import Outcome
from ..checks.check_results import CheckResult
from ..core.status import Status
from ..judging.bounds import Bounds
from ..judging.metrics import ulp_histogram
from ..judging.tensor_verdict import TensorVerdict
from .resultrecords import ResultRecord

__all__ = [
    "class_utilization",
    "failure_margin",
    "gist",
    "gradient_fields",
    "job_outcome",
    "result_fields",
    "unjudged_record",
]


def failure_margin(res: CheckResult) -> float:
    """How close the case is to failing: the largest of the deterministic-bound utilizations
    (O and LSE) and ``max_ulp / (2·E_naive + 1)``, the empirical rule's utilization. Above 1
    from a deterministic bound the case fails; above 1 from the empirical rule it fails only
    where the probabilistic bound is exceeded too (the rule needs both), so a PASS can score
    above 1. A FAIL-HARD for another reason (NaN/Inf, masked rows) scores just above 1.
    """
    v = res.verdict
    if not math.isfinite(v.max_ulp):  # NaN/Inf where the exact result is finite
        return math.inf
    margin = 0.0
    if math.isfinite(v.det_util):
        margin = max(margin, v.det_util)
    if math.isfinite(v.naive_ulp):
        margin = max(margin, v.max_ulp / (2 * v.naive_ulp + 1))
    if math.isfinite(v.lse_det_util):
        margin = max(margin, v.lse_det_util)
    if v.verdict == Status.FAIL_HARD:
        margin = max(margin, 1.0 + 1e-9)
    return margin


def gist(message: str) -> str:
    """A failure message without the numbers that vary from case to case (shapes, lengths,
    addresses): two failures with the same gist are the same failure."""
    return re.sub(r"0x[0-9a-f]+|-?\d+(\.\d+)?(e[-+]?\d+)?", "N", message)


def class_utilization(res: CheckResult, every: Bounds) -> dict[str, float | None]:
    """Max |error| / deterministic bound of O against each known arithmetic class (``None``
    where the output is not finite where the oracle is)."""
    o, ref = res.output.o, res.ref
    ok = np.isfinite(ref.o.hi) & np.isfinite(o)
    if (np.isfinite(ref.o.hi) & ~np.isfinite(o)).any():
        return dict.fromkeys(every.parts)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.where(ok, np.abs((o - ref.o.hi) - ref.o.lo), 0.0)
        out = {}
        for cls, b in every.parts.items():
            u = np.where(b.o.det > 0, err / b.o.det, np.where(err > 0, np.inf, 0.0))
            out[cls] = float(u.max()) if u.size else 0.0
    return out


def _missing(x: float) -> float | None:
    """``None`` for a value that does not apply (NaN in the verdict means 'not computed')."""
    return None if math.isnan(x) else x


def result_fields(res: CheckResult, every: Bounds) -> dict[str, Any]:
    v, s = res.verdict, res.verdict.summary
    ref = res.ref
    e = v["o"].errors  # O's floored-ULP errors, as judged
    ok = np.isfinite(ref.o.hi) & np.isfinite(res.output.o)
    with np.errstate(invalid="ignore"):
        d = ((res.output.o - ref.o.hi) - ref.o.lo)[ok]
        # The error of the correctly rounded output: the floor no kernel can go below.
        rn = ((ref.o.rounded.astype(np.float64) - ref.o.hi) - ref.o.lo)[ok]
    return {
        "status": v.verdict,
        "reasons": v.reasons,
        "score": failure_margin(res),
        "class_util": class_utilization(res, every),
        "metrics": {
            # NaN/inf here: the kernel returned NaN/±Inf where the exact result is finite.
            "max_ulp": v.max_ulp,
            "median_ulp": s.median_floored_ulp,
            "max_ulp_int": s.max_ulp_int,
            "det_util": _missing(v.det_util),
            "prob_util": _missing(v.prob_util),
            "naive_ulp": _missing(v.naive_ulp),
            "naive_ratio": _missing(v.naive_ratio),
            "lse_err": _missing(v.lse_err),
            "lse_det_util": _missing(v.lse_det_util),
            "normwise_rel": s.normwise_rel,
            "rmse": s.rmse,
            "sse": float(np.sum(d * d)),
            "oracle_rn_sse": float(np.sum(rn * rn)),
            "n_finite": int(d.size),
            "max_abs": s.max_abs,
            "nonfinite_mismatches": s.nonfinite_mismatches,
            "count": s.count,
            "has_lse": res.output.lse is not None,
        },
        "ulp_hist": ulp_histogram(np.where(ok, e, np.nan)),
        "worst": v.worst[:3],
    }


def gradient_fields(verdicts: dict[str, TensorVerdict]) -> dict[str, Any]:
    """The fields of a gradient result record: the worst verdict of dQ, dK, dV, the reasons,
    a score (the failure margin of the worst gradient, as :func:`failure_margin`), and per
    gradient its verdict and numbers."""
    level = Status.worst(v.verdict for v in verdicts.values())
    margins = []
    for v in verdicts.values():
        if not math.isfinite(v.max_ulp):
            margins.append(math.inf)
            continue
        emp = v.max_ulp / (2 * v.naive_ulp + 1) if math.isfinite(v.naive_ulp) else 0.0
        margins.append(max(emp, v.det_util if math.isfinite(v.det_util) else 0.0))
    per = {
        name: {
            "verdict": v.verdict,
            "max_ulp": v.max_ulp,
            "det_util": _missing(v.det_util),
            "prob_util": _missing(v.prob_util),
            "naive_ulp": _missing(v.naive_ulp),
            "naive_ratio": _missing(v.naive_ratio),
            "worst": v.worst[:2],
        }
        for name, v in verdicts.items()
    }
    return {
        "status": level,
        "reasons": [r for v in verdicts.values() for r in v.reasons],
        "score": max(margins),
        "gradients": per,
    }


def job_outcome(job: Any) -> Any:
    """What a kernel run gave: its value, the failed :class:`Outcome` it ended in, or (a
    string) why it was not run (outside the kernel's contract)."""
    if isinstance(job, str):
        return job
    got: Outcome = job.result()
    return got.value if got.ok else got


def unjudged_record(cls: type[ResultRecord], common: dict[str, Any], out: Any) -> Any:
    """The record of a run with nothing to judge (:func:`job_outcome` gave a reason or a
    failure), or ``None`` if ``out`` is the kernel's output. A SKIP scores 0; a broken result
    is infinitely far from passing."""
    if isinstance(out, str):
        return cls(**common, status=Status.SKIP, reasons=(out,), score=0.0)
    if isinstance(out, Outcome):
        score = 0.0 if out.status == Status.SKIP else math.inf
        return cls(**common, status=out.status, reasons=(out.message,), score=score)
    return None
