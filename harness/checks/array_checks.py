"""The dense checks' public forms, taking arrays: ``flashcheck.check``,
``flashcheck.check_gradients`` and ``flashcheck.call``.

Each validates the inputs into a :class:`~flashcheck.harness.cases.case.Case` once, refuses an
input outside the kernel's declared contract with the reason, runs the case-level check of
:mod:`.accuracy` (the one code path the property suite, the replay and the campaigns share) and
saves the case per ``save``: a verdict other than PASS, or a kernel that raised on it
(:mod:`.raised`).
"""

from __future__ import annotations

import inspect
import os
from dataclasses import replace
from typing import Any

from ..adapters.adapter import Kernel
from ..adapters.probe import default_probe_device
from ..adapters.ragged_call import dense_arrays_refusal
from ..adapters.registry import as_kernel, declared_spec
from ..cases.case import Case
from ..cases.store import save_case
from ..core.semantics import as_exact_array
from .accuracy import check_case, check_gradients_case
from .check_results import CheckResult, GradientCheckResult
from .raised import saved_if_raised

__all__ = ["call", "check", "check_gradients"]


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


def _writer(case: Case, adapter: Kernel, device: str, case_dir, context: dict) -> Any:
    """What saves ``case`` with a given verdict (for a kernel that raised on it)."""
    spec = declared_spec(adapter)
    return lambda verdict: save_case(
        case, kernel=spec, device=device, directory=case_dir, verdict=verdict, context=context
    )


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
    context = {"property": "accuracy", "api": "check"}
    with saved_if_raised(save, _writer(case, adapter, device, case_dir, context), case_dir):
        res = check_case(adapter, case, device=device)
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
    context = {"property": "gradients", "api": "check_gradients"}
    with saved_if_raised(save, _writer(case, adapter, device, case_dir, context), case_dir):
        res = check_gradients_case(adapter, case, device=device)
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
