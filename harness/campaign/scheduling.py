"""How a campaign runs a list of work items: submitted ahead to the executor, collected and
written in plan order, and, under a time budget, cut cleanly.

:class:`Scheduler` is the part of :class:`~flashcheck.harness.campaign.runner.Campaign` that
feeds the executor: work is submitted far ahead (a slow case must not leave the other workers
idle) and collected in the order of the work list, so what a campaign writes does not depend on
who finished first. Under a budget (:mod:`flashcheck.harness.campaign.budget`) little is
submitted ahead, a case that would start a new compile waits until it is its worker's next
call and is dropped when the compile no longer fits, a case that would outlast the budget at
the session's rate is not started, and what was not started when the budget ran out is
cancelled and left for a resume. Without a budget, a kernel and dtype's next
search generation is drawn and submitted as soon as its own results are in, not when every
kernel's are: the workers do not wait for the slowest case of a generation.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..adapters.palette import compile_key
from ..cases.case import Case
from ..cases.families import Recipe
from ..core.progress import Progress
from .budget import groups_not_run, missing_by_part
from .logrecords import CoverageRecord
from .plan import Item, fit_recipe

__all__ = ["Group", "Scheduler", "Task", "cancelled"]


@dataclass
class Group:
    """One fitted case of an item and what runs on it: a kernel future, or a SKIP reason, per
    spec (``check``: the structural property, for the structural part)."""

    recipe: Recipe
    case: Case
    reference: Any
    runs: dict[str, Any]
    check: str | None = None


@dataclass
class Task:
    item: Item
    specs: list[str]
    done: list[str]
    groups: list[Group] = field(default_factory=list)
    compiles: list[str] = field(default_factory=list)  # the new compile keys it calls
    index: int = -1  # its place in the work list being run


def cancelled(task: Task) -> bool:
    """Cancel what ``task`` still waits for; ``True`` if any part of it had not started (the
    task is then dropped: a part that was running finishes in the background, unrecorded)."""
    futures = [
        f for g in task.groups for f in (g.reference, *g.runs.values()) if isinstance(f, cf.Future)
    ]
    return any([f.cancel() for f in futures])  # (a list: cancel every one)


def _ahead_key(item: Item, specs: Sequence[str]) -> str | None:
    """The key a task submitted ahead is found by: its one kernel's result key."""
    return item.key(specs[0]) if len(specs) == 1 else None


class Scheduler:
    """The scheduling half of a campaign (a mixin of
    :class:`~flashcheck.harness.campaign.runner.Campaign`, whose fields it uses: ``executor``,
    ``kernels``, ``budget``, ``preset``, the ``_submit`` / ``_collect`` of one item and the
    ``_children`` of a search generation)."""

    _generations = 0  # search generations of this run
    # Work submitted ahead: tasks by result key, the children drawn, by (spec, dtype, gen),
    # and the (spec, dtype, gen) to draw once the work list's entry n is collected.
    _ahead: dict[str | None, Task]
    _next: dict[tuple[str, str, int], list[Item]]
    _finish: dict[int, list[tuple[str, str, int]]]

    # -- running items: submitted ahead, results written in plan order ---------------------
    def _execute(self, work: Sequence[tuple[Item, Sequence[str]]], progress: Progress) -> None:
        """Evaluate each ``(item, specs)`` with the executor's parallelism; results are written
        in the order of ``work``, as a one-worker run writes them. Work is submitted far ahead
        (a slow case must not leave the other workers idle) and collected in order."""
        window = max(256, 8 * (self.executor.workers + self.executor.kernel_workers))
        budgeted = self.budget.seconds is not None
        if budgeted:
            # Little submitted ahead: at the budget, only what is in flight still finishes.
            window = 2 * (self.executor.workers + self.executor.kernel_workers)
        pending: deque[Task] = deque()
        todo = iter(enumerate(work))
        held: list[tuple[int, tuple[Item, Sequence[str]]]] = []  # waiting for a compile slot

        def feed() -> None:
            while len(pending) < window:
                entry = held.pop() if held else next(todo, None)
                if entry is None:
                    return
                n, nxt = entry
                if self.budget.spent:
                    self._cut = True  # left for a resume
                    return
                if not self._fits(*nxt, progress):
                    continue
                if budgeted and self._compile_need(*nxt) > 0:
                    # A submitted call cannot be taken back once its worker starts it, so under
                    # a budget a new compile waits until it is the worker's next call; whether
                    # it fits is decided then.
                    if sum(bool(t.compiles) for t in pending) >= self.executor.kernel_workers:
                        held.append(entry)
                        return
                task = self._ahead.pop(_ahead_key(*nxt), None) or self._submit(*nxt)
                task.index = n
                pending.append(task)

        feed()
        while pending:
            task = pending.popleft()
            if self.budget.spent and cancelled(task):
                self._cut = True  # not started when the budget ran out: left for a resume
                continue
            t0 = time.monotonic()
            if task.compiles:
                progress.compiling(f"compiling {'; '.join(task.compiles)}")
            self._collect(task)
            if task.compiles:
                progress.compile_time += time.monotonic() - t0
            ran = len(task.specs) - len(task.done)
            if ran:
                item = task.item
                progress.advance(item.cost() * ran, f"{item.part} {item.recipe.dtype} {item.tag}")
            self._run_ahead(self._finish.pop(task.index, ()))
            feed()

    def coverage(self) -> CoverageRecord | None:
        """What a run stopped by its budget covered (``None``: it ran to its end)."""
        if not self._cut:
            return None
        runnable = [
            (it, [s for s in specs if self._runnable(s, it.recipe.dtype)])
            for it, specs in self._fixed
        ]
        done = set(self._done)
        missing = missing_by_part(runnable, done)
        planned = sum(len(specs) for _, specs in runnable)
        live = any(self._runnable(k, dt) for k in self.kernels for dt in self.dtypes)
        if not sum(missing.values()) and (self._searched or not live):
            # Everything that could run ran, and the search too, or it had nothing to run
            # (every kernel and dtype stopped after identical failures): no cut.
            return None
        return CoverageRecord(
            budget=float(self.budget.seconds or 0.0),
            planned=planned,
            ran=planned - sum(missing.values()),
            missing=missing,
            search=self._searched,
            unrun=tuple(groups_not_run(runnable, done)),
        )

    # -- the next search generation, a kernel and dtype at a time ---------------------------
    def _plan_ahead(self, work: Sequence[tuple[Item, Sequence[str]]], gen: int) -> None:
        """Before running ``work``: note, for each (kernel, dtype), the last entry of ``work``
        whose results the search can draw from; once that is collected, the kernel and dtype's
        search generation ``gen`` is submitted (:meth:`_run_ahead`) while the rest of ``work``
        is still being collected. Generation ``gen`` of one kernel and dtype depends only on its
        own earlier forward results (:func:`~flashcheck.harness.campaign.search.parents`), so
        it is the same whenever it is drawn; results are still written in plan order. Not under
        a budget, whose cut must find nothing submitted ahead."""
        self._finish = {}
        if self.budget.seconds is not None or gen >= self._generations:
            return
        last: dict[tuple[str, str], int] = {}
        for n, (item, specs) in enumerate(work):
            # Only forward results outside the structural and options parts can be parents:
            # the generation is drawn while the fixed parts' others still run. (A kernel that
            # a later failure stops for the dtype leaves its drawn generation unrun.)
            if item.backward or item.part in ("structural", "options"):
                continue
            for spec in specs:
                last[(spec, item.recipe.dtype)] = n
        for pair, n in last.items():
            self._finish.setdefault(n, []).append((*pair, gen))

    def _run_ahead(self, pairs: Sequence[tuple[str, str, int]]) -> None:
        """Draw and submit search generation ``gen`` of each ``(spec, dtype, gen)`` now; the
        generation's own run takes the drawn children (:meth:`generation`) and their tasks."""
        for spec, dtype, gen in pairs:
            if not self._runnable(spec, dtype):
                continue
            kids = self._next[(spec, dtype, gen)] = self._children(spec, dtype, gen)
            for child in kids:
                if child.key(spec) not in self._done:
                    self._ahead[_ahead_key(child, [spec])] = self._submit(child, [spec])

    def generation(self, spec: str, dtype: str, gen: int) -> list[Item]:
        """Search generation ``gen`` of ``spec`` and ``dtype``: drawn ahead, or now."""
        kids = self._next.pop((spec, dtype, gen), None)
        return self._children(spec, dtype, gen) if kids is None else kids

    def _compile_need(self, item: Item, specs: Sequence[str]) -> float:
        """Seconds of compiling ``item`` would start: its new compile keys, at each kernel's
        probed compile time."""
        need = 0.0
        for spec in specs:
            kern = self.kernels[spec]
            if not kern.compile_keys or item.key(spec) in self._done:
                continue
            if not self._runnable(spec, item.recipe.dtype):
                continue
            key = compile_key(kern, fit_recipe(item.recipe, kern, palette=self.preset.palette))
            if key and (spec, key) not in self._keys:
                need += kern.compile_seconds
        return need

    def _fits(self, item: Item, specs: Sequence[str], progress: Progress) -> bool:
        """Whether ``item`` would finish in the budget left: the compiles it would start, and
        its own time on one worker at the session's rate (a started case is not stopped, so
        one that outlasts the budget overruns it). An item that does not fit is left for a
        resume."""
        if self.budget.seconds is None:
            return True
        dtype = item.recipe.dtype
        if not any(self._runnable(s, dtype) and item.key(s) not in self._done for s in specs):
            # Nothing of it would run (its kernels stopped after identical failures, or done):
            # it costs nothing, and leaving it "for a resume" told a user whose every kernel
            # had stopped that the budget had cut the run.
            return True
        rate = progress.seconds_per_cost() or 0.0
        run = item.cost() * item.weight() * rate * max(1, self.executor.workers)
        if self._compile_need(item, specs) + run <= self.budget.left():
            return True
        self._cut = True
        return False
