"""The error-report campaign: kernels × dtypes × input families × sizes, structural
properties, and a worst-case search.

A campaign is a deterministic function of its configuration (preset, seed, kernels, dtypes,
device) and of the kernels' contracts; what it runs (presets, the fixed plan, search mutations)
is in :mod:`flashcheck.harness.campaign.plan`. Each planned case is fitted to each kernel's
contract (:func:`~flashcheck.harness.campaign.plan.fit_recipe`), so a kernel is only ever given
inputs it accepts, and kernels whose fitted cases coincide share one oracle evaluation. The
parts are described in :mod:`flashcheck.harness.campaign.plan`, the worst-case search in
:mod:`flashcheck.harness.campaign.search`.

Every result is appended to a JSONL file (:mod:`flashcheck.harness.core.resultlog`) as soon as
it exists. A re-run with the same configuration skips every result already there: the plan is
rebuilt from the seed, and the search's next generation is rebuilt from the results on file, so
an interrupted campaign resumes without recomputing anything and ends with the same numbers as
an uninterrupted one. Kernels run in a child process with a per-case time limit
(:mod:`flashcheck.harness.adapters.worker`); one that raises, hangs or returns the wrong shape
is recorded as ``ERROR``, ``TIMEOUT`` or ``BAD-OUTPUT`` and the campaign goes on, unless it
failed the same way :data:`STREAK` times in a row: then that kernel and dtype stop, and one
``stopped`` record says why.

A kernel that compiles per shape has its work grouped by compile key, each key on one kernel
worker (:mod:`flashcheck.harness.campaign.grouping`). At the end the worst and failing cases are
re-run and saved as case files next to the report
(:mod:`flashcheck.harness.campaign.casefiles`), each replayable with ``flashcheck replay``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.adapter import Kernel
from ..adapters.outcome import Outcome
from ..adapters.palette import compile_key
from ..adapters.worker import KernelRef
from ..cases.case import Case
from ..cases.families import Recipe, make_case
from ..checks.accuracy import campaign_gradient_bounds, check_case
from ..core.progress import Progress
from ..core.resultlog import ResultLog
from ..core.status import Status
from ..judging.verdict import judge_gradients
from . import search
from .budget import Budget, priority_order
from .casefiles import CaseFiles, unsaved_worst
from .executor import Executor, GradientReference, Reference
from .grouping import affinity, compile_waits, grouped, palette_first
from .logrecords import CaseFileRecord, StoppedRecord, parse_records
from .option_plan import option_work
from .plan import (
    PARTS,
    PRESETS,
    Item,
    Preset,
    fit_recipe,
    gradient_items,
    plan_items,
    structural_items,
)
from .records import gist, gradient_fields, job_outcome, result_fields, unjudged_record
from .resultrecords import (
    AccuracyResult,
    CaseOptions,
    CaseShape,
    GradientResult,
    ResultRecord,
    StructuralResult,
)
from .scheduling import Group, Scheduler, Task

__all__ = ["PRESETS", "STREAK", "Campaign", "Item", "Preset", "plan_items"]

STREAK = 5  # identical failures in a row that stop a kernel for a dtype
# Seconds of one reference worker per unit of Item.cost(), for the first ETA: the default CPU
# campaign (142,312 units with the search's estimate) takes about 150 s on 2 cores.
SECONDS_PER_COST = 150 * 2 / 142_312


@dataclass
class Campaign(Scheduler):
    """A campaign bound to its results file; :meth:`run` executes (or resumes) it."""

    log: ResultLog
    preset: Preset
    seed: int
    kernels: dict[str, Kernel]  # spec → adapter
    devices: dict[str, str]  # spec → device it runs on
    dtypes: tuple[str, ...]
    executor: Executor
    case_dir: Path
    echo: Callable[[str], None] = print
    progress_stream: Any = None
    streak: int = STREAK
    parts: tuple[str, ...] = PARTS
    budget: Budget = field(default_factory=lambda: Budget(None))
    _fixed: list[tuple[Item, list[str]]] = field(default_factory=list)
    _cut: bool = False  # the budget stopped the run before its end
    _searched: bool = True
    _done: dict[str, ResultRecord] = field(default_factory=dict)
    _streaks: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    _stopped: set[tuple[str, str]] = field(default_factory=set)
    _keys: set[tuple[str, tuple]] = field(default_factory=set)  # (spec, compile key) submitted

    def __post_init__(self) -> None:
        records = parse_records(self.log.records)
        self._results = [r for r in records if isinstance(r, ResultRecord)]
        self._done = {r.key: r for r in self._results}
        self._saved = {r.key for r in records if isinstance(r, CaseFileRecord)}
        # Gradient references of this run by recipe, for the case files: recomputing one (the
        # strict fallback can take minutes) in the main process would serialise the pool's work.
        self._grad_refs: dict[Recipe, Any] = {}  # a GradientReference or its future
        self._stopped = {(r.kernel, r.dtype) for r in records if isinstance(r, StoppedRecord)}
        self._ahead, self._next, self._finish = {}, {}, {}

    # -- bookkeeping ------------------------------------------------------------------------
    def results(self) -> list[ResultRecord]:
        """Every result on file, in order."""
        return list(self._results)

    def _runnable(self, spec: str, dtype: str) -> bool:
        return (spec, dtype) not in self._stopped and self.kernels[spec].unavailable(
            dtype, self.devices[spec]
        ) is None

    def _tally(self, rec: ResultRecord) -> None:
        """Follow runs of identical failures (in plan order, on file or new); after
        :attr:`streak` of them the kernel stops for that dtype, with one record saying why."""
        group = (rec.kernel, rec.dtype)
        if group in self._stopped or rec.status == Status.SKIP:
            return
        if not rec.status.broken:
            self._streaks.pop(group, None)
            return
        same = f"{rec.status}: {gist(rec.reason)}"  # the failures compare without numbers
        last, n = self._streaks.get(group, ("", 0))
        n = n + 1 if same == last else 1
        self._streaks[group] = (same, n)
        if n >= self.streak:
            self._stopped.add(group)
            why = f"{rec.status}: {rec.reason}"  # ... and are told with the last one's
            self.log.append(StoppedRecord(group[0], group[1], why, n).to_json())
            self.echo(f"{group[0]} {group[1]}: stopped after {n} identical failures ({why})")

    def _common(self, item: Item, spec: str, case: Case, recipe: Recipe) -> dict[str, Any]:
        """The fields every result of ``spec`` on ``case`` shares."""
        b, hq, hk, nq, nk, d, dv = case.shape
        return {
            "key": item.key(spec),
            "part": item.part,
            "tag": item.tag,
            "kernel": spec,
            "dtype": item.recipe.dtype,
            "device": self.devices[spec],
            "family": recipe.family,
            "arithmetic": self.kernels[spec].arithmetic,
            "recipe": recipe,
            "shape": CaseShape(b, hq, hk, nq, nk, d, dv),
            "options": CaseOptions(
                causal=case.causal,
                window=case.window,
                mask=case.mask is not None,
                scale=case.scale,
                softcap=case.softcap,
                sinks=None if case.sinks is None else tuple(float(x) for x in case.sinks),
            ),
        }

    def _submit(self, item: Item, specs: Sequence[str]) -> Task:
        dtype = item.recipe.dtype
        live = [s for s in specs if self._runnable(s, dtype)]
        task = Task(item, live, [s for s in live if item.key(s) in self._done])
        new = [s for s in live if item.key(s) not in self._done]
        if item.part == "structural":
            for spec in new:
                group = self._submit_check(item, spec)
                if not isinstance(group.runs[spec], str):
                    self._compiles(task, spec, group.recipe)
                task.groups.append(group)
            return task
        gradients = item.backward
        fitted: dict[Recipe, list[str]] = {}
        for spec in new:
            fitted.setdefault(
                fit_recipe(item.recipe, self.kernels[spec], palette=self.preset.palette), []
            ).append(spec)
        for recipe, group in fitted.items():
            case = make_case(recipe)
            runs: dict[str, Any] = {}
            call = self.executor.backward if gradients else self.executor.run
            for spec in group:
                adapter = self.kernels[spec]
                check = adapter.backward_supports if gradients else adapter.supports
                why = check(case, self.devices[spec])
                kref = KernelRef.of(adapter, spec)
                if why is None:
                    self._compiles(task, spec, recipe)
                    pin = affinity(adapter, recipe, palette=self.preset.palette)
                    why = call(kref, case, self.devices[spec], affinity=pin)
                runs[spec] = why
            ref = self.executor.gradient_reference if gradients else self.executor.reference
            task.groups.append(Group(recipe, case, ref(recipe), runs))
        return task

    def _submit_check(self, item: Item, spec: str) -> Group:
        name = item.tag.split("/")[0]
        adapter = self.kernels[spec]
        recipe = fit_recipe(item.recipe, adapter, palette=self.preset.palette)
        case = make_case(recipe)
        contract = adapter.backward_supports if item.backward else adapter.supports
        why = contract(case, self.devices[spec])
        if why is None and name == "batch-head-independence" and not adapter.batched:
            why = "the kernel takes one (batch, head) slice per call"
        if why is None:
            b, hq = case.shape[:2]
            # A backward has twice a forward's time limit.
            calls = (1 + b * hq if name == "batch-head-independence" else 4) * (1 + item.backward)
            kref = KernelRef.of(adapter, spec)
            pin = affinity(adapter, recipe, palette=self.preset.palette)
            why = self.executor.check(name, kref, case, self.devices[spec], calls, affinity=pin)
        return Group(recipe, case, None, {spec: why}, check=name)

    def _compiles(self, task: Task, spec: str, recipe: Recipe) -> None:
        """Note on ``task`` the compile keys its calls are the first to use."""
        key = compile_key(self.kernels[spec], recipe)
        if key and (spec, key) not in self._keys:
            self._keys.add((spec, key))
            task.compiles.append(f"{spec} {', '.join(map(str, key))}")

    def _collect(self, task: Task) -> None:
        for spec in task.done:
            self._tally(self._done[task.item.key(spec)])  # a resumed run follows the same runs
        for group in task.groups:
            if group.check is not None:
                self._collect_check(task.item, group)
            elif task.item.backward:
                self._collect_gradients(task.item, group)
            else:
                self._collect_group(task.item, group)

    def _collect_check(self, item: Item, group: Group) -> None:
        ((spec, job),) = group.runs.items()
        t0 = time.perf_counter()
        got = job_outcome(job)
        seconds = None if isinstance(job, str) else {"wait": round(time.perf_counter() - t0, 4)}
        if isinstance(got, str):
            status, msg = Status.SKIP, got
        elif isinstance(got, Outcome):
            status, msg = got.status, got.message
        else:
            status, msg = got.status, got.message
            if status is Status.NOT_APPLICABLE:
                status = Status.SKIP  # nothing was checked: recorded as SKIP, with the reason
        self._append(
            StructuralResult(
                **self._common(item, spec, group.case, group.recipe),
                property=group.check,
                status=status,
                reasons=(msg,),
                score=0.0 if status in (Status.PASS, Status.SKIP) else math.inf,
                seconds=seconds,
            )
        )

    def _collect_group(self, item: Item, group: Group) -> None:
        ref: Reference = group.reference.result()
        # Every class's bounds, computed once per case, serve the kernels of that class.
        bounds_cache: dict = {("unknown", None, "accurate"): ref.every}
        bounds_cache.update({(cls, None, "accurate"): b for cls, b in ref.every.parts.items()})
        for spec, job in group.runs.items():
            common = {
                **self._common(item, spec, group.case, group.recipe),
                "seconds": {"oracle": round(ref.seconds, 4)},
                "max_logit": float(ref.max_logit),
                "finite_inputs": bool(ref.finite),
            }
            out = job_outcome(job)
            rec = unjudged_record(AccuracyResult, common, out)
            if rec is None:
                res = check_case(
                    self.kernels[spec],
                    group.case,
                    device=self.devices[spec],
                    output=out,
                    ref=ref.ref,
                    naive=ref.naive,
                    bounds_cache=bounds_cache,
                )
                rec = AccuracyResult.judged(common, result_fields(res, ref.every))
            self._append(rec)

    def _collect_gradients(self, item: Item, group: Group) -> None:
        ref: GradientReference = group.reference.result()
        self._grad_refs[group.recipe] = ref
        for spec, job in group.runs.items():
            common = {
                **self._common(item, spec, group.case, group.recipe),
                "seconds": {"oracle": round(ref.seconds, 4)},
            }
            grads = job_outcome(job)
            rec = unjudged_record(GradientResult, common, grads)
            if rec is None:
                bounds = campaign_gradient_bounds(self.kernels[spec], group.case, ref.every)
                named = {"dq": grads.dq, "dk": grads.dk, "dv": grads.dv}
                if grads.dsinks is not None:
                    named["dsinks"] = grads.dsinks
                verdicts = judge_gradients(
                    named,
                    ref.ref,
                    bounds,
                    naive=ref.naive,
                )
                rec = GradientResult.judged(common, gradient_fields(verdicts))
            self._append(rec)

    def _append(self, rec: ResultRecord) -> None:
        if (rec.kernel, rec.dtype) in self._stopped:
            return  # submitted ahead, but a one-worker run would not have run it
        self.log.append(rec.to_json())
        self._results.append(rec)
        self._done[rec.key] = rec
        self._tally(rec)

    # -- the parts --------------------------------------------------------------------------
    def _fixed_work(self) -> list[tuple[Item, list[str]]]:
        """The fixed parts' items, each with the kernels that run it."""
        items = [
            it for it in plan_items(self.preset, self.dtypes, self.seed) if it.part in self.parts
        ]
        checks = [it for dt in self.dtypes for it in structural_items(self.preset, dt, self.seed)]
        checks = checks if "structural" in self.parts else []
        specs = list(self.kernels)
        backward = [s for s in specs if self.kernels[s].backward is not None]
        grads = [it for dt in self.dtypes for it in gradient_items(self.preset, dt, self.seed)]
        grads = grads if backward and "gradients" in self.parts else []
        work = [(it, backward if it.backward else specs) for it in items + checks + grads]
        if "options" in self.parts:
            work += option_work(self.preset, self.dtypes, self.seed, self.kernels)
        return work

    def run(self) -> None:
        """Run every part not yet on file: the fixed parts, then the search."""
        p = self.preset
        self.budget.in_flight = max(
            (k.compile_seconds for k in self.kernels.values() if k.compile_keys), default=0.0
        )
        fixed = grouped(self._fixed_work(), self.kernels, palette=p.palette)
        if self.budget.seconds is not None:
            fixed = palette_first(priority_order(fixed), self.kernels, palette=p.palette)
        generations = p.search_generations if "search" in self.parts else 0
        per_generation = p.search_population * (1 + p.search_max_work * 128 / 65536)
        search_cost = len(self.kernels) * len(self.dtypes) * generations * per_generation
        total = sum(it.cost() * it.weight() * len(sp) for it, sp in fixed)
        total += search_cost
        done = sum(
            it.cost() * it.weight() for it, sp in fixed for s in sp if it.key(s) in self._done
        )
        if self._done:
            self.echo(f"resuming: {len(self._done)} results already in {self.log.path}")
        # Compile waits apart: one per compile key (and kernel), shared by the kernel workers.
        keys, wait = compile_waits(fixed, self.kernels, palette=p.palette)
        wait /= self.executor.kernel_workers
        out = self.progress_stream
        progress = Progress(
            total,
            done_cost=done,
            label="report ",
            stream=out,
            keys=keys,
            compile_seconds=wait,
            prior_rate=SECONDS_PER_COST / max(1, self.executor.workers),
        )
        self._generations = generations
        self._plan_ahead(fixed, 0)
        self._execute(fixed, progress)
        self._fixed = fixed
        # The search, a generation at a time for every kernel and dtype together (written in
        # that order); generation g of one pair depends only on that pair's earlier results,
        # so it is drawn and submitted as soon as they are in (Scheduler._plan_ahead).
        for gen in range(generations):
            # A generation draws its parents from every earlier result: after a cut it would
            # draw other children than a complete run, and a resume would add those too.
            if self.budget.spent or self._cut:
                self._cut = True
                self._searched = False
                break
            work = []
            for spec in self.kernels:
                for dt in self.dtypes:
                    if self._runnable(spec, dt):
                        work += [(child, [spec]) for child in self.generation(spec, dt, gen)]
            work = grouped(work, self.kernels, palette=p.palette)
            self._plan_ahead(work, gen + 1)
            self._execute(work, progress)
        if not self._cut:
            progress.done = progress.total  # the search's cost was an estimate
        progress.finish()

    def _children(self, spec: str, dtype: str, gen: int) -> list[Item]:
        """Generation ``gen`` of the worst-case search for ``spec`` and ``dtype``."""
        pool = search.parents(self._results, spec, dtype, gen, self.preset.search_parents)
        return search.children(
            pool,
            spec=spec,
            dtype=dtype,
            gen=gen,
            preset=self.preset,
            seed=self.seed,
            adapter=self.kernels[spec],
            device=self.devices[spec],
        )

    # -- case files for the worst cases -----------------------------------------------------
    def save_worst(self, per_group: int = 3) -> None:
        """Re-run and save the worst case of each kernel × dtype and up to ``per_group``
        failing ones, and the first failing case of each structural property (skipping any
        already saved), appending a ``case-file`` record each
        (:func:`~flashcheck.harness.campaign.casefiles.worst_results`)."""
        todo = unsaved_worst(self._results, self.kernels, self.dtypes, self._saved, per_group)
        if todo:
            n = len(todo)
            self.echo(f"case files: re-running {n} worst or failing case{'s' * (n != 1)}")
        files = CaseFiles(self.executor, self.kernels, self.devices, self.case_dir, self.echo)
        files.palette = self.preset.palette
        if self.budget.seconds is not None:  # failing cases first: they are what a replay needs
            todo.sort(key=lambda e: -e[1].status.severity)
        for rec in files.save_all(todo, self._grad_refs, self.budget):
            self.log.append(rec.to_json())
            self._saved.add(rec.key)
