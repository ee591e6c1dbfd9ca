"""The accuracy check of one kernel on one case, forward and gradients: kernel → oracle → bounds →
naive baseline → one judge per tensor (:mod:`flashcheck.harness.judging.verdict`).

:func:`check_case` and :func:`check_gradients_case` are the single code paths behind the
property suite, ``flashcheck replay`` and the report campaign, so a replay recomputes exactly
what the failing test computed; :func:`check` and :func:`check_gradients` are their public forms
(``flashcheck.check``, ``flashcheck.check_gradients``), taking arrays and saving a failing case.

Both share one preparation: the inputs are validated and converted to exact float64 once, into
the case's :attr:`~flashcheck.harness.cases.case.Case.problem`, which the oracle and the bounds
reuse; the naive baseline (``naive-numpy``) is built once per process. The gradients' upstream
gradient is the case's :meth:`~flashcheck.harness.cases.case.Case.grad_output` (a ``dO`` given
with the case, or one drawn from a hash of its inputs, so a replay recomputes the same one).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import replace
from functools import cache
from typing import Any

from ..adapters.adapter import Kernel, KernelGradients, KernelOutput
from ..adapters.builtin import project_kernels
from ..adapters.probe import default_probe_device
from ..adapters.ragged_call import dense_arrays_refusal
from ..adapters.registry import as_kernel, declared_spec
from ..cases.case import FP8_DTYPES, Case
from ..cases.store import save_case
from ..core.semantics import as_exact_array
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
    "call",
    "campaign_gradient_bounds",
    "case_oracle",
    "check",
    "check_case",
    "check_gradients",
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


def _prepare(api: str, kernel: Any, q: Any, k: Any, v: Any, options: dict, save: str):
    """The kernel, the case (validated and converted once) and the checks every public entry
    point makes before running the kernel."""
    if save not in ("failure", "always", "never"):
        raise ValueError(f"save must be 'failure', 'always' or 'never', got {save!r}")
    adapter = as_kernel(kernel)
    if adapter.layout != "dense" or adapter.op != "attention":
        raise ValueError(dense_arrays_refusal(adapter, api))
    if isinstance(q, Case):
        if k is not None or v is not None:
            raise ValueError("pass either a Case as q, or the arrays q, k, v; not both")
        case = q
    else:
        if k is None or v is None:
            raise ValueError(f"{api}(kernel, q, k, v): k and v are required with array inputs")
        case = Case.from_arrays(q, k, v, **options)
    _ = case.problem  # the shapes, GQA grouping and masks checked, with clear messages
    return adapter, case


def _device(adapter: Kernel, q: Any, device: str | None) -> str:
    if device is not None:
        return device
    tensor_dev = getattr(getattr(q, "device", None), "type", None)
    return tensor_dev if tensor_dev in ("cpu", "cuda") else default_probe_device(adapter)


def _save(res: Any, case: Case, adapter: Kernel, device: str, save: str, case_dir, **kw):
    if save == "always" or (save == "failure" and not res.passed):
        spec = declared_spec(adapter)
        res.case_id = save_case(case, kernel=spec, device=device, directory=case_dir, **kw)
        res.case_dir = None if case_dir is None else os.fspath(case_dir)


def call(kernel: Any, case: Case, *, device: str | None = None) -> Any:
    """Call ``kernel`` on ``case`` as every check does, and return what it returned.

    ``kernel`` as for :func:`check`; ``case``: a :class:`~flashcheck.harness.cases.case.Case`
    (``flashcheck.load_case(id)`` rebuilds a saved one). The inputs are handed over as torch
    tensors on ``device`` (default: CUDA if the kernel runs there and a GPU is present, else
    the CPU), or numpy arrays for a kernel declared ``api="numpy"``, with only the options the
    kernel's signature names (``causal``, ``window``, ``mask``, ``scale``). Use it to step
    through a failing case in a debugger.
    """
    if not isinstance(case, Case):
        raise TypeError(
            f"call(kernel, case) takes a flashcheck Case, got {type(case).__name__}: build one "
            "with flashcheck.Case.from_arrays(q, k, v, ...) or flashcheck.load_case(id)"
        )
    adapter = as_kernel(kernel)
    device = device or default_probe_device(adapter)
    return adapter.call(case, device).result


def check(
    kernel: Any,
    q: Any,
    k: Any = None,
    v: Any = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> CheckResult:
    """Judge ``kernel`` on one input against the oracle and the error bounds.

    ``kernel``: a function ``fn(q, k, v, **options) -> O or (O, LSE)``, a
    :func:`flashcheck.kernel` declaration, or a spec string (a built-in name or
    ``"package.module:function"``). ``q (B, Hq, Nq, d)``, ``k (B, Hk, Nk, d)``,
    ``v (B, Hk, Nk, dv)``: numpy arrays or torch tensors of one dtype among fp16, bf16 and
    fp32, their values taken as exact; or pass a :class:`~flashcheck.harness.cases.case.Case`
    as ``q`` alone. The options are those of ``softmax(scale·QKᵀ + mask)·V``, with
    ``softcap`` (scores ``c·tanh(s/c)``) and ``sinks`` (one float32 logit per query head in
    every row's denominator) as :func:`flashcheck.oracle` takes them. FP8 inputs
    (``float8_e4m3fn``/``float8_e5m2``) come with ``descale_q``, ``descale_k``, ``descale_v``
    (float32 ``(B, Hk)``, default 1), handed to the kernel as keywords of those names; the
    kernel's O is judged in bf16 ulps by the flash-fp8 class (docs/error-bounds.md, section 14).

    The verdict is FAIL-HARD when an error exceeds the deterministic bound of the kernel's
    arithmetic class (class ``unknown``: the loosest bound of the classes at or above the input
    format's precision, so ``tf32`` products count only when declared), or a finite
    output is NaN/Inf; FAIL when it exceeds both twice the same-precision naive error plus one
    floored ulp and the probabilistic bound; PASS otherwise.

    ``device``: where the kernel runs (default: the tensors' device, else CUDA if available).
    ``save``: ``"failure"`` (default) writes the case to ``case_dir`` (default
    ``$FLASHCHECK_CASE_DIR`` or ``reports/cases``) when the verdict is not PASS, ``"always"``
    every time, ``"never"`` not at all; the result's ``replay`` is the command that re-runs it.
    An input outside the kernel's declared contract raises ``ValueError`` with the reason.
    """
    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
    opts.update(softcap=softcap, sinks=sinks)
    descales = {"descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v}
    opts.update({n: d for n, d in descales.items() if d is not None})
    adapter, case = _prepare("check", kernel, q, k, v, opts, save)
    device = _device(adapter, q, device)
    outside = adapter.options is not None and _missing_options(case, adapter.options)
    if outside:
        raise ValueError(
            f"the input needs {outside} but {adapter.name} takes no keyword of that name: "
            + _how_to_take(adapter, outside)
        )
    _refuse_outside_contract(adapter, case, device, adapter.supports(case, device))
    res = check_case(adapter, case, device=device)
    context = {"property": "accuracy", "api": "check"}
    _save(
        res, case, adapter, device, save, case_dir, verdict=res.verdict.as_dict(), context=context
    )
    return res


def check_gradients(
    kernel: Any,
    q: Any,
    k: Any = None,
    v: Any = None,
    *,
    do: Any = None,
    do_layout: str = "contiguous",
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> GradientCheckResult:
    """Judge ``kernel``'s gradients ``dQ``, ``dK``, ``dV`` on one input.

    ``kernel`` and the inputs as for :func:`flashcheck.check`; the kernel needs a backward
    (torch autograd through its output, or a backward function: ``flashcheck.kernel(fn,
    backward=...)``). ``do``: the upstream gradient (O's shape, the inputs' dtype); default a
    standard normal one drawn from a hash of the inputs. ``do_layout``: how ``dO`` is handed to
    the backward: ``"contiguous"``, ``"strided"`` (a view into a larger NaN-filled buffer) or
    ``"expanded"`` (one row of values broadcast with stride 0 over batch, heads and queries, as
    autograd hands over the gradient of ``O.sum()``; a given ``do`` must then have equal rows,
    a drawn one is its first row repeated). The exact gradients of ``Σ dO ∘ O``
    come from the oracle; each gradient is FAIL-HARD above its deterministic bound (the
    kernel's ``backward_arithmetic``; ``unknown``: the loosest class at the precision floor) or
    NaN/Inf where the exact value is finite, FAIL above both twice the naive backward's error
    plus one floored ulp and the probabilistic bound, PASS otherwise. ``save`` and
    ``case_dir`` as for ``check``.
    """
    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
    opts.update(softcap=softcap, sinks=sinks)
    adapter, case = _prepare("check_gradients", kernel, q, k, v, opts, save)
    if adapter.backward is None:
        raise ValueError(
            f"{adapter.name} has no backward: declare one with flashcheck.kernel(fn, "
            "backward='autograd') for a torch function differentiable by autograd, or "
            "backward=bwd for a function bwd(q, k, v, do, **options) -> (dQ, dK, dV)"
        )
    if do is not None:
        do64, fmt = as_exact_array(do, "do")
        if fmt.name != case.dtype:
            raise ValueError(f"do must have the inputs' dtype ({case.dtype}), got {fmt.name}")
        case = case.with_grad_output(do64.astype(case.q.dtype))
    if do_layout != case.do_layout:
        case = replace(case, do_layout=do_layout)  # checks the name (and an expanded do's rows)
    device = _device(adapter, q, device)
    _refuse_outside_contract(adapter, case, device, adapter.backward_supports(case, device))
    res = check_gradients_case(adapter, case, device=device)
    context = {"property": "gradients", "api": "check_gradients"}
    _save(res, case, adapter, device, save, case_dir, verdict=res.as_dict(), context=context)
    return res


def _refuse_outside_contract(adapter: Kernel, case: Case, device: str, why: str | None) -> None:
    """Raise ``ValueError`` when ``case`` lies outside what ``adapter`` declares (its dtypes,
    masks, shapes, options or score limit; ``why`` from ``supports``): a verdict there would
    judge the kernel on inputs it never promised to take. Fields not declared are not probed
    here and take no part."""
    if case.dtype not in adapter.dtypes:
        why = f"{case.dtype} is not among its dtypes ({', '.join(adapter.dtypes) or 'none'})"
    if why is not None:
        raise ValueError(
            f"this input is outside {adapter.name}'s declared contract: {why}. Pass an input "
            "inside it, or declare the contract wider (flashcheck.kernel(fn, dtypes=..., "
            "masks=..., ...))"
        )


def _how_to_take(adapter: Kernel, names: list[str]) -> str:
    """How to have ``names`` passed to ``adapter``'s function: a ``**kwargs`` signature is
    given the soft-cap and sinks only when declared (they change the softmax, and a function
    that forwards its keywords elsewhere may not take them)."""
    try:
        params = inspect.signature(adapter.fn).parameters.values()
    except (TypeError, ValueError):
        params = ()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        example = tuple(sorted({"causal", "scale"} | set(names)))
        return (
            "its **kwargs is given them only when declared: flashcheck.kernel(fn, options="
            f"(...)) with every option it takes, e.g. options={example!r}; or leave the "
            "option out"
        )
    return "add it to the function's signature, or leave the option out"


def _missing_options(case: Case, options: frozenset[str]) -> list[str]:
    need = {
        "causal": case.causal,
        "window": case.window is not None,
        "mask": case.mask is not None,
        "scale": case.scale is not None,
        "softcap": case.softcap is not None,
        "sinks": case.sinks is not None,
    }
    return [name for name, used in need.items() if used and name not in options]
