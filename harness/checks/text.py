"""Kernel and oracle side by side, as text: the worst elements of an accuracy check
(:mod:`flashcheck.harness.checks.accuracy`), forward or gradients."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..cases.case import DTYPES
from ..judging.verdict import GRADIENT_LABELS

__all__ = ["elide_shapes", "format_check", "format_gradient_check", "format_reason_groups"]


def _number(x: float) -> str:
    """``x`` to 4 digits; NaN and ±Inf spelled so (never as a small number)."""
    return f"{x:.4g}" if math.isfinite(x) else ("NaN" if math.isnan(x) else "∞")


def _metric(x: float) -> str:
    """A summary figure: NaN there means none applies (no naive baseline for this kernel's
    case, no bound), so it reads "n/a"; ±Inf as :func:`_number`."""
    return "n/a" if math.isnan(x) else _number(x)


def _bits_hex(x: float, dtype: str) -> str:
    arr = np.array([x]).astype(DTYPES[dtype])
    width = arr.dtype.itemsize * 2
    return "0x" + format(int(arr.view(f"u{arr.dtype.itemsize}")[0]), f"0{width}x")


def _mismatch_text(res: Any, count: int) -> str:
    """O's NaN/Inf mismatches (``count``) split by what the exact value is: finite (each one
    a failure, named in the reasons) or itself NaN/Inf (±inf where the exact value is NaN, say:
    the NaN rule for non-finite inputs judges those, not the bound, so no reason here names
    them; a user read 31 such "NaN/Inf where the exact value is finite (or the reverse)" and
    looked for the failure)."""
    o, hi = np.asarray(res.output.o, dtype=np.float64), np.asarray(res.ref.o.hi)
    finite = int((np.isfinite(hi) & ~np.isfinite(o)).sum())
    parts = []
    if finite:
        parts.append(f"NaN/Inf where the exact value is finite: {finite} of {o.size} elements")
    if count - finite:
        parts.append(
            f"{count - finite} of {o.size} elements where the exact value is NaN/Inf and the "
            "kernel's is another (finite, or ±inf for NaN): not judged by the bound; the NaN "
            "rule of flashcheck test wants NaN where a NaN input is involved, and judges "
            "neither value where only ±inf inputs are"
        )
    return "; ".join(parts)


def format_check(res: Any, *, worst: int = 5) -> str:
    """A human-readable side-by-side of kernel and oracle for the worst elements of a
    :class:`~flashcheck.harness.checks.check_results.CheckResult`."""
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
        lse = f"LSE max error {_number(v.lse_err)} (det util {_metric(v.lse_det_util)})"
    if res.case.shape[4] == 0:
        # No keys: no rounding happens and no bound applies; an error in ulps of the smallest
        # subnormal (8e6 and 5e39 were printed) and NaN utilizations say nothing.
        wrong = int(np.count_nonzero(np.asarray(res.output.o) != 0))
        lines.append(
            f"no keys: every row must be exactly O = 0, LSE = −inf (no rounding, no bound); "
            f"{wrong} of {np.asarray(res.output.o).size} O elements are not 0"
        )
    else:
        lines.append(
            f"max floored-ULP error {worst_text}; naive same-precision {_metric(v.naive_ulp)} "
            f"(ratio {_metric(v.naive_ratio)}); bound utilization det {_metric(v.det_util)}, "
            f"prob {_metric(v.prob_util)}; {lse}"
        )
    s = v.summary
    keyless = res.case.shape[4] == 0
    # Where the exact O is 0 throughout, the "relative" norm is the absolute one (a keyless
    # sequence read "normwise rel 16.5").
    rel = "rel" if np.any(np.nan_to_num(np.asarray(res.ref.o.hi))) else "abs (the exact O is 0)"
    sizes = f"normwise {rel} {s.normwise_rel:.3g}, RMSE {s.rmse:.3g}, max abs {s.max_abs:.3g}"
    if s.nonfinite_mismatches:
        # Those three are over the pairs both finite: never a small error next to a NaN.
        sizes = f"{_mismatch_text(res, s.nonfinite_mismatches)}; over the other elements: {sizes}"
    lines.append(sizes)
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
            # (no keys: an ulp of the smallest subnormal, 3.6e44 of them in fp32, says nothing)
            "-" if keyless else _number(row["floored_ulp"]),
        ]
        if res.bounds is not None:
            cells += [f"{row['det_bound']:.4g}", f"{row['prob_bound']:.4g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + _worst_lse(res, worst))


def _worst_lse(res: Any, worst: int) -> list[str]:
    """The worst LSE rows beside the oracle, where LSE exceeds its deterministic bound (an
    LSE-only failure showed only O's table, all zeros)."""
    v = res.verdict
    if res.output.lse is None or res.bounds is None or not v.lse_det_util > 1:
        return []
    got = np.asarray(res.output.lse, dtype=np.float64)
    exact = np.asarray(res.ref.lse.hi, dtype=np.float64)
    det = np.asarray(res.bounds.lse.det, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(got - exact)
        util = np.where(np.isnan(err), np.inf, err / det)
    order = np.argsort(-np.nan_to_num(util, nan=np.inf), axis=None)[:worst]
    lines = ["", "worst LSE rows, by bound utilization:"]
    lines += ["| (b, h, i) | kernel | oracle (hi) | abs err | det bound |", "|---|---|---|---|---|"]
    for flat in order:
        i = np.unravel_index(flat, got.shape)
        cells = [str(tuple(int(x) for x in i)), f"{got[i]:.9g}", f"{exact[i]:.17g}"]
        cells += [_number(float(err[i])), f"{det[i]:.4g}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def format_gradient_check(res: Any, *, worst: int = 3) -> str:
    """Verdict per gradient and, for each, the worst elements beside the oracle, of a
    :class:`~flashcheck.harness.checks.check_results.GradientCheckResult`."""
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


def elide_shapes(text: str) -> str:
    """``text`` with every tuple of integers (a shape, an element's index) written ``(...)``:
    one failure at several shapes reads as one."""
    return re.sub(r"\(\d+(?:, \d+)*,?\)", "(...)", text)


def format_reason_groups(groups: list[tuple[str, list[str]]], *, full: int = 3) -> list[str]:
    """Bullet lines for reasons that come in groups under one heading (a ragged case's failing
    sequences, each with its lengths and worst element): the heading once, its reasons
    indented under it. Past the first ``full`` groups, a group takes one line, its first reason
    and how many more there are (a user read twenty lines that repeated five headings; the
    case file keeps every reason)."""
    lines = []
    for n, (head, reasons) in enumerate(groups):
        if not reasons:
            continue
        if n < full or len(reasons) == 1:
            if len(reasons) == 1:
                lines.append(f"  - {head}: {reasons[0]}")
            else:
                lines.append(f"  - {head}:")
                lines += [f"      {r}" for r in reasons]
        else:
            more = len(reasons) - 1
            lines.append(f"  - {head}: {reasons[0]} (and {more} more reasons)")
    return lines
