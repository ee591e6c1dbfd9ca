"""Run one kernel on one case and judge it: kernel → oracle → bounds → naive baseline → verdict.

:func:`check_case` is the single code path behind the property suite, ``flashcheck replay`` and
the report campaign, so a replay recomputes exactly what the failing test computed;
:func:`check` is its public form (``flashcheck.check``), taking arrays and saving a failing
case. :func:`format_check` prints kernel and oracle side by side for the worst elements.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel, KernelOutput
from ..adapters.builtin import project_kernels
from ..adapters.probe import default_probe_device
from ..adapters.registry import as_kernel
from ..cases.case import DTYPES, Case
from ..cases.store import save_case
from ..core.semantics import make_problem
from ..oracle.evaluate import OracleResult, oracle
from .bounds import Bounds, error_bounds
from .metrics import ErrorSummary
from .verdict import Verdict, judge, naive_error

__all__ = ["CheckResult", "check", "check_case", "format_check", "kernel_bounds", "naive_reference"]


@dataclass
class CheckResult:
    """One kernel judged on one case.

    ``verdict``: the :class:`~flashcheck.harness.judging.verdict.Verdict` (``.verdict`` is
    ``"PASS"``, ``"FAIL"`` or ``"FAIL-HARD"``, ``.reasons`` says why); ``ref``: the oracle's
    answer; ``bounds``: the a-priori error bounds applied; ``output``: the kernel's O (and LSE)
    as exact float64; ``case_id``: the saved case file's id, if one was saved.
    """

    kernel: str
    device: str
    case: Case
    output: KernelOutput
    ref: OracleResult
    bounds: Bounds | None
    verdict: Verdict
    case_id: str | None = None
    case_dir: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict.verdict == "PASS"

    @property
    def metrics(self) -> ErrorSummary:
        """Floored-ULP, integer-ULP, normwise, RMSE and max-abs errors, NaN/Inf mismatches."""
        return self.verdict.summary

    @property
    def replay(self) -> str | None:
        """The command that re-runs the saved case (``None`` if none was saved)."""
        if self.case_id is None:
            return None
        where = "" if self.case_dir is None else f" --dir {self.case_dir}"
        return f"flashcheck replay {self.case_id}{where}"

    def __str__(self) -> str:
        text = format_check(self)
        return text + (f"\nreplay: {self.replay}" if self.replay else "")


def naive_reference(case: Case, ref: OracleResult) -> tuple[float | None, float | None]:
    """``E_naive`` (floored ulps) and the naive LSE error, or ``None`` outside naive's domain."""
    naive = project_kernels()["naive-numpy"]
    if naive.supports(case, "cpu") is not None:
        return None, None
    out = naive.run(case)
    lse_err = None
    if out.lse is not None:
        fin = np.isfinite(ref.lse.hi) & np.isfinite(out.lse)
        with np.errstate(invalid="ignore"):  # −inf − (−inf) in masked rows, dropped by `fin`
            d = np.abs((out.lse - ref.lse.hi) - ref.lse.lo)[fin]
        lse_err = float(d.max()) if d.size else 0.0
    return naive_error(out.o, ref), lse_err


def kernel_bounds(adapter: Kernel, case: Case, **kw: Any) -> Bounds:
    """The a-priori bounds of ``adapter``'s arithmetic class on ``case`` (for class
    ``unknown``: the loosest of every known class)."""
    return error_bounds(
        case.q,
        case.k,
        case.v,
        arithmetic=adapter.arithmetic,
        key_block=adapter.key_block,
        **case.options(),
        **kw,
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
    """Judge ``adapter`` on ``case``.

    ``output``, ``ref`` and ``naive`` (the result of :func:`naive_reference`) reuse values
    already computed for the same case: a campaign runs many kernels on one case.
    ``bounds_cache`` (a dict kept per case) shares the bounds between kernels of one
    arithmetic class and key block.
    """
    out = adapter.run(case, device) if output is None else output
    opts = case.options()
    if ref is None:
        ref = oracle(case.q, case.k, case.v, **opts)
    key = (adapter.arithmetic, adapter.key_block)
    if bounds_cache is not None and key in bounds_cache:
        bounds = bounds_cache[key]
    else:
        bounds = kernel_bounds(adapter, case)
        if bounds_cache is not None:
            bounds_cache[key] = bounds
    n_ulp, n_lse = naive_reference(case, ref) if naive is None else naive
    verdict = judge(out.o, out.lse, ref, bounds, naive_ulp=n_ulp, naive_lse_err=n_lse)
    return CheckResult(adapter.name, device, case, out, ref, bounds, verdict)


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
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> CheckResult:
    """Judge ``kernel`` on one input against the oracle and the error bounds (SPEC 3.4).

    ``kernel``: a function ``fn(q, k, v, **options) -> O or (O, LSE)``, a
    :func:`flashcheck.kernel` declaration, or a spec string (a built-in name or
    ``"package.module:function"``). ``q (B, Hq, Nq, d)``, ``k (B, Hk, Nk, d)``,
    ``v (B, Hk, Nk, dv)``: numpy arrays or torch tensors of one dtype among fp16, bf16 and
    fp32, their values taken as exact; or pass a :class:`~flashcheck.harness.cases.case.Case`
    as ``q`` alone. The options are those of ``softmax(scale·QKᵀ + mask)·V`` (SPEC 3.1).

    The verdict is FAIL-HARD when an error exceeds the deterministic bound of the kernel's
    arithmetic class (class ``unknown``: the loosest bound of every known class), or a finite
    output is NaN/Inf; FAIL when it exceeds both twice the same-precision naive error plus one
    floored ulp and the probabilistic bound; PASS otherwise.

    ``device``: where the kernel runs (default: the tensors' device, else CUDA if available).
    ``save``: ``"failure"`` (default) writes the case to ``case_dir`` (default
    ``$FLASHCHECK_CASE_DIR`` or ``reports/cases``) when the verdict is not PASS, ``"always"``
    every time, ``"never"`` not at all; the result's ``replay`` is the command that re-runs it.
    """
    if save not in ("failure", "always", "never"):
        raise ValueError(f"save must be 'failure', 'always' or 'never', got {save!r}")
    adapter = as_kernel(kernel)
    if isinstance(q, Case):
        if k is not None or v is not None:
            raise ValueError("pass either a Case as q, or the arrays q, k, v; not both")
        case = q
    else:
        if k is None or v is None:
            raise ValueError("check(kernel, q, k, v): k and v are required with array inputs")
        case = Case.from_arrays(q, k, v, causal=causal, window=window, mask=mask, scale=scale)
    if device is None:
        tensor_dev = getattr(getattr(q, "device", None), "type", None)
        device = tensor_dev if tensor_dev in ("cpu", "cuda") else default_probe_device(adapter)
    # The shapes, GQA grouping and masks checked before the kernel sees them (clear messages).
    make_problem(case.q, case.k, case.v, **case.options())
    outside = adapter.options is not None and _missing_options(case, adapter.options)
    if outside:
        raise ValueError(
            f"the input needs {outside} but {adapter.name} takes no keyword of that name: add "
            "it to the function's signature, or leave the option out"
        )
    res = check_case(adapter, case, device=device)
    if save == "always" or (save == "failure" and not res.passed):
        res.case_id = save_case(
            case,
            kernel=adapter.name,
            device=device,
            verdict=res.verdict.as_dict(),
            directory=case_dir,
            context={"property": "accuracy", "api": "check"},
        )
        res.case_dir = None if case_dir is None else os.fspath(case_dir)
    return res


def _missing_options(case: Case, options: frozenset[str]) -> list[str]:
    need = {
        "causal": case.causal,
        "window": case.window is not None,
        "mask": case.mask is not None,
        "scale": case.scale is not None,
    }
    return [name for name, used in need.items() if used and name not in options]


def _number(x: float) -> str:
    """``x`` to 4 digits; NaN and ±Inf spelled so (never as a small number)."""
    return f"{x:.4g}" if math.isfinite(x) else ("NaN" if math.isnan(x) else "∞")


def _bits_hex(x: float, dtype: str) -> str:
    arr = np.array([x]).astype(DTYPES[dtype])
    width = arr.dtype.itemsize * 2
    return "0x" + format(int(arr.view(f"u{arr.dtype.itemsize}")[0]), f"0{width}x")


def format_check(res: CheckResult, *, worst: int = 5) -> str:
    """A human-readable side-by-side of kernel and oracle for the worst elements."""
    v = res.verdict
    lines = [
        f"kernel {res.kernel} on {res.device}: {res.case.describe()}",
        f"verdict {v.verdict}",
    ]
    lines += [f"  - {r}" for r in v.reasons]
    worst_text = (
        f"{v.max_ulp:.4g}"
        if math.isfinite(v.max_ulp)
        else (
            f"{'NaN' if math.isnan(v.max_ulp) else '∞'} (the kernel returned NaN/Inf where the "
            "exact result is finite; those elements are listed first)"
        )
    )
    lse = "LSE not returned"
    if res.output.lse is not None:
        lse = f"LSE max error {v.lse_err:.3g} (det util {v.lse_det_util:.3g})"
    lines.append(
        f"max floored-ULP error {worst_text}; naive same-precision {v.naive_ulp:.4g} "
        f"(ratio {v.naive_ratio:.3g}); bound utilization det {v.det_util:.3g}, prob "
        f"{v.prob_util:.3g}; {lse}"
    )
    s = v.summary
    lines.append(
        f"normwise rel {s.normwise_rel:.3g}, RMSE {s.rmse:.3g}, max abs {s.max_abs:.3g}, "
        f"NaN/Inf mismatches {s.nonfinite_mismatches} of {s.count}"
    )
    lines += ["", f"worst elements, by {'bound utilization' if res.bounds else 'floored ulp'}:"]
    head = "| (b, h, i, c) | kernel | bits | oracle (hi) | W_c | abs err | floored ulp |"
    sep = "|---|---|---|---|---|---|---|"
    if res.bounds is not None:
        head += " det bound | prob bound |"
        sep += "---|---|"
    lines += [head, sep]
    for row in v.worst[:worst]:
        val = row["kernel"]
        bits = _bits_hex(val, res.output.o_dtype) if math.isfinite(val) else "-"
        cells = [
            str(tuple(row["index"])),
            f"{val:.9g}",
            bits,
            f"{row['oracle']:.17g}",
            f"{row['floor_W']:.4g}",
            _number(row["abs_err"]),
            _number(row["floored_ulp"]),
        ]
        if res.bounds is not None:
            cells += [f"{row['det_bound']:.4g}", f"{row['prob_bound']:.4g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
