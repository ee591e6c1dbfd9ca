"""Run one kernel's backward on one case and judge dQ, dK, dV (SPEC 3.7).

:func:`check_gradients_case` is the code path behind the suite's gradient properties, the
report campaign's gradient part and ``flashcheck replay`` of a gradient failure;
:func:`check_gradients` is its public form (``flashcheck.check_gradients``). The upstream
gradient is the case's :meth:`~flashcheck.harness.cases.case.Case.grad_output` (a ``dO`` given
with the case, or one drawn from a hash of its inputs, so a replay recomputes the same one).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

from ..adapters.adapter import Kernel, KernelGradients
from ..adapters.builtin import project_kernels
from ..adapters.probe import default_probe_device
from ..adapters.registry import as_kernel
from ..cases.case import Case
from ..cases.store import save_case
from ..core.semantics import as_exact_array, make_problem
from ..core.status import Status
from ..oracle.evaluate import OracleResult, oracle
from .gradient_bounds import GradientBounds, gradient_bounds
from .tensor_verdict import TensorVerdict as GradientVerdict
from .verdict import GRADIENT_LABELS, gradient_errors, judge_gradients

__all__ = [
    "GradientCheckResult",
    "check_gradients",
    "check_gradients_case",
    "format_gradient_check",
    "gradient_oracle",
    "kernel_gradient_bounds",
    "naive_gradient_reference",
]


@dataclass
class GradientCheckResult:
    """One kernel's gradients judged on one case.

    ``verdicts``: a :class:`~flashcheck.harness.judging.gradient_verdict.GradientVerdict` per
    gradient (``"dq"``, ``"dk"``, ``"dv"``); ``verdict``: the worst of them; ``grads``: the
    kernel's gradients as exact float64; ``ref``: the oracle (with its ``dq_*``, ``dk_*``,
    ``dv_*`` fields); ``bounds``: the gradient bounds applied.
    """

    kernel: str
    device: str
    case: Case
    grads: KernelGradients
    ref: OracleResult
    bounds: GradientBounds | None
    verdicts: dict[str, GradientVerdict]
    case_id: str | None = None
    case_dir: str | None = None

    @property
    def verdict(self) -> str:
        return Status.worst(v.verdict for v in self.verdicts.values())

    @property
    def passed(self) -> bool:
        return self.verdict == "PASS"

    @property
    def reasons(self) -> list[str]:
        return [r for v in self.verdicts.values() for r in v.reasons]

    @property
    def replay(self) -> str | None:
        if self.case_id is None:
            return None
        where = "" if self.case_dir is None else f" --dir {self.case_dir}"
        return f"flashcheck replay {self.case_id}{where}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "gradients": {n: v.as_dict() for n, v in self.verdicts.items()},
        }

    def __str__(self) -> str:
        text = format_gradient_check(self)
        return text + (f"\nreplay: {self.replay}" if self.replay else "")


def gradient_oracle(case: Case) -> OracleResult:
    """The oracle's O, LSE and gradients for ``case`` and its upstream gradient."""
    return oracle(case.q, case.k, case.v, do=case.grad_output(), **case.options())


def naive_gradient_reference(case: Case, ref: OracleResult) -> dict[str, float] | None:
    """``E_naive`` per gradient: the errors of the same-precision naive backward (the numpy
    emulation of torch autograd through the naive forward), or ``None`` outside its domain."""
    naive = project_kernels()["naive-numpy"]
    if naive.supports(case, "cpu") is not None:
        return None
    g = naive.run_backward(case)
    return gradient_errors({"dq": g.dq, "dk": g.dk, "dv": g.dv}, ref)


def kernel_gradient_bounds(adapter: Kernel, case: Case) -> GradientBounds:
    """The gradient bounds of ``adapter``'s backward class on ``case``."""
    return gradient_bounds(
        case.q,
        case.k,
        case.v,
        case.grad_output(),
        arithmetic=adapter.backward_arithmetic,
        key_block=adapter.key_block,
        **case.options(),
    )


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
    verdicts = judge_gradients({"dq": g.dq, "dk": g.dk, "dv": g.dv}, ref, bounds, naive=naive)
    return GradientCheckResult(adapter.name, device, case, g, ref, bounds, verdicts)


def check_gradients(
    kernel: Any,
    q: Any,
    k: Any = None,
    v: Any = None,
    *,
    do: Any = None,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> GradientCheckResult:
    """Judge ``kernel``'s gradients ``dQ``, ``dK``, ``dV`` on one input (SPEC 3.7).

    ``kernel`` and the inputs as for :func:`flashcheck.check`; the kernel needs a backward
    (torch autograd through its output, or a backward function: ``flashcheck.kernel(fn,
    backward=...)``). ``do``: the upstream gradient (O's shape, the inputs' dtype); default a
    standard normal one drawn from a hash of the inputs. The exact gradients of ``Σ dO ∘ O``
    come from the oracle; each gradient is FAIL-HARD above its deterministic bound (the
    kernel's ``backward_arithmetic``; ``unknown``: the loosest class) or NaN/Inf where the
    exact value is finite, FAIL above both twice the naive backward's error plus one floored ulp
    and the probabilistic bound, PASS otherwise. ``save`` and ``case_dir`` as for ``check``.
    """
    if save not in ("failure", "always", "never"):
        raise ValueError(f"save must be 'failure', 'always' or 'never', got {save!r}")
    adapter = as_kernel(kernel)
    if adapter.backward is None:
        raise ValueError(
            f"{adapter.name} has no backward: declare one with flashcheck.kernel(fn, "
            "backward='autograd') for a torch function differentiable by autograd, or "
            "backward=bwd for a function bwd(q, k, v, do, **options) -> (dQ, dK, dV)"
        )
    if isinstance(q, Case):
        if k is not None or v is not None:
            raise ValueError("pass either a Case as q, or the arrays q, k, v; not both")
        case = q
    else:
        if k is None or v is None:
            raise ValueError("check_gradients(kernel, q, k, v): k and v are required")
        case = Case.from_arrays(q, k, v, causal=causal, window=window, mask=mask, scale=scale)
    if do is not None:
        do64, fmt = as_exact_array(do, "do")
        if fmt.name != case.dtype:
            raise ValueError(f"do must have the inputs' dtype ({case.dtype}), got {fmt.name}")
        case = replace(case, do=do64.astype(case.q.dtype))
    if device is None:
        tensor_dev = getattr(getattr(q, "device", None), "type", None)
        device = tensor_dev if tensor_dev in ("cpu", "cuda") else default_probe_device(adapter)
    make_problem(case.q, case.k, case.v, **case.options())
    res = check_gradients_case(adapter, case, device=device)
    if save == "always" or (save == "failure" and not res.passed):
        context = {"property": "gradients", "api": "check_gradients"}
        res.case_id = save_case(
            case,
            kernel=adapter.name,
            device=device,
            verdict=res.as_dict(),
            directory=case_dir,
            context=context,
        )
        res.case_dir = None if case_dir is None else os.fspath(case_dir)
    return res


def _number(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else ("NaN" if math.isnan(x) else "∞")


def format_gradient_check(res: GradientCheckResult, *, worst: int = 3) -> str:
    """Verdict per gradient and, for each, the worst elements beside the oracle."""
    lines = [
        f"kernel {res.kernel} on {res.device} (gradients): {res.case.describe()}",
        f"verdict {res.verdict}",
    ]
    lines += [f"  - {r}" for r in res.reasons]
    for name, v in res.verdicts.items():
        label = GRADIENT_LABELS[name]
        lines += [
            "",
            v.line(),
            f"| {label} index | kernel | oracle (hi) | floor | abs err | floored ulp | det bound |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in v.worst[:worst]:
            cells = [
                str(tuple(row["index"])),
                f"{row['kernel']:.9g}",
                f"{row['oracle']:.17g}",
                f"{row['floor']:.4g}",
                _number(row["abs_err"]),
                _number(row["floored_ulp"]),
                _number(row.get("det_bound", math.nan)),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
