"""A kernel under test that hangs, in a suite run: its property fails with ``TIMEOUT``, the case
that hung is saved, and the run goes on.

The plugin limits every kernel call of a run with kernels under test (``flashcheck test``,
``--flashcheck-kernel``) to ``--flashcheck-timeout`` seconds (:func:`session_limit`, with
:mod:`flashcheck.harness.adapters.call_limit`). :func:`run_limited` makes the call of one
property: a call stopped by the limit saves its case and raises :class:`KernelTimedOut`, which
Hypothesis reports at once instead of shrinking (each smaller example that hangs would wait the
whole limit again). A call stuck outside Python, which the limit cannot stop, is saved by the
watchdog before it ends the run with exit status 1, and the line it prints names the case file.
The limit's notices ("has not returned after 30 s") go to the terminal as they happen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import pytest

from ..harness.adapters.call_limit import CallLimit, KernelHung
from ..harness.cases.ragged import RaggedCase
from ..harness.cases.ragged_store import save_ragged_case
from ..harness.cases.store import save_case
from ..harness.core.status import Status
from .profiles import RUN_CONTEXT
from .run_output import mark_session, say_live

__all__ = ["KernelTimedOut", "run_limited", "session_limit"]

# The property call in progress: (kernel name, case, device, property), for the watchdog.
_IN_FLIGHT: list[tuple[str, Any, str, str]] = []


class KernelTimedOut(BaseException):
    """A kernel under test did not return within the run's time limit; ``case_id`` names the
    saved case and ``summary`` says so in one line (as
    :class:`~flashcheck.properties.assertions.AttentionMismatch`'s do). A ``BaseException``, as
    the :class:`~flashcheck.harness.adapters.call_limit.KernelHung` it comes from."""

    __module__ = "flashcheck"

    def __init__(self, message: str, case_id: str | None, summary: str):
        super().__init__(message)
        self.case_id = case_id
        self.summary = summary


def _save(kernel: str, case: Any, device: str, prop: str, why: str) -> str | None:
    """Save the case that hung (every time: it was not shrunk, it is the input that hung)."""
    ctx = {**RUN_CONTEXT, "property": prop}
    save = save_ragged_case if isinstance(case, RaggedCase) else save_case
    verdict = {"verdict": str(Status.TIMEOUT), "message": why, "reasons": [why]}
    return save(case, kernel=kernel, device=device, verdict=verdict, context=ctx)


def run_limited(kernel: Any, case: Any, device: str, prop: str, call: Callable[[], Any]) -> Any:
    """``call()`` (which calls ``kernel`` on ``case`` for property ``prop``), or, where the time
    limit stopped the kernel, the case saved and :class:`KernelTimedOut` raised."""
    __tracebackhide__ = True
    _IN_FLIGHT.append((kernel.name, case, device, prop))
    try:
        return call()
    except KernelHung as err:
        _timed_out(kernel.name, case, device, prop, err)
    finally:
        _IN_FLIGHT.pop()


def _timed_out(kernel: str, case: Any, device: str, prop: str, err: KernelHung) -> NoReturn:
    __tracebackhide__ = True
    why = f"TIMEOUT: {err} (stopped by the run's time limit, --timeout)"
    cid = _save(kernel, case, device, prop, why)
    what = case.describe() if hasattr(case, "describe") else ""
    where = f"\nsaved case {cid}; replay with: flashcheck replay {cid}" if cid else ""
    raise KernelTimedOut(
        f"{prop} failed for {kernel}: {why}\non {what}{where}", cid, f"{prop}: {why}"
    ) from None


def _stuck(say: Callable[[str], None]) -> Callable[[str, Any], None]:
    def on_stuck(what: str, case: Any) -> None:
        if not _IN_FLIGHT:
            return
        kernel, case, device, prop = _IN_FLIGHT[-1]
        cid = _save(kernel, case, device, prop, f"TIMEOUT: {what} did not return (stuck)")
        mark_session("hung")  # `flashcheck test` then adds no guess of its own
        say(f"flashcheck: {prop}: the case that hung is saved: flashcheck replay {cid}")

    return on_stuck


def session_limit(config: pytest.Config) -> CallLimit:
    """The limit of a run's kernel calls: ``--flashcheck-timeout`` seconds, its notices on the
    terminal, the case saved by the watchdog for a call stuck outside Python."""
    seconds = config.getoption("flashcheck_timeout")
    if not seconds > 0:
        raise pytest.UsageError(f"--flashcheck-timeout takes seconds > 0, got {seconds}")
    return CallLimit(seconds, say=say_live, on_stuck=_stuck(say_live))
