"""The error-report campaign: kernels × dtypes × input families × sizes, structural
properties, and a worst-case search.

A campaign is a deterministic function of its configuration (preset, seed, kernels, dtypes,
device) and of the kernels' contracts; what it runs (presets, the fixed plan, search mutations)
is in :mod:`flashcheck.harness.campaign.plan`. Each planned case is fitted to each kernel's
contract (:func:`~flashcheck.harness.campaign.plan.fit_recipe`), so a kernel is only ever given
inputs it accepts, and kernels whose fitted cases coincide share one oracle evaluation. Parts:

- ``grid``: every input family of :mod:`flashcheck.harness.cases.families` at the preset's
  lengths, with shapes, masks, GQA and scale drawn from an RNG seeded by (seed, dtype, family,
  length);
- ``length``: N(0,1) inputs at growing sequence length (the error-vs-N figure);
- ``logit``: the ``huge_logits`` family at growing score magnitude (error vs max |logit|);
- ``fa3``: FlashAttention-3's outlier inputs, N(0,1) + N(0,100)·Bernoulli(0.001), fp16/bf16
  (the RMSE table);
- ``structural``: per kernel and dtype, the structural properties of
  :mod:`flashcheck.harness.judging.structural` (batch/head independence, padded buffers,
  determinism, key permutation, the NaN rule, options applied) on a few cases each;
- ``gradients``: for kernels with a backward, dQ, dK and dV on the scenarios of
  :data:`~flashcheck.harness.campaign.plan.GRADIENT_SCENARIOS` (masked rows, off-grid lengths,
  huge logits, ties, windows; two batches of four query heads on two kv heads), judged against
  the gradient oracle, the backward class's bounds and the naive backward;
- ``search``: per kernel and dtype, a targeted search for the worst case. Generation ``g``
  mutates the ``parents`` highest-scoring cases found so far for that kernel and dtype
  (lengths to neighbouring block edges, magnitudes ×/÷, head dims, masks, scale, family, RNG
  seed). The score is the *failure margin*: the larger of the deterministic-bound utilization
  and ``max_ulp / (2·E_naive + 1)`` (the empirical limit), infinite for a NaN/Inf mismatch;
  above 1 means the case fails. A generation runs for every kernel and dtype at once.

Every result is appended to a JSONL file (:mod:`flashcheck.harness.core.resultlog`) as soon as
it exists. A re-run with the same configuration skips every result already there: the plan is
rebuilt from the seed, and the search's next generation is rebuilt from the results on file, so
an interrupted campaign resumes without recomputing anything and ends with the same numbers as
an uninterrupted one. Kernels run in a child process with a per-case time limit
(:mod:`flashcheck.harness.campaign.worker`); one that raises, hangs or returns the wrong shape
is recorded as ``ERROR``, ``TIMEOUT`` or ``BAD-OUTPUT`` and the campaign goes on, unless it
failed the same way :data:`STREAK` times in a row: then that kernel and dtype stop, and one
``stopped`` record says why.

At the end the worst case of each kernel and dtype, and up to three failing ones, are re-run and
saved as case files next to the report, so each can be replayed with ``flashcheck replay``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.adapter import Kernel
from ..adapters.registry import resolve
from ..cases.case import DTYPES, Case
from ..cases.families import Recipe, make_case
from ..cases.store import save_case
from ..checks.accuracy import check_case, check_gradients_case
from ..core.progress import Progress
from ..core.resultlog import ResultLog, num
from ..judging.verdict import judge_gradients
from .executor import (
    Executor,
    GradientReference,
    Reference,
    outcome,
)
from .plan import (
    PARTS,
    PRESETS,
    STRUCTURAL,
    Item,
    Preset,
    fit_recipe,
    gradient_items,
    mutate,
    plan_items,
    rng_for,
    structural_items,
)
from .records import (
    SEVERITY,
    gist,
    gradient_fields,
    result_fields,
)
from .worker import KernelFailure

__all__ = [
    "PRESETS",
    "STREAK",
    "Campaign",
    "Item",
    "Preset",
    "check_dtypes",
    "default_kernels",
    "kernel_device",
    "plan_items",
    "resolve_kernels",
]

STREAK = 5  # identical failures in a row that stop a kernel for a dtype


@dataclass
class _Group:
    """One fitted case of an item and what runs on it: a kernel future, or a SKIP reason, per
    spec (``check``: the structural property, for the structural part)."""

    recipe: Recipe
    case: Case
    reference: Any
    runs: dict[str, Any]
    check: str | None = None


@dataclass
class _Task:
    item: Item
    specs: list[str]
    done: list[str]
    groups: list[_Group] = field(default_factory=list)


@dataclass
class Campaign:
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
    _done: dict[str, dict[str, Any]] = field(default_factory=dict)
    _streaks: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    _stopped: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._done = {r["key"]: r for r in self.log.records if r.get("type") == "result"}
        # Gradient references of this run by recipe, for the case files: recomputing one (the
        # strict fallback can take minutes) in the main process would serialise the pool's work.
        self._grad_refs: dict[Recipe, Any] = {}  # a GradientReference or its future
        self._stopped = {
            (r["kernel"], r["dtype"]) for r in self.log.records if r.get("type") == "stopped"
        }

    # -- bookkeeping ------------------------------------------------------------------------
    def results(self) -> list[dict[str, Any]]:
        return [r for r in self.log.records if r.get("type") == "result"]

    def _runnable(self, spec: str, dtype: str) -> bool:
        return (spec, dtype) not in self._stopped and self.kernels[spec].unavailable(
            dtype, self.devices[spec]
        ) is None

    def _tally(self, rec: dict[str, Any]) -> None:
        """Follow runs of identical failures (in plan order, on file or new); after
        :attr:`streak` of them the kernel stops for that dtype, with one record saying why."""
        group = (rec["kernel"], rec["dtype"])
        if group in self._stopped or rec["status"] == "SKIP":
            return
        if rec["status"] not in ("ERROR", "TIMEOUT", "BAD-OUTPUT"):
            self._streaks.pop(group, None)
            return
        why = f"{rec['status']}: {gist(rec['reasons'][0] if rec['reasons'] else '')}"
        last, n = self._streaks.get(group, ("", 0))
        n = n + 1 if why == last else 1
        self._streaks[group] = (why, n)
        if n >= self.streak:
            self._stopped.add(group)
            self.log.append(
                {
                    "type": "stopped",
                    "kernel": group[0],
                    "dtype": group[1],
                    "reason": why,
                    "count": n,
                }
            )
            self.echo(f"{group[0]} {group[1]}: stopped after {n} identical failures ({why})")

    def _record(
        self, item: Item, spec: str, case: Case, recipe: Recipe, **fields: Any
    ) -> dict[str, Any]:
        b, hq, hk, nq, nk, d, dv = case.shape
        rec = {
            "type": "result",
            "key": item.key(spec),
            "part": item.part,
            "tag": item.tag,
            "kernel": spec,
            "dtype": item.recipe.dtype,
            "device": self.devices[spec],
            "family": recipe.family,
            "arithmetic": self.kernels[spec].arithmetic,
            "recipe": asdict(recipe),
            "shape": {"B": b, "Hq": hq, "Hk": hk, "Nq": nq, "Nk": nk, "d": d, "dv": dv},
            "options": {
                "causal": case.causal,
                "window": case.window,
                "mask": case.mask is not None,
                "scale": case.scale,
            },
        }
        rec.update(fields)
        return rec

    # -- running items: submitted ahead, results written in plan order ---------------------
    def _execute(self, work: Sequence[tuple[Item, Sequence[str]]], progress: Progress) -> None:
        """Evaluate each ``(item, specs)`` with the executor's parallelism; results are written
        in the order of ``work``, as a one-worker run writes them. Work is submitted far ahead
        (a slow case must not leave the other workers idle) and collected in order."""
        window = max(256, 8 * (self.executor.workers + self.executor.kernel_workers))
        pending: deque[_Task] = deque()
        todo = iter(work)
        for item, specs in todo:
            pending.append(self._submit(item, specs))
            if len(pending) >= window:
                break
        while pending:
            task = pending.popleft()
            self._collect(task)
            ran = len(task.specs) - len(task.done)
            if ran:
                item = task.item
                progress.advance(item.cost() * ran, f"{item.part} {item.recipe.dtype} {item.tag}")
            nxt = next(todo, None)
            if nxt is not None:
                pending.append(self._submit(*nxt))

    def _submit(self, item: Item, specs: Sequence[str]) -> _Task:
        dtype = item.recipe.dtype
        live = [s for s in specs if self._runnable(s, dtype)]
        task = _Task(item, live, [s for s in live if item.key(s) in self._done])
        new = [s for s in live if item.key(s) not in self._done]
        if item.part == "structural":
            for spec in new:
                task.groups.append(self._submit_check(item, spec))
            return task
        gradients = item.part == "gradients"
        fitted: dict[Recipe, list[str]] = {}
        for spec in new:
            fitted.setdefault(fit_recipe(item.recipe, self.kernels[spec]), []).append(spec)
        for recipe, group in fitted.items():
            case = make_case(recipe)
            runs: dict[str, Any] = {}
            call = self.executor.backward if gradients else self.executor.run
            for spec in group:
                adapter = self.kernels[spec]
                check = adapter.backward_supports if gradients else adapter.supports
                why = check(case, self.devices[spec])
                runs[spec] = why if why is not None else call(spec, case, self.devices[spec])
            ref = self.executor.gradient_reference if gradients else self.executor.reference
            task.groups.append(_Group(recipe, case, ref(recipe), runs))
        return task

    def _submit_check(self, item: Item, spec: str) -> _Group:
        name = item.tag.split("/")[0]
        adapter = self.kernels[spec]
        recipe = fit_recipe(item.recipe, adapter)
        case = make_case(recipe)
        why = adapter.supports(case, self.devices[spec])
        if why is None and name == "batch-head-independence" and not adapter.batched:
            why = "the kernel takes one (batch, head) slice per call"
        if why is None:
            b, hq = case.shape[:2]
            calls = 1 + b * hq if name == "batch-head-independence" else 4
            why = self.executor.check(name, spec, case, self.devices[spec], calls)
        return _Group(recipe, case, None, {spec: why}, check=name)

    def _collect(self, task: _Task) -> None:
        for spec in task.done:
            self._tally(self._done[task.item.key(spec)])  # a resumed run follows the same runs
        for group in task.groups:
            if group.check is not None:
                self._collect_check(task.item, group)
            elif task.item.part == "gradients":
                self._collect_gradients(task.item, group)
            else:
                self._collect_group(task.item, group)

    def _collect_check(self, item: Item, group: _Group) -> None:
        ((spec, job),) = group.runs.items()
        common: dict[str, Any] = {"property": group.check, "score": 0.0}
        if isinstance(job, str):
            status, msg = "SKIP", job
        else:
            t0 = time.perf_counter()
            try:
                ok, msg = outcome(job)
                status = "PASS" if ok else "FAIL"
                if ok and msg.startswith("not applicable"):
                    status = "SKIP"  # nothing was checked: not a pass
            except KernelFailure as fail:
                status, msg = fail.status, fail.message
            common["seconds"] = {"wait": round(time.perf_counter() - t0, 4)}
        if status not in ("PASS", "SKIP"):
            common["score"] = math.inf
        self._append(
            self._record(
                item, spec, group.case, group.recipe, status=status, reasons=[msg], **common
            )
        )

    def _collect_group(self, item: Item, group: _Group) -> None:
        ref: Reference = group.reference.result()
        # Every class's bounds, computed once per case, serve the kernels of that class.
        bounds_cache: dict = {("unknown", None): ref.every}
        bounds_cache.update({(cls, None): b for cls, b in ref.every.parts.items()})
        common = {"max_logit": ref.max_logit, "finite_inputs": ref.finite}
        for spec, job in group.runs.items():
            seconds = {"oracle": round(ref.seconds, 4)}
            if isinstance(job, str):
                self._append(
                    self._record(
                        item,
                        spec,
                        group.case,
                        group.recipe,
                        status="SKIP",
                        reasons=[job],
                        score=0.0,
                        seconds=seconds,
                        **common,
                    )
                )
                continue
            try:
                out = outcome(job)
            except KernelFailure as fail:
                score = 0.0 if fail.status == "SKIP" else math.inf
                self._append(
                    self._record(
                        item,
                        spec,
                        group.case,
                        group.recipe,
                        status=fail.status,
                        reasons=[fail.message],
                        score=score,
                        seconds=seconds,
                        **common,
                    )
                )
                continue
            res = check_case(
                self.kernels[spec],
                group.case,
                device=self.devices[spec],
                output=out,
                ref=ref.ref,
                naive=ref.naive,
                bounds_cache=bounds_cache,
            )
            self._append(
                self._record(
                    item,
                    spec,
                    group.case,
                    group.recipe,
                    seconds=seconds,
                    **common,
                    **result_fields(res, ref.every),
                )
            )

    def _collect_gradients(self, item: Item, group: _Group) -> None:
        ref: GradientReference = group.reference.result()
        self._grad_refs[group.recipe] = ref
        for spec, job in group.runs.items():
            seconds = {"oracle": round(ref.seconds, 4)}
            if isinstance(job, str):
                self._append(
                    self._record(
                        item,
                        spec,
                        group.case,
                        group.recipe,
                        status="SKIP",
                        reasons=[job],
                        score=0.0,
                        seconds=seconds,
                    )
                )
                continue
            try:
                grads = outcome(job)
            except KernelFailure as fail:
                score = 0.0 if fail.status == "SKIP" else math.inf
                self._append(
                    self._record(
                        item,
                        spec,
                        group.case,
                        group.recipe,
                        status=fail.status,
                        reasons=[fail.message],
                        score=score,
                        seconds=seconds,
                    )
                )
                continue
            cls = self.kernels[spec].backward_arithmetic
            bounds = ref.every.parts.get(cls, ref.every)  # (unknown: the loosest of all)
            verdicts = judge_gradients(
                {"dq": grads.dq, "dk": grads.dk, "dv": grads.dv}, ref.ref, bounds, naive=ref.naive
            )
            self._append(
                self._record(
                    item,
                    spec,
                    group.case,
                    group.recipe,
                    seconds=seconds,
                    **gradient_fields(verdicts),
                )
            )

    def _append(self, rec: dict[str, Any]) -> None:
        if (rec["kernel"], rec["dtype"]) in self._stopped:
            return  # submitted ahead, but a one-worker run would not have run it
        self.log.append(rec)
        self._done[rec["key"]] = rec
        self._tally(rec)

    # -- the parts --------------------------------------------------------------------------
    def run(self) -> None:
        items = [
            it for it in plan_items(self.preset, self.dtypes, self.seed) if it.part in self.parts
        ]
        checks = [it for dt in self.dtypes for it in structural_items(self.preset, dt, self.seed)]
        checks = checks if "structural" in self.parts else []
        specs = list(self.kernels)
        backward = [s for s in specs if self.kernels[s].backward is not None]
        grads = [it for dt in self.dtypes for it in gradient_items(self.preset, dt, self.seed)]
        grads = grads if backward and "gradients" in self.parts else []
        p = self.preset
        generations = p.search_generations if "search" in self.parts else 0
        search_cost = (
            len(specs)
            * len(self.dtypes)
            * generations
            * p.search_population
            * (1 + p.search_max_work * 128 / 65536)
        )
        fixed = [(it, specs) for it in items + checks] + [(it, backward) for it in grads]
        # A backward costs about three forwards (its oracle and bounds likewise).
        weight = {"gradients": 3.0}
        total = sum(it.cost() * weight.get(it.part, 1.0) * len(sp) for it, sp in fixed)
        total += search_cost
        done = sum(
            it.cost() * weight.get(it.part, 1.0)
            for it, sp in fixed
            for s in sp
            if it.key(s) in self._done
        )
        n_done = len(self._done)
        if n_done:
            self.echo(f"resuming: {n_done} results already in {self.log.path}")
        progress = Progress(total, done_cost=done, label="report ", stream=self.progress_stream)
        self._execute(fixed, progress)
        # The search, a generation at a time for every kernel and dtype together: generation
        # g of one pair depends only on that pair's earlier results.
        for gen in range(generations):
            work = []
            for spec in specs:
                for dt in self.dtypes:
                    if self._runnable(spec, dt):
                        work += [(child, [spec]) for child in self._children(spec, dt, gen)]
            self._execute(work, progress)
        progress.done = progress.total  # the search's cost was an estimate
        progress.finish()

    def _children(self, spec: str, dtype: str, gen: int) -> list[Item]:
        """Generation ``gen`` of the worst-case search for ``spec`` and ``dtype``: mutations of
        the highest-scoring cases so far (none if there are none)."""
        p = self.preset
        adapter = self.kernels[spec]
        # Parents come from the fixed parts and earlier generations only, so a resumed
        # generation sees exactly the pool the uninterrupted run saw.
        pool = [
            r
            for r in self.results()
            if r["kernel"] == spec
            and r["dtype"] == dtype
            and r["status"] != "SKIP"
            and r["part"] not in ("structural", "gradients")
            and _generation(r) < gen
        ]
        pool.sort(key=lambda r: (-num(r["score"]), r["key"]))
        parents = [Recipe(**_recipe_args(r["recipe"])) for r in pool[: p.search_parents]]
        if not parents:
            return []
        rng = rng_for(self.seed, "search", spec, dtype, gen)
        children = []
        for c in range(p.search_population):
            parent = parents[c % len(parents)]
            child = parent
            for _ in range(20):
                child = mutate(rng, parent, p, adapter)
                if adapter.supports(make_case(child), self.devices[spec]) is None:
                    break
            children.append(Item("search", f"{gen}/{c}", child))
        return children

    # -- case files for the worst cases -----------------------------------------------------
    def save_worst(self, per_group: int = 3) -> None:
        """Re-run and save the worst case of each kernel × dtype and up to ``per_group``
        failing ones, and the first failing case of each structural property (skipping any
        already saved), appending a ``case-file`` record each."""
        saved = {r["key"] for r in self.log.records if r.get("type") == "case-file"}
        todo: list[tuple[str, dict[str, Any]]] = []
        for spec in self.kernels:
            for dt in self.dtypes:
                mine = [r for r in self.results() if r["kernel"] == spec and r["dtype"] == dt]
                rows = [
                    r
                    for r in mine
                    if r["part"] not in ("structural", "gradients")
                    and r["status"] in ("PASS", "FAIL", "FAIL-HARD")
                ]
                rows.sort(key=lambda r: (-SEVERITY[r["status"]], -num(r["score"]), r["key"]))
                pick = rows[:1] + [r for r in rows[1:] if r["status"] != "PASS"][: per_group - 1]
                first: dict[str, dict[str, Any]] = {}
                for r in mine:
                    if r["part"] == "structural" and r["status"] == "FAIL":
                        first.setdefault(r["property"], r)
                # The worst gradient case and the first failing one.
                grad = sorted(
                    (
                        r
                        for r in mine
                        if r["part"] == "gradients" and r["status"] in ("PASS", "FAIL", "FAIL-HARD")
                    ),
                    key=lambda r: (-SEVERITY[r["status"]], -num(r["score"]), r["key"]),
                )
                pick += grad[:1]
                todo.extend((spec, r) for r in [*pick, *first.values()] if r["key"] not in saved)
        # A resumed run lacks the references of earlier sessions: compute them on the pool, in
        # parallel, before the (serial) re-runs.
        for _, r in todo:
            recipe = Recipe(**_recipe_args(r["recipe"]))
            if r["part"] == "gradients" and recipe not in self._grad_refs:
                self._grad_refs[recipe] = self.executor.gradient_reference(recipe)
        if todo:
            self.echo(f"case files: re-running {len(todo)} worst or failing cases")
        for spec, r in todo:
            self._save_case(spec, r)

    def _save_case(self, spec: str, r: dict[str, Any]) -> None:
        recipe = Recipe(**_recipe_args(r["recipe"]))
        case = make_case(recipe)
        dev = self.devices[spec]
        prop = "gradients" if r["part"] == "gradients" else r.get("property", "accuracy")
        if prop == "gradients":
            try:
                grads = outcome(self.executor.backward(spec, case, dev))
            except KernelFailure as fail:
                self.echo(
                    f"warning: re-running the backward of {spec} on {r['key']} for its "
                    f"case file failed: {fail}"
                )
                return
            gref = self._grad_refs[recipe]
            if not isinstance(gref, GradientReference):  # a future submitted by save_worst
                gref = self._grad_refs[recipe] = gref.result()
            adapter = self.kernels[spec]
            # The bounds the recorded verdict used (_collect_gradients), so the replay agrees.
            bounds = gref.every.parts.get(adapter.backward_arithmetic, gref.every)
            res = check_gradients_case(
                adapter,
                case,
                device=dev,
                grads=grads,
                ref=gref.ref,
                naive=gref.naive,
                bounds=bounds,
            )
            verdict = res.as_dict()
        elif prop in STRUCTURAL:
            try:
                ok, msg = outcome(self.executor.check(prop, spec, case, dev, 8))
            except KernelFailure as fail:
                self.echo(f"warning: re-running {prop} of {spec} on {r['key']} failed: {fail}")
                return
            verdict = {"verdict": "PASS" if ok else "FAIL", "property": prop, "message": msg}
        else:
            try:
                out = outcome(self.executor.run(spec, case, dev))
            except KernelFailure as fail:
                self.echo(
                    f"warning: re-running {spec} on {r['key']} for its case file failed: {fail}"
                )
                return
            verdict = check_case(self.kernels[spec], case, device=dev, output=out).verdict
            verdict = verdict.as_dict()
        cid = save_case(
            case,
            kernel=spec,
            device=dev,
            verdict=verdict,
            directory=self.case_dir,
            context={"property": prop, "result_key": r["key"], "part": r["part"]},
        )
        self.log.append(
            {
                "type": "case-file",
                "key": r["key"],
                "case_id": cid,
                "kernel": spec,
                "dtype": r["dtype"],
                "recorded": r["status"],
                "replayed": verdict["verdict"],
            }
        )


def _generation(r: dict[str, Any]) -> int:
    return int(r["tag"].split("/")[0]) if r["part"] == "search" else -1


def _recipe_args(d: dict[str, Any]) -> dict[str, Any]:
    out = dict(d)
    if out.get("window") is not None:
        out["window"] = tuple(out["window"])
    return out


def kernel_device(adapter: Kernel, device: str) -> str:
    """``device`` if the kernel runs there, else its first device."""
    return device if device in adapter.devices else adapter.devices[0]


def default_kernels() -> list[str]:
    """Every built-in kernel (the project's and the library adapters)."""
    from ..adapters.registry import BUILTIN

    return list(BUILTIN)


def resolve_kernels(specs: Sequence[str]) -> dict[str, Kernel]:
    """Adapters for ``specs`` (duplicates dropped, order kept); ``ValueError`` names a bad one."""
    out: dict[str, Kernel] = {}
    for spec in specs:
        if spec not in out:
            out[spec] = resolve(spec)
    return out


def check_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}: choose from {sorted(DTYPES)}")
    return tuple(dict.fromkeys(dtypes))
