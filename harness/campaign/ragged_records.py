"""The records of a campaign on ragged kernels in ``results.jsonl``, and the file read back.

A ragged campaign's file has the dense campaign's ``header`` (its configuration names the part
``ragged``), ``session``, ``contract`` and ``limitation`` records, one ``ragged-result`` record
per kernel, case and check (:class:`RaggedResult`), and ``complete``. The dense reader skips
the kinds it does not know, and this module reads the file through the same typed records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.resultlog import read_records
from ..core.status import Status
from .logrecords import (
    CompleteRecord,
    ContractRecord,
    Header,
    LimitationRecord,
    SessionRecord,
    parse_record,
)
from .resultrecords import decode_number

__all__ = ["RAGGED_PART", "RaggedResult", "RaggedResults", "is_ragged_campaign", "load_ragged"]

# The campaign part a ragged campaign's configuration names (its header tells it apart).
RAGGED_PART = "ragged"


@dataclass(frozen=True)
class RaggedResult:
    """One check of one kernel on one ragged case: ``check`` is ``accuracy`` or a property's
    name; ``status`` its outcome (a property is PASS, FAIL or NOT-APPLICABLE); ``reasons``
    what failed, each naming the sequence; ``case`` the case's one-line description;
    ``det_util`` the worst deterministic-bound utilization of an accuracy check; ``case_id``
    the saved case file of a failure."""

    TYPE: ClassVar[str] = "ragged-result"
    key: str
    kernel: str
    dtype: str
    layout: str
    family: str
    check: str
    status: Status
    reasons: tuple[str, ...] = ()
    case: str = ""
    det_util: float | None = None
    case_id: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RaggedResult:
        util = decode_number(d.get("det_util"))
        return cls(
            key=d["key"],
            kernel=d["kernel"],
            dtype=d["dtype"],
            layout=d["layout"],
            family=d["family"],
            check=d["check"],
            status=Status(d["status"]),
            reasons=tuple(d.get("reasons") or ()),
            case=d.get("case", ""),
            det_util=None if util is None else float(util),
            case_id=d.get("case_id"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "key": self.key,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "layout": self.layout,
            "family": self.family,
            "check": self.check,
            "status": str(self.status),
            "reasons": list(self.reasons),
            "case": self.case,
            "det_util": self.det_util,
            "case_id": self.case_id,
        }


@dataclass(frozen=True)
class RaggedResults:
    """A ragged campaign's file sorted by kind."""

    header: Header
    results: tuple[RaggedResult, ...] = ()
    sessions: tuple[SessionRecord, ...] = ()
    contracts: tuple[ContractRecord, ...] = ()
    limitations: tuple[LimitationRecord, ...] = ()
    complete: bool = False


def parse_ragged(records: list[Mapping[str, Any]]) -> RaggedResults:
    """The typed records of a ragged campaign's lines (the first is its header)."""
    header = parse_record(records[0]) if records else None
    if not isinstance(header, Header):
        raise ValueError("a results file starts with its header record")
    by: dict[type, list] = {}
    for d in records[1:]:
        rec = RaggedResult.from_json(d) if d.get("type") == RaggedResult.TYPE else parse_record(d)
        if rec is not None:
            by.setdefault(type(rec), []).append(rec)
    return RaggedResults(
        header=header,
        results=tuple(by.get(RaggedResult, ())),
        sessions=tuple(by.get(SessionRecord, ())),
        contracts=tuple(by.get(ContractRecord, ())),
        limitations=tuple(by.get(LimitationRecord, ())),
        complete=bool(by.get(CompleteRecord)),
    )


def is_ragged_campaign(header: Header) -> bool:
    """Whether a results file's header is a ragged campaign's."""
    return header.config.parts == (RAGGED_PART,)


def load_ragged(path: str | os.PathLike) -> RaggedResults:
    """The ragged campaign's results file at ``path``, typed and sorted by kind."""
    return parse_ragged(read_records(path))
