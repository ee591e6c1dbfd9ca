"""The accuracy check of one kernel on one case, forward and gradients: kernel → oracle → bounds →
naive baseline → one judge per tensor (:mod:`flashcheck.harness.judging.verdict`).

:func:`check_case` and :func:`check_gradients_case` are the single code paths behind the
property suite, ``flashcheck replay`` and the report campaign, so a replay recomputes exactly
what the failing test computed; :func:`check` and :func:`check_gradients` are their public forms
(``flashcheck.check``, ``flashcheck.check_gradients``, in :mod:`.array_checks`) take arrays and
save a failing case.

Both share one preparation: the inputs are validated and converted to exact float64 once, into
the case's :attr:`~flashcheck.harness.cases.case.Case.problem`, which the oracle and the bounds
reuse; the naive baseline (``naive-numpy``) is built once per process. The gradients' upstream
gradient is the case's :meth:`~flashcheck.harness.cases.case.Case.grad_output` (a ``dO`` given
with the case, or one drawn from a hash of its inputs, so a replay recomputes the same one).
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

from ..adapters.adapter import Kernel, KernelGradients, KernelOutput
from ..adapters.builtin import project_kernels
from ..cases.case import FP8_DTYPES, Case
from ..core.status import Status
from ..judging.bounds import Bounds, problem_bounds
from ..judging.classes import PRECISION_BELOW
from ..judging.diagnosis import CONSISTENT, explain
from ..judging.gradient_bounds import GradientBounds, problem_gradient_bounds
from ..judging.verdict import baseline_error, gradient_errors, judge, judge_gradients
from ..oracle.evaluate import OracleResult, problem_oracle
from ..oracle.memo import memoized_oracle
from .check_results import CheckResult, GradientCheckResult
from .gradient_readings import mask_readings
from .text import format_check, format_gradient_check

__all__ = [
    "bounds_key",
    "campaign_gradient_bounds",
    "case_oracle",
    "check_case",
    "check_gradients_case",
    "format_check",
    "format_gradient_check",
    "gradient_oracle",
    "kernel_bounds",
    "kernel_gradient_bounds",
    "naive_baseline",
    "naive_gradient_reference",
    "naive_reference",
]


# A soft-capped forward beyond the accurate tanh's bounds but within the approximate one's.
APPROX_TANH = (
    f"{CONSISTENT}an approximate tanh in the soft-cap (the GPU's tanh.approx.f32, as "
    'FlashAttention\'s): its errors fit those bounds; declare tanh="approx" in flashcheck.kernel '
    "if the kernel uses it"
)


_FAILING = (Status.FAIL, Status.FAIL_HARD)


@cache
def naive_baseline() -> Kernel:
    """The same-precision naive kernel (``naive-numpy``) whose errors set ``E_naive``, built
    once per process."""
    return project_kernels()["naive-numpy"]


def case_oracle(case: Case, *, memo: bool = True) -> OracleResult:
    """The oracle's O and LSE for ``case`` (from its validated problem); with ``memo``, computed
    once per process for equal problems (the property suite tests its kernels on the same
    cases; a campaign, which computes each case once, passes ``memo=False``)."""
    return memoized_oracle(case.problem) if memo else problem_oracle(case.problem)


def gradient_oracle(case: Case, *, memo: bool = True) -> OracleResult:
    """The oracle's O, LSE and gradients for ``case`` and its upstream gradient (``memo`` as for
    :func:`case_oracle`)."""
    do = case.grad_output()
    return memoized_oracle(case.problem, do=do) if memo else problem_oracle(case.problem, do=do)


def naive_reference(case: Case, ref: OracleResult) -> tuple[float | None, float | None]:
    """``E_naive`` (floored ulps) and the naive LSE's absolute error, or ``None`` outside the
    naive kernel's domain."""
    naive = naive_baseline()
    if case.dtype in FP8_DTYPES or naive.supports(case, "cpu") is not None:
        return None, None  # no same-precision FP8 baseline: the probabilistic bound decides
    out = naive.run(case)
    lse_err = None if out.lse is None else baseline_error("lse", out.lse, ref.lse, ref.fmt)
    return baseline_error("o", out.o, ref.o, ref.fmt), lse_err


def naive_gradient_reference(case: Case, ref: OracleResult) -> dict[str, float] | None:
    """``E_naive`` per gradient: the errors of the same-precision naive backward (the numpy
    emulation of torch autograd through the naive forward), or ``None`` outside its domain."""
    naive = naive_baseline()
    if naive.supports(case, "cpu") is not None:
        return None
    return gradient_errors(_grads(naive.run_backward(case)), ref)


def _grads(g: KernelGradients) -> dict[str, Any]:
    """A backward's gradients by name (``dsinks`` where the case has sinks)."""
    out = {"dq": g.dq, "dk": g.dk, "dv": g.dv}
    if g.dsinks is not None:
        out["dsinks"] = g.dsinks
    return out


def kernel_bounds(adapter: Kernel, case: Case, **kw: Any) -> Bounds:
    """The a-priori bounds of ``adapter``'s arithmetic class on ``case`` (for class
    ``unknown``: the loosest of every known class); ``kw`` as for
    :func:`~flashcheck.harness.judging.bounds.problem_bounds`."""
    return problem_bounds(
        case.problem,
        arithmetic=adapter.arithmetic,
        key_block=adapter.key_block,
        tanh=adapter.tanh,
        **kw,
    )


def bounds_key(adapter: Kernel, case: Case) -> tuple:
    """What the forward bounds of ``adapter`` on ``case`` depend on besides the case: the class,
    the key block and, on a soft-capped case, the kernel's tanh (``bounds_cache``'s key; a
    campaign fills the keys of the accurate tanh from every class's bounds)."""
    return (adapter.arithmetic, adapter.key_block, adapter.tanh if case.softcap else "accurate")


def campaign_gradient_bounds(adapter: Kernel, case: Case, every: GradientBounds) -> GradientBounds:
    """The gradient bounds of ``adapter``'s backward class on ``case`` out of ``every`` (class
    ``unknown``, whose parts are every class's bounds with the accurate tanh); computed anew for
    a kernel whose approximate tanh changes them (a soft-capped case)."""
    if adapter.tanh != "accurate" and case.softcap:
        return kernel_gradient_bounds(adapter, case)
    return every.parts.get(adapter.backward_arithmetic, every)


def kernel_gradient_bounds(adapter: Kernel, case: Case) -> GradientBounds:
    """The gradient bounds of ``adapter``'s backward class on ``case``."""
    return problem_gradient_bounds(
        case.problem,
        case.grad_output(),
        arithmetic=adapter.backward_arithmetic,
        key_block=adapter.key_block,
        tanh=adapter.tanh,
    )


def check_case(
    adapter: Kernel,
    case: Case,
    *,
    device: str = "cpu",
    output: KernelOutput | None = None,
    ref: OracleResult | None = None,
    naive: tuple[float | None, float | None] | None = None,
    bounds_cache: dict | None = None,
) -> CheckResult:
    """Judge ``adapter``'s forward on ``case``.

    ``output``, ``ref`` and ``naive`` (the result of :func:`naive_reference`) reuse values
    already computed for the same case: a campaign runs many kernels on one case.
    ``bounds_cache`` (a dict kept per case) shares the bounds between kernels of one
    arithmetic class and key block.
    """
    out = adapter.run(case, device) if output is None else output
    ref = case_oracle(case) if ref is None else ref
    key = bounds_key(adapter, case)
    if bounds_cache is not None and key in bounds_cache:
        bounds = bounds_cache[key]
    else:
        bounds = kernel_bounds(adapter, case)
        if bounds_cache is not None:
            bounds_cache[key] = bounds
    n_ulp, n_lse = naive_reference(case, ref) if naive is None else naive
    verdict = judge(out.o, out.lse, ref, bounds, naive_ulp=n_ulp, naive_lse_err=n_lse)
    if verdict.verdict == Status.FAIL_HARD and bounds is not None:
        lse = None if out.lse is None else (out.lse, ref.lse.hi, bounds.lse.det)
        explain(verdict, case.problem, out.o, ref.o.hi, bounds.o.det, lse=lse)
        if case.softcap and adapter.tanh == "accurate":
            alt = kernel_bounds(replace(adapter, tanh="approx"), case)
            fits = judge(out.o, out.lse, ref, alt, naive_ulp=n_ulp, naive_lse_err=n_lse)
            if fits.verdict != Status.FAIL_HARD:
                verdict.diagnosis.append(APPROX_TANH)
                # The tanh explains the errors; a lower-precision class they also fit does not
                # (an fp32 kernel was told "consistent with tf32: declare tf32" first).
                for t in verdict.tensors.values():
                    t.reasons[:] = [r for r in t.reasons if PRECISION_BELOW not in r]
    return CheckResult(adapter.name, device, case, out, ref, bounds, verdict)


def check_gradients_case(
    adapter: Kernel,
    case: Case,
    *,
    device: str = "cpu",
    grads: KernelGradients | None = None,
    ref: OracleResult | None = None,
    naive: dict[str, float] | None = None,
    bounds: GradientBounds | None = None,
) -> GradientCheckResult:
    """Judge ``adapter``'s gradients on ``case`` (values already computed may be passed in)."""
    g = adapter.run_backward(case, device) if grads is None else grads
    ref = gradient_oracle(case) if ref is None else ref
    bounds = kernel_gradient_bounds(adapter, case) if bounds is None else bounds
    naive = naive_gradient_reference(case, ref) if naive is None else naive
    verdicts = judge_gradients(_grads(g), ref, bounds, naive=naive)
    failing = [n for n in ("dq", "dk", "dv") if verdicts[n].verdict in _FAILING]
    if failing:
        # Said once, on the first failing gradient (the report counts reasons per result).
        verdicts[failing[0]].reasons += mask_readings(
            case, _grads(g), lambda alt: kernel_gradient_bounds(adapter, alt)
        )
    return GradientCheckResult(adapter.name, device, case, g, ref, bounds, verdicts)
