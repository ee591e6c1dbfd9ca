"""``gradient-do-layouts``: a backward gives the same gradients whatever the memory layout of
the upstream gradient ``dO`` it is handed.

Autograd hands a backward whatever tensor the graph above produced: the gradient of ``O.sum()``
is one value expanded with stride 0, the gradient through a slice or a transpose is a strided
view. A backward that assumes a contiguous ``dO`` (pointer arithmetic from the shape, a
``view`` where a ``reshape`` was needed; FlashAttention issue #355 was one) computes from the
wrong elements. This check runs the backward twice for each non-contiguous layout of
:data:`~flashcheck.harness.cases.case.DO_LAYOUTS`, once with ``dO`` in that layout and once
with the same values in a fresh contiguous array, and compares the gradients: within twice the
gradient bound of each other (two results each within the bound of the exact gradient are
within twice it of each other). The strided view sits inside a NaN-filled buffer, so a read
outside the logical tensor shows as NaN. Bits that differ within that allowance are reported,
not gated, for every kernel: a deterministic kernel promises the same bits for the same call,
and a correct torch backward can round differently for a dO that starts mid-row (its matmul
takes another path), as a compiled kernel can per stride alignment.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..judging.verdict import GRADIENT_LABELS
from .accuracy import kernel_gradient_bounds
from .structural import StructuralResult

__all__ = ["LAYOUT_BITS", "gradient_do_layouts"]

_WHAT = {
    "strided": "a strided view into a larger buffer",
    "expanded": "one row expanded with stride 0",
}


def _count(n) -> str:
    n = int(np.sum(n))
    return f"{n} element{'s' * (n != 1)}"


_WRONG_ELEMENTS = (
    "a backward that assumes a contiguous dO reads the wrong elements: use dO's strides, or make "
    "it contiguous first"
)
_BEYOND = (
    "a backward that assumes a contiguous dO reads other elements, or its gradients there are "
    "wrong whatever dO's layout and differ only by their rounding, when the gradient accuracy "
    "results fail too: a mask or a scale missing in the backward, say"
)
LAYOUT_BITS = "the bits depend on dO's layout (measured; not gated): "


def _difference(adapter: Kernel, case: Case, a, b) -> tuple[str, str | None] | None:
    """How the gradients ``b`` (``dO`` in a layout) differ from ``a`` (``dO`` contiguous):
    ``(what, hint)`` beyond what the bounds allow, ``(what, None)`` for differences within
    them, ``None`` for the same bits."""
    bounds = None
    within = []
    for name in ("dq", "dk", "dv"):
        x, y = getattr(a, name), getattr(b, name)
        if np.array_equal(x, y, equal_nan=True):
            continue
        label = GRADIENT_LABELS[name]
        extra, lost = np.isnan(y) & ~np.isnan(x), np.isnan(x) & ~np.isnan(y)
        if extra.any():
            return (
                f"{label} is NaN in {_count(extra)} where dO contiguous gives numbers",
                _WRONG_ELEMENTS,
            )
        if lost.any():
            return (
                f"{label} is a number in {_count(lost)} where dO contiguous gives NaN",
                _WRONG_ELEMENTS,
            )
        if bounds is None:
            bounds = kernel_gradient_bounds(adapter, case)
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y), 0.0)
            infs = (np.isinf(x) | np.isinf(y)) & (x != y)
        over = (diff > 2 * bounds[name].det) | infs
        if over.any():
            return (
                f"{label} differs from its value with dO contiguous by more than twice its "
                f"bound in {_count(over)} (max {float(diff.max()):.3g})",
                _BEYOND,
            )
        n = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        within.append(f"{label} in {_count(n)} (max {float(diff.max()):.3g})")
    if within:
        return "differ from those with dO contiguous: " + ", ".join(within), None
    return None


def gradient_do_layouts(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The backward's gradients with ``dO`` strided and expanded against the same values of
    ``dO`` handed over contiguous."""
    b_n, hq, _, nq, *_ = case.shape
    do = case.grad_output()
    tested, bits = [], []
    for layout in ("strided", "expanded"):
        if layout == "expanded":
            if b_n * hq * nq == 1:
                continue  # one row: broadcasting it gives the contiguous tensor
            do = np.broadcast_to(do[:1, :1, :1], do.shape).copy()
        # The same values of dO handed over contiguous and in the layout.
        plain = replace(case.with_grad_output(do), do_layout="contiguous")
        laid = replace(plain, do_layout=layout)
        found = _difference(
            adapter, plain, adapter.run_backward(plain, device), adapter.run_backward(laid, device)
        )
        if found is not None and found[1] is not None:
            what, hint = found
            return StructuralResult.failed(f"with dO as {_WHAT[layout]}, {what} ({hint})")
        if found is not None:
            bits.append(f"with dO as {_WHAT[layout]}, the gradients {found[0]}")
        tested.append(layout)
    said = f"the same gradients with dO {' and '.join(tested)} as with dO contiguous"
    if bits:
        # Within twice the bounds: right values, other roundings (a compiled variant or a
        # library path per stride). `deterministic` promises repeatable calls, not this.
        return StructuralResult.passed(
            f"{LAYOUT_BITS}{'; '.join(bits)}, within twice their bounds (copy a non-contiguous "
            "dO contiguous first for bits independent of its layout)"
        )
    return StructuralResult.passed(said)
