"""The property suite under a time budget (``flashcheck test --budget DURATION``,
``--flashcheck-budget SECONDS``): the properties that find bugs first run first, and those not
started when the budget is spent are skipped with that reason; the run ends by saying what it
covered.

The order: batch/head independence (where indexing bugs show at once), the other structural
properties, accuracy, gradients, then the pinned regression cases and the contract; within each,
the collection order. A property that has started runs to its end (Hypothesis' examples are not
cut short), so a run may pass its budget by one property's time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ..harness.core.progress import format_seconds

__all__ = ["SuiteBudget"]

_SUITE = Path(__file__).resolve().parent
# Lower runs first; a test matches the first entry its name starts with.
_FIRST = (
    ("test_batch_and_head_independence", 0),
    ("test_structure", 1),
    ("test_ragged_error", 2),
    ("test_ragged", 1),
    ("test_accuracy", 2),
    ("test_gradients", 3),
)


def _rank(item: Any) -> int:
    module = Path(str(item.path)).stem
    for prefix, rank in _FIRST:
        if item.name.startswith(prefix) or module == prefix:
            return rank
    return len(_FIRST)


@dataclass
class SuiteBudget:
    """The pytest plugin object of a budgeted run (``seconds`` from the session's start)."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    ran: int = 0
    cut: list[str] = field(default_factory=list)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        suite = [i for i in items if Path(str(i.path)).resolve().parent == _SUITE]
        if not suite:
            return
        order = {id(i): n for n, i in enumerate(items)}
        suite.sort(key=lambda i: (_rank(i), order[id(i)]))
        others = [i for i in items if Path(str(i.path)).resolve().parent != _SUITE]
        items[:] = suite + others

    def pytest_runtest_setup(self, item: Any) -> None:
        if time.monotonic() - self.started >= self.seconds:
            self.cut.append(item.name)
            pytest.skip(
                f"the time budget of {format_seconds(self.seconds)} was spent before this property "
                "started (flashcheck test --budget)"
            )
        self.ran += 1

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        spent = time.monotonic() - self.started
        tr = terminalreporter
        tr.section("flashcheck time budget")
        if not self.cut:
            tr.line(
                f"every property ran within the budget: {format_seconds(spent)} of "
                f"{format_seconds(self.seconds)}"
            )
            return
        tr.line(
            f"{self.ran} properties ran in {format_seconds(spent)} "
            f"(budget {format_seconds(self.seconds)}); "
            f"{len(self.cut)} were not started, each skipped with that reason. Batch/head "
            "independence and the other structural properties ran first; run again without "
            "--budget for the rest."
        )
