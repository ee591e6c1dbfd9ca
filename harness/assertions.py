"""Assertions for tests: judge a kernel on a case; on failure save the case, then raise.

The case file is written *before* the ``AssertionError`` propagates (SPEC 5). Inside a
Hypothesis test only the final, shrunk example is saved (Hypothesis re-runs it last with
``is_final`` set); every intermediate failure during shrinking would otherwise leave a file.
"""

from __future__ import annotations

from typing import Any

from harness.adapters import resolve
from harness.cases import Case
from harness.casestore import save_case
from harness.checking import CheckResult, check_case, format_check

__all__ = ["RUN_CONTEXT", "KernelCheckFailure", "assert_kernel_passes", "save_failure"]

# Filled by the test session (conftest): Hypothesis profile and seed, recorded in case files.
RUN_CONTEXT: dict[str, Any] = {}


class KernelCheckFailure(AssertionError):
    """A kernel failed a property; ``case_id`` names the saved case (``None`` if not saved)."""

    def __init__(self, message: str, case_id: str | None):
        super().__init__(message)
        self.case_id = case_id


def _final_hypothesis_example() -> bool:
    """True outside Hypothesis, or on the final (reported) run of a failing example."""
    try:
        from hypothesis.control import _current_build_context

        ctx = _current_build_context.value
    except (ImportError, AttributeError):
        return True
    return ctx is None or bool(getattr(ctx, "is_final", True))


def save_failure(
    case: Case, kernel: str, device: str, verdict: dict[str, Any] | None, prop: str
) -> str | None:
    if not _final_hypothesis_example():
        return None
    ctx = dict(RUN_CONTEXT)
    ctx["property"] = prop
    return save_case(case, kernel=kernel, device=device, verdict=verdict, context=ctx)


def fail(case: Case, kernel: str, device: str, prop: str, message: str, verdict=None):
    """Save ``case`` (final example only) and raise :class:`KernelCheckFailure`."""
    cid = save_failure(case, kernel, device, verdict, prop)
    where = f"\nsaved case {cid}; replay with: flashcheck replay {cid}" if cid else ""
    raise KernelCheckFailure(f"{prop} failed for {kernel}: {message}{where}", cid)


def assert_kernel_passes(
    kernel: str, case: Case, *, device: str = "cpu", prop: str = "accuracy"
) -> CheckResult:
    """Judge ``kernel`` (a name or ``module:function`` spec) on ``case``; raise unless PASS."""
    adapter = resolve(kernel)
    res = check_case(adapter, case, device=device)
    if res.verdict.verdict != "PASS":
        fail(case, kernel, device, prop, "\n" + format_check(res), res.verdict.as_dict())
    return res
