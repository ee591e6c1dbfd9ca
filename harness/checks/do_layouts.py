"""``gradient-do-layouts``: a backward gives the same gradients whatever the memory layout of
the upstream gradient ``dO`` it is handed.

Autograd hands a backward whatever tensor the graph above produced: the gradient of ``O.sum()``
is one value expanded with stride 0, the gradient through a slice or a transpose is a strided
view. A backward that assumes a contiguous ``dO`` (pointer arithmetic from the shape, a
``view`` where a ``reshape`` was needed; FlashAttention issue #355 was one) computes from the
wrong elements. This check runs the backward twice for each non-contiguous layout of
:data:`~flashcheck.harness.cases.case.DO_LAYOUTS`, once with ``dO`` in that layout and once
with the same values in a fresh contiguous array, and compares the gradients: bitwise for a
kernel declared deterministic, else within twice the gradient bound of each other (two results
each within the bound of the exact gradient are within twice it of each other). The strided
view sits inside a NaN-filled buffer, so a read outside the logical tensor shows as NaN. A
deterministic kernel whose gradients differ only within that allowance is told that its bits
depend on the layout (a compiled variant per stride alignment, say), not that it reads the
wrong elements.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..judging.verdict import GRADIENT_LABELS
from .accuracy import kernel_gradient_bounds
from .structural import StructuralResult

__all__ = ["gradient_do_layouts"]

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
_LAYOUT_BITS = (
    "the values stay within the bounds but the bits depend on dO's layout, as when a compiler "
    "builds one variant per stride alignment: copy a non-contiguous dO contiguous first, or do "
    "not declare the kernel deterministic"
)


def _difference(adapter: Kernel, case: Case, a, b) -> tuple[str, str] | None:
    """How the gradients ``b`` (``dO`` in a layout) differ from ``a`` (``dO`` contiguous) beyond
    what the kernel's contract allows, with a hint at the cause; ``None`` if they do not."""
    bounds = None
    for name in ("dq", "dk", "dv"):
        x, y = getattr(a, name), getattr(b, name)
        label = GRADIENT_LABELS[name]
        extra, lost = np.isnan(y) & ~np.isnan(x), np.isnan(x) & ~np.isnan(y)
        if adapter.deterministic and np.array_equal(x, y, equal_nan=True):
            continue
        if bounds is None:
            bounds = kernel_gradient_bounds(adapter, case)
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
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y), 0.0)
            infs = (np.isinf(x) | np.isinf(y)) & (x != y)
        over = (diff > 2 * bounds[name].det) | infs
        if adapter.deterministic:
            n = ~((x == y) | (np.isnan(x) & np.isnan(y)))
            found = (
                f"{label} differs from its value with dO contiguous in {_count(n)} "
                f"(max {float(diff.max()):.3g}; declared deterministic: compared bitwise)"
            )
            return found, _WRONG_ELEMENTS if over.any() else _LAYOUT_BITS
        if over.any():
            return (
                f"{label} differs from its value with dO contiguous by more than twice its "
                f"bound in {_count(over)} (max {float(diff.max()):.3g})",
                _WRONG_ELEMENTS,
            )
    return None


def gradient_do_layouts(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The backward's gradients with ``dO`` strided and expanded against the same values of
    ``dO`` handed over contiguous."""
    b_n, hq, _, nq, *_ = case.shape
    do = case.grad_output()
    tested = []
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
        if found is not None:
            what, hint = found
            return StructuralResult.failed(f"with dO as {_WHAT[layout]}, {what} ({hint})")
        tested.append(layout)
    return StructuralResult.passed(
        f"the same gradients with dO {' and '.join(tested)} as with dO contiguous"
    )
