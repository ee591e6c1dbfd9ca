"""flashcheck: numerics and property testing for softmax attention kernels.

The public API (docs/api.md); everything under ``flashcheck.harness``, ``flashcheck.kernels``
and ``flashcheck.properties`` is internal and may change.

- :func:`oracle`: the exact ``softmax(scale·QKᵀ + mask)·V`` and its log-sum-exp, with
  certified error bounds and correctly rounded values in the input format (and, given an
  upstream gradient ``do=``, the exact dQ, dK, dV likewise); it also takes FlashAttention's
  varlen and paged layouts (``cu_seqlens_q=``/``cu_seqlens_k=``, ``block_table=``/
  ``cache_seqlens=``) and the split-KV merge (``op="combine"``);
- :func:`check`: judge a kernel on one input (verdict, metrics, bounds, a saved case to replay),
  or on a :class:`RaggedCase` (a varlen or paged batch, or split-KV partials) for a kernel
  declared with ``kernel(fn, layout=...)`` or ``op="combine"``;
- :func:`check_gradients`: the same for the kernel's gradients dQ, dK, dV (per sequence on a
  varlen :class:`RaggedCase` for a kernel declared with ``layout="varlen", backward=...``);
- :func:`assert_attention`: the same as a test assertion (raises :class:`AttentionMismatch`);
- :func:`load_case`: a saved failing case, rebuilt bit for bit; :func:`call`: a kernel called
  on a case as the checks call it (only the options its signature names);
- :func:`kernel`: declare a function's contract (arithmetic class, dtypes, head dims, masks, GQA,
  ``Nq != Nk``, sequence-length multiple, ...); undeclared parts are probed;
- :mod:`flashcheck.strategies`: Hypothesis strategies of the adversarial input families, inside
  a kernel's contract.

Names load on first use, so ``import flashcheck`` costs nothing until one is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from flashcheck.harness.core.environment import __version__

if TYPE_CHECKING:
    from flashcheck import strategies
    from flashcheck.harness.adapters.adapter import Kernel
    from flashcheck.harness.adapters.declare import kernel
    from flashcheck.harness.cases.case import Case
    from flashcheck.harness.cases.ragged import RaggedCase
    from flashcheck.harness.cases.ragged_store import saved_any_case as load_case
    from flashcheck.harness.checks.check_results import CheckResult, GradientCheckResult
    from flashcheck.harness.checks.dispatch import call, check
    from flashcheck.harness.checks.ragged import RaggedCheckResult
    from flashcheck.harness.checks.ragged_gradients import RaggedGradientResult, check_gradients
    from flashcheck.harness.oracle.combine import CombineResult
    from flashcheck.harness.oracle.dispatch import oracle
    from flashcheck.harness.oracle.evaluate import OracleResult
    from flashcheck.harness.oracle.layouts import LayoutResult
    from flashcheck.properties.assertions import AttentionMismatch, assert_attention

__all__ = [
    "AttentionMismatch",
    "Case",
    "CheckResult",
    "CombineResult",
    "GradientCheckResult",
    "Kernel",
    "LayoutResult",
    "OracleResult",
    "RaggedCase",
    "RaggedCheckResult",
    "RaggedGradientResult",
    "__version__",
    "assert_attention",
    "call",
    "check",
    "check_gradients",
    "kernel",
    "load_case",
    "oracle",
    "strategies",
]

# Each public name: the module that defines it (and its name there, where it differs).
_WHERE = {
    "call": "flashcheck.harness.checks.dispatch",
    "load_case": ("flashcheck.harness.cases.ragged_store", "saved_any_case"),
    "oracle": "flashcheck.harness.oracle.dispatch",
    "OracleResult": "flashcheck.harness.oracle.evaluate",
    "LayoutResult": "flashcheck.harness.oracle.layouts",
    "CombineResult": "flashcheck.harness.oracle.combine",
    "check": "flashcheck.harness.checks.dispatch",
    "RaggedCheckResult": "flashcheck.harness.checks.ragged",
    "RaggedGradientResult": "flashcheck.harness.checks.ragged_gradients",
    "RaggedCase": "flashcheck.harness.cases.ragged",
    "CheckResult": "flashcheck.harness.checks.check_results",
    "check_gradients": "flashcheck.harness.checks.ragged_gradients",
    "GradientCheckResult": "flashcheck.harness.checks.check_results",
    "kernel": "flashcheck.harness.adapters.declare",
    "Kernel": "flashcheck.harness.adapters.adapter",
    "Case": "flashcheck.harness.cases.case",
    "assert_attention": "flashcheck.properties.assertions",
    "AttentionMismatch": "flashcheck.properties.assertions",
}


def __getattr__(name: str) -> Any:
    if name == "strategies":
        return importlib.import_module("flashcheck.strategies")
    if name in _WHERE:
        where = _WHERE[name]
        module, attr = (where, name) if isinstance(where, str) else where
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'flashcheck' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
