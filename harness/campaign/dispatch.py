"""Kernel calls handed to kernel workers: each worker's own queue first, then the shared one.

A call either may run on any kernel worker or belongs to a group whose calls must all run on
one worker (a compiling kernel's calls of one compile key, so that one worker compiles it).
A group is bound to the first worker that takes one of its calls: one thread per worker takes,
whenever its worker is free, the oldest call of its own groups, else the oldest other call
(binding that call's group to it, if unbound). A new compile key thus goes to a free worker,
a worker with less bound work takes more of the rest, and no call waits for a worker that is
busy while another is idle. Before, the two kinds competed for a worker
through a lock in no set order: a worker with more pinned work could still hold some when the
shared calls had run out, the other worker idle. On two H100s the campaign ran at 1.70x one
GPU's rate with only 5 % of the run serial; the time some GPU was busy shrank only 1.72x.

Which worker runs a call does not change its result: workers are identical processes, and
results are consumed in plan order.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["Dispatcher"]

Item = tuple[cf.Future, str, tuple[Any, ...]]


class Dispatcher:
    """Runs ``call(i, fn, *args)`` for submitted calls on ``workers`` threads, thread ``i``
    serving worker ``i`` (module docstring). :meth:`submit` returns the call's future."""

    def __init__(self, workers: int, call: Callable[..., Any]) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._call = call
        self._cond = threading.Condition()
        self._shared: deque[tuple[int | None, Item]] = deque()
        self._own: list[deque[Item]] = [deque() for _ in range(workers)]
        self._bound: dict[int, int] = {}  # group -> worker
        self._closed = False
        self._threads = [
            threading.Thread(target=self._serve, args=(i,), name=f"kernel{i}", daemon=True)
            for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, group: int | None, fn: str, *args: Any) -> cf.Future:
        """Queue ``fn(*args)``: on the first free worker (``group=None``), else on the worker
        bound to ``group`` (the first to take one of its calls)."""
        fut: cf.Future = cf.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("cannot submit a kernel call after the executor closed")
            if group in self._bound:
                self._own[self._bound[group]].append((fut, fn, args))
            else:
                self._shared.append((group, (fut, fn, args)))
            self._cond.notify_all()
        return fut

    def bound(self) -> dict[int, int]:
        """Each group's worker so far."""
        with self._cond:
            return dict(self._bound)

    def _take(self, i: int) -> Item | None:
        with self._cond:
            while True:
                if self._own[i]:
                    return self._own[i].popleft()
                while self._shared:
                    group, item = self._shared.popleft()
                    if group is None:
                        return item
                    owner = self._bound.setdefault(group, i)
                    if owner == i:
                        return item
                    # Queued before its group was bound elsewhere: it goes to that worker.
                    self._own[owner].append(item)
                    self._cond.notify_all()
                if self._closed:
                    return None
                self._cond.wait()

    def _serve(self, i: int) -> None:
        while (item := self._take(i)) is not None:
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(self._call(i, fn, *args))
            except BaseException as exc:  # handed to whoever waits on the future
                fut.set_exception(exc)

    def close(self, *, wait: bool = True) -> None:
        """Cancel the calls not started; with ``wait``, wait for those running to end."""
        with self._cond:
            self._closed = True
            pending = [*(it for _, it in self._shared), *(it for q in self._own for it in q)]
            self._shared.clear()
            for q in self._own:
                q.clear()
            self._cond.notify_all()
        for fut, _, _ in pending:
            fut.cancel()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()
