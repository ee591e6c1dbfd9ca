"""One judge: a kernel's output tensor against the oracle's certified tensor, its bounds and the
naive baseline.

:func:`judge_tensor` decides every tensor, forward (``o``, ``lse``) and backward (``dq``,
``dk``, ``dv``), by one table:

- **FAIL-HARD** when an element exceeds its deterministic bound (class ``unknown``: the
  loosest bound of the classes at or above the input format's precision,
  :func:`flashcheck.harness.judging.bounds.error_bounds`; when the errors fit a class below
  that floor, such as ``tf32`` for fp32 inputs, the reason names it and its declaration), or
  is NaN/Inf where the oracle is finite;
- **FAIL** when an element's error exceeds ``max(2·E_naive + floor, probabilistic bound)``,
  ``E_naive`` being the largest error of the same-precision naive baseline on the same case
  (FlashAttention's "at most twice the baseline's error" rule, with a floor); without a naive
  baseline, when it exceeds the probabilistic bound;
- **PASS** otherwise.

Errors are floored-ULP errors (:mod:`flashcheck.harness.judging.metrics`) with a floor of one
floored ulp, except for LSE, whose rules are these explicit parts of the same table:

- LSE's errors are absolute and its floor is one fp32 ulp of ``|LSE|`` (LSE is an fp32 output
  whatever the input format); the probabilistic bound applies to it only beside a naive
  baseline;
- a row that keeps no key must give exactly ``O = 0`` and ``LSE = −inf`` (flashcheck's
  contract, as FlashAttention's): any other O is FAIL-HARD, a NaN row with the reason
  :data:`CONVENTION` (PyTorch's SDPA gives NaN there), and any other LSE is FAIL-HARD.

A case's verdict (:class:`Verdict`) is the worst (:meth:`Status.worst`) of its tensors'.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.formats import FP32, Format, ulp
from ..core.status import Status
from ..oracle.evaluate import OracleResult
from ..oracle.tensor import CertifiedTensor
from .classes import PRECISION_BELOW, precision_reason, reduced_classes
from .gradient_diagnosis import diagnose_gradient
from .metrics import floored_ulp_error, floored_ulp_scale, summarize
from .roundoff import TensorBounds
from .tensor_verdict import LABELS, TensorVerdict, Verdict

__all__ = [
    "CONVENTION",
    "EMPIRICAL_FACTOR",
    "EMPIRICAL_FLOOR",
    "GRADIENT_LABELS",
    "LABELS",
    "TensorVerdict",
    "Verdict",
    "baseline_error",
    "gradient_errors",
    "judge",
    "judge_gradients",
    "judge_tensor",
    "lower_bounds",
    "naive_error",
]

# Reasons that start with this are a departure from flashcheck's conventions rather than a
# numerical error; reports label them so.
CONVENTION = "convention difference: "
EMPIRICAL_FACTOR = 2.0
EMPIRICAL_FLOOR = 1.0  # floored ulps: anything within one ulp of the floor is never a FAIL
GRADIENT_LABELS = {name: LABELS[name] for name in ("dq", "dk", "dv", "dsinks")}
# The worst-element rows name the floor as the reports show it: W_c for O.
_FLOOR_KEY = {"o": "floor_W"}


def _ratio(num: np.ndarray, den: Any) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(den > 0, num / den, np.where(num > 0, np.inf, 0.0))


def baseline_error(name: str, y: Any, ref: CertifiedTensor, fmt: Format) -> float:
    """The largest error of a baseline's tensor ``y`` where it and the oracle are finite, in the
    unit :func:`judge_tensor` uses for ``name`` (``E_naive`` for the naive baseline)."""
    y = np.asarray(y, dtype=np.float64)
    if name == "lse":
        fin = np.isfinite(ref.hi) & np.isfinite(y)
        with np.errstate(invalid="ignore"):  # −inf − (−inf) in masked rows, dropped by `fin`
            e = np.abs((y - ref.hi) - ref.lo)[fin]
    else:
        e = floored_ulp_error(y, ref.hi, ref.lo, ref.floor, fmt)
        e = e[np.isfinite(e)]
    return float(e.max()) if e.size else 0.0


def naive_error(o_naive: np.ndarray, ref: OracleResult) -> float:
    """``E_naive`` of O: the naive baseline's largest floored-ULP error where both are finite."""
    return baseline_error("o", o_naive, ref.o, ref.fmt)


def gradient_errors(grads: dict[str, np.ndarray], ref: Any) -> dict[str, float]:
    """The largest floored-ULP error of each gradient (``E_naive`` when ``grads`` are the naive
    backward's); ``ref`` holds the gradients' certified tensors (``ref["dq"]``)."""
    return {name: baseline_error(name, y, ref[name], ref.fmt) for name, y in grads.items()}


def judge_tensor(
    name: str,
    y: Any,
    ref: CertifiedTensor,
    bounds: TensorBounds | None,
    *,
    fmt: Format,
    naive: float | None,
    empty_rows: np.ndarray | None = None,
    summary: bool = False,
    worst: int = 5,
    lower: dict[str, TensorBounds] | None = None,
) -> TensorVerdict:
    """The verdict of the kernel's tensor ``y`` (any float array, compared exactly) against the
    oracle's ``ref`` by the table of the module docstring.

    ``name``: ``"o"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"``; ``bounds``: the tensor's
    bounds, or ``None``; ``fmt``: the kernel's output format; ``naive``: ``E_naive``
    (:func:`baseline_error`), or ``None``; ``empty_rows``: for ``o`` and ``lse``, the rows that
    keep no key (``(B, H, R)``; for ``lse`` by default where the oracle's LSE is ``−inf``);
    ``summary``: also every metric of :func:`~flashcheck.harness.judging.metrics.summarize`;
    ``worst``: how many worst elements to list; ``lower``: for a kernel of class ``unknown``,
    the bounds of the classes below the precision floor (:func:`lower_bounds`): an error above
    ``bounds`` but within one of them adds the reason that names its declaration.
    """
    y = np.asarray(y, dtype=np.float64)
    if name not in LABELS:
        raise ValueError(f"name must be one of {sorted(LABELS)}, got {name!r}")
    if y.shape != ref.shape:
        raise ValueError(f"{LABELS[name]} has shape {y.shape}, the oracle's is {ref.shape}")
    absolute = name == "lse"
    if absolute and empty_rows is None:
        empty_rows = np.isneginf(ref.hi)
    flags = _Flags()
    fin_ref = np.isfinite(ref.hi)
    bad = fin_ref & ~np.isfinite(y)
    if absolute:
        bad = bad | (empty_rows & ~np.isneginf(y))
    _exactness(flags, name, y, bad, empty_rows)
    ok = fin_ref & np.isfinite(y)
    err, e, den, slack, worst_err = _errors(name, y, ref, fmt, ok, bad)
    stats = None
    if summary:
        stats = summarize(y, ref.hi, ref.lo, ref.floor, ref.rounded, fmt, floored=e)
    det_util, prob_util, rank = _utilization(flags, name, err, e, ok, bad, bounds, fmt, lower)
    ratio = math.nan
    if naive is not None:
        ratio = worst_err / naive if naive > 0 else (0.0 if worst_err == 0 else math.inf)
        limit = EMPIRICAL_FACTOR * naive + slack
        if bounds is not None:
            limit = np.maximum(limit, _ratio(bounds.prob, den) if not absolute else bounds.prob)
        # Finite pairs only: a NaN/Inf where the oracle is finite has its own FAIL-HARD
        # reason, and counted here it made the largest error "nan" (a user read "max nan ulp").
        over = ok & (e > limit)
        if over.any():
            flags.empirical(name, int(over.sum()), float(e[over].max()), naive)
    elif bounds is not None and not absolute:
        over = err > bounds.prob
        if over.any():
            flags.add(
                Status.FAIL,
                f"{int(over.sum())} {LABELS[name]} elements above the probabilistic bound",
            )
    return TensorVerdict(
        name=name,
        verdict=flags.level,
        reasons=flags.reasons,
        max_err=worst_err,
        det_util=det_util,
        prob_util=prob_util,
        naive_ulp=math.nan if naive is None else float(naive),
        naive_ratio=ratio,
        worst=[] if absolute else _worst(name, y, ref, err, e, bad, rank, bounds, worst),
        summary=stats,
        errors=e,
    )


def _utilization(flags, name, err, e, ok, bad, bounds, fmt, lower):
    """The largest deterministic and probabilistic bound utilizations (NaN without bounds,
    ∞ where an output is NaN/Inf and its exact value finite), the ranking of the worst
    elements, and the FAIL-HARD of an error above the deterministic bound, with the precision
    reason when the errors fit a class below the floor."""
    if bounds is None:
        return math.nan, math.nan, e
    u_det = np.where(ok, _ratio(err, bounds.det), 0.0)
    u_prob = np.where(ok, _ratio(err, bounds.prob), 0.0)
    det_util = float(u_det.max()) if u_det.size else 0.0
    prob_util = float(u_prob.max()) if u_prob.size else 0.0
    if (u_det > 1).any():
        _below_floor(flags, err, ok, bad, fmt, lower or {})
        flags.det(name, int((u_det > 1).sum()), det_util)
    if bad.any():
        # NaN/Inf where the exact value is finite: an error no bound covers. Reported as an
        # infinite utilization, never as the (small) utilization of the finite elements.
        det_util = prob_util = math.inf
    return det_util, prob_util, np.where(bad, np.inf, u_det)


def lower_bounds(bounds: Any, name: str) -> dict[str, TensorBounds] | None:
    """The bounds of tensor ``name`` for the classes below the precision floor that class
    ``unknown``'s envelope leaves out (``None`` for a declared class or plain bounds)."""
    if getattr(bounds, "arithmetic", None) != "unknown":
        return None
    below = reduced_classes(bounds.fmt.name)
    return {c: bounds.parts[c][name] for c in below if c in bounds.parts}


def _below_floor(flags, err, ok, bad, fmt: Format, lower: dict[str, TensorBounds]) -> None:
    """The precision reason when every finite error fits a lower class's deterministic bound
    (a NaN/Inf fits none)."""
    if bad.any():
        return
    for cls, b in lower.items():
        if not (np.where(ok, err, 0.0) > b.det).any():
            flags.add(Status.FAIL_HARD, precision_reason(fmt.name, cls))
            return


def _precision_everywhere(tensors: dict[str, TensorVerdict]) -> None:
    """Keep a precision reason ("the errors fit the bounds of tf32 matmuls") only where every
    tensor above its deterministic bound fits that class: O within tf32's bounds beside an LSE
    beyond them told a user to declare tf32, and declared, the kernel still failed."""
    over = [t for t in tensors.values() if t.det_util > 1]
    for reason in {r for t in over for r in t.reasons if PRECISION_BELOW in r}:
        if not all(reason in t.reasons for t in over):
            for t in tensors.values():
                t.reasons[:] = [r for r in t.reasons if r != reason]


def _errors(name: str, y, ref: CertifiedTensor, fmt: Format, ok, bad):
    """Each element's absolute error ``err`` and its error ``e`` in the tensor's unit, computed
    once (0 where either value is not finite; ``e`` = inf where ``bad``), that unit ``den``, the
    empirical rule's floor ``slack``, and the largest error (NaN/inf where ``bad``)."""
    with np.errstate(invalid="ignore"):
        err = np.where(ok, np.abs((y - ref.hi) - ref.lo), 0.0)
    if name == "lse":
        # LSE: absolute errors, floor one fp32 ulp of |LSE| (LSE is an fp32 output).
        worst_err = float(err.max()) if err.size else 0.0
        if bad.any():  # a wrong −inf/NaN/inf has no finite error: never shown as a small one
            worst_err = math.inf
        return err, err, 1.0, ulp(np.where(ok, ref.hi, 0.0), FP32), worst_err
    den = floored_ulp_scale(ref.hi, ref.lo, ref.floor, fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(ok, err / den, 0.0)
    worst_err = float(e.max()) if e.size else 0.0
    if bad.any():
        # NaN or ±Inf where the exact result is finite has no finite error: never report it as
        # a small one (tables, figures and replay show NaN, and list it first).
        worst_err = math.nan if np.isnan(y[bad]).any() else math.inf
        e = np.where(bad, np.inf, e)
    return err, e, den, EMPIRICAL_FLOOR, worst_err


class _Flags:
    """The reasons found so far and the most severe status among them."""

    def __init__(self) -> None:
        self.level = Status.PASS
        self.reasons: list[str] = []

    def add(self, status: Status, why: str) -> None:
        self.reasons.append(f"{status}: {why}")
        self.level = Status.worst((self.level, status))

    def det(self, name: str, count: int, util: float) -> None:
        if name == "lse":
            why = f"LSE exceeds its deterministic bound (max util {util:.3g})"
        else:
            why = (
                f"{count} {LABELS[name]} elements exceed the deterministic bound "
                f"(max utilization {util:.3g})"
            )
        self.add(Status.FAIL_HARD, why)

    def empirical(self, name: str, count: int, worst: float, naive: float) -> None:
        if name == "lse":
            why = f"LSE error {worst:.3g} above max(2·naive + ulp, prob bound)"
        else:
            why = (
                f"{count} {LABELS[name]} elements above max(2·naive + 1 ulp, probabilistic "
                f"bound) (max {worst:.3g} ulp vs naive {naive:.3g})"
            )
        self.add(Status.FAIL, why)


def _exactness(flags: _Flags, name: str, y, bad, empty_rows) -> None:
    """FAIL-HARD for values that must be exact: finite where the oracle is, and the rows that
    keep no key exactly ``O = 0`` (NaN there: the convention reason), ``LSE = −inf``."""
    label = LABELS[name]
    if name == "lse":
        if bad.any():
            flags.add(
                Status.FAIL_HARD,
                f"{int(bad.sum())} LSE values wrong in finiteness (masked rows "
                "must give -inf, others finite)",
            )
        return
    if empty_rows is None:
        if bad.any():
            flags.add(
                Status.FAIL_HARD,
                f"{int(bad.sum())} {label} elements NaN/Inf where the oracle is finite",
            )
        return
    # O of a row that keeps no key: the exact 0 is finite, but a NaN there is reported as the
    # convention difference it is, not counted among the NaN/Inf elements.
    in_empty = empty_rows[..., None] & np.ones_like(bad)
    if (bad & ~in_empty).any():
        n_bad = int((bad & ~in_empty).sum())
        flags.add(Status.FAIL_HARD, f"{n_bad} {label} elements NaN/Inf where the oracle is finite")
    nan_rows = empty_rows & np.isnan(y).all(axis=-1)
    if nan_rows.any():
        flags.add(
            Status.FAIL_HARD,
            f"{CONVENTION}{int(nan_rows.sum())} fully masked rows give NaN, not "
            "O = 0 (flashcheck's contract, as FlashAttention)",
        )
    nonzero = empty_rows & (y != 0).any(axis=-1) & ~nan_rows
    if nonzero.any():
        flags.add(Status.FAIL_HARD, f"{int(nonzero.sum())} fully masked rows with O != 0")


def _worst(name, y, ref, err, e, bad, rank, bounds, n) -> list[dict[str, Any]]:
    """The ``n`` elements of highest ``rank``, each beside the oracle and its bounds."""
    rows = []
    for flat in np.argsort(-rank, axis=None, kind="stable")[:n]:
        idx = np.unravel_index(flat, e.shape)
        nonfinite = math.nan if np.isnan(y[idx]) else math.inf
        row = {
            "index": [int(i) for i in idx],
            "kernel": float(y[idx]),
            "oracle": float(ref.hi[idx]),
            "oracle_lo": float(ref.lo[idx]),
            _FLOOR_KEY.get(name, "floor"): float(ref.floor[idx]),
            "abs_err": float(err[idx]) if not bad[idx] else nonfinite,
            "floored_ulp": float(e[idx]) if not bad[idx] else nonfinite,
        }
        if bounds is not None:
            row["det_bound"] = float(bounds.det[idx])
            row["prob_bound"] = float(bounds.prob[idx])
        rows.append(row)
    return rows


def judge(
    o: np.ndarray,
    lse: np.ndarray | None,
    ref: OracleResult,
    bounds: Any | None,
    *,
    naive_ulp: float | None,
    naive_lse_err: float | None = None,
    worst: int = 5,
) -> Verdict:
    """The forward verdict of a kernel's ``o`` and ``lse`` (``None`` if it returns none)
    against the oracle ``ref``, the forward bounds (:class:`~.bounds.Bounds`, or ``None``) and
    the naive baseline's errors (``E_naive`` of O and the naive LSE's absolute error)."""
    empty = np.isneginf(ref.lse.hi)
    kw = {"fmt": ref.fmt, "empty_rows": empty, "worst": worst}
    tensors = {
        "o": judge_tensor(
            "o",
            o,
            ref.o,
            None if bounds is None else bounds["o"],
            naive=naive_ulp,
            summary=True,
            lower=lower_bounds(bounds, "o"),
            **kw,
        )
    }
    if lse is not None:
        lse_bounds = None if bounds is None else bounds["lse"]
        tensors["lse"] = judge_tensor(
            "lse",
            lse,
            ref.lse,
            lse_bounds,
            naive=naive_lse_err,
            lower=lower_bounds(bounds, "lse"),
            **kw,
        )
    _precision_everywhere(tensors)
    return Verdict(tensors)


def judge_gradients(
    grads: dict[str, np.ndarray],
    ref: Any,
    bounds: Any | None,
    *,
    naive: dict[str, float] | None,
    worst: int = 5,
) -> dict[str, TensorVerdict]:
    """Verdicts of the kernel gradients ``grads`` (``{"dq": ..., "dk": ..., "dv": ...}``)
    against the oracle ``ref`` (computed with ``do=``), the gradient bounds (a
    :class:`~.gradient_bounds.GradientBounds` or any mapping of names to
    :class:`TensorBounds`; or ``None``) and the naive backward's errors
    (:func:`gradient_errors`, or ``None``)."""
    verdicts = {
        name: judge_tensor(
            name,
            y,
            ref[name],
            None if bounds is None else bounds[name],
            fmt=ref.fmt,
            naive=None if naive is None else naive[name],
            worst=worst,
            lower=lower_bounds(bounds, name),
        )
        for name, y in grads.items()
    }
    _precision_everywhere(verdicts)
    if bounds is not None:
        for name, v in verdicts.items():
            if v.verdict in (Status.FAIL, Status.FAIL_HARD):
                v.reasons += diagnose_gradient(name, grads[name], ref[name].hi, bounds[name].det)
    return verdicts
