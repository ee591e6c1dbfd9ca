"""Assertions for tests: judge a kernel; on failure save the case, then raise with its replay.

The case file is written *before* the ``AssertionError`` propagates. Inside a
Hypothesis test only the final, shrunk example is saved (see
:func:`flashcheck.properties.plugin.final_example`); every intermediate failure during shrinking
would otherwise leave a file.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

from ..harness.cases.case import Case
from ..harness.cases.ragged import RaggedCase
from ..harness.cases.ragged_store import save_ragged_case
from ..harness.cases.store import save_case
from ..harness.checks.accuracy import format_check
from ..harness.checks.check_results import CheckResult
from ..harness.checks.dispatch import check
from ..harness.checks.ragged import RaggedCheckResult, format_ragged_check
from .plugin import RUN_CONTEXT, final_example

__all__ = ["AttentionMismatch", "assert_attention", "fail", "save_failure"]


class AttentionMismatch(AssertionError):
    """A kernel failed a check; ``case_id`` names the saved case (``None`` if not saved),
    ``result`` holds the numbers (a :class:`CheckResult`, or a :class:`RaggedCheckResult`
    for a ragged case, for accuracy failures) and
    ``summary`` says in one line what failed."""

    __module__ = "flashcheck"  # shown in tracebacks as the public name users catch

    def __init__(
        self,
        message: str,
        case_id: str | None,
        result: CheckResult | RaggedCheckResult | None = None,
        summary: str | None = None,
    ):
        super().__init__(message)
        self.case_id = case_id
        self.result = result
        self.summary = summary or message.strip().splitlines()[0]


def save_failure(
    case: Case | RaggedCase,
    kernel: str,
    device: str,
    verdict: dict[str, Any] | None,
    prop: str,
    directory: str | os.PathLike | None = None,
) -> str | None:
    """Save the case of a failing property (the final Hypothesis example only), dense or
    ragged (the file ``flashcheck replay`` reads for each); its id."""
    if not final_example():
        return None
    ctx = dict(RUN_CONTEXT)
    ctx["property"] = prop
    if isinstance(case, RaggedCase):
        # A ragged record keeps the accuracy and the gradient verdicts apart (one case file
        # may hold both: the replay compares each with its own check).
        kw = {"gradient_verdict": verdict} if prop == "gradients" else {"verdict": verdict}
        return save_ragged_case(
            case, kernel=kernel, device=device, context=ctx, directory=directory, **kw
        )
    return save_case(
        case, kernel=kernel, device=device, verdict=verdict, context=ctx, directory=directory
    )


def fail(
    case: Case | RaggedCase,
    kernel: str,
    device: str,
    prop: str,
    message: str,
    verdict: dict[str, Any] | None = None,
    *,
    directory: str | os.PathLike | None = None,
    result: CheckResult | RaggedCheckResult | None = None,
    summary: str | None = None,
) -> NoReturn:
    """Save ``case`` (final example only) and raise :class:`AttentionMismatch`; ``summary``
    (default: from ``result``'s verdict, else the message's first line) is its one line."""
    __tracebackhide__ = True  # the user's test is where it failed, not this helper
    cid = save_failure(case, kernel, device, verdict, prop, directory)
    where = ""
    if cid:
        flag = "" if directory is None else f" --dir {os.fspath(directory)}"
        where = f"\nsaved case {cid}; replay with: flashcheck replay {cid}{flag}"
    if summary is None and isinstance(result, CheckResult):
        v = result.verdict
        # The first reason of the verdict's own level: a FAIL-HARD case was summed up by its
        # first reason, a FAIL line, in pytest's summary.
        mine = [r for r in v.reasons if r.startswith(f"{v.verdict}:")] or v.reasons
        summary = "; ".join([*mine[:1], *v.diagnosis[:1]]) or str(v.verdict)
    if summary is None:
        summary = message.strip().splitlines()[0] if message.strip() else "failed"
    sep = ":" if message.startswith("\n") else ": "  # a message that opens on its own line
    raise AttentionMismatch(
        f"{prop} failed for {kernel}{sep}{message}{where}", cid, result, f"{prop}: {summary}"
    )


def assert_attention(
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
    device: str | None = None,
    case_dir: str | os.PathLike | None = None,
    **descales: Any,
) -> CheckResult | RaggedCheckResult:
    """Assert that ``kernel`` passes :func:`flashcheck.check` on this input (or on a ``Case``
    passed as ``q``, e.g. drawn from :func:`flashcheck.strategies.attention_cases`, or a
    ``RaggedCase`` from :func:`flashcheck.strategies.ragged_cases`); FP8 inputs' descales
    (``descale_q=``, ...) as for :func:`flashcheck.check`.

    On FAIL or FAIL-HARD the case is saved (to ``case_dir``, default ``$FLASHCHECK_CASE_DIR`` or
    ``reports/cases``; inside Hypothesis, only the final shrunk example) and
    :class:`AttentionMismatch` is raised with kernel and oracle side by side and the
    ``flashcheck replay`` command. Returns the :class:`CheckResult` (for a ragged case the
    :class:`RaggedCheckResult`) when it passes.
    """
    __tracebackhide__ = True
    res = check(
        kernel,
        q,
        k,
        v,
        causal=causal,
        window=window,
        mask=mask,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
        device=device,
        save="never",
        **descales,
    )
    if isinstance(res, RaggedCheckResult):
        if not res.passed:
            first = [*res.diagnosis[:1], *res.reasons[:1]]
            fail(
                res.case,
                res.kernel,
                res.device,
                "accuracy",
                "\n" + format_ragged_check(res),
                res.as_dict(),
                directory=case_dir,
                result=res,
                summary="; ".join(first) or str(res.verdict),
            )
        return res
    if not res.passed:
        fail(
            res.case,
            res.kernel,
            res.device,
            "accuracy",
            "\n" + format_check(res),
            res.verdict.as_dict(),
            directory=case_dir,
            result=res,
        )
    return res
