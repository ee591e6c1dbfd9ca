"""A time limit on every kernel call made in this process.

The report's dense campaign runs kernels in a child process that it kills past ``--timeout``
(:mod:`.worker`). The kernels called in the calling process itself (by ``flashcheck test`` and
the pytest plugin, the ragged and FP8 campaigns, ``flashcheck replay``) get their limit here:
inside :func:`limit_calls`, every call of a kernel's own function (the adapters wrap each one
in :func:`kernel_call`) is interrupted after ``seconds`` by an alarm signal, which raises
:class:`KernelHung` inside the kernel. The caller records it as ``TIMEOUT`` and goes on.

An alarm is delivered only between Python instructions: a call stuck outside Python (a GPU
kernel that never ends, a deadlock in a C extension) cannot be interrupted. For those a
watchdog thread waits ``grace`` seconds more, then says what hung, runs the policy's
``on_stuck`` (which records the case) and ends the process with exit status 1: a test run or a
campaign never waits for ever. The alarm needs the main thread of a POSIX process; elsewhere
(a worker thread, Windows) only the watchdog acts.

Outside :func:`limit_calls` (the default) a kernel call runs unlimited, as in a user's own
program.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CallLimit", "KernelHung", "current_limit", "kernel_call", "limit_calls"]


class KernelHung(BaseException):
    """A kernel call ran past its time limit.

    A ``BaseException``, not an ``Exception``: a kernel's own ``except Exception`` cannot
    swallow it, and Hypothesis stops at it instead of shrinking the example (each smaller
    example that hangs would cost the whole limit again)."""

    def __init__(self, what: str, seconds: float):
        super().__init__(f"{what} did not return within {seconds:g} s")
        self.what = what
        self.seconds = seconds


@dataclass(frozen=True)
class CallLimit:
    """How long one kernel call may take, and what to do while and after it overruns.

    ``seconds``: the limit. ``grace``: the seconds the watchdog waits past the limit for a call
    the alarm could not interrupt, before it ends the process. ``notice``: after this many
    seconds (``None``: never) ``say`` is called once with a line saying the call is still
    running and when it will be stopped. ``say``: where those lines go (default: stderr).
    ``on_stuck(what, case)``: called by the watchdog just before it ends the process (save the
    case; it must not raise)."""

    seconds: float
    grace: float = 30.0
    notice: float | None = 30.0
    say: Callable[[str], None] | None = None
    on_stuck: Callable[[str, Any], None] | None = None

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"a call limit needs seconds > 0, got {self.seconds!r}")
        if not self.grace > 0:
            raise ValueError(f"a call limit needs grace > 0, got {self.grace!r}")


class _State:
    policy: CallLimit | None = None
    depth = 0  # kernel calls in progress (a kernel that calls another: one limit, the outer)


def current_limit() -> CallLimit | None:
    """The limit of kernel calls in this process now (``None``: unlimited)."""
    return _State.policy


@contextlib.contextmanager
def limit_calls(policy: CallLimit | None) -> Iterator[CallLimit | None]:
    """Within the block, every kernel call in this process is limited by ``policy`` (``None``:
    unlimited); the previous policy is restored after it."""
    if policy is not None and not isinstance(policy, CallLimit):
        raise TypeError(f"limit_calls takes a CallLimit or None, got {type(policy).__name__}")
    saved = _State.policy
    _State.policy = policy
    try:
        yield policy
    finally:
        _State.policy = saved


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class _Job:
    """The kernel call the watchdog watches: its policy, name, input and start."""

    policy: CallLimit
    what: str
    case: Any
    started: float
    noticed: bool = False


class _Watchdog(threading.Thread):
    """One daemon thread for the process, woken at each call's start and end (a thread per
    call would cost more than the calls of a fast kernel)."""

    def __init__(self) -> None:
        super().__init__(name="flashcheck-watchdog", daemon=True)
        self.cv = threading.Condition()
        self.job: _Job | None = None

    def watch(self, job: _Job | None) -> None:
        with self.cv:
            self.job = job
            self.cv.notify()

    def run(self) -> None:
        with self.cv:
            while True:
                job = self.job
                if job is None:
                    self.cv.wait()
                    continue
                p = job.policy
                elapsed = time.monotonic() - job.started
                if p.notice is not None and p.notice < p.seconds and not job.noticed:
                    if elapsed >= p.notice:
                        job.noticed = True
                        (p.say or _stderr)(
                            f"flashcheck: {job.what} has not returned after {p.notice:g} s; it "
                            f"is stopped at {p.seconds:g} s (--timeout)"
                        )
                    else:
                        self.cv.wait(p.notice - elapsed)
                        continue
                if elapsed >= p.seconds + p.grace:
                    _stuck(job)
                self.cv.wait(p.seconds + p.grace - elapsed)


def _stuck(job: _Job) -> None:
    p = job.policy
    (p.say or _stderr)(
        f"flashcheck: {job.what} did not return within {p.seconds:g} s and could not be "
        f"interrupted ({p.grace:g} s later it was still running outside Python: a GPU kernel or "
        "a C extension); ending this process with exit status 1"
    )
    if p.on_stuck is not None:
        try:
            p.on_stuck(job.what, job.case)
        except BaseException as err:  # the exit below must happen whatever on_stuck raises
            _stderr(f"flashcheck: could not record the hung call: {type(err).__name__}: {err}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


_DOG: list[_Watchdog] = []
_DOG_LOCK = threading.Lock()


def _watchdog() -> _Watchdog:
    with _DOG_LOCK:
        if not _DOG or not _DOG[0].is_alive():
            _DOG[:] = [_Watchdog()]
            _DOG[0].start()
        return _DOG[0]


def _can_alarm() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def kernel_call(what: str, case: Any = None) -> Iterator[None]:
    """Run the block (one call of a kernel's own function, ``what`` naming it for the messages,
    ``case`` its input for ``on_stuck``) under the current :class:`CallLimit`: past
    ``seconds`` it raises :class:`KernelHung` (module docstring). No limit: nothing happens."""
    policy = _State.policy
    if policy is None or _State.depth:
        yield
        return
    dog = _watchdog()
    alarm = _can_alarm()
    previous: Any = None
    outer = (0.0, 0.0)
    started = time.monotonic()
    if alarm:

        def _ring(signum: int, frame: Any) -> None:
            raise KernelHung(what, policy.seconds)

        previous = signal.signal(signal.SIGALRM, _ring)
        # Someone else's alarm (pytest-timeout's signal method, say) is set again afterwards.
        outer = signal.setitimer(signal.ITIMER_REAL, policy.seconds)
    _State.depth += 1
    dog.watch(_Job(policy, what, case, started))
    try:
        yield
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
            if outer[0] > 0:
                left = outer[0] - (time.monotonic() - started)
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3), outer[1])
        _State.depth -= 1
        dog.watch(None)
