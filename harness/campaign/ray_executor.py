"""A campaign on a Ray cluster: ``flashcheck report --executor ray [--address ...]``.

The same two kinds of work as :class:`~flashcheck.harness.campaign.executor.LocalExecutor`,
scheduled by Ray: each reference (oracle, naive baseline, bounds of one case) is a Ray task of
one CPU; kernels run in Ray actors of one GPU each (for a CPU campaign, as many actors as the
cluster has CPUs). An actor
is the kernel's isolated process, as a kernel worker is locally: a call past the time limit
kills it and a fresh actor takes its place, as does an actor that died (a crash) or an
exception that mentions CUDA. The campaign process
(the driver) writes the JSONL and renders the report; results are bitwise identical to a local
run, because every worker computes single-threaded.

What is shipped to the workers: the inputs of each task (a recipe, a case's arrays) and the
kernel's reference (:class:`~flashcheck.harness.adapters.worker.KernelRef`: its spec and its
whole contract). Workers import flashcheck and the kernel's module themselves, so both must be
installed on every node (a local instance finds the driver's current directory through
``PYTHONPATH``, set for its workers). Requires ``pip install 'flashcheck[ray]'``.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import time
from typing import Any

from ..adapters.outcome import DIED, Outcome, died
from ..adapters.probe import Runner
from ..adapters.worker import KernelRef, KernelWorker, poisoned
from ..cases.case import Case
from ..cases.families import Recipe
from ..checks.registry import check_target
from ..core.status import Status
from .executor import (
    Executor,
    compute_gradient_reference,
    compute_reference,
)
from .processes import SINGLE_THREAD

__all__ = ["KernelActor", "RayExecutor", "apply"]


class KernelActor:
    """A Ray actor that runs kernel calls in its own process (Ray's worker process is the
    isolation; the driver enforces the time limit and replaces the actor)."""

    def __init__(self) -> None:
        self.worker = KernelWorker(isolate=False)

    def call(self, fn: str, *args: Any) -> Outcome:
        return getattr(self.worker, fn)(*args)


def apply(fn: Any, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - runs in Ray
    """``fn(*args, **kwargs)``: the body of a Ray task of :meth:`RayExecutor.submit`."""
    return fn(*args, **kwargs)


class RayExecutor(Executor):
    """References as Ray tasks, kernels on Ray actors; ``address`` None starts a Ray instance
    on this machine (and stops it at the end). ``kernels=False``: tasks only, no actor (for a
    campaign that calls its kernels itself)."""

    def __init__(
        self,
        *,
        address: str | None = None,
        device: str = "cpu",
        timeout: float = 300.0,
        kernel_workers: int | None = None,
        kernels: bool = True,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise ValueError("--executor ray needs Ray: pip install 'flashcheck[ray]'") from None
        self._ray = ray
        path = os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)
        env = {**SINGLE_THREAD, "PYTHONPATH": path}
        self._started = not ray.is_initialized()
        if self._started:
            ray.init(
                address=address,
                runtime_env={"env_vars": env},
                include_dashboard=False,
                log_to_driver=False,
                logging_level="ERROR",
            )
        resources = ray.cluster_resources()
        self.workers = max(1, int(resources.get("CPU", 1)))
        gpus = int(resources.get("GPU", 0)) if device == "cuda" else 0
        self.kernel_workers = (kernel_workers or (gpus or self.workers)) if kernels else 0
        # A CPU actor keeps Ray's default (a CPU to be placed, none held while it runs), so
        # that kernel actors never starve the reference tasks of CPUs.
        self._actor = ray.remote(num_gpus=1)(KernelActor) if gpus else ray.remote(KernelActor)
        self.timeout = float(timeout)
        # (slot, actor): a replaced actor keeps its slot, the timeline's worker number.
        self._free: queue.Queue = queue.Queue()
        for slot in range(self.kernel_workers):
            self._free.put((slot, self._actor.remote()))
        # The compile groups each slot's actor has called (the timeline's first calls).
        self._seen: list[set[tuple[str, str, int | None]]] = [
            set() for _ in range(self.kernel_workers)
        ]
        self._reference = ray.remote(num_cpus=1)(compute_reference)
        self._gradient_reference = ray.remote(num_cpus=1)(compute_gradient_reference)
        self._apply = ray.remote(num_cpus=1)(apply)
        self._threads = cf.ThreadPoolExecutor(max(1, self.kernel_workers), thread_name_prefix="ray")

    def reference(self, recipe: Recipe) -> cf.Future:
        return self.timed_reference(self._reference.remote(recipe).future())

    def submit(self, fn: Any, *args: Any, **kwargs: Any) -> cf.Future:
        return self._apply.remote(fn, *args, **kwargs).future()

    def _on_actor(self, fn: str, *args: Any, calls: int = 1, kind: str = "") -> Outcome:
        from ray.exceptions import GetTimeoutError, RayActorError

        if not self.kernel_workers:
            raise ValueError("this executor was made with kernels=False: it runs no kernel calls")
        slot, actor = self._free.get()
        began = time.time()
        try:
            out = self._ray.get(actor.call.remote(fn, *args), timeout=self.timeout * calls)
        except GetTimeoutError:
            out = Outcome.failed(Status.TIMEOUT, f"no result within {self.timeout * calls:g} s")
        except RayActorError as err:
            out = Outcome.failed(Status.ERROR, f"{DIED} ({type(err).__name__})")
        # (The wait for the actor's result: its start, if new, is not told apart.)
        self.note_kernel_call(
            self._seen[slot], slot, fn, kind or fn, None, args, began, time.time(), out
        )
        if out.status is Status.TIMEOUT or (
            out.status is Status.ERROR and (poisoned(out.message) or died(out))
        ):
            self._ray.kill(actor)
            actor = self._actor.remote()
            self._seen[slot].clear()  # a fresh process: nothing it compiled is left
        self._free.put((slot, actor))
        return out

    def runner(self, ref: KernelRef, device: str) -> Runner:
        # The probe's calls, recorded as such on the timeline (as the local executor does).
        def run(case: Case) -> Outcome:
            return self._threads.submit(
                self._on_actor, "run", ref, case, device, kind="probe"
            ).result()

        return run

    # ``affinity`` is ignored: any free actor runs a call (a compiling kernel compiles each key
    # once per actor).
    def run(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        return self._threads.submit(self._on_actor, "run", ref, case, device)

    def gradient_reference(self, recipe: Recipe) -> cf.Future:
        return self.timed_reference(self._gradient_reference.remote(recipe).future())

    def backward(
        self, ref: KernelRef, case: Case, device: str, *, affinity: int | None = None
    ) -> cf.Future:
        # The KernelWorker's backward (in-process in the actor) has no limit of its own; the
        # driver's wait is twice a forward call's, as for a local worker.
        return self._threads.submit(self._on_actor, "backward", ref, case, device, calls=2)

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
        return self._threads.submit(
            self._on_actor, "check", target, ref, case, device, calls, calls=calls
        )

    def close(self, *, interrupted: bool = False) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        while not self._free.empty():
            self._ray.kill(self._free.get()[1])
        if self._started:
            self._ray.shutdown()
