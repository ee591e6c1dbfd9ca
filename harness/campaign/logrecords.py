"""The records of a campaign's ``results.jsonl``, one frozen dataclass per kind, and the file
read back as types (:func:`load`).

Each kind reads and writes its own JSON (``from_json`` / ``to_json``) and nothing else does:
the runner writes records through these types, and the renderer, the gate and the terminal
summary read them back through :func:`parse_records` / :func:`load`.

Kinds (the ``type`` key): ``header`` (the campaign's configuration, first line), ``session``
(the environment of one run of the campaign), ``contract`` (what a kernel accepts),
``limitation`` (what cannot run here), ``result`` (one kernel on one case:
:mod:`flashcheck.harness.campaign.resultrecords`), ``stopped`` (a kernel stopped after
repeated identical failures), ``case-file`` (a saved, replayable case), ``complete`` and
``phases`` (a profiled run's timeline: :mod:`flashcheck.harness.campaign.phases`). Files
written by older versions (without ``no_run`` or contract records) still load: absent fields
read as their default.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..core.progress import format_seconds
from ..core.resultlog import jsonable, read_records
from ..core.status import Status
from .phases import PhaseTimeline
from .resultrecords import AccuracyResult, GradientResult, ResultRecord, StructuralResult

__all__ = [
    "CampaignConfig",
    "CaseFileRecord",
    "CompleteRecord",
    "ContractRecord",
    "CoverageRecord",
    "Header",
    "LimitationRecord",
    "Record",
    "ResultsFile",
    "SessionRecord",
    "StoppedRecord",
    "load",
    "parse_record",
    "parse_records",
]

# -- the records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CampaignConfig:
    """What identifies a campaign: resuming with another configuration is refused.
    ``parts`` is ``None`` when every part runs (older files do not record it)."""

    name: str
    preset: str
    seed: int
    kernels: tuple[str, ...]
    dtypes: tuple[str, ...]
    device: str
    parts: tuple[str, ...] | None = None
    palette: int | None = None  # compile keys per dtype, when not the default (older: None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CampaignConfig:
        parts = d.get("parts")
        return cls(
            name=d["name"],
            preset=d["preset"],
            seed=int(d["seed"]),
            kernels=tuple(d["kernels"]),
            dtypes=tuple(d["dtypes"]),
            device=d["device"],
            parts=None if parts is None else tuple(parts),
            palette=d.get("palette"),
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "preset": self.preset,
            "seed": self.seed,
            "kernels": list(self.kernels),
            "dtypes": list(self.dtypes),
            "device": self.device,
        }
        if self.parts is not None:
            out["parts"] = list(self.parts)
        if self.palette is not None:
            out["palette"] = self.palette
        return out


@dataclass(frozen=True)
class Header:
    """The first line: the configuration, the command that reproduces the campaign and where
    its case files go (``None`` in files that did not record it)."""

    TYPE: ClassVar[str] = "header"
    config: CampaignConfig
    command: str
    case_dir: str | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Header:
        return cls(CampaignConfig.from_json(d["config"]), d["command"], d.get("case_dir"))

    def to_json(self) -> dict[str, Any]:
        out = {"type": self.TYPE, "config": self.config.to_json(), "command": self.command}
        if self.case_dir is not None:
            out["case_dir"] = self.case_dir
        return out


@dataclass(frozen=True)
class SessionRecord:
    """The environment of one run (a resumed campaign has one per run)."""

    TYPE: ClassVar[str] = "session"
    env: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SessionRecord:
        return cls(dict(d.get("env", {})))

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "env": jsonable(self.env)}


@dataclass(frozen=True)
class ContractRecord:
    """What a kernel accepts, declared or probed, one line per clause."""

    TYPE: ClassVar[str] = "contract"
    kernel: str
    lines: tuple[str, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ContractRecord:
        return cls(d["kernel"], tuple(d["lines"]))

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "kernel": self.kernel, "lines": list(self.lines)}


@dataclass(frozen=True)
class LimitationRecord:
    """A kernel and dtype that cannot run here, and why; ``no_run``: the kernel ran on no probe
    input at all (a failure of the kernel, which the gate counts)."""

    TYPE: ClassVar[str] = "limitation"
    kernel: str
    dtype: str
    reason: str
    device: str
    no_run: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LimitationRecord:
        return cls(d["kernel"], d["dtype"], d["reason"], d["device"], bool(d.get("no_run")))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "reason": self.reason,
            "device": self.device,
            "no_run": self.no_run,
        }


@dataclass(frozen=True)
class StoppedRecord:
    """A kernel and dtype stopped after ``count`` identical failures in a row."""

    TYPE: ClassVar[str] = "stopped"
    kernel: str
    dtype: str
    reason: str
    count: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StoppedRecord:
        return cls(d["kernel"], d["dtype"], d["reason"], int(d["count"]))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "reason": self.reason,
            "count": self.count,
        }


@dataclass(frozen=True)
class CaseFileRecord:
    """A result re-run and saved as a case file (``case_id``), with the status on record and
    the one the re-run gave."""

    TYPE: ClassVar[str] = "case-file"
    key: str
    case_id: str
    kernel: str
    dtype: str
    recorded: Status
    replayed: Status

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CaseFileRecord:
        return cls(
            d["key"],
            d["case_id"],
            d["kernel"],
            d["dtype"],
            Status(d["recorded"]),
            Status(d["replayed"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "key": self.key,
            "case_id": self.case_id,
            "kernel": self.kernel,
            "dtype": self.dtype,
            "recorded": str(self.recorded),
            "replayed": str(self.replayed),
        }


@dataclass(frozen=True)
class CompleteRecord:
    """The last line of a campaign that ran to the end."""

    TYPE: ClassVar[str] = "complete"
    results: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CompleteRecord:
        return cls(d.get("results"))

    def to_json(self) -> dict[str, Any]:
        return {"type": self.TYPE, "results": self.results}


@dataclass(frozen=True)
class CoverageRecord:
    """What a budgeted campaign covered when its budget ran out: ``budget`` seconds, the
    results ``ran`` of ``planned`` (the fixed parts'), ``missing`` results per part not run,
    and whether the search ran (``search``)."""

    TYPE: ClassVar[str] = "coverage"
    budget: float
    planned: int
    ran: int
    missing: Mapping[str, int]
    search: bool
    # Groups of the first pass (part and input family, or structural property, in a dtype)
    # of which nothing ran; () in records written before it was kept.
    unrun: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CoverageRecord:
        return cls(
            budget=float(d["budget"]),
            planned=int(d["planned"]),
            ran=int(d["ran"]),
            missing=dict(d.get("missing") or {}),
            search=bool(d.get("search")),
            unrun=tuple(d.get("unrun") or ()),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "budget": self.budget,
            "planned": self.planned,
            "ran": self.ran,
            "missing": dict(self.missing),
            "search": self.search,
            **({"unrun": list(self.unrun)} if self.unrun else {}),
        }

    def text(self) -> str:
        """One sentence for the report and the terminal."""
        missing = ", ".join(f"{n} {part}" for part, n in self.missing.items() if n)
        search = "the search ran" if self.search else "the search did not run"
        if self.unrun:
            shown = ", ".join(self.unrun[:6]) + (", ..." if len(self.unrun) > 6 else "")
            n = len(self.unrun)
            first = f"{n} {_UNRUN[n > 1]} did not run once ({shown})"
        else:
            first = "Every input family and structural property ran first"
        return (
            f"{self.ran} of {self.planned} planned results ran within the time budget of "
            f"{format_seconds(self.budget)} ({missing or 'none'} not run; {search}). {first}; "
            "the same command without --budget (or with a larger one) completes it without "
            "recomputing anything."
        )


_UNRUN = ("input family or structural property", "input families or structural properties")


Record = (
    Header
    | CoverageRecord
    | SessionRecord
    | ContractRecord
    | LimitationRecord
    | ResultRecord
    | StoppedRecord
    | CaseFileRecord
    | CompleteRecord
    | PhaseTimeline
)

_KINDS: dict[str, Any] = {
    k.TYPE: k
    for k in (
        Header,
        SessionRecord,
        ContractRecord,
        LimitationRecord,
        ResultRecord,
        StoppedRecord,
        CaseFileRecord,
        CompleteRecord,
        CoverageRecord,
        PhaseTimeline,
    )
}


def parse_record(d: Mapping[str, Any]) -> Record | None:
    """The typed record of one JSON line (``None`` for a kind this version does not know:
    a newer file's extra records are ignored, not fatal)."""
    kind = _KINDS.get(d.get("type", "header" if "schema" in d else ""))
    return None if kind is None else kind.from_json(d)


def parse_records(records: Iterable[Mapping[str, Any]]) -> list[Record]:
    """The typed records of a results file's lines, in order (unknown kinds dropped)."""
    return [r for r in map(parse_record, records) if r is not None]


@dataclass(frozen=True)
class ResultsFile:
    """A results file sorted by kind: forward ``results``, ``structural`` and ``gradients``
    results, and the other records; ``complete`` once the campaign ran to the end."""

    header: Header
    results: tuple[AccuracyResult, ...] = ()
    structural: tuple[StructuralResult, ...] = ()
    gradients: tuple[GradientResult, ...] = ()
    sessions: tuple[SessionRecord, ...] = ()
    limitations: tuple[LimitationRecord, ...] = ()
    case_files: dict[str, CaseFileRecord] = field(default_factory=dict)
    contracts: dict[str, ContractRecord] = field(default_factory=dict)
    stopped: tuple[StoppedRecord, ...] = ()
    complete: bool = False
    coverage: CoverageRecord | None = None  # the last budgeted session's, if it stopped early
    timelines: tuple[PhaseTimeline, ...] = ()  # one per profiled session

    @classmethod
    def from_records(cls, records: Iterable[Record]) -> ResultsFile:
        """Sort parsed records (the first must be the header)."""
        records = list(records)
        header = records[0]
        if not isinstance(header, Header):
            raise ValueError("a results file starts with its header record")
        by: dict[type, list] = {}
        for r in records[1:]:
            by.setdefault(type(r), []).append(r)
        return cls(
            header=header,
            results=tuple(by.get(AccuracyResult, ())),
            structural=tuple(by.get(StructuralResult, ())),
            gradients=tuple(by.get(GradientResult, ())),
            sessions=tuple(by.get(SessionRecord, ())),
            limitations=tuple(by.get(LimitationRecord, ())),
            case_files={r.key: r for r in by.get(CaseFileRecord, ())},
            contracts={r.kernel: r for r in by.get(ContractRecord, ())},
            stopped=tuple(by.get(StoppedRecord, ())),
            complete=bool(by.get(CompleteRecord)),
            coverage=(by.get(CoverageRecord) or [None])[-1] if not by.get(CompleteRecord) else None,
            timelines=tuple(by.get(PhaseTimeline, ())),
        )

    @property
    def every_result(self) -> list[ResultRecord]:
        """Every result record, forward, structural and gradient."""
        return [*self.results, *self.structural, *self.gradients]


def load(path: str | os.PathLike) -> ResultsFile:
    """The results file at ``path``, typed and sorted by kind."""
    return ResultsFile.from_records(parse_records(read_records(path)))
