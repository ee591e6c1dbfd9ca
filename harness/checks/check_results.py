"""What an accuracy check returns: one kernel's forward (:class:`CheckResult`) or gradients
(:class:`GradientCheckResult`) judged on one case, with the replay command of the saved case."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..adapters.adapter import KernelGradients, KernelOutput
from ..adapters.registry import declared_spec
from ..cases.case import Case
from ..core.status import Status
from ..judging.bounds import Bounds
from ..judging.gradient_bounds import GradientBounds
from ..judging.metrics import ErrorSummary
from ..judging.tensor_verdict import TensorVerdict, Verdict
from ..oracle.evaluate import OracleResult
from .text import format_check, format_gradient_check

__all__ = ["CheckResult", "GradientCheckResult", "Replayable", "recorded_line", "replayed_as"]


def recorded_line(
    recorded: str | None, replayed: str, *, saved_by: str | None = None, now: str | None = None
) -> str | None:
    """A replay's closing line: the verdict the case file recorded against the one just
    replayed (``None`` where the file records none). ``saved_by`` and ``now``: the kernel the
    file names and the one replayed; where they differ the line names both and compares
    nothing (a user's kernel on a pinned case read "same verdict", the verdict of the project's
    old buggy kernel, as if nothing were wrong)."""
    if recorded is None:
        return None
    if saved_by is not None and now is not None and saved_by != now:
        return f"\nrecorded for {saved_by}: {recorded}; {now} replayed: {replayed}"
    same = "same verdict" if recorded == replayed else "DIFFERENT verdict"
    return f"\nrecorded verdict: {recorded}; replayed: {replayed} ({same})"


def replayed_as(adapter: Any, record: dict[str, Any]) -> str:
    """The name a replayed kernel goes by in :func:`recorded_line`: the case file's own where
    it is the kernel the file names (by its spec or its name), else its name."""
    same = record["kernel"] in (adapter.name, declared_spec(adapter))
    return record["kernel"] if same else adapter.name


class Replayable:
    """A check's result that may have been saved as a case file (``case_id`` in ``case_dir``):
    its replay command, and a one-line repr (the dataclass's would print every array it holds;
    the results declare ``@dataclass(repr=False)``)."""

    case_id: str | None
    case_dir: str | None

    @property
    def replay(self) -> str | None:
        """The command that re-runs the saved case (``None`` if none was saved)."""
        if self.case_id is None:
            return None
        where = "" if self.case_dir is None else f" --dir {self.case_dir}"
        return f"flashcheck replay {self.case_id}{where}"

    def __repr__(self) -> str:
        verdict = getattr(self.verdict, "verdict", self.verdict)
        saved = f"; {self.replay}" if self.replay else ""
        return f"<{type(self).__name__} {self.kernel}: {verdict} on {self.case.describe()}{saved}>"


@dataclass(repr=False)
class CheckResult(Replayable):
    """One kernel's forward judged on one case.

    ``verdict``: the :class:`~flashcheck.harness.judging.tensor_verdict.Verdict` (``.verdict``
    is ``PASS``, ``FAIL`` or ``FAIL-HARD``, ``.reasons`` says why, ``verdict["o"]`` is O's own);
    ``ref``: the oracle's answer; ``bounds``: the a-priori error bounds applied; ``output``: the
    kernel's O (and LSE) as exact float64; ``case_id``: the saved case file's id, if one was.
    """

    kernel: str
    device: str
    case: Case
    output: KernelOutput
    ref: OracleResult
    bounds: Bounds | None
    verdict: Verdict
    case_id: str | None = None
    case_dir: str | None = None

    @property
    def passed(self) -> bool:
        return self.verdict.verdict == Status.PASS

    @property
    def metrics(self) -> ErrorSummary:
        """Floored-ULP, integer-ULP, normwise, RMSE and max-abs errors, NaN/Inf mismatches."""
        return self.verdict.summary

    def __str__(self) -> str:
        text = format_check(self)
        return text + (f"\nreplay: {self.replay}" if self.replay else "")


@dataclass(repr=False)
class GradientCheckResult(Replayable):
    """One kernel's gradients judged on one case.

    ``verdicts``: a :class:`~flashcheck.harness.judging.tensor_verdict.TensorVerdict` per
    gradient (``"dq"``, ``"dk"``, ``"dv"``, and ``"dsinks"`` with sinks); ``verdict``: the worst
    of them; ``grads``: the kernel's gradients as exact float64; ``ref``: the oracle (with
    ``ref.dq``, ``ref.dk``, ``ref.dv``); ``bounds``: the gradient bounds applied.
    """

    kernel: str
    device: str
    case: Case
    grads: KernelGradients
    ref: OracleResult
    bounds: GradientBounds | None
    verdicts: dict[str, TensorVerdict]
    case_id: str | None = None
    case_dir: str | None = None

    @property
    def verdict(self) -> Status:
        return Status.worst(v.verdict for v in self.verdicts.values())

    @property
    def passed(self) -> bool:
        return self.verdict == Status.PASS

    @property
    def reasons(self) -> list[str]:
        return [r for v in self.verdicts.values() for r in v.reasons]

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reasons": self.reasons,
            "gradients": {n: v.as_dict() for n, v in self.verdicts.items()},
        }

    def __str__(self) -> str:
        text = format_gradient_check(self)
        return text + (f"\nreplay: {self.replay}" if self.replay else "")
