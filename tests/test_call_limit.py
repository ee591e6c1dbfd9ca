"""The time limit on kernel calls made in this process (harness/adapters/call_limit.py)."""

import subprocess
import sys
import textwrap
import time

import pytest

from flashcheck.harness.adapters.call_limit import (
    CallLimit,
    KernelHung,
    current_limit,
    kernel_call,
    limit_calls,
)
from flashcheck.harness.adapters.outcome import call_kernel
from flashcheck.harness.core.status import Status

# serial: wall-clock limits and budgets (tox runs them alone, conftest.py).
pytestmark = pytest.mark.serial


def _spin(seconds: float) -> str:
    """A kernel that tries to swallow every exception while it sleeps."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            time.sleep(0.01)
        except Exception:  # a kernel's own handler must not hide the time limit
            return "swallowed"
    return "returned"


def test_a_call_past_its_limit_is_stopped_inside_the_kernel():
    before = current_limit()  # (the plugin's, in a run with kernels under test)
    t0 = time.monotonic()
    with limit_calls(CallLimit(0.3, notice=None)), pytest.raises(KernelHung) as err:
        with kernel_call("k:fn"):
            _spin(30)
    assert time.monotonic() - t0 < 5
    assert str(err.value) == "k:fn did not return within 0.3 s"
    assert current_limit() is before  # restored after the block


def test_without_a_limit_or_within_it_nothing_happens():
    with limit_calls(None), kernel_call("k:fn"):
        assert _spin(0.2) == "returned"  # no limit: not stopped
    with limit_calls(CallLimit(5.0)), kernel_call("k:fn"):
        assert _spin(0.1) == "returned"
        with kernel_call("k:inner"):  # a kernel calling another: one limit, the outer's
            assert _spin(0.05) == "returned"


def test_call_kernel_records_a_stopped_call_as_timeout():
    with limit_calls(CallLimit(0.2, notice=None)):

        def hung():
            with kernel_call("k:fn"):
                _spin(30)

        out = call_kernel(hung)
    assert out.status is Status.TIMEOUT and "did not return within 0.2 s" in out.message


def test_bad_limits_are_refused():
    with pytest.raises(ValueError, match="seconds > 0"):
        CallLimit(0)
    with pytest.raises(TypeError, match="CallLimit or None"):
        with limit_calls(3.0):
            pass


def test_a_call_stuck_outside_python_ends_the_process_after_recording_it():
    # Blocking SIGALRM stands in for a thread stuck in C (a GPU sync): the alarm cannot reach
    # it, so the watchdog says so, runs on_stuck and exits with status 1.
    code = textwrap.dedent(
        """
        import signal, time
        from flashcheck.harness.adapters.call_limit import CallLimit, kernel_call, limit_calls

        def stuck(what, case):
            print("recorded", what, case, flush=True)

        with limit_calls(CallLimit(0.3, grace=0.3, notice=0.1, on_stuck=stuck)):
            with kernel_call("k:fn", case="the case"):
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(30)
        print("not reached")
        """
    )
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 20
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout == "recorded k:fn the case\n"
    assert "k:fn has not returned after 0.1 s; it is stopped at 0.3 s" in out.stderr
    assert "could not be interrupted" in out.stderr and "exit status 1" in out.stderr


def test_an_alarm_set_outside_is_kept():
    # (pytest-timeout's signal method uses SIGALRM too)
    import signal

    rang = []
    before = signal.signal(signal.SIGALRM, lambda *_: rang.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.4)
        with limit_calls(CallLimit(5.0)), kernel_call("k:fn"):
            _spin(0.1)
        time.sleep(0.6)
        assert rang == [True]  # the outer alarm still went off, once, with its own handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
