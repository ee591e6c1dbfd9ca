"""The structural checks by name: what the property suite, the campaign and ``flashcheck replay``
call, and how a kernel worker finds one without importing this layer.

Each check is ``check(kernel, case, device) -> StructuralResult``. Forward checks call
``kernel.run``; gradient checks call ``kernel.run_backward`` (and the forward, for its LSE).
"""

from __future__ import annotations

from collections.abc import Callable

from ..adapters.adapter import Kernel
from ..cases.case import Case
from .batch_invariance import batch_invariance
from .conformance import conformance, gradient_conformance
from .do_layouts import gradient_do_layouts
from .integrity import gradient_integrity, integrity
from .nan_rule import nan_rule
from .structural import (
    StructuralResult,
    batch_head_independence,
    determinism,
    gradient_determinism,
    key_permutation,
    options_applied,
    padded_buffers,
)

__all__ = ["CHECKS", "GRADIENT_CHECKS", "Check", "check_target"]

Check = Callable[[Kernel, Case, str], StructuralResult]

CHECKS: dict[str, Check] = {
    "batch-head-independence": batch_head_independence,
    "padded-buffers": padded_buffers,
    "determinism": determinism,
    "key-permutation": key_permutation,
    "nan-rule": nan_rule,
    "conformance": conformance,
    "options-applied": options_applied,
    "integrity": integrity,
    "batch-invariance": batch_invariance,
}
GRADIENT_CHECKS: dict[str, Check] = {
    "gradient-determinism": gradient_determinism,
    "gradient-conformance": gradient_conformance,
    "gradient-integrity": gradient_integrity,
    "gradient-do-layouts": gradient_do_layouts,
}


def check_target(name: str) -> str:
    """``"package.module:function"`` of the check ``name``: how a kernel worker
    (:class:`flashcheck.harness.adapters.worker.KernelWorker`), which sits below this layer,
    is told which check to run."""
    fn = CHECKS.get(name) or GRADIENT_CHECKS.get(name)
    if fn is None:
        known = ", ".join([*CHECKS, *GRADIENT_CHECKS])
        raise ValueError(f"unknown structural check {name!r}: choose from {known}")
    return f"{fn.__module__}:{fn.__name__}"
