"""What the judge returns: a verdict per tensor (:class:`TensorVerdict`) and a case's forward
verdict over its tensors (:class:`Verdict`); the rules are in
:mod:`flashcheck.harness.judging.verdict`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.status import Status
from .metrics import ErrorSummary

__all__ = ["LABELS", "TensorVerdict", "Verdict"]

LABELS = {"o": "O", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV", "dsinks": "dσ"}


@dataclass
class TensorVerdict:
    """The outcome for one tensor of one case, with the numbers behind it.

    ``max_err``: the largest error, in floored ulps (for LSE: absolute); NaN or inf where the
    kernel returned NaN or ±Inf where the exact result is finite (never a small number).
    ``det_util``, ``prob_util``: the largest ``|error| / bound`` (NaN without bounds; ∞ where
    an output is NaN/Inf and its exact value finite);
    ``naive_ulp``: ``E_naive`` in the same unit (NaN without a naive baseline) and
    ``naive_ratio`` ``= max_err / E_naive``; ``worst``: the worst elements, by deterministic
    bound utilization (by error without bounds), NaN/Inf first; ``summary``: every metric of
    :func:`~flashcheck.harness.judging.metrics.summarize`, when asked for; ``errors``: each
    element's error in the tensor's unit, as judged (0 where the kernel's and the oracle's
    values are not both finite, inf where the kernel's is NaN/Inf and the oracle's finite).
    """

    name: str
    verdict: Status
    reasons: list[str]
    max_err: float
    det_util: float
    prob_util: float
    naive_ulp: float
    naive_ratio: float
    worst: list[dict[str, Any]] = field(default_factory=list)
    summary: ErrorSummary | None = None
    errors: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def max_ulp(self) -> float:
        """The largest floored-ULP error (NaN for LSE, whose errors are absolute)."""
        return math.nan if self.name == "lse" else self.max_err

    def line(self) -> str:
        unit, short = ("absolute", "") if self.name == "lse" else ("floored ulp", " ulp")
        # NaN means none applies (a merge has no naive baseline): said so, not "nan".
        naive = (
            "no naive baseline"
            if np.isnan(self.naive_ulp)
            else f"naive {self.naive_ulp:.3g}{short} (ratio {self.naive_ratio:.3g})"
        )
        util = "n/a" if np.isnan(self.det_util) else f"{self.det_util:.3g}"
        err = f"max {self.max_err:.3g} {unit}"
        if np.isnan(self.max_err):
            err = "max error NaN (NaN in the output where the exact value is a number)"
        return f"{LABELS[self.name]} {self.verdict}: {err}, det-bound utilization {util}, {naive}"

    def as_dict(self) -> dict[str, Any]:
        """The verdict as a dict, its numbers NaN and ±inf as their ``repr`` (the worst rows
        as they are, as case files have always stored them)."""
        numbers = {
            "max_ulp": self.max_err,
            "det_util": self.det_util,
            "prob_util": self.prob_util,
            "naive_ulp": self.naive_ulp,
            "naive_ratio": self.naive_ratio,
        }
        return {
            "name": self.name,
            "verdict": str(self.verdict),
            "reasons": self.reasons,
            **_jsonable(numbers),
            "worst": self.worst,
        }


@dataclass
class Verdict:
    """A case's forward verdict: the worst of its tensors' (``o`` and, when the kernel returns
    it, ``lse``), with O's numbers as the case's (``max_ulp``, ``summary``, ``worst``) and
    LSE's as ``lse_err`` and ``lse_det_util`` (NaN without LSE)."""

    tensors: dict[str, TensorVerdict]
    diagnosis: list[str] = field(default_factory=list)  # what a failure is consistent with

    def __getitem__(self, name: str) -> TensorVerdict:
        return self.tensors[name]

    @property
    def verdict(self) -> Status:
        return Status.worst(t.verdict for t in self.tensors.values())

    @property
    def reasons(self) -> list[str]:
        # Each reason once: a reason about the kernel as a whole (its precision below the
        # input format's) is found by O's judgement and LSE's alike.
        every = [r for t in self.tensors.values() for r in t.reasons] + self.diagnosis
        return list(dict.fromkeys(every))

    @property
    def summary(self) -> ErrorSummary:
        return self.tensors["o"].summary

    @property
    def max_ulp(self) -> float:
        return self.tensors["o"].max_err

    @property
    def det_util(self) -> float:
        return self.tensors["o"].det_util

    @property
    def prob_util(self) -> float:
        return self.tensors["o"].prob_util

    @property
    def naive_ulp(self) -> float:
        return self.tensors["o"].naive_ulp

    @property
    def naive_ratio(self) -> float:
        return self.tensors["o"].naive_ratio

    @property
    def worst(self) -> list[dict[str, Any]]:
        return self.tensors["o"].worst

    @property
    def lse_err(self) -> float:
        return self.tensors["lse"].max_err if "lse" in self.tensors else math.nan

    @property
    def lse_det_util(self) -> float:
        return self.tensors["lse"].det_util if "lse" in self.tensors else math.nan

    def line(self) -> str:
        return (
            f"{self.verdict}: max {self.max_ulp:.3g} floored ulp, det-bound utilization "
            f"{self.det_util:.3g}, prob-bound utilization {self.prob_util:.3g}, naive "
            f"{self.naive_ulp:.3g} ulp (ratio {self.naive_ratio:.3g}), LSE err {self.lse_err:.3g}"
        )

    def as_dict(self) -> dict[str, Any]:
        keys = ("verdict", "reasons", "max_ulp", "det_util", "prob_util", "naive_ulp")
        keys += ("naive_ratio", "lse_err", "lse_det_util", "worst")
        out = {key: getattr(self, key) for key in keys}
        out["summary"] = dict(self.summary.__dict__)
        return _jsonable(out)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, Status):
        return str(x)
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not np.isfinite(x):
        return repr(x)
    return x
