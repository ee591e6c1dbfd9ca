"""The exit gate of ``flashcheck report`` (``--fail-on``): what in a campaign's records makes
the command exit 1, one line per kernel, dtype and kind of finding."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..checks.structural import ignored_option
from ..core.status import Status
from .logrecords import LimitationRecord, Record, StoppedRecord
from .resultrecords import GradientResult, ResultRecord, StructuralResult

__all__ = ["GATES", "gate_exit_code", "gate_findings"]

# Each gate (``--fail-on``) and the least severity it counts: FAIL-HARD and every broken status
# have severity 2, FAIL 1 (:attr:`Status.severity`).
GATES = {"fail-hard": 2, "fail": 1, "never": None}


def _gated(r: ResultRecord, least: int) -> str | None:
    """What the gate counts in a result, or ``None``: a failed structural property (whatever
    the gate's level), else a status of at least the gate's severity."""
    if isinstance(r, StructuralResult) and r.status == Status.FAIL:
        ignored = r.property == "options-applied" and r.reasons and ignored_option(r.reasons[0])
        if ignored:
            # The option's name, not the case's value of it: two cases that found the cap
            # ignored are one line with a count, as accuracy failures are.
            return f"structural property {r.property} failed ({ignored.split('=')[0]} ignored)"
        return f"structural property {r.property} failed"
    if r.status.severity >= least > 0:
        if isinstance(r, StructuralResult):  # raised, hung or a wrong shape inside a property
            return f"structural property {r.property} {r.status}"
        return f"gradients {r.status}" if isinstance(r, GradientResult) else str(r.status)
    return None


def gate_findings(records: Sequence[Record], fail_on: str) -> list[str]:
    """What the gate ``fail_on`` finds in a campaign's records, one line per kernel, dtype and
    kind (empty: the gate passes). Beyond the statuses of :data:`GATES`, every gate but
    ``never`` counts a failed structural property, a kernel stopped after repeated identical
    failures, and a kernel that could not run at all."""
    least = GATES[fail_on]
    if least is None:
        return []
    found: Counter = Counter()
    for r in records:
        if isinstance(r, ResultRecord):
            what = _gated(r, least)
            if what is not None:
                found[(r.kernel, r.dtype, what)] += 1
        elif isinstance(r, StoppedRecord):
            found[(r.kernel, r.dtype, f"stopped after {r.count} x {r.reason}")] += 1
        elif isinstance(r, LimitationRecord) and r.no_run:
            found[(r.kernel, r.dtype, f"could not run at all ({r.reason})")] += 1
    return [
        f"{n} {what}: {k} {dt}" if n > 1 else f"{what}: {k} {dt}"
        for (k, dt, what), n in found.items()
    ]


def gate_exit_code(records: Sequence[Record], fail_on: str) -> int:
    """1 if the gate ``fail_on`` finds anything (:func:`gate_findings`), else 0."""
    return int(bool(gate_findings(records, fail_on)))
