"""Where a campaign's work runs: references on a process pool, kernels on isolated workers.

A campaign has two kinds of work. *References* (the oracle, the same-precision naive baseline
and the bounds of every arithmetic class for one case) are pure CPU work: they go to a pool of
processes over the machine's cores. *Kernel calls* (and structural properties, which call the
kernel several times) go to isolated kernel workers (:class:`KernelWorker`): one per visible GPU
when the kernels run on CUDA, one per core on a CPU machine. The campaign submits work ahead and
consumes results in plan order, so what it writes does not depend on who finished first.

Results are bitwise identical whatever the number of workers: every worker process computes
single-threaded (``OMP_NUM_THREADS=1`` and friends, set before it starts, and one torch thread),
so no float64 sum is split differently across threads; the campaign process itself only judges
(elementwise numpy). :class:`LocalExecutor` runs on this machine; :class:`RayExecutor` (the
``ray`` extra) runs the same two kinds of work on a Ray cluster.
"""

from __future__ import annotations

import concurrent.futures as cf
import math
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..adapters.outcome import Outcome
from ..adapters.probe import Runner
from ..adapters.worker import KernelRef, KernelWorker
from ..cases.case import Case
from ..cases.families import Recipe, make_case
from ..checks.accuracy import (
    case_oracle,
    gradient_oracle,
    naive_gradient_reference,
    naive_reference,
)
from ..checks.registry import check_target
from ..judging.bounds import Bounds, problem_bounds
from ..judging.gradient_bounds import GradientBounds, problem_gradient_bounds
from ..oracle.evaluate import OracleResult
from .dispatch import Dispatcher
from .phases import PhaseClock
from .processes import SINGLE_THREAD, gpu_count, pool_process_setup, warm, worker_gpus
from .stopping import await_manager, manager_of, release_reader, sigint_held

__all__ = [
    "Executor",
    "GradientReference",
    "LocalExecutor",
    "Reference",
    "compute_gradient_reference",
    "compute_reference",
]


@dataclass
class Reference:
    """What judging a case needs besides the kernel's output."""

    ref: OracleResult
    naive: tuple[float | None, float | None]
    every: Bounds  # class "unknown": its parts are every class's own bounds
    max_logit: float
    finite: bool
    seconds: float
    span: tuple[float, float] = (0.0, 0.0)  # wall clock (time.time()) of the whole work


def _max_logit(case: Case) -> float:
    """``max |scale·q·k|`` over finite entries, in float64 (for plotting, not for judging)."""
    *_, d, _ = case.shape
    tau = abs(case.scale) if case.scale is not None else 1 / math.sqrt(d)
    q = np.nan_to_num(case.q.astype(np.float64), nan=0, posinf=0, neginf=0)
    k = np.nan_to_num(case.k.astype(np.float64), nan=0, posinf=0, neginf=0)
    k = np.repeat(k, q.shape[1] // k.shape[1], axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.abs(tau * (q @ np.swapaxes(k, -1, -2)))
    s = s[np.isfinite(s)]
    return float(s.max()) if s.size else 0.0


def compute_reference(recipe: Recipe) -> Reference:
    """The oracle, the naive baseline and every class's bounds for ``make_case(recipe)``."""
    began = time.time()
    case = make_case(recipe)
    t0 = time.perf_counter()
    # the inputs are validated and converted once, for both; each case once, so no memo
    ref = case_oracle(case, memo=False)
    naive = naive_reference(case, ref)
    seconds = time.perf_counter() - t0
    every = problem_bounds(case.problem, arithmetic="unknown")
    finite = all(bool(np.isfinite(x.astype(np.float32)).all()) for x in (case.q, case.k, case.v))
    return Reference(ref, naive, every, _max_logit(case), finite, seconds, (began, time.time()))


@dataclass
class GradientReference:
    """What judging a case's gradients needs besides the kernel's: the oracle with ``dO``, the
    naive backward's errors, and every class's gradient bounds."""

    ref: OracleResult
    naive: dict[str, float] | None
    every: GradientBounds  # class "unknown": its parts are every class's own bounds
    seconds: float
    span: tuple[float, float] = (0.0, 0.0)  # wall clock (time.time()) of the whole work


def compute_gradient_reference(recipe: Recipe) -> GradientReference:
    """The gradient oracle, the naive backward and every class's gradient bounds for
    ``make_case(recipe)`` and its ``dO`` (:meth:`Case.grad_output`)."""
    began = time.time()
    case = make_case(recipe)
    t0 = time.perf_counter()
    ref = gradient_oracle(case, memo=False)
    naive = naive_gradient_reference(case, ref)
    seconds = time.perf_counter() - t0
    every = problem_gradient_bounds(case.problem, case.grad_output(), arithmetic="unknown")
    return GradientReference(ref, naive, every, seconds, (began, time.time()))


class Executor:
    """The interface a campaign runs on: futures of references, and of kernel calls and
    structural checks. A kernel future's result is the call's
    :class:`~flashcheck.harness.adapters.outcome.Outcome` (a failure is never raised across
    processes). A kernel travels as a :class:`~flashcheck.harness.adapters.worker.KernelRef`
    (its spec and its whole contract); a structural check by its name
    (:data:`flashcheck.harness.checks.registry.CHECKS`).

    ``affinity``: ``None`` runs a kernel call on any free kernel worker; calls of the same int
    run on one worker, in the order submitted (a compiling kernel's calls of one compile key go
    to the worker that has compiled it); :class:`LocalExecutor` binds each int to the first
    free worker (:mod:`~flashcheck.harness.campaign.dispatch`). An executor
    whose workers share no compiled state may ignore it."""

    workers: int = 1
    kernel_workers: int = 1
    # Set to record the phase timeline (flashcheck.harness.campaign.phases): an executor that
    # can time its work adds its spans of reference work, kernel work and worker starts.
    clock: PhaseClock | None = None

    def reference(self, recipe: Recipe) -> cf.Future:
        raise NotImplementedError

    def run(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        raise NotImplementedError

    def gradient_reference(self, recipe: Recipe) -> cf.Future:
        raise NotImplementedError

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> cf.Future:
        """``fn(*args, **kwargs)`` on the reference processes: pure CPU work whose result does
        not depend on where it runs (``fn`` a module-level function, its arguments and result
        picklable)."""
        raise NotImplementedError

    def backward(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        raise NotImplementedError

    def check(
        self,
        name: str,
        ref: KernelRef,
        case: Case,
        device: str,
        calls: int,
        *,
        affinity: int | None = None,
    ) -> cf.Future:
        raise NotImplementedError

    def timed_reference(self, fut: cf.Future) -> cf.Future:
        """``fut`` (a reference's), whose span goes on the timeline when it is done."""
        if self.clock is not None:
            fut.add_done_callback(self._note_reference)
        return fut

    def _note_reference(self, fut: cf.Future) -> None:
        clock = self.clock
        if clock is not None and not fut.cancelled() and fut.exception() is None:
            clock.add("reference", *fut.result().span)

    def note_kernel_call(
        self,
        seen: set[tuple[str, str, int | None]],
        worker: int,
        fn: str,
        kind: str,
        affinity: int | None,
        args: tuple[Any, ...],
        begin: float,
        end: float,
        out: Any,
    ) -> None:
        """One kernel call ``fn(*args)`` of ``kind`` on ``worker``, from ``begin`` to ``end``, on
        the timeline; ``seen``: the compile groups that worker has called since its process
        started (updated here), which tells a group's first call."""
        ref: KernelRef = args[1] if fn == "check" else args[0]
        # A structural check calls the forward kernel: it shares the forward's compile groups.
        # A probe's cases have shapes of their own: its calls are a group of their own.
        compiled = {"backward": "backward", "probe": "probe"}.get(kind, "forward")
        group = (ref.spec, compiled, affinity)
        first = group not in seen
        seen.add(group)
        if self.clock is not None:
            inside = out.span if isinstance(out, Outcome) else None
            self.clock.add(
                "kernel", begin, end, worker=worker, kernel=ref.spec, call=kind, first=first,
                inside=inside,
            )  # fmt: skip

    def runner(self, ref: KernelRef, device: str) -> Runner:
        """A probe runner (:func:`flashcheck.harness.adapters.probe.probe`) over this
        executor's isolated kernel calls, all on one worker (a probe times repeated calls)."""

        def run(case: Case) -> Outcome:
            return self.run(ref, case, device, affinity=0).result()

        return run

    def close(self, *, interrupted: bool = False) -> None:
        """Stop the workers; ``interrupted`` (Ctrl-C): at once, without finishing the calls
        in flight."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self.close(interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))


class LocalExecutor(Executor):
    """References on ``workers`` processes, kernels on ``kernel_workers`` isolated workers
    (on CUDA, worker ``i`` sees GPU ``i % device_count`` only), all single-threaded.
    ``isolate=False`` runs everything in this process (no time limit: for debugging).
    ``kernels=False``: the reference processes only, for a campaign that calls its kernels
    itself and whose references need no torch (kernel calls are then refused)."""

    def __init__(
        self,
        *,
        workers: int | None = None,
        kernel_workers: int | None = None,
        device: str = "cpu",
        timeout: float = 300.0,
        isolate: bool = True,
        kernels: bool = True,
    ) -> None:
        cores = os.cpu_count() or 1
        self.workers = workers or cores
        gpus = gpu_count() if device == "cuda" and kernels else 0
        self.kernel_workers = kernel_workers or (gpus or cores)
        if self.workers < 1 or self.kernel_workers < 1:
            raise ValueError("workers and kernel workers must be >= 1")
        if not kernels:
            self.kernel_workers = 0
        self.isolate = isolate
        self._saved = {k: os.environ.get(k) for k in SINGLE_THREAD}
        if isolate:
            os.environ.update(SINGLE_THREAD)  # inherited by every process started below
        self._pool = None
        if isolate:
            self._pool = cf.ProcessPoolExecutor(
                self.workers,
                mp_context=mp.get_context("spawn"),
                initializer=pool_process_setup,
                initargs=(kernels,),
            )
        self._all: list[KernelWorker] = []
        visible = worker_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        for i in range(self.kernel_workers if isolate else min(1, self.kernel_workers)):
            env = {"CUDA_VISIBLE_DEVICES": visible[i % gpus]} if gpus else {}
            # On a GPU, a restart after a CUDA error is the common case: a standby child hides it.
            worker = KernelWorker(timeout=timeout, isolate=isolate, env=env, standby=bool(gpus))
            self._all.append(worker)
        if isolate:
            # Started now, not at the first call: the workers' imports (torch in each) and the
            # pool's overlap the caller's set-up and probing instead of delaying the first case.
            for w in self._all:
                w.start()
            for _ in range(self.workers):  # (the pool starts a process per task, up to workers)
                self._pool.submit(warm)
        # The compile groups each worker has called (kernel_time's "first call"), per call kind.
        self._seen: list[set[tuple[str, str, int | None]]] = [set() for _ in self._all]
        # None with kernels=False (a references-only pool).
        self._dispatch = Dispatcher(len(self._all), self._on_worker) if self._all else None

    def reference(self, recipe: Recipe) -> cf.Future:
        return self.timed_reference(self.submit(compute_reference, recipe))

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> cf.Future:
        if self._pool is not None:
            return self._pool.submit(fn, *args, **kwargs)
        fut: cf.Future = cf.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except Exception as err:  # as the pool's future would carry it
            fut.set_exception(err)
        return fut

    def _on_worker(self, i: int, fn: str, tag: tuple[int | None, str], *args: Any) -> Outcome:
        # Called from worker i's own dispatch thread only: one call at a time per worker.
        worker = self._all[i]
        seen = len(worker.starts)
        t0 = time.time()
        out = getattr(worker, fn)(*args)
        t1 = time.time()
        started = worker.starts[seen:]
        if started:  # a fresh process: nothing it compiled before is left
            self._seen[i].clear()
        affinity, kind = tag
        if self.clock is not None:
            # A call that (re)started its worker waited for the start first: that part is the
            # worker start's, not kernel work.
            for span in started:
                self.clock.add("worker start", *span)
        begin = max([t0, *(end for _, end in started)])
        self.note_kernel_call(self._seen[i], i, fn, kind, affinity, args, begin, t1, out)
        return out

    def _submit(self, affinity: int | None, fn: str, *args: Any, kind: str = "") -> cf.Future:
        if self._dispatch is None:
            raise ValueError("this executor was made with kernels=False: it runs no kernel calls")
        # The affinity and the kind of call (for the timeline; default: ``fn``) travel with
        # the call: the worker's thread marks a group's first call.
        return self._dispatch.submit(affinity, fn, (affinity, kind or fn), *args)

    def runner(self, ref: KernelRef, device: str) -> Runner:
        # As the base class's (every call on one worker, through group 0), recorded as probe
        # calls: the timeline keeps them apart from the campaign's calls of group 0.
        def run(case: Case) -> Outcome:
            return self._submit(0, "run", ref, case, device, kind="probe").result()

        return run

    def run(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        return self._submit(affinity, "run", ref, case, device)

    def gradient_reference(self, recipe: Recipe) -> cf.Future:
        return self.timed_reference(self.submit(compute_gradient_reference, recipe))

    def backward(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        return self._submit(affinity, "backward", ref, case, device)

    def check(
        self,
        name: str,
        ref: KernelRef,
        case: Case,
        device: str,
        calls: int,
        *,
        affinity: int | None = None,
    ) -> cf.Future:
        target = check_target(name)
        return self._submit(affinity, "check", target, ref, case, device, calls)

    def close(self, *, interrupted: bool = False) -> None:
        if interrupted:
            # A SIGINT sent to this process alone (kill -INT, timeout -s INT, a scheduler)
            # reaches no child: a kernel call or a reference in flight would hold the exit for
            # its whole duration (measured: 15 s for a 20 s kernel). The children are stopped
            # first, so the threads waiting on them return at once.
            try:
                # The command line restores SIGPIPE's default (for `| head`): a write to a pipe
                # of a child stopped here would then end this process mid-shutdown.
                signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            except (AttributeError, ValueError):  # no SIGPIPE here, or not the main thread
                pass
            # A second SIGINT must not stop this half-way, leaving processes alive: one is
            # common (`timeout -s INT` signals the process and then its group; an impatient
            # Ctrl-C), and Python's exit then waits on the pool's processes.
            with sigint_held():
                for w in self._all:
                    w.kill()
                for child in mp.active_children():
                    child.kill()
                if self._pool is not None:
                    release_reader(self._pool)
            if self._dispatch is not None:
                self._dispatch.close(wait=False)
        # A second Ctrl-C while shutting down must not leave processes behind: the steps are
        # retried without waiting.
        if self._dispatch is not None:
            try:
                self._dispatch.close(wait=True)
            except KeyboardInterrupt:
                self._dispatch.close(wait=False)
        # Every process exits at once (each tears down torch: seconds), not one after another.
        stops = [threading.Thread(target=w.close) for w in self._all]
        manager = manager_of(self._pool)
        if self._pool is not None:
            stop = {"wait": not interrupted, "cancel_futures": True}
            stops.append(threading.Thread(target=self._pool.shutdown, kwargs=stop))
        for t in stops:
            t.start()
        try:
            for t in stops:
                t.join()
        except KeyboardInterrupt:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
        if interrupted and manager is not None:
            with sigint_held():
                await_manager(manager)
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
