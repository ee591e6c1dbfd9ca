"""The ragged campaign's reference work, computed ahead on the campaign's reference processes.

Judging a ragged case needs, per sequence, the oracle, the naive baseline and the bounds (and
for a varlen kernel with a backward, the same for the gradients): pure CPU work that does not
depend on the kernel's output (:mod:`flashcheck.harness.checks.ragged_references`). The
campaign submits all of it for every case it has yet to judge before it calls the first
kernel, one task per sequence, in plan order, to an
:class:`~flashcheck.harness.campaign.executor.Executor`'s reference processes (``--workers``,
or Ray tasks). The kernels still run one at a time in the campaign's process; when a case's
kernel call is done, its judging takes each sequence's reference as it comes, waiting for
those still in flight. Every worker computes single-threaded, so a reference is bitwise the
same wherever it was computed: the verdicts do not depend on the number of workers.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..cases.ragged import RaggedCase
from ..checks.ragged_gradients import gradient_sequences, varlen_backward_supports
from ..checks.ragged_references import (
    GradientSequenceReference,
    SequenceReference,
    forward_reference,
    gradient_reference,
)
from .executor import Executor

__all__ = ["CaseReferences", "RaggedReferences", "Task"]

# How often (seconds) a wait for a reference says so on the progress line.
POLL = 1.0


@dataclass(frozen=True)
class Task:
    """One reference task: its future, and the call that computes it here where the future
    fails (a worker that died, a pool shut down): the verdict never depends on where it ran."""

    future: cf.Future
    call: Callable[[], object]


@dataclass
class CaseReferences:
    """The tasks of one case's references, by sequence index: ``forward`` for every sequence
    with query rows, ``gradients`` for every sequence whose gradients are judged (empty when
    the case gets no gradient check)."""

    forward: dict[int, Task] = field(default_factory=dict)
    gradients: dict[int, Task] = field(default_factory=dict)


@dataclass
class RaggedReferences:
    """Submits cases' reference work to ``executor`` and hands it to the checks.

    ``waiting(text)`` is called (about every second) while the campaign waits for a
    reference: the progress line says so. ``waited``: the seconds spent waiting in all;
    ``tasks``: the number of tasks submitted."""

    executor: Executor
    waiting: Callable[[str], None] = lambda text: None
    waited: float = 0.0
    tasks: int = 0
    _cases: dict[object, CaseReferences] = field(default_factory=dict)

    def submit(self, key: object, adapter: Kernel, case: RaggedCase) -> None:
        """Submit the references ``adapter``'s checks need on ``case`` under ``key``: the
        forward ones of each sequence with query rows, then, for a varlen kernel with a
        backward whose contract takes the case, the gradient ones (a combine case needs
        none: its merge oracle is cheap and depends on the format of the kernel's output)."""
        if case.layout == "combine":
            return
        refs = CaseReferences()
        fwd = {"arithmetic": adapter.arithmetic, "key_block": adapter.key_block}
        fwd["tanh"] = adapter.tanh
        for b in range(case.sequences):
            if case.lengths(b)[0]:
                refs.forward[b] = self._task(forward_reference, case.sequence(b), fwd)
        if adapter.backward is not None and varlen_backward_supports(adapter, case) is None:
            bwd = {"arithmetic": adapter.backward_arithmetic, "key_block": adapter.key_block}
            bwd["tanh"] = adapter.tanh
            for b, seq in gradient_sequences(case).items():
                refs.gradients[b] = self._task(gradient_reference, seq, bwd)
        self.tasks += len(refs.forward) + len(refs.gradients)
        self._cases[key] = refs

    def forward(self, key: object, note: str) -> Callable[[int], SequenceReference] | None:
        """``references(b)`` for :func:`~flashcheck.harness.checks.ragged.check_ragged_case`
        (``None`` where nothing was submitted under ``key``: the check computes its own)."""
        refs = self._cases.get(key)
        if refs is None or not refs.forward:
            return None
        return lambda b: self._wait(refs.forward[b], f"{note}: waiting on the oracle, seq {b}")

    def gradients(
        self, key: object, note: str
    ) -> Callable[[int], GradientSequenceReference] | None:
        """``references(b)`` for
        :func:`~flashcheck.harness.checks.ragged_gradients.check_varlen_gradients`, as
        :meth:`forward`."""
        refs = self._cases.get(key)
        if refs is None or not refs.gradients:
            return None
        text = f"{note}: waiting on the gradient oracle, seq"
        return lambda b: self._wait(refs.gradients[b], f"{text} {b}")

    def release(self, key: object) -> None:
        """Forget ``key``'s references (its case is judged), cancelling any not started."""
        refs = self._cases.pop(key, None)
        if refs is not None:
            for task in (*refs.forward.values(), *refs.gradients.values()):
                task.future.cancel()

    def _task(self, fn: Callable[..., object], seq: Case, kwargs: dict) -> Task:
        return Task(self.executor.submit(fn, seq, **kwargs), partial(fn, seq, **kwargs))

    def _wait(self, task: Task, text: str) -> object:
        t0 = time.monotonic()
        try:
            while True:
                if not task.future.done():
                    self.waiting(text)
                try:
                    return task.future.result(timeout=POLL)
                except cf.TimeoutError:
                    continue
                except Exception:  # the task failed, not necessarily the reference
                    # The same function here: an error of the reference itself raises again
                    # (and the check reports it), a lost worker costs only the time.
                    return task.call()
        finally:
            self.waited += time.monotonic() - t0
