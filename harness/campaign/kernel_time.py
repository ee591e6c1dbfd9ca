"""Kernel work split by kernel: which kernels the kernel workers spent their busy time on.

Every kernel call a kernel worker runs is recorded with its kernel (the spec), its kind (a
forward ``run``, a ``backward``, a structural ``check``, or a forward call of the ``probe`` that
finds what the kernel accepts) and whether it was the *first* call of its compile group on its
worker: for a kernel that compiles per shape, the first call of a compile key on the worker that
runs that key (the call that paid the compile); for a kernel without compile keys, its first
call on each worker (lazy initialisation: library handles, autotuning caches). A worker that was
replaced (after a crash or a timeout) starts over. A call also records when its worker process
itself was busy with it (the call's span there): the rest of the call is sending the case and
the output through the pipe, and waiting for the process.

For each ``(kernel, kind)`` with call spans ``[a_i, b_i)`` clipped to the run:

* ``busy = Σ (b_i - a_i)``, worker-seconds: two workers busy with one kernel at once count
  twice, so the rows add up to the kernel workers' total busy time;
* ``first = Σ (b_i - a_i)`` over its first calls (the compile's part is at most that);
* ``inside = Σ |[a_i, b_i) ∩ W_i|``, ``W_i`` the call's span in the worker process (``None``
  where no call recorded one);
* ``share = busy / Σ busy`` over every row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CALL_KINDS", "KernelCall", "KernelRow", "kernel_rows", "kernel_table"]

CALL_KINDS = ("run", "backward", "check", "probe")


@dataclass(frozen=True)
class KernelCall:
    """One kernel call on a kernel worker: ``time.time()`` readings, the kernel's spec, the
    call's kind (:data:`CALL_KINDS`), whether it was the first of its compile group, and its
    span in the worker process (``None``: not known)."""

    start: float
    end: float
    kernel: str
    call: str
    first: bool
    inside: tuple[float, float] | None = None


@dataclass(frozen=True)
class KernelRow:
    """A kernel's calls of one kind: their count, busy seconds (summed over workers), how many
    were first calls of a compile group and their seconds, the share of all kernel busy time,
    and the seconds spent in the worker process (``None``: not recorded) (module docstring)."""

    kernel: str
    call: str
    calls: int
    busy: float
    first_calls: int
    first_busy: float
    share: float
    inside: float | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> KernelRow:
        return cls(
            str(d["kernel"]),
            str(d["call"]),
            int(d["calls"]),
            float(d["busy"]),
            int(d["first_calls"]),
            float(d["first_busy"]),
            float(d["share"]),
            None if d.get("inside") is None else float(d["inside"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "call": self.call,
            "calls": self.calls,
            "busy": self.busy,
            "first_calls": self.first_calls,
            "first_busy": self.first_busy,
            "share": self.share,
            "inside": self.inside,
        }


def kernel_rows(calls: Iterable[KernelCall], *, lo: float, hi: float) -> tuple[KernelRow, ...]:
    """One :class:`KernelRow` per ``(kernel, kind)`` of ``calls``, each call clipped to
    ``[lo, hi)``; the busiest first (ties by kernel, then kind)."""
    if hi < lo:
        raise ValueError(f"the run must end after it starts: lo={lo}, hi={hi}")
    # [calls, busy, first calls, first busy, inside (None until a call records it)]
    acc: dict[tuple[str, str], list[Any]] = {}
    for c in calls:
        a, b = max(c.start, lo), min(c.end, hi)
        seconds = max(0.0, b - a)
        row = acc.setdefault((c.kernel, c.call), [0, 0.0, 0, 0.0, None])
        row[0] += 1
        row[1] += seconds
        if c.first:
            row[2] += 1
            row[3] += seconds
        if c.inside is not None:
            row[4] = (row[4] or 0.0) + max(0.0, min(b, c.inside[1]) - max(a, c.inside[0]))
    total = sum(r[1] for r in acc.values())
    rows = [
        KernelRow(
            kernel=k,
            call=kind,
            calls=int(n),
            busy=round(busy, 4),
            first_calls=int(nf),
            first_busy=round(fb, 4),
            share=round(busy / total, 6) if total > 0 else 0.0,
            inside=None if inside is None else round(inside, 4),
        )
        for (k, kind), (n, busy, nf, fb, inside) in acc.items()
    ]
    return tuple(sorted(rows, key=lambda r: (-r.busy, r.kernel, r.call)))


def kernel_table(rows: Iterable[KernelRow]) -> list[str]:
    """A markdown table of ``rows`` (none: no lines), with a total row."""
    rows = list(rows)
    if not rows:
        return []
    lines = [
        "| kernel | call | calls | busy (s) | in the worker process (s) | first calls | "
        "of which first calls (s) | share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        inside = "–" if r.inside is None else f"{r.inside:.1f}"
        lines.append(
            f"| {r.kernel} | {r.call} | {r.calls} | {r.busy:.1f} | {inside} | {r.first_calls} | "
            f"{r.first_busy:.1f} | {r.share:.1%} |"
        )
    busy = sum(r.busy for r in rows)
    first = sum(r.first_busy for r in rows)
    known = [r.inside for r in rows if r.inside is not None]
    inside = f"{sum(known):.1f}" if known else "–"
    calls, firsts = sum(r.calls for r in rows), sum(r.first_calls for r in rows)
    lines.append(f"| all | | {calls} | {busy:.1f} | {inside} | {firsts} | {first:.1f} | 100.0% |")
    return lines
