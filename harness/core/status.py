"""The status of one judged result, one structural check or one kernel call, in one place.

Statuses are strings on disk (``results.jsonl``, case files) and in the report; :class:`Status`
is a ``StrEnum``, so ``Status.FAIL_HARD == "FAIL-HARD"`` and a record written by an older
flashcheck reads back as the same member (``Status("FAIL-HARD")``).

Three families:

- *judged*: the kernel produced an output and it was compared with the oracle: ``PASS``,
  ``FAIL`` (above the empirical rule and the probabilistic bound), ``FAIL-HARD`` (above the
  deterministic bound, or NaN/Inf where the exact result is finite);
- *broken*: the kernel produced nothing judgeable inside its contract: ``BAD-OUTPUT`` (wrong
  shape or type), ``ERROR`` (it raised, or its process died), ``TIMEOUT``;
- *not counted*: ``SKIP`` (the kernel declined the input at run time) and ``NOT-APPLICABLE``
  (a check that has nothing to test on this input, with the reason).
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

__all__ = ["Status"]


class Status(StrEnum):
    """A result's status; members compare equal to their on-disk strings."""

    PASS = "PASS"
    FAIL = "FAIL"
    FAIL_HARD = "FAIL-HARD"
    BAD_OUTPUT = "BAD-OUTPUT"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"
    SKIP = "SKIP"
    NOT_APPLICABLE = "NOT-APPLICABLE"

    @property
    def severity(self) -> int:
        """0 for a pass or a result that is not counted, 1 for FAIL, 2 for FAIL-HARD and every
        broken status: what orders worst cases and what :meth:`worst` picks."""
        return _SEVERITY[self]

    @property
    def judged(self) -> bool:
        """The kernel's output was compared with the oracle (PASS, FAIL, FAIL-HARD)."""
        return self in (Status.PASS, Status.FAIL, Status.FAIL_HARD)

    @property
    def broken(self) -> bool:
        """The kernel produced nothing judgeable inside its contract (BAD-OUTPUT, ERROR,
        TIMEOUT)."""
        return self in (Status.BAD_OUTPUT, Status.ERROR, Status.TIMEOUT)

    @property
    def counted(self) -> bool:
        """Neither a SKIP nor NOT-APPLICABLE: the result says something about the kernel."""
        return self not in (Status.SKIP, Status.NOT_APPLICABLE)

    @property
    def failed(self) -> bool:
        """FAIL, FAIL-HARD or broken."""
        return self.severity > 0

    @classmethod
    def worst(cls, statuses: Iterable[str]) -> Status:
        """The most severe of ``statuses`` (``PASS`` for none); among equals, the first."""
        out = cls.PASS
        for s in statuses:
            s = cls(s)
            if s.severity > out.severity:
                out = s
        return out


_SEVERITY = {
    Status.PASS: 0,
    Status.SKIP: 0,
    Status.NOT_APPLICABLE: 0,
    Status.FAIL: 1,
    Status.FAIL_HARD: 2,
    Status.BAD_OUTPUT: 2,
    Status.ERROR: 2,
    Status.TIMEOUT: 2,
}
