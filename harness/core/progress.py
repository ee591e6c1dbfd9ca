"""A dependency-free progress bar with an ETA, for long campaigns.

On a terminal it redraws one line (``\\r``); elsewhere (CI logs, pipes) it prints a line at most
every ``interval`` seconds, so logs stay readable. The ETA weights the remaining work by a cost
per item (e.g. the number of score elements), so a few large cases at the end do not make it lie.

For a kernel that compiles per shape, compile waits are counted apart: with ``keys`` compile
keys to go through at ``compile_seconds`` each, of which ``k`` started (:meth:`compiling`), the
ETA is ``(keys - k)·compile_seconds`` plus the remaining cost at the rate measured without the
time spent waiting for compiles (:attr:`compile_time`, kept by the caller).

Until 5 % of the work is done, a ``prior_rate`` (seconds per unit of cost, from the plan) gives
the ETA, marked ``~``: a rate measured on the first item or two can be off by a factor of 100.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "format_seconds"]


def format_seconds(s: float) -> str:
    """``s`` seconds as ``h:mm:ss`` or ``m:ss``."""
    s = max(0, round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """Progress over ``total_cost`` units of work, ``done_cost`` of them finished already."""

    def __init__(
        self,
        total_cost: float,
        *,
        done_cost: float = 0.0,
        label: str = "",
        stream: TextIO | None = None,
        interval: float = 10.0,
        width: int = 28,
        keys: int = 0,
        compile_seconds: float = 0.0,
        prior_rate: float | None = None,
    ) -> None:
        self.total = max(float(total_cost), 1e-12)
        self.done = float(done_cost)
        self.start_done = self.done
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self.width = width
        self.t0 = time.monotonic()
        self._last = -1e9
        self.note = ""
        if keys < 0 or compile_seconds < 0:
            raise ValueError(f"keys and compile_seconds are >= 0, got {keys}, {compile_seconds}")
        self.keys, self.compile_seconds, self.compiled = keys, compile_seconds, 0
        self.compile_time = 0.0  # seconds of the elapsed time spent waiting for compiles
        # Seconds per unit of cost expected before any is measured (the plan's estimate): the
        # first lines then show an estimate ("~") instead of a rate from one item.
        self.prior_rate = prior_rate

    def _estimating(self) -> bool:
        """Whether the ETA still comes from :attr:`prior_rate`: until 5 % of the work is done
        (a rate measured on the first items says little)."""
        return self.prior_rate is not None and self.done - self.start_done < 0.05 * self.total

    def seconds_per_cost(self) -> float | None:
        """Seconds per unit of cost at the rate of this session, compile waits left out
        (``None`` before any work is measured; the prior rate while :meth:`_estimating`)."""
        if self._estimating():
            return self.prior_rate
        spent = time.monotonic() - self.t0 - self.compile_time
        worked = self.done - self.start_done
        if worked <= 0 or spent <= 0 or (self.keys and worked < 0.01 * self.total):
            return None  # (with compiles ahead, a rate from the first 1 % says little)
        return spent / worked

    def eta(self) -> float | None:
        """Seconds left at the rate of this session (``None`` before any work is measured;
        the prior rate's estimate while :meth:`_estimating`), compile waits counted apart
        (see the module)."""
        waits = max(0, self.keys - self.compiled) * self.compile_seconds
        rate = self.seconds_per_cost()
        return None if rate is None else (self.total - self.done) * rate + waits

    def compiling(self, note: str) -> None:
        """Say (now, on a terminal or not) that the work waits for a compile of a new key."""
        self.compiled += 1
        self.note = note
        self._last = time.monotonic()
        self.stream.write(("\r" + self.line()[:160].ljust(100)) if self.tty else self.line() + "\n")
        self.stream.flush()

    def line(self) -> str:
        frac = min(1.0, self.done / self.total)
        fill = int(frac * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        eta = self.eta()
        eta_s = "?" if eta is None else ("~" * self._estimating()) + format_seconds(eta)
        spent = format_seconds(time.monotonic() - self.t0)
        note = f"  {self.note}" if self.note else ""
        return f"{self.label}[{bar}] {100 * frac:5.1f}%  {spent} elapsed, ETA {eta_s}{note}"

    def advance(self, cost: float, note: str = "") -> None:
        self.done += cost
        self.note = note
        now = time.monotonic()
        if self.tty:
            if now - self._last >= 0.2:
                self.stream.write("\r" + self.line()[:160].ljust(100))
                self.stream.flush()
                self._last = now
        elif now - self._last >= self.interval:
            self.stream.write(self.line() + "\n")
            self.stream.flush()
            self._last = now

    def finish(self, message: str = "") -> None:
        if self.tty:
            self.stream.write("\r" + self.line()[:160].ljust(100) + "\n")
        else:
            self.stream.write(self.line() + "\n")
        if message:
            self.stream.write(message + "\n")
        self.stream.flush()
