"""The records of a benchmark's ``results.jsonl`` as types: one :class:`SpeedRecord` per shape
and provider (with its :class:`BenchCheck`), :class:`CeilingsRecord` per measurement of the
GPU's ceilings, and the file read back (:class:`BenchResults`, :func:`load_bench`).

Each type reads and writes its own JSON. A speed record keeps the order its keys were written
in (``order``), so a record read and written again, and ``bench.json``, are the same JSON as
before; a record written before the backward passes existed reads with ``pass = "fwd"``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..core.resultlog import read_records
from ..core.status import Status

__all__ = [
    "BenchCheck",
    "BenchResults",
    "CeilingsRecord",
    "SpeedRecord",
    "done_keys",
    "load_bench",
]


@dataclass(frozen=True)
class BenchCheck:
    """The oracle check of one provider's output (forward: ``max_ulp`` a number) or of its
    gradients (``max_ulp`` per gradient, ``kv_mode``: the dK/dV reference used); ``verdict``
    is a :class:`Status` value, or ``"unchecked"`` where no reference could be built."""

    verdict: str
    reasons: tuple[str, ...] = ()
    max_ulp: Any = None
    naive_ulp: Any = None
    det_util: Any = None
    rows: int | None = None
    keys: int | None = None
    kv_mode: str | None = None
    order: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.verdict == Status.PASS

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BenchCheck:
        names = {f.name for f in fields(cls)} - {"order"}
        kw = {k: v for k, v in d.items() if k in names}
        kw["reasons"] = tuple(d.get("reasons", ()))
        return cls(**kw, order=tuple(k for k in d if k in names))

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.order}
        if "reasons" in out:
            out["reasons"] = list(self.reasons)
        return out


_PASS = "pass"  # the JSON name of SpeedRecord.pass_ (a Python keyword)


@dataclass(frozen=True)
class SpeedRecord:
    """One provider on one shape: what was measured, or why it was not (``status``: ``ok``,
    ``skipped`` or ``error``, with ``reason``). Sizes are bytes, times milliseconds (``ms``: the
    pass's median; ``fwd_ms``, ``fwdbwd_ms``, ``diff_ms``: the backward's side timings)."""

    key: str
    provider: str
    part: str
    dtype: str
    b: int
    h: int
    n: int
    d: int
    causal: bool
    pass_: str = "fwd"
    status: str = "ok"
    reason: str | None = None
    first_call_s: float | None = None
    triton: dict[str, Any] | None = None
    peak_extra_bytes: int | None = None
    saved_bytes: int | None = None
    bwd_peak_extra_bytes: int | None = None
    out_bytes: int | None = None
    lse_bytes: int | None = None
    grad_bytes: int | None = None
    ms: float | None = None
    runs: int | None = None
    spread: float | None = None
    tflops: float | None = None
    fwd_ms: float | None = None
    fwdbwd_ms: float | None = None
    diff_ms: float | None = None
    diff_tflops: float | None = None
    # How the pass was timed: "in turn" (round after round with the shape's other fast
    # providers) or "alone"; None in results written before the bench timed in turn.
    timing: str | None = None
    check: BenchCheck | None = None
    check_s: float | None = None
    order: tuple[str, ...] = ()

    @property
    def counts(self) -> bool:
        """A speed that counts: measured, and its output passed the oracle check."""
        return self.status == "ok" and self.check is not None and self.check.passed

    def value(self, name: str) -> Any:
        """The field ``name`` by its JSON name (``"pass"`` is :attr:`pass_`)."""
        return getattr(self, "pass_" if name == _PASS else name)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SpeedRecord:
        names = {f.name for f in fields(cls)} - {"order", "pass_", "check"}
        kw = {k: v for k, v in d.items() if k in names}
        # (keys this version does not know are dropped)
        order = tuple(k for k in d if k in names or k in (_PASS, "check"))
        if _PASS not in d:  # written before the backward passes existed
            order += (_PASS,)
        check = d.get("check")
        return cls(
            **kw,
            pass_=d.get(_PASS, "fwd"),
            check=None if check is None else BenchCheck.from_json(check),
            order=order,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "speed"}
        for k in self.order:
            v = self.value(k)
            out[k] = v.to_json() if isinstance(v, BenchCheck) else v
        return out


@dataclass(frozen=True)
class CeilingsRecord:
    """The GPU's ceilings measured in the run: bf16 matmul TFLOP/s and device-copy TB/s."""

    matmul_bf16_tflops: float
    copy_tbs: float
    matmul_n: int | None = None
    copy_bytes: int | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> CeilingsRecord:
        return cls(d["matmul_bf16_tflops"], d["copy_tbs"], d.get("matmul_n"), d.get("copy_bytes"))

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "ceilings",
            "matmul_bf16_tflops": self.matmul_bf16_tflops,
            "matmul_n": self.matmul_n,
            "copy_tbs": self.copy_tbs,
            "copy_bytes": self.copy_bytes,
        }


@dataclass(frozen=True)
class BenchResults:
    """A benchmark's results by shape: ``shapes[key][provider]`` and ``meta[key]`` (one record
    of the shape, for its dimensions); ``when`` pairs each ceilings measurement with the session
    it was taken in and whether at its start or end."""

    header: dict[str, Any]
    shapes: dict[str, dict[str, SpeedRecord]]
    meta: dict[str, SpeedRecord]
    ceilings: tuple[tuple[str, CeilingsRecord], ...] = ()
    sessions: tuple[dict[str, Any], ...] = ()
    complete: bool = False

    @classmethod
    def from_records(cls, recs: Iterable[Mapping[str, Any]]) -> BenchResults:
        recs = list(recs)
        shapes: dict[str, dict[str, SpeedRecord]] = {}
        meta: dict[str, SpeedRecord] = {}
        ceilings, sessions = [], []
        session, seen = 0, 0
        for d in recs[1:]:
            kind = d.get("type")
            if kind == "speed":
                r = SpeedRecord.from_json(d)
                shapes.setdefault(r.key, {})[r.provider] = r
                meta[r.key] = r
            elif kind == "session":
                sessions.append(dict(d.get("env", {})))
                session, seen = session + 1, 0
            elif kind == "ceilings":
                when = f"session {session}, {'start' if seen == 0 else 'end'}"
                ceilings.append((when, CeilingsRecord.from_json(d)))
                seen += 1
        complete = any(d.get("type") == "complete" for d in recs)
        return cls(dict(recs[0]), shapes, meta, tuple(ceilings), tuple(sessions), complete)

    @property
    def env(self) -> dict[str, Any]:
        """The environment of the last session (empty if none was recorded)."""
        return self.sessions[-1] if self.sessions else {}

    def only(self, keys: Iterable[str]) -> BenchResults:
        """These results restricted to the shapes ``keys``."""
        keys = list(keys)
        return replace(
            self,
            shapes={k: self.shapes[k] for k in keys},
            meta={k: self.meta[k] for k in keys},
        )


def done_keys(records: Iterable[Mapping[str, Any]]) -> set[str]:
    """The keys of the shapes a results file marks as finished (``shape-done`` records)."""
    return {d["key"] for d in records if d.get("type") == "shape-done"}


def load_bench(path: str | os.PathLike) -> BenchResults:
    """The benchmark results file at ``path``, typed."""
    return BenchResults.from_records(read_records(path))
