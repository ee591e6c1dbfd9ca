"""Kernel calls handed to kernel workers (harness/campaign/dispatch.py): a group's calls on the
worker that took its first one, in order, before that worker's other calls; no call waits
behind a busy worker while another is free; closing cancels what has not started."""

import threading

import pytest

from flashcheck.harness.campaign.dispatch import Dispatcher


class _Calls:
    """A stand-in for the kernel workers: records (worker, name) in call order; a call named
    ``hold`` blocks until released."""

    def __init__(self) -> None:
        self.log: list[tuple[int, str]] = []
        self.release = threading.Event()
        self.held = threading.Event()

    def __call__(self, i: int, fn: str, *args):
        if fn == "hold":
            self.held.set()
            assert self.release.wait(10)
        if fn == "boom":
            raise RuntimeError("kernel worker failed")
        self.log.append((i, fn))
        return (i, fn, args)


@pytest.fixture
def calls():
    return _Calls()


@pytest.fixture
def dispatcher(calls):
    """``dispatcher(n)``: a Dispatcher of ``n`` workers over ``calls``; at the end the held
    calls are released (no dispatch thread stays blocked) and every dispatcher closed."""
    made = []

    def make(n: int) -> Dispatcher:
        made.append(Dispatcher(n, calls))
        return made[-1]

    yield make
    calls.release.set()
    for d in made:
        d.close()


def test_shared_calls_run_on_the_free_worker_while_the_other_is_busy_with_its_group(
    calls, dispatcher
):
    d = dispatcher(2)
    hold = d.submit(7, "hold")
    assert calls.held.wait(10)
    worker = d.bound()[7]
    pinned = [d.submit(7, f"own{k}") for k in range(3)]
    shared = [d.submit(None, f"shared{k}") for k in range(6)]
    # Every shared call finishes on the other worker while the group's is held.
    assert [f.result(timeout=10)[0] for f in shared] == [1 - worker] * 6
    assert not hold.done() and not any(f.done() for f in pinned)
    calls.release.set()
    assert [f.result(timeout=10)[:2] for f in pinned] == [(worker, f"own{k}") for k in range(3)]
    assert hold.result(timeout=10) == (worker, "hold", ())


def test_a_worker_takes_its_groups_calls_before_shared_ones_and_errors_reach_the_caller(
    calls, dispatcher
):
    d = dispatcher(1)
    hold = d.submit(0, "hold")  # binds group 0 to the worker
    assert calls.held.wait(10)
    later = [d.submit(None, "shared"), d.submit(0, "own", 7), d.submit(0, "boom")]
    calls.release.set()
    hold.result(timeout=10)
    assert later[1].result(timeout=10) == (0, "own", (7,))
    with pytest.raises(RuntimeError, match="kernel worker failed"):
        later[2].result(timeout=10)
    later[0].result(timeout=10)
    assert [fn for _, fn in calls.log] == ["hold", "own", "shared"]


def test_a_groups_calls_queued_before_it_was_bound_follow_it_and_new_groups_go_to_free_workers(
    calls, dispatcher
):
    d = dispatcher(2)
    # Group 5's first call holds its worker; its later calls, queued before any worker
    # took one, must still run there, while group 6 and free calls go to the other.
    first = d.submit(5, "hold")
    later = [d.submit(5, "five") for _ in range(3)]
    assert calls.held.wait(10)
    other = [d.submit(6, "six") for _ in range(2)] + [d.submit(None, "free")]
    w5 = d.bound()[5]
    assert {f.result(timeout=10)[0] for f in other} == {1 - w5}
    assert d.bound() == {5: w5, 6: 1 - w5}
    assert not any(f.done() for f in later)
    calls.release.set()
    assert {f.result(timeout=10)[0] for f in [first, *later]} == {w5}


def test_closing_cancels_calls_not_started_and_refuses_new_ones(calls, dispatcher):
    d = dispatcher(1)
    hold = d.submit(0, "hold")
    assert calls.held.wait(10)
    waiting = [d.submit(0, "own"), d.submit(None, "shared")]
    closer = threading.Thread(target=d.close)
    closer.start()
    calls.release.set()
    closer.join(10)
    assert not closer.is_alive() and hold.result(timeout=1)[1] == "hold"
    assert all(f.cancelled() for f in waiting)
    with pytest.raises(RuntimeError, match="after the executor closed"):
        d.submit(None, "late")
    with pytest.raises(ValueError, match="workers must be >= 1"):
        Dispatcher(0, calls)
