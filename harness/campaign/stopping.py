"""How an interrupted campaign stops its processes at once and leaves nothing behind: SIGINT
held off while children are killed, the process pool's reader and manager threads released
so that neither the shutdown nor Python's exit waits on them or trips over them. The pool
exposes neither thread (Python 3.14 adds ``kill_workers`` for the first), so its attributes
are looked up defensively."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["await_manager", "manager_of", "release_reader", "sigint_held"]


@contextlib.contextmanager
def sigint_held() -> Iterator[None]:
    """SIGINT ignored in the block (in the main thread; elsewhere nothing changes)."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: signals reach the main thread only anyway
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def manager_of(pool: cf.ProcessPoolExecutor | None) -> threading.Thread | None:
    """The manager thread of ``pool`` (``None`` without one). Take it before a shutdown, which
    drops the pool's reference to it."""
    thread = getattr(pool, "_executor_manager_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def await_manager(thread: threading.Thread, timeout: float = 2.0) -> None:
    """Wait (at most ``timeout`` s) for a process pool's manager ``thread`` to end after a
    shutdown that did not wait. Python 3.11's exit wakes each pool's manager thread through a
    pipe that the thread closes as it ends, with no lock between the two
    (python/cpython#125451, fixed in later versions); an exit at that moment printed "OSError:
    [Errno 9] Bad file descriptor" after the "interrupted" line (a CI run of the SIGINT test).
    Once the thread has ended, the exit finds the pipe closed and leaves it alone. Python's
    exit joins that thread anyway, without a bound."""
    if thread.is_alive():
        thread.join(timeout)


def release_reader(pool: cf.ProcessPoolExecutor) -> None:
    """Let the reader thread of ``pool``, whose processes were just killed, end. A process
    killed while it wrote a result (a reference: megabytes) leaves half a message in the result
    pipe, and the reader waits for the rest for ever, holding up the pool's shutdown and this
    process's exit (measured: 2 of 4 kills of processes sending 160 MB results; after a Ctrl-C
    on a 2-core machine). Closing this process's own end of that pipe's writer ends the wait:
    the reader gets end-of-file and takes the pool for broken. Python 3.11-3.13 give no public
    way (3.14 adds ``kill_workers``), hence the attribute names, looked up defensively."""
    kill = getattr(pool, "kill_workers", None)
    if callable(kill):  # Python >= 3.14
        kill()
        return
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        with contextlib.suppress(OSError):
            writer.close()
