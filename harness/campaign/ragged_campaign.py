"""The campaign of a kernel of a ragged layout (varlen, paged) or a split-KV merge.

For each kernel and dtype, every case of the families of its layout
(:mod:`flashcheck.harness.cases.ragged_families`) is judged by the accuracy check of ragged
cases (:func:`~flashcheck.harness.checks.ragged.check_ragged_case`: per sequence against the
oracle and the bounds), for varlen kernels with a backward by the per-sequence gradient
check (:mod:`~flashcheck.harness.checks.ragged_gradients`), then, for varlen and paged
kernels, by the properties of :mod:`flashcheck.harness.checks.ragged_properties` (page
independence on paged cases only). Each check gives one :class:`~.ragged_records.RaggedResult`,
appended to the results file as it is produced; a case with a failure is saved as a case file
(``flashcheck replay`` re-runs its accuracy check and the properties that failed on it, with
the campaign's seed). Results already on file are not recomputed: an interrupted campaign
resumes.

The kernels run in this process, one call at a time, each under the time limit of
:mod:`~flashcheck.harness.adapters.call_limit` where the caller set one (``flashcheck report``:
``--timeout``): a call stopped by it is recorded as ``TIMEOUT`` and the campaign goes on; one
that cannot be stopped (stuck outside Python) ends the process after
:meth:`RaggedCampaign.stuck` has recorded it, so that the resumed run does not call it again.
With an ``executor``, the references every case still to judge needs (oracle, naive baseline
and bounds per sequence, and the same for the gradients) are submitted to its reference
processes before the first kernel call (:mod:`.ragged_pool`); the results are the same bits as
without one, written in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from ..adapters.adapter import Kernel
from ..adapters.outcome import call_kernel
from ..adapters.ragged_call import head_dim_for, kernel_layout, ragged_supports
from ..cases.ragged import RaggedCase
from ..cases.ragged_families import family_cases, sizes_for
from ..cases.ragged_store import save_ragged_case
from ..checks.ragged import RaggedCheckResult, check_ragged_case
from ..checks.ragged_diagnosis import diagnose_ragged
from ..checks.ragged_gradients import (
    check_varlen_gradients,
    varlen_backward_supports,
    worst_gradient_util,
)
from ..checks.ragged_properties import RAGGED_PROPERTIES
from ..core.progress import Progress
from ..core.resultlog import ResultLog
from ..core.status import Status
from .executor import Executor
from .ragged_pool import RaggedReferences
from .ragged_records import RaggedResult

__all__ = ["RaggedCampaign", "checks_of"]


def checks_of(layout: str, *, gradients: bool = False) -> tuple[str, ...]:
    """The checks a case of ``layout`` gets: accuracy, the gradients of a varlen kernel with a
    backward (``gradients=True``), and the properties that apply."""
    if layout == "combine":
        return ("accuracy",)
    props = [p for p in RAGGED_PROPERTIES if layout == "paged" or p != "page-independence"]
    grads = ("gradients",) if gradients and layout == "varlen" else ()
    return ("accuracy", *grads, *props)


@dataclass
class RaggedCampaign:
    """Runs (or resumes) the ragged campaign of ``adapters`` into ``log`` (module docstring)."""

    log: ResultLog
    adapters: dict[str, Kernel]
    devices: dict[str, str]
    dtypes: tuple[str, ...]
    seed: int
    preset: str
    case_dir: Path
    echo: Callable[[str], None] = print
    progress: TextIO | None = None  # the progress line's stream (None: stderr)
    # The reference processes (.ragged_pool); None: every reference computed inline, in turn.
    executor: Executor | None = None
    _done: set[str] = field(default_factory=set)
    _refs: RaggedReferences | None = None
    # The case being judged: (spec, device, case, {check: key}, the records' common fields).
    _current: tuple[str, str, RaggedCase, dict[str, str], dict[str, Any]] | None = None

    def run(self) -> int:
        """Every kernel, dtype and case; returns the number of results on file. A progress
        line (stderr) names the case at work from the start: one case's gradient oracle can
        take minutes."""
        self._done = {d["key"] for d in self.log.records if d.get("type") == RaggedResult.TYPE}
        plan = []
        for spec, adapter in self.adapters.items():
            dev = self.devices[spec]
            for dtype in self.dtypes:
                if adapter.unavailable(dtype, dev) is not None:
                    continue
                cases = family_cases(
                    kernel_layout(adapter),
                    dtype,
                    seed=self.seed,
                    preset=self.preset,
                    d=head_dim_for(adapter, sizes_for(self.preset).d),
                    gqa=adapter.gqa,
                )
                self.echo(f"  {spec} {dtype}: {len(cases)} cases")
                plan += [(spec, adapter, dev, dtype, i, case) for i, case in enumerate(cases)]
        todo = [item for item in plan if not self._finished(*item)]
        prog = Progress(
            len(plan), done_cost=len(plan) - len(todo), label="report ", stream=self.progress
        )
        if self.executor is not None:
            self._refs = RaggedReferences(self.executor, lambda text: prog.advance(0, text))
            for spec, adapter, _, dtype, i, case in todo:
                if ragged_supports(adapter, case) is None:
                    self._refs.submit((spec, dtype, i), adapter, case)
            self.echo(
                f"  references: {self._refs.tasks} tasks (one per sequence) for {len(todo)} "
                f"cases, on {self.executor.workers} processes"
            )
        for item in todo:
            spec, _, _, dtype, i, case = item
            note = self._note((spec, dtype, i), case)
            prog.advance(0, note)
            try:
                self._case(*item)
            finally:
                if self._refs is not None:
                    self._refs.release((spec, dtype, i))
            prog.advance(1, note)
        prog.finish()
        if self._refs is not None and self._refs.tasks:
            self.echo(f"  the campaign waited {self._refs.waited:.1f} s on references")
        return len(self._done)

    def _finished(self, spec, adapter, dev, dtype, i, case) -> bool:
        checks = checks_of(case.layout, gradients=adapter.backward is not None)
        return all(self._key(spec, dtype, i, case, c) in self._done for c in checks)

    def _key(self, spec: str, dtype: str, i: int, case: RaggedCase, check: str) -> str:
        return f"{spec}|{dtype}|{case.family}|{i}|{check}"

    def _case(
        self, spec: str, adapter: Kernel, dev: str, dtype: str, i: int, case: RaggedCase
    ) -> None:
        checks = checks_of(case.layout, gradients=adapter.backward is not None)
        keys = {c: self._key(spec, dtype, i, case, c) for c in checks}
        if all(k in self._done for k in keys.values()):
            return
        base = {"kernel": spec, "dtype": dtype, "layout": case.layout, "family": case.family}
        base["case"] = case.describe()
        why = ragged_supports(adapter, case)
        if why is not None:
            for c in checks:
                self._write(
                    RaggedResult(
                        keys[c],
                        **base,
                        check=c,
                        status=Status.SKIP,
                        reasons=(f"outside the kernel's contract: {why}",),
                    )
                )
            return
        item = (spec, dtype, i)
        self._current = (spec, dev, case, keys, base)
        try:
            self._judge(adapter, dev, case, keys, base, item)
        finally:
            self._current = None

    def _judge(
        self,
        adapter: Kernel,
        dev: str,
        case: RaggedCase,
        keys: dict[str, str],
        base: dict[str, Any],
        item: tuple[str, str, int],
    ) -> None:
        spec, checks = item[0], tuple(keys)
        first, acc = self._accuracy(adapter, dev, case, keys["accuracy"], base, item)
        rows = [first]
        for name in checks[1:]:
            if acc is None:
                # No output to compare: the accuracy record says why (raised, declined, bad).
                why = f"not applicable (the kernel gave no usable output: {first.status})"
                rows.append(
                    RaggedResult(
                        keys[name], **base, check=name, status=Status.NOT_APPLICABLE, reasons=(why,)
                    )
                )
            elif name == "gradients":
                rows.append(self._gradients(adapter, dev, case, keys[name], base, item))
            else:
                rows.append(self._property(adapter, dev, case, keys[name], name, base))
        # (no output: the case file records why, as the accuracy record does)
        broken = {"verdict": str(first.status), "reasons": list(first.reasons)}
        self._record(spec, dev, case, rows, broken if acc is None else acc.as_dict())

    def _record(
        self,
        spec: str,
        dev: str,
        case: RaggedCase,
        rows: list[RaggedResult],
        verdict: dict[str, Any] | None,
    ) -> None:
        """Save the case if a check failed, then append the records not yet on file."""
        failed = [r for r in rows if r.status.severity > 0]
        grads = next((r for r in failed if r.check == "gradients"), None)
        cid = None
        if failed:
            cid = save_ragged_case(
                case,
                kernel=spec,
                device=dev,
                verdict=verdict,
                gradient_verdict=None
                if grads is None
                else {"verdict": str(grads.status), "reasons": list(grads.reasons)},
                context={
                    "property": ", ".join(r.check for r in failed),
                    "api": "report",
                    "seed": self.seed,
                    "findings": [f"{r.check}: {r.reasons[0]}" for r in failed if r.reasons],
                },
                directory=self.case_dir,
            )
        for r in rows:
            if r.key not in self._done:
                self._write(_with_id(r, cid) if r.status.severity > 0 else r)

    def stuck(self, what: str, case: object) -> None:
        """Record the case being judged as ``TIMEOUT`` in every check not yet on file, and save
        it: called by the watchdog of :mod:`~flashcheck.harness.adapters.call_limit` before it
        ends the process, for a kernel call it could not interrupt."""
        if self._current is None:
            return
        spec, dev, rcase, keys, base = self._current
        why = f"{what} did not return, and could not be interrupted: the campaign stopped here"
        rows = [
            RaggedResult(key, **base, check=c, status=Status.TIMEOUT, reasons=(why,))
            for c, key in keys.items()
            if key not in self._done
        ]
        self._record(spec, dev, rcase, rows, {"verdict": str(Status.TIMEOUT), "reasons": [why]})

    def _note(self, item: tuple[str, str, int], case: RaggedCase) -> str:
        spec, dtype, i = item
        return f"{spec} {dtype} {case.family}/{i}"

    def _accuracy(
        self,
        adapter: Kernel,
        dev: str,
        case: RaggedCase,
        key: str,
        base: dict[str, Any],
        item: tuple[str, str, int],
    ) -> tuple[RaggedResult, RaggedCheckResult | None]:
        refs = None if self._refs is None else self._refs.forward(item, self._note(item, case))
        out = call_kernel(lambda: check_ragged_case(adapter, case, device=dev, references=refs))
        if not out.ok:
            msg = out.message.strip().splitlines()[-1] if out.message.strip() else str(out.status)
            return RaggedResult(
                key, **base, check="accuracy", status=out.status, reasons=(msg,)
            ), None
        res: RaggedCheckResult = out.value
        util = res.merge.det_util if res.merge is not None else _worst_util(res)
        # The bug class first, where the output's pattern names one; then the sequence's reasons.
        reasons = diagnose_ragged(res, adapter)
        rec = RaggedResult(
            key,
            **base,
            check="accuracy",
            status=res.verdict,
            reasons=tuple(reasons + res.reasons),
            det_util=util,
        )
        return rec, res

    def _gradients(
        self,
        adapter: Kernel,
        dev: str,
        case: RaggedCase,
        key: str,
        base: dict,
        item: tuple[str, str, int],
    ) -> RaggedResult:
        """The per-sequence gradient check (:mod:`~flashcheck.harness.checks.ragged_gradients`)."""
        why = varlen_backward_supports(adapter, case)
        if why is not None:
            reasons = (f"outside the backward's contract: {why}",)
            return RaggedResult(key, **base, check="gradients", status=Status.SKIP, reasons=reasons)
        refs = None if self._refs is None else self._refs.gradients(item, self._note(item, case))
        out = call_kernel(
            lambda: check_varlen_gradients(adapter, case, device=dev, references=refs)
        )
        if not out.ok:
            msg = out.message.strip().splitlines()[-1] if out.message.strip() else str(out.status)
            return RaggedResult(key, **base, check="gradients", status=out.status, reasons=(msg,))
        res = out.value
        return RaggedResult(
            key,
            **base,
            check="gradients",
            status=res.verdict,
            reasons=tuple(res.reasons),
            det_util=worst_gradient_util(res),
        )

    def _property(
        self, adapter: Kernel, dev: str, case: RaggedCase, key: str, name: str, base: dict
    ) -> RaggedResult:
        out = call_kernel(lambda: RAGGED_PROPERTIES[name](adapter, case, dev, seed=self.seed))
        if out.status is Status.TIMEOUT:
            reasons = (f"on a variant of the case: {out.message}",)
            return RaggedResult(key, **base, check=name, status=out.status, reasons=reasons)
        if not out.ok:
            # A kernel that raises on a variant of a case it ran: the property cannot hold.
            return RaggedResult(
                key,
                **base,
                check=name,
                status=Status.FAIL,
                reasons=(f"the kernel failed on a variant: {out.message}",),
            )
        found = out.value
        return RaggedResult(key, **base, check=name, status=found.status, reasons=(found.message,))

    def _write(self, rec: RaggedResult) -> None:
        self.log.append(rec.to_json())
        self._done.add(rec.key)


def _worst_util(res: RaggedCheckResult) -> float | None:
    utils = [r.verdict.det_util for r in res.sequences if r is not None]
    finite = [u for u in utils if u == u]
    return max(finite) if finite else None


def _with_id(rec: RaggedResult, case_id: str | None) -> RaggedResult:
    return replace(rec, case_id=case_id)
