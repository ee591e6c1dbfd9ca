"""A campaign under a time budget (``flashcheck report --budget DURATION``).

Without a budget a campaign runs its plan in plan order, to the end. With one, the plan is
reordered so that what finds bugs comes first, and the campaign stops cleanly when the budget
is spent, writes its report and says what it covered:

1. one item of every (part, input family) and every structural property in each dtype, items
   with several sequences (batch > 1: where indexing bugs live) first, the dtypes in turn;
2. then the rest, round-robin over the same groups (breadth before depth), in plan order
   within each group.

The budget counts from the process's start (imports and probing included). The cases get it
less a tail (15 %, at most 30 s, plus the slowest compile a case in flight may still be
doing) kept for re-running the failing cases that get case files and
for the summary; cases not started when their share is spent are cancelled, a case that
would first compile a new key is not started when the kernel's compile time no longer fits,
and a case is not started when it would not finish in the share left at the campaign's rate.
Case files are saved failing cases first, until the whole budget is spent.

The reordering is a function of the plan alone, so a budgeted run resumed without a budget
(or with a larger one) computes only what is missing and ends with the same results as an
unbudgeted run. A budgeted run that stops early appends a
:class:`~flashcheck.harness.campaign.logrecords.CoverageRecord`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..core.progress import format_seconds
from .plan import Item

__all__ = [
    "Budget",
    "groups_not_run",
    "missing_by_part",
    "parse_duration",
    "priority_order",
    "process_age",
]

T = TypeVar("T")
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``"90"`` or ``"90s"``, ``"3m"``, ``"1.5h"``, ``"2m30s"``, ``"2:30"``
    (minutes:seconds) or ``"1:02:30"``. ``ValueError`` says what is accepted."""
    s = text.strip().lower()
    how = "use e.g. 90s, 3m, 1h, 2m30s or 2:30"
    if s.startswith("-"):
        raise ValueError(f"a duration must be positive, got {text!r}: {how}")
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", s):
        parts = [int(p) for p in s.split(":")]
        seconds = 0
        for p in parts:
            seconds = seconds * 60 + p
        value = float(seconds)
    elif re.fullmatch(r"\d+(\.\d+)?", s):
        value = float(s)
    else:
        pieces = re.findall(r"(\d+(?:\.\d+)?)\s*(min|h|m|s)", s)
        if not pieces or re.sub(r"(\d+(?:\.\d+)?)\s*(min|h|m|s)", "", s).strip():
            raise ValueError(f"cannot read the duration {text!r}: {how}")
        value = sum(float(n) * _UNITS[u] for n, u in pieces)
    if value <= 0:
        raise ValueError(f"a duration must be positive, got {text!r}: {how}")
    return value


def _group(item: Item) -> tuple[str, str, str]:
    """The group an item's first pass takes one of: its part and input family, or its
    structural property, in its dtype."""
    return (item.part, item.check or item.recipe.family, item.recipe.dtype)


def priority_order(work: Sequence[tuple[Item, T]]) -> list[tuple[Item, T]]:
    """``work`` (items with what runs them) reordered as the module docstring says."""
    groups: dict[tuple[str, str], list[tuple[Item, T]]] = {}
    for entry in work:
        groups.setdefault(_group(entry[0]), []).append(entry)
    first, rest = [], []
    for members in groups.values():
        # The group's first item with several sequences, else its first item.
        pick = next((e for e in members if e[0].recipe.b > 1), members[0])
        first.append(pick)
        rest.append([e for e in members if e is not pick])
    # Batch > 1 first; within each, the dtypes in turn (a bug of one dtype is not left
    # behind every case of another), plan order kept otherwise.
    turn: dict[tuple[bool, str], int] = {}
    rank = []
    for e in first:
        at = (e[0].recipe.b == 1, e[0].recipe.dtype)
        rank.append((at[0], turn.get(at, 0)))
        turn[at] = turn.get(at, 0) + 1
    first = [e for _, e in sorted(zip(rank, first, strict=True), key=lambda x: x[0])]
    out = list(first)
    depth = max((len(r) for r in rest), default=0)
    for i in range(depth):
        out += [r[i] for r in rest if i < len(r)]
    return out


# What a budget keeps back from the campaign's cases for what follows them: the re-runs that
# save the failing cases' files, and the summary. A share of the budget, capped.
TAIL_SHARE = 0.15
TAIL_MAX = 30.0


def process_age() -> float:
    """Seconds since this process started (Linux; 0 where that cannot be read), so a budget
    given on the command line counts the interpreter's start and the imports too."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


@dataclass
class Budget:
    """A time budget of ``seconds`` from ``started`` (a ``time.monotonic()`` reading; default
    now; ``seconds=None``: no budget). The campaign's cases get the budget less its
    :attr:`tail`; the tail is for saving case files and ending (:attr:`over`)."""

    seconds: float | None
    started: float = field(default_factory=time.monotonic)
    # Kept back as well: what a case started just before the cases' share ends may still
    # take (a compile of the slowest compiling kernel), since a started case is not stopped.
    in_flight: float = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def tail(self) -> float:
        if self.seconds is None:
            return 0.0
        return min(TAIL_SHARE * self.seconds, TAIL_MAX) + self.in_flight

    @property
    def spent(self) -> bool:
        """The cases' share is spent: start no more of them."""
        return self.seconds is not None and self.elapsed() >= self.seconds - self.tail

    @property
    def over(self) -> bool:
        """The whole budget is spent: save no more case files."""
        return self.seconds is not None and self.elapsed() >= self.seconds

    def used(self) -> str:
        """How much of the budget has gone, as ``"0:27 of 0:40"``."""
        return f"{format_seconds(self.elapsed())} of {format_seconds(self.seconds or 0.0)}"

    def left(self) -> float:
        """Seconds left of the cases' share."""
        if self.seconds is None:
            return float("inf")
        return max(0.0, self.seconds - self.tail - self.elapsed())


def missing_by_part(work: Iterable[tuple[Item, Sequence[str]]], done: set[str]) -> dict[str, int]:
    """Per part, how many (item, kernel) results of ``work`` are not in ``done``."""
    out: dict[str, int] = {}
    for item, specs in work:
        n = sum(item.key(s) not in done for s in specs)
        if n:
            out[item.part] = out.get(item.part, 0) + n
    return out


def groups_not_run(work: Iterable[tuple[Item, Sequence[str]]], done: set[str]) -> list[str]:
    """The groups of the first pass of :func:`priority_order` (a part and input family, or a
    structural property, in a dtype) of which no result of ``work`` is in ``done``, each as
    ``"part family dtype"``, in the order of ``work``."""
    seen: dict[tuple[str, str, str], bool] = {}
    for item, specs in work:
        if not specs:  # (no kernel could run it here: nothing of it was left undone)
            continue
        g = _group(item)
        seen[g] = seen.get(g, False) or any(item.key(s) in done for s in specs)
    return [" ".join(g) for g, ran in seen.items() if not ran]
