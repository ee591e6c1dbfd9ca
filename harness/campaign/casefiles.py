"""Case files for a campaign's worst cases: which results to save, and re-running each to save
it as a replayable case file (``flashcheck replay``).

Per kernel and dtype: the worst forward case (by severity, then failure margin) and up to two
more failing ones, the first failing case of each structural property, and the worst gradient
case. Each is re-run on its kernel, judged again, saved with
:func:`~flashcheck.harness.cases.store.save_case`, and recorded as a ``case-file`` record with
the status on record and the one the re-run gave.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.adapter import Kernel
from ..adapters.outcome import Outcome
from ..adapters.palette import DEFAULT_PALETTE
from ..adapters.worker import KernelRef
from ..cases.case import Case
from ..cases.families import Recipe, make_case
from ..cases.store import save_case
from ..checks.accuracy import campaign_gradient_bounds, check_case, check_gradients_case
from ..core.status import Status
from .executor import Executor, GradientReference
from .grouping import affinity
from .logrecords import (
    CaseFileRecord,
)
from .plan import STRUCTURAL
from .resultrecords import (
    GradientResult,
    ResultRecord,
    StructuralResult,
)

__all__ = ["CaseFiles", "unsaved_worst", "worst_results"]


def _worst_first(r: ResultRecord) -> tuple[int, float, str]:
    return (-r.status.severity, -r.score, r.key)


_SAVED_STRUCTURAL = (Status.FAIL, Status.ERROR, Status.BAD_OUTPUT)


def worst_results(results: Sequence[ResultRecord], per_group: int = 3) -> list[ResultRecord]:
    """The results of one kernel and dtype worth a case file: the worst judged forward case and
    up to ``per_group - 1`` more failing ones, the worst judged gradient case, and the first
    failing case of each structural property (a FAIL, or a check where the kernel raised or
    returned the wrong shape; not one where it hung, which its re-run would wait out again)."""
    forward = sorted(
        (
            r
            for r in results
            if r.status.judged and not isinstance(r, StructuralResult | GradientResult)
        ),
        key=_worst_first,
    )
    pick = forward[:1] + [r for r in forward[1:] if r.status != Status.PASS][: per_group - 1]
    grad = sorted(
        (r for r in results if isinstance(r, GradientResult) and r.status.judged),
        key=_worst_first,
    )
    first: dict[str, ResultRecord] = {}
    for r in results:
        if isinstance(r, StructuralResult) and r.status in _SAVED_STRUCTURAL:
            first.setdefault(r.property, r)
    return [*pick, *grad[:1], *first.values()]


def unsaved_worst(
    results: Sequence[ResultRecord],
    specs: Iterable[str],
    dtypes: Sequence[str],
    saved: Container[str],
    per_group: int = 3,
) -> list[tuple[str, ResultRecord]]:
    """``(spec, result)`` for the results of each kernel and dtype worth a case file
    (:func:`worst_results`) whose key is not in ``saved``."""
    todo: list[tuple[str, ResultRecord]] = []
    for spec in specs:
        for dt in dtypes:
            mine = [r for r in results if r.kernel == spec and r.dtype == dt]
            todo += [(spec, r) for r in worst_results(mine, per_group) if r.key not in saved]
    return todo


def _payload(job: Any) -> Any:
    """The value of a kernel job, or the failed :class:`Outcome` it ended in."""
    got: Outcome = job.result()
    return got.value if got.ok else got


def _no_value(got: Outcome, prop: str) -> dict[str, Any] | None:
    """The verdict of a re-run that gave no value: ERROR, TIMEOUT or BAD-OUTPUT, saved as such
    so that the replay shows it again (``None`` for a kernel that declined the input)."""
    if got.status is Status.SKIP:
        return None
    return {"verdict": str(got.status), "property": prop, "message": got.message}


@dataclass
class CaseFiles:
    """Re-runs results on their kernels and saves them as case files in ``case_dir``."""

    executor: Executor
    kernels: dict[str, Kernel]
    devices: dict[str, str]
    case_dir: Path
    echo: Callable[[str], None] = print
    palette: int = DEFAULT_PALETTE  # keys per dtype of compiling kernels (their worker)
    # Submitted ahead by :meth:`prefetch`: the re-runs' kernel jobs by (spec, result key), and
    # the forward references by recipe.
    _jobs: dict[tuple[str, str], Any] = field(default_factory=dict)
    _refs: dict[Recipe, Any] = field(default_factory=dict)

    def prefetch(self, todo: Iterable[tuple[str, ResultRecord]]) -> None:
        """Submit every re-run of ``todo`` and its forward reference now, so that they run
        in parallel on the workers and the pool; :meth:`save` then only waits and judges (in
        the main process, one after another, they were a serial tail of the campaign)."""
        for spec, r in todo:
            case = make_case(r.recipe)
            if isinstance(r, GradientResult):
                job = self._submit_backward(spec, r, case)
            elif isinstance(r, StructuralResult) and r.property in STRUCTURAL:
                job = self._submit_check(spec, r, case)
            else:
                job = self._submit_run(spec, r, case)
                if r.recipe not in self._refs:
                    self._refs[r.recipe] = self.executor.reference(r.recipe)
            self._jobs[(spec, r.key)] = job

    def save_all(
        self, todo: Sequence[tuple[str, ResultRecord]], grad_refs: dict[Recipe, Any], budget: Any
    ) -> Iterator[CaseFileRecord]:
        """:meth:`save` each of ``todo`` in order, until ``budget`` (a
        :class:`~flashcheck.harness.campaign.budget.Budget`) is over; without a budget every
        re-run is submitted ahead (:meth:`prefetch`). ``grad_refs`` gets the gradient
        references ``todo`` needs that it lacks."""
        # A resumed run lacks the references of earlier sessions: computed on the pool, in
        # parallel, before the re-runs.
        for _, r in todo:
            if isinstance(r, GradientResult) and r.recipe not in grad_refs:
                grad_refs[r.recipe] = self.executor.gradient_reference(r.recipe)
        if budget.seconds is None:
            self.prefetch(todo)
        for n, (spec, r) in enumerate(todo):
            if budget.over:
                self.echo(
                    f"case files: {len(todo) - n} left unsaved at the time budget; the same "
                    "command without --budget saves them"
                )
                return
            rec = self.save(spec, r, grad_refs)
            if rec is not None:
                yield rec

    def _job(self, spec: str, r: ResultRecord, submit: Callable[[], Any]) -> Any:
        job = self._jobs.pop((spec, r.key), None)
        return submit() if job is None else job

    def _submit_run(self, spec: str, r: ResultRecord, case: Case) -> Any:
        kref = KernelRef.of(self.kernels[spec], spec)
        return self.executor.run(kref, case, self.devices[spec], affinity=self._pin(spec, r))

    def _submit_backward(self, spec: str, r: ResultRecord, case: Case) -> Any:
        kref = KernelRef.of(self.kernels[spec], spec)
        return self.executor.backward(kref, case, self.devices[spec], affinity=self._pin(spec, r))

    def _submit_check(self, spec: str, r: ResultRecord, case: Case) -> Any:
        kref = KernelRef.of(self.kernels[spec], spec)
        pin = self._pin(spec, r)
        return self.executor.check(r.property, kref, case, self.devices[spec], 8, affinity=pin)

    def _pin(self, spec: str, r: ResultRecord) -> int | None:
        return affinity(self.kernels[spec], r.recipe, palette=self.palette)

    def save(
        self, spec: str, r: ResultRecord, grad_refs: dict[Recipe, Any]
    ) -> CaseFileRecord | None:
        """Re-run ``r`` on ``spec`` and save its case file (``None``, with a warning, if the
        re-run failed). ``grad_refs``: the gradient references by recipe (or their futures)."""
        case = make_case(r.recipe)
        if isinstance(r, GradientResult):
            verdict = self._gradients(spec, r, case, grad_refs)
            prop = "gradients"
        elif isinstance(r, StructuralResult) and r.property in STRUCTURAL:
            verdict = self._structural(spec, r, case)
            prop = r.property
        else:
            verdict = self._accuracy(spec, r, case)
            prop = r.property if isinstance(r, StructuralResult) else "accuracy"
        if verdict is None:
            return None
        cid = save_case(
            case,
            kernel=spec,
            device=self.devices[spec],
            verdict=verdict,
            directory=self.case_dir,
            context={"property": prop, "result_key": r.key, "part": r.part},
        )
        return CaseFileRecord(r.key, cid, spec, r.dtype, r.status, Status(verdict["verdict"]))

    def _gradients(
        self, spec: str, r: ResultRecord, case: Case, grad_refs: dict[Recipe, Any]
    ) -> dict[str, Any] | None:
        dev = self.devices[spec]
        grads = _payload(self._job(spec, r, lambda: self._submit_backward(spec, r, case)))
        if isinstance(grads, Outcome):
            return self._failed_rerun(grads, f"the backward of {spec} on {r.key}", "gradients")
        gref = grad_refs[r.recipe]
        if not isinstance(gref, GradientReference):  # a future submitted by save_worst
            gref = grad_refs[r.recipe] = gref.result()
        adapter = self.kernels[spec]
        # The bounds the recorded verdict used (the runner's gradient part), so the replay
        # agrees.
        bounds = campaign_gradient_bounds(adapter, case, gref.every)
        res = check_gradients_case(
            adapter, case, device=dev, grads=grads, ref=gref.ref, naive=gref.naive, bounds=bounds
        )
        return res.as_dict()

    def _failed_rerun(self, got: Outcome, what: str, prop: str) -> dict[str, Any] | None:
        """A re-run without a value: its case is saved with that status (a kernel that raised,
        hung or returned the wrong shape does so again on replay); one that declined the input
        is not saved, with a warning."""
        verdict = _no_value(got, prop)
        if verdict is None:
            self.echo(f"warning: re-running {what} for its case file gave no result: {got}")
        return verdict

    def _structural(self, spec: str, r: StructuralResult, case: Case) -> dict[str, Any] | None:
        prop = r.property
        got = _payload(self._job(spec, r, lambda: self._submit_check(spec, r, case)))
        if isinstance(got, Outcome):
            return self._failed_rerun(got, f"{prop} of {spec} on {r.key}", prop)
        return {"verdict": str(got.status), "property": prop, "message": got.message}

    def _accuracy(self, spec: str, r: ResultRecord, case: Case) -> dict[str, Any] | None:
        dev = self.devices[spec]
        out = _payload(self._job(spec, r, lambda: self._submit_run(spec, r, case)))
        if isinstance(out, Outcome):
            prop = r.property if isinstance(r, StructuralResult) else "accuracy"
            return self._failed_rerun(out, f"{spec} on {r.key}", prop)
        ahead = self._refs.get(r.recipe)
        if ahead is None:
            res = check_case(self.kernels[spec], case, device=dev, output=out)
        else:  # the same oracle and baseline, computed on the pool
            ref = ahead.result()
            res = check_case(
                self.kernels[spec], case, device=dev, output=out, ref=ref.ref, naive=ref.naive
            )
        return res.verdict.as_dict()
