"""What a suite run prints: each failure as its reason, its case and its replay command, and a
closing summary per property and dtype (registered by the plugin for a run with a kernel under
test, as ``flashcheck test`` is).

A failing property raises :class:`~flashcheck.properties.assertions.AttentionMismatch`, whose
message already holds everything a user needs (kernel and oracle side by side, the saved case,
the replay command). The traceback into the suite's own source and Hypothesis' notes about its
search say nothing about the kernel: for the suite's tests they are replaced by that message
and the drawn case. Tests that are not the suite's (a user's own, using
``flashcheck.assert_attention``) keep pytest's usual report.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Brief", "Outcome"]

_SUITE = Path(__file__).resolve().parent


@dataclass
class Outcome:
    """One property test of one kernel and dtype, as the closing summary lists it."""

    test: str  # the property test's name
    param: str  # kernel-dtype
    outcome: str  # passed, FAILED, skipped, not applicable (another layout's property)
    reason: str = ""
    replay: str | None = None


_PINNED = re.compile(r"^pinned case [0-9a-f]{16} \(.*?\)(: | lies outside )")
_LAYOUT = re.compile(r"^(.* is a dense kernel): this test applies to .* only$")


def _skip_group(why: str) -> str:
    """One line for the skips that differ only in which pinned regression case or which
    other layout's test they are: "pinned cases: this run tests fp32 only" rather than one
    line per case (each case is still in pytest's own -rs list)."""
    why = _PINNED.sub(lambda m: "pinned cases" + m.group(1).replace("lies", "lie"), why)
    return _LAYOUT.sub(r"\1: tests of the varlen, paged and split-KV layouts", why)


def _unjudgeable(o: Outcome) -> str:
    """For a failure because the kernel's output could not be judged (BAD-OUTPUT), its reason
    with the shapes and the property left out; else ``""``."""
    if o.outcome != "FAILED" or "BAD-OUTPUT: " not in o.reason:
        return ""
    from ..harness.checks.text import elide_shapes

    return elide_shapes(o.reason.split("BAD-OUTPUT: ", 1)[1].split(" (and ")[0])


@dataclass
class Brief:
    """The pytest plugin object that shortens failures and prints the closing summary."""

    outcomes: list[Outcome] = field(default_factory=list)

    @staticmethod
    def _in_suite(item: Any) -> bool:
        return Path(str(item.path)).resolve().parent == _SUITE

    @staticmethod
    def _names(item: Any) -> tuple[str, str]:
        """The property's name (with the case it runs, if parametrized by one) and its
        kernel and dtype."""
        name, _, rest = item.name.partition("[")
        params = getattr(getattr(item, "callspec", None), "params", {})
        param = " ".join(
            str(params[p]) for p in ("flashcheck_kernel", "flashcheck_dtype") if params.get(p)
        )
        extra = [x for x in rest.rstrip("]").split("-") if x and x not in param.split()]
        extra = [x for x in extra if x != "n/a"]
        if extra and param:  # a parametrized property: which case (or regression file) it ran
            name = f"{name}[{'-'.join(extra)}]"
        return name, param or rest.rstrip("]")

    def pytest_deselected(self, items: list[Any]) -> None:
        """Properties of another layout than the kernel's, deselected by the plugin: counted
        as not applicable, with the reason."""
        for item in items:
            mark = item.get_closest_marker("flashcheck_other_layout")
            if mark is not None and self._in_suite(item):
                name, param = self._names(item)
                self.outcomes.append(Outcome(name, param, "not applicable", str(mark.args[0])))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: Any, call: Any):
        report = (yield).get_result()
        if not self._in_suite(item):
            return
        name, param = self._names(item)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.skipped:
                why = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
                self.outcomes.append(
                    Outcome(name, param, "skipped", str(why).removeprefix("Skipped: "))
                )
            elif report.failed:
                self.outcomes.append(self._failure(name, param, report, call))
            elif report.when == "call":
                self.outcomes.append(Outcome(name, param, "passed"))

    def _failure(self, name: str, param: str, report: Any, call: Any) -> Outcome:
        exc = None if call.excinfo is None else call.excinfo.value
        # Hypothesis reports several distinct failures of one property as a group.
        found = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        # An AttentionMismatch or KernelTimedOut (by their fields: assertions imports the
        # plugin that loads this)
        if not all(hasattr(e, "case_id") and hasattr(e, "summary") for e in found):
            crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", "")
            return Outcome(name, param, "FAILED", crash.splitlines()[0] if crash else "error")
        texts = []
        for e in found:
            drawn = [n for n in getattr(e, "__notes__", ()) if n.startswith("Draw ")]
            texts.append("\n".join([str(e), *drawn]))
        head = f"{len(found)} distinct failures:\n\n" if len(found) > 1 else ""
        report.longrepr = head + "\n\n".join(texts)
        replays = [f"flashcheck replay {e.case_id}" for e in found if e.case_id]
        more = f" (and {len(found) - 1} other distinct failure(s))" if len(found) > 1 else ""
        return Outcome(
            name, param, "FAILED", found[0].summary + more, "\n      ".join(replays) or None
        )

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.outcomes:
            return
        tr = terminalreporter
        tr.section("flashcheck summary")
        by: dict[str, list[Outcome]] = defaultdict(list)
        for o in self.outcomes:
            by[o.param].append(o)
        for param, rows in by.items():
            kinds = ("passed", "FAILED", "skipped", "not applicable")
            n = {k: sum(o.outcome == k for o in rows) for k in kinds}
            counts = ", ".join(f"{v} {k}" for k, v in n.items() if v)
            tr.line(f"{param}: {counts}")
            # A kernel whose output cannot be judged at all (a wrong shape, no tensor) fails
            # every property the same way: the first says how, the others are listed by name.
            first: dict[str, Outcome] = {}
            alike: dict[str, list[str]] = defaultdict(list)
            for o in rows:
                key = _unjudgeable(o)
                if key in first:
                    alike[key].append(o.test)
                elif key:
                    first[key] = o
            for o in rows:
                key = _unjudgeable(o)
                if o.outcome != "FAILED" or (key and first[key] is not o):
                    continue
                tr.line(f"  FAILED {o.test}: {o.reason}", red=True)
                if o.replay:
                    tr.line(f"      {o.replay}")
                if alike.get(key):
                    tr.line(
                        f"  FAILED the same way ({len(alike[key])} more): " + ", ".join(alike[key]),
                        red=True,
                    )
            for kind in ("skipped", "not applicable"):
                grouped = defaultdict(list)
                for o in rows:
                    if o.outcome == kind:
                        grouped[_skip_group(o.reason)].append(o.test)
                for why, tests in grouped.items():
                    tr.line(f"  {kind} {len(tests)}: {why}")
