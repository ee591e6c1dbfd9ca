"""A campaign's phase timeline (``flashcheck report --profile-phases``): where its wall time goes.

A :class:`PhaseClock` collects wall-clock spans ``[start, end)`` (``time.time()`` seconds, one
clock for every process on the machine) of each phase of a run: start-up (process start to the
report's first step: the interpreter and the imports), set-up (resolving the kernels), worker
start (a kernel worker's spawn until its imports are done), probing, reference work (the oracle,
baselines and bounds on the pool), kernel work (a kernel worker busy with a call), case files,
rendering, and shut-down (stopping the workers). :meth:`PhaseClock.timeline` condenses them
into a :class:`PhaseTimeline`, the typed ``phases`` record a profiled run appends to its
results file (one per session, so a resumed campaign keeps every session's).

For each phase, with ``U(p)`` the union of its spans and ``K`` the union of the kernel spans:

* ``busy = |U(p)|`` (its share: ``busy / wall``; phases overlap, so shares need not sum to 1);
* ``overlap = |U(p) ∩ K|``, the part of it hidden behind kernel work;
* ``exclusive``: the instants where ``p`` is the first active phase in :data:`PHASES` order
  (kernel work first). Every instant of the run belongs to exactly one phase or to ``other``
  (the campaign process alone: planning, judging, waiting), so the exclusive times sum to
  ``wall``.

The serial share is ``(wall - |K|) / wall``: the part of the run in which no kernel worker is
busy, which more kernel workers (GPUs) cannot shorten. Kernel spans recorded with their kernel
also give the split of kernel work by kernel (:mod:`~flashcheck.harness.campaign.kernel_time`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .kernel_time import CALL_KINDS, KernelCall, KernelRow, kernel_rows, kernel_table

__all__ = ["OTHER", "PHASES", "PhaseClock", "PhaseGap", "PhaseRow", "PhaseTimeline", "measure"]

GAPS = 5  # the longest stretches without kernel work a timeline keeps

# In priority order: an instant where several are active is attributed to the first.
PHASES = (
    "kernel",
    "reference",
    "worker start",
    "probing",
    "case files",
    "rendering",
    "set-up",
    "start-up",
    "shut-down",
)
OTHER = "other"  # no phase active: the campaign process alone


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering the same instants as ``spans``."""
    out: list[list[float]] = []
    for a, b in sorted(s for s in spans if s[1] > s[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(spans: Sequence[tuple[float, float]]) -> float:
    return sum(b - a for a, b in spans)


def _intersect(x: Sequence[tuple[float, float]], y: Sequence[tuple[float, float]]) -> float:
    """``|x ∩ y|`` of two disjoint sorted interval lists (a merge walk)."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _all_of(unions: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The spans inside every one of ``unions`` (each sorted and disjoint): a merge, linear in
    their lengths (a campaign records thousands of calls)."""
    out = list(unions[0]) if unions else []
    for u in unions[1:]:
        both, i, j = [], 0, 0
        while i < len(out) and j < len(u):
            lo, hi = max(out[i][0], u[j][0]), min(out[i][1], u[j][1])
            if lo < hi:
                both.append((lo, hi))
            if out[i][1] < u[j][1]:
                i += 1
            else:
                j += 1
        out = both
    return out


def _exclusive(unions: Mapping[str, list[tuple[float, float]]], lo: float, hi: float):
    """Seconds of ``[lo, hi)`` attributed to each phase by :data:`PHASES` priority, and to
    :data:`OTHER` where none is active."""
    events: list[tuple[float, int, int]] = []  # (time, +1/-1, phase rank)
    for rank, name in enumerate(PHASES):
        for a, b in unions.get(name, ()):
            a, b = max(a, lo), min(b, hi)
            if b > a:
                events += [(a, 1, rank), (b, -1, rank)]
    events.sort()
    active = [0] * len(PHASES)
    out = dict.fromkeys([*PHASES, OTHER], 0.0)
    at = lo
    for t, step, rank in events:
        if t > at:
            top = next((PHASES[r] for r, n in enumerate(active) if n), OTHER)
            out[top] += t - at
            at = t
        active[rank] += step
    out[OTHER] += max(0.0, hi - at)
    return out


@dataclass(frozen=True)
class PhaseRow:
    """One phase of a run: its first start and last end (seconds from the run's start), its
    busy, exclusive and kernel-overlapped seconds (module docstring) and its span count."""

    name: str
    first: float
    last: float
    busy: float
    exclusive: float
    overlap: float
    spans: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PhaseRow:
        return cls(
            d["name"],
            float(d["first"]),
            float(d["last"]),
            float(d["busy"]),
            float(d["exclusive"]),
            float(d["overlap"]),
            int(d["spans"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "first": self.first,
            "last": self.last,
            "busy": self.busy,
            "exclusive": self.exclusive,
            "overlap": self.overlap,
            "spans": self.spans,
        }


@dataclass(frozen=True)
class PhaseGap:
    """A stretch without kernel work, ``start`` to ``end`` seconds from the run's start, and
    the phases active in it (``other``: none, the campaign process alone)."""

    start: float
    end: float
    active: tuple[str, ...]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PhaseGap:
        return cls(float(d["start"]), float(d["end"]), tuple(d["active"]))

    def to_json(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "active": list(self.active)}


def _gaps(unions: Mapping[str, list[tuple[float, float]]], lo: float, hi: float):
    """The :data:`GAPS` longest stretches of ``[lo, hi)`` without kernel work, in time order."""
    edges = [lo, *(t for span in unions.get("kernel", []) for t in span), hi]
    holes = [(a, b) for a, b in zip(edges[::2], edges[1::2], strict=True) if b > a]
    holes = sorted(sorted(holes, key=lambda h: h[0] - h[1])[:GAPS])
    out = []
    for a, b in holes:
        active = tuple(
            n for n in PHASES[1:] if _intersect(unions.get(n, []), [(a, b)]) > 0.01 * (b - a)
        )
        out.append(PhaseGap(round(a - lo, 4), round(b - lo, 4), active or (OTHER,)))
    return tuple(out)


@dataclass(frozen=True)
class PhaseTimeline:
    """The ``phases`` record: a run's ``wall`` seconds (process start to its end), one
    :class:`PhaseRow` per phase (and ``other``), the ``serial`` seconds (no kernel worker
    busy), the executor's sizes, and how loaded the machine was (``cores``; the 1-minute load
    average at the run's start and end: other processes' work skews every figure)."""

    TYPE: ClassVar[str] = "phases"
    wall: float
    rows: tuple[PhaseRow, ...]
    serial: float
    workers: int
    kernel_workers: int
    cores: int
    load: tuple[float, float]
    gaps: tuple[PhaseGap, ...] = ()
    # Kernel work per kernel worker (seconds busy), and how long all of them were busy at
    # once: with several workers, a serial share near 0 does not make a run scale if one
    # worker still has work while the others are idle (empty when not recorded).
    kernel_busy: tuple[float, ...] = ()
    all_busy: float | None = None
    # Kernel work per kernel and call kind (empty when not recorded: older results files).
    kernels: tuple[KernelRow, ...] = ()

    @property
    def serial_share(self) -> float:
        """``serial / wall``: the share of the run no kernel worker was busy."""
        return self.serial / self.wall if self.wall > 0 else 0.0

    def row(self, name: str) -> PhaseRow | None:
        return next((r for r in self.rows if r.name == name), None)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PhaseTimeline:
        return cls(
            wall=float(d["wall"]),
            rows=tuple(PhaseRow.from_json(r) for r in d["rows"]),
            serial=float(d["serial"]),
            workers=int(d["workers"]),
            kernel_workers=int(d["kernel_workers"]),
            cores=int(d["cores"]),
            load=(float(d["load"][0]), float(d["load"][1])),
            gaps=tuple(PhaseGap.from_json(g) for g in d.get("gaps", ())),
            kernel_busy=tuple(float(x) for x in d.get("kernel_busy", ())),
            all_busy=None if d.get("all_busy") is None else float(d["all_busy"]),
            kernels=tuple(KernelRow.from_json(k) for k in d.get("kernels", ())),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.TYPE,
            "wall": self.wall,
            "rows": [r.to_json() for r in self.rows],
            "serial": self.serial,
            "workers": self.workers,
            "kernel_workers": self.kernel_workers,
            "cores": self.cores,
            "load": list(self.load),
            "gaps": [g.to_json() for g in self.gaps],
            "kernel_busy": list(self.kernel_busy),
            "all_busy": self.all_busy,
            "kernels": [k.to_json() for k in self.kernels],
        }

    def table(self) -> list[str]:
        """A markdown table, one row per phase, then the kernel work per kernel (if recorded),
        then the serial share and the machine's load."""
        pct = 100 / self.wall if self.wall > 0 else 0.0
        lines = [
            "| phase | from (s) | to (s) | busy (s) | share | exclusive (s) | under kernel work |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in self.rows:
            if r.spans == 0 and r.exclusive == 0:
                continue
            under = f"{r.overlap / r.busy:.0%}" if r.busy > 0 and r.name != "kernel" else "–"
            lines.append(
                f"| {r.name} | {r.first:.1f} | {r.last:.1f} | {r.busy:.1f} | "
                f"{r.busy * pct:.1f} % | {r.exclusive:.1f} | {under} |"
            )
        if self.kernels:
            lines += ["", "kernel work per kernel (busy: summed over kernel workers):", ""]
            lines += kernel_table(self.kernels)
        lines.append(
            f"\nwall {self.wall:.1f} s; serial (no kernel worker busy) {self.serial:.1f} s = "
            f"{self.serial_share:.1%}; {self.workers} reference workers, {self.kernel_workers} "
            f"kernel workers, {self.cores} cores, load average {self.load[0]:.2f} at the start "
            f"and {self.load[1]:.2f} at the end"
        )
        if len(self.kernel_busy) > 1 and self.all_busy is not None:
            busy = ", ".join(f"{b:.1f}" for b in self.kernel_busy)
            lines.append(
                f"kernel work per kernel worker: {busy} s; all {len(self.kernel_busy)} busy at "
                f"once {self.all_busy:.1f} s ({self.all_busy * pct:.1f} % of the run)"
            )
        if self.gaps:
            lines.append(
                "longest stretches without kernel work: "
                + "; ".join(
                    f"{g.start:.1f}-{g.end:.1f} s ({', '.join(g.active)})" for g in self.gaps
                )
            )
        return lines


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return 0.0


class PhaseClock:
    """Collects phase spans from any thread; ``origin`` (a ``time.time()`` reading, default
    now) is the run's start, e.g. the process's."""

    def __init__(self, *, origin: float | None = None) -> None:
        self.origin = time.time() if origin is None else float(origin)
        self.load_start = _load()
        self._spans: dict[str, list[tuple[float, float]]] = {}
        self._by_worker: dict[int, list[tuple[float, float]]] = {}
        self._calls: list[KernelCall] = []
        self._lock = threading.Lock()

    def add(
        self,
        phase: str,
        start: float,
        end: float,
        *,
        worker: int | None = None,
        kernel: str | None = None,
        call: str = "run",
        first: bool = False,
        inside: tuple[float, float] | None = None,
    ) -> None:
        """Record that ``phase`` was active from ``start`` to ``end`` (``time.time()``).
        Kernel work only: ``worker``, the kernel worker that did it; ``kernel``, the kernel's
        spec, ``call`` its kind, ``first`` whether it was the first call of its compile group
        and ``inside`` its span in the worker process
        (:mod:`~flashcheck.harness.campaign.kernel_time`)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}: choose from {list(PHASES)}")
        if (worker is not None or kernel is not None) and phase != "kernel":
            raise ValueError(f"a worker or kernel is recorded for kernel work only, not {phase!r}")
        if call not in CALL_KINDS:
            raise ValueError(f"unknown call kind {call!r}: choose from {list(CALL_KINDS)}")
        with self._lock:
            self._spans.setdefault(phase, []).append((float(start), float(end)))
            if worker is not None:
                self._by_worker.setdefault(worker, []).append((float(start), float(end)))
            if kernel is not None:
                rec = KernelCall(float(start), float(end), kernel, call, first, inside)
                self._calls.append(rec)

    def spans(self, phase: str) -> list[tuple[float, float]]:
        with self._lock:
            return list(self._spans.get(phase, ()))

    def timeline(
        self, *, end: float | None = None, workers: int = 1, kernel_workers: int = 1
    ) -> PhaseTimeline:
        """The :class:`PhaseTimeline` of the run from :attr:`origin` to ``end`` (default now);
        spans are clipped to it."""
        end = time.time() if end is None else float(end)
        lo = self.origin
        with self._lock:
            raw = {k: list(v) for k, v in self._spans.items()}
            per_worker = {k: list(v) for k, v in self._by_worker.items()}
            calls = list(self._calls)
        unions = {k: _union((max(a, lo), min(b, end)) for a, b in v) for k, v in raw.items()}
        each = [
            _union((max(a, lo), min(b, end)) for a, b in per_worker.get(i, ()))
            for i in range(kernel_workers)
        ]
        kernel = unions.get("kernel", [])
        excl = _exclusive(unions, lo, end)
        rows = []
        for name in PHASES:
            u = unions.get(name, [])
            rows.append(
                PhaseRow(
                    name=name,
                    first=round(u[0][0] - lo, 4) if u else 0.0,
                    last=round(u[-1][1] - lo, 4) if u else 0.0,
                    busy=round(_length(u), 4),
                    exclusive=round(excl[name], 4),
                    overlap=round(_intersect(u, kernel), 4),
                    spans=len(raw.get(name, ())),
                )
            )
        rows.append(PhaseRow(OTHER, 0.0, 0.0, 0.0, round(excl[OTHER], 4), 0.0, 0))
        wall = end - lo
        return PhaseTimeline(
            wall=round(wall, 4),
            rows=tuple(rows),
            serial=round(wall - _length(kernel), 4),
            workers=workers,
            kernel_workers=kernel_workers,
            cores=os.cpu_count() or 1,
            load=(self.load_start, _load()),
            gaps=_gaps(unions, lo, end),
            kernel_busy=tuple(round(_length(u), 4) for u in each) if per_worker else (),
            all_busy=round(_length(_all_of(each)), 4) if per_worker else None,
            kernels=kernel_rows(calls, lo=lo, hi=end),
        )


class measure:
    """``with measure(clock, "probing"): ...`` records the block as a span of the phase
    (nothing when ``clock`` is ``None``)."""

    def __init__(self, clock: PhaseClock | None, phase: str) -> None:
        self.clock, self.phase = clock, phase

    def __enter__(self) -> None:
        self.t0 = time.time()

    def __exit__(self, *exc: Any) -> None:
        if self.clock is not None:
            self.clock.add(self.phase, self.t0, time.time())
