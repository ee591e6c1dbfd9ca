"""Run one kernel on one case and judge it: kernel → oracle → bounds → naive baseline → verdict.

:func:`check_case` is the single code path behind the property suite, ``flashcheck replay`` and
the report campaign, so a replay recomputes exactly what the failing test computed.
:func:`format_check` prints kernel and oracle side by side for the worst elements.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.adapters import KernelAdapter, KernelOutput, builtin_adapters
from harness.bounds import Bounds, error_bounds
from harness.cases import Case
from harness.oracle import OracleResult, oracle
from harness.verdict import Verdict, judge, naive_error

__all__ = ["CheckResult", "check_case", "format_check", "naive_reference"]


@dataclass
class CheckResult:
    kernel: str
    device: str
    case: Case
    output: KernelOutput
    ref: OracleResult
    bounds: Bounds | None
    verdict: Verdict


def naive_reference(case: Case, ref: OracleResult) -> tuple[float | None, float | None]:
    """``E_naive`` (floored ulps) and the naive LSE error, or ``None`` outside naive's domain."""
    naive = builtin_adapters()["naive-numpy"]
    if naive.supports(case, "cpu") is not None:
        return None, None
    out = naive.run(case)
    lse_err = None
    if out.lse is not None:
        fin = np.isfinite(ref.lse_hi) & np.isfinite(out.lse)
        with np.errstate(invalid="ignore"):  # −inf − (−inf) in masked rows, dropped by `fin`
            d = np.abs((out.lse - ref.lse_hi) - ref.lse_lo)[fin]
        lse_err = float(d.max()) if d.size else 0.0
    return naive_error(out.o, ref), lse_err


def check_case(
    adapter: KernelAdapter,
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
    bounds = None
    if adapter.arithmetic != "unknown":
        key = (adapter.arithmetic, adapter.key_block)
        if bounds_cache is not None and key in bounds_cache:
            bounds = bounds_cache[key]
        else:
            bounds = error_bounds(
                case.q, case.k, case.v, arithmetic=adapter.arithmetic,
                key_block=adapter.key_block, **opts,
            )  # fmt: skip
            if bounds_cache is not None:
                bounds_cache[key] = bounds
    n_ulp, n_lse = naive_reference(case, ref) if naive is None else naive
    verdict = judge(out.o, out.lse, ref, bounds, naive_ulp=n_ulp, naive_lse_err=n_lse)
    return CheckResult(adapter.name, device, case, out, ref, bounds, verdict)


def _bits_hex(x: float, dtype: str) -> str:
    from harness.cases import DTYPES

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
    lines.append(
        f"max floored-ULP error {v.max_ulp:.4g}; naive same-precision {v.naive_ulp:.4g} "
        f"(ratio {v.naive_ratio:.3g}); bound utilization det {v.det_util:.3g}, prob "
        f"{v.prob_util:.3g}; LSE max error {v.lse_err:.3g} (det util {v.lse_det_util:.3g})"
    )
    s = v.summary
    lines.append(
        f"normwise rel {s.normwise_rel:.3g}, RMSE {s.rmse:.3g}, max abs {s.max_abs:.3g}, "
        f"NaN/Inf mismatches {s.nonfinite_mismatches} of {s.count}"
    )
    head = "| (b, h, i, c) | kernel | bits | oracle (hi) | W_c | abs err | floored ulp |"
    sep = "|---|---|---|---|---|---|---|"
    if res.bounds is not None:
        head += " det bound | prob bound |"
        sep += "---|---|"
    lines += ["", head, sep]
    for row in v.worst[:worst]:
        val = row["kernel"]
        bits = _bits_hex(val, res.output.o_dtype) if math.isfinite(val) else "-"
        cells = [
            str(tuple(row["index"])),
            f"{val:.9g}",
            bits,
            f"{row['oracle']:.17g}",
            f"{row['floor_W']:.4g}",
            f"{row['abs_err']:.4g}",
            f"{row['floored_ulp']:.4g}",
        ]
        if res.bounds is not None:
            cells += [f"{row['det_bound']:.4g}", f"{row['prob_bound']:.4g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
