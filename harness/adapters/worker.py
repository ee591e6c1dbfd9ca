"""Running kernels in a child process, so a kernel that hangs or crashes cannot stop its caller.

:class:`KernelWorker` keeps one child process (``multiprocessing`` *spawn*: no state inherited
from the parent, safe with CUDA) that runs kernels on cases sent over a pipe: a plain call
(:meth:`KernelWorker.run`), a backward call, or a structural check, which calls the kernel
several times (:meth:`KernelWorker.check`). The kernel travels as a :class:`KernelRef`: its spec
and every contract field the parent knows (declared, overridden on the command line, probed),
so the kernel the child runs has exactly the parent's contract. The parent waits at most
``timeout`` seconds per kernel call; past that it kills the child (and its CUDA context with it)
and starts a fresh one for the next call. Every request answers one
:class:`~flashcheck.harness.adapters.outcome.Outcome`: a kernel that raises is reported with its
exception, a child that dies (segfault, ``os._exit``) as a crash, a hang as ``TIMEOUT``.

The child is replaced only when it must be: after a crash, a timeout, or an exception that
mentions CUDA (a device error can leave the context unusable). A Python exception the kernel
raised (a shape it rejects, a bug) leaves the child as it is: starting a new one means importing
torch and initialising CUDA again, seconds per call.

``KernelWorker(isolate=False)`` runs kernels in the calling process instead (no timeout): for
debugging with pdb, for a Ray actor (whose process is the isolation), and for tests of code that
is not about isolation.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Any

from ..cases.case import Case
from ..core.status import Status
from .adapter import Kernel
from .outcome import DIED, Outcome, call_kernel, describe
from .registry import resolve

__all__ = ["KernelRef", "KernelWorker", "poisoned"]

_ENV_LOCK = threading.Lock()
# Kernel fields that hold functions: rebuilt in the worker by resolving the spec (a closure or a
# lambda does not pickle), never sent.
_CALLABLE_FIELDS = ("fn", "check_available", "check_case")
# Seconds a new child may take to start (spawn, import torch) before it counts as hung.
START_SECONDS = 120.0


@dataclass(frozen=True)
class KernelRef:
    """A picklable reference to a :class:`~flashcheck.harness.adapters.adapter.Kernel`: the
    ``spec`` that :func:`~flashcheck.harness.adapters.registry.resolve` finds its functions by,
    and its contract (every other field, as ``(name, value)`` pairs). :meth:`kernel` rebuilds
    the kernel with exactly that contract."""

    spec: str
    contract: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, kernel: Kernel, spec: str) -> KernelRef:
        """The reference of ``kernel``, whose functions ``resolve(spec)`` finds."""
        if not isinstance(kernel, Kernel):
            raise TypeError(f"KernelRef.of takes a Kernel, got {type(kernel).__name__}")
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"KernelRef.of needs the kernel's spec string, got {spec!r}")
        pairs = []
        for f in fields(Kernel):
            value = getattr(kernel, f.name)
            if f.name in _CALLABLE_FIELDS or (f.name == "backward" and callable(value)):
                continue
            pairs.append((f.name, value))
        return cls(spec, tuple(pairs))

    def kernel(self, cache: dict[str, Kernel] | None = None) -> Kernel:
        """The kernel: ``resolve(spec)`` (kept in ``cache``, by spec) with this contract."""
        base = cache.get(self.spec) if cache is not None else None
        if base is None:
            base = resolve(self.spec)
            if cache is not None:
                cache[self.spec] = base
        return replace(base, **dict(self.contract))


def _function(target: str) -> Any:
    """The function ``"package.module:name"`` (a structural check, named by the layer that
    owns it, so this layer imports nothing above it)."""
    mod, _, name = target.partition(":")
    return getattr(importlib.import_module(mod), name)


def _call(kernels: dict[str, Kernel], msg: tuple) -> Outcome:
    """Execute one request (:func:`_execute`); the outcome carries when this process spent on
    it, which the phase timeline sets apart from the pipe's transfers and waits."""
    began = time.time()
    out = _execute(kernels, msg)
    return replace(out, span=(began, time.time()))


def _execute(kernels: dict[str, Kernel], msg: tuple) -> Outcome:
    """Execute one request: ``("run", ref, case, device)``, ``("backward", ref, case, device)``
    or ``("check", target, ref, case, device)``."""
    kind, *args = msg
    if kind == "check":
        target, ref, case, device = args
        try:
            kern, check = ref.kernel(kernels), _function(target)
        except Exception as err:  # the spec or the check cannot be loaded in this process
            return Outcome.failed(Status.ERROR, describe(err))
        return call_kernel(check, kern, case, device)
    ref, case, device = args
    try:
        kern = ref.kernel(kernels)
    except Exception as err:
        return Outcome.failed(Status.ERROR, describe(err))
    return call_kernel(kern.run if kind == "run" else kern.run_backward, case, device)


def _serve(conn) -> None:  # pragma: no cover - runs in the child process
    import signal

    # Ctrl-C reaches the whole process group; the parent handles it and stops this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.environ.get("OMP_NUM_THREADS") == "1":
        # A single-threaded campaign (flashcheck.harness.campaign.executor): torch too, so
        # results do not depend on how many workers share the machine.
        try:
            import torch

            torch.set_num_threads(1)
        except ImportError:
            pass
    # Started: the parent times a worker's start (spawn and imports) from this message.
    conn.send(("ready", time.time()))
    kernels: dict[str, Kernel] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        out = _call(kernels, msg)
        try:
            conn.send(out)
        except OSError:  # the campaign stopped (Ctrl-C) while this call ran: nobody to tell
            return


def poisoned(message: str) -> bool:
    """Whether an exception may have left the device unusable (then the child is replaced)."""
    low = message.lower()
    return "cuda" in low or "device-side" in low or "illegal memory" in low


class KernelWorker:
    """Run a kernel (``ref.kernel().run(case, device)``, its backward, or a structural check)
    with a time limit, in a child process; every call answers an :class:`Outcome`."""

    def __init__(
        self,
        *,
        timeout: float = 300.0,
        isolate: bool = True,
        env: dict[str, str] | None = None,
        standby: bool = False,
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.isolate = isolate
        self.env = dict(env or {})  # extra environment of the child (e.g. the GPU it sees)
        # A second child kept started once the first has answered a call, so that replacing a
        # child (after a crash, a timeout or a CUDA error) waits for no imports: a GPU worker's
        # restart took 3.5-4 s of the campaign's serial time each (benchmarks/RESULTS.md).
        self.standby = standby and isolate
        self._spare: tuple[Any, Any, float] | None = None  # (process, pipe, spawned)
        self._proc = None
        self._conn = None
        self._local: dict[str, Kernel] = {}
        self.restarts = 0
        # (spawned, ready) wall-clock times (time.time()) of every child started so far.
        self.starts: list[tuple[float, float]] = []
        self._spawned: float | None = None  # a child started whose ready message is unread

    def __enter__(self) -> KernelWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Start the child process now, without waiting for it (its imports overlap whatever
        the caller does next); a call waits for it. Nothing when it runs or ``isolate=False``."""
        if self.isolate and (self._proc is None or not self._proc.is_alive()):
            self._start()

    def _start(self) -> None:
        if self._spare is not None and self._spare[0].is_alive():
            self._proc, self._conn, self._spawned = self._spare
            self._spare = None
            return
        self._drop_spare()
        self._proc, self._conn, self._spawned = self._spawn()

    def _spawn(self) -> tuple[Any, Any, float]:
        spawned = time.time()
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="flashcheck-kernel")
        with _ENV_LOCK:  # a spawned child takes this process's environment as it is now
            saved = {k: os.environ.get(k) for k in self.env}
            os.environ.update(self.env)
            try:
                proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        child.close()
        return proc, parent, spawned

    def _keep_spare(self) -> None:
        if self.standby and self._spare is None:
            self._spare = self._spawn()

    def _drop_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare[0].kill()
            spare[0].join()
            spare[1].close()

    def close(self) -> None:
        """Stop the child process (politely, then by force), and the standby child."""
        self._drop_spare()
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        fresh, self._spawned = self._spawned is not None, None
        if proc is None:
            return
        if fresh:  # started but never called: nothing to finish politely
            proc.kill()
            proc.join()
            conn.close()
            return
        try:
            conn.send(None)
        except (OSError, BrokenPipeError):
            pass
        proc.join(timeout=2)
        if proc.is_alive():
            proc.kill()
            proc.join()
        conn.close()

    def kill(self) -> None:
        """Stop the child process now, its call unfinished (the run was interrupted), and the
        standby child."""
        self._drop_spare()
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        self._spawned = None
        if proc is not None:
            proc.kill()
            proc.join()
            conn.close()

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._conn.close()
        self._proc = self._conn = None
        self._spawned = None
        self.restarts += 1

    def _request(self, msg: tuple, timeout: float) -> Outcome:
        if not self.isolate:
            return _call(self._local, msg)
        return self._remote(msg, timeout)

    def _died(self) -> Outcome:
        self._proc.join()  # reaped: its exit code is known
        code = self._proc.exitcode
        self._kill()
        return Outcome.failed(Status.ERROR, f"{DIED} (exit code {code})")

    def _ready(self, timeout: float) -> Outcome | None:
        """Wait for a started child's ready message; a failed outcome if it dies or does not
        start within ``timeout`` seconds (at least :data:`START_SECONDS`: the imports are no
        part of a kernel's time limit)."""
        timeout = max(timeout, START_SECONDS)
        deadline = time.monotonic() + timeout
        while not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            if not self._proc.is_alive():
                return self._died()
            if time.monotonic() >= deadline:
                self._kill()
                why = f"the kernel process did not start in {timeout:g} s"
                return Outcome.failed(Status.TIMEOUT, why)
        try:
            _, ready = self._conn.recv()
        except EOFError:
            return self._died()
        self.starts.append((self._spawned or ready, ready))
        self._spawned = None
        return None

    def _remote(self, msg: tuple, timeout: float) -> Outcome:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        if self._spawned is not None:
            failed = self._ready(timeout)
            if failed is not None:
                return failed
        try:
            self._conn.send(msg)
        except (OSError, BrokenPipeError):
            self._kill()
            return Outcome.failed(Status.ERROR, f"{DIED} before the call")
        deadline = time.monotonic() + timeout
        while not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            if not self._proc.is_alive():
                return self._died()
            if time.monotonic() >= deadline:
                self._kill()
                return Outcome.failed(Status.TIMEOUT, f"no result within {timeout:g} s")
        try:
            out = self._conn.recv()
        except EOFError:
            return self._died()
        if out.status is Status.ERROR and poisoned(out.message):
            self._kill()  # a fresh process and CUDA context for the next call
        self._keep_spare()
        return out

    def run(self, ref: KernelRef, case: Case, device: str) -> Outcome:
        """The kernel's :class:`~flashcheck.harness.adapters.adapter.KernelOutput` on ``case``
        (the outcome's value), or why there is none."""
        return self._request(("run", _checked(ref), case, device), self.timeout)

    def backward(self, ref: KernelRef, case: Case, device: str) -> Outcome:
        """The kernel's gradients for the case's ``dO`` (``Kernel.run_backward``), or why there
        are none; the time limit is twice a forward call's (a backward runs the forward too)."""
        return self._request(("backward", _checked(ref), case, device), 2 * self.timeout)

    def check(self, target: str, ref: KernelRef, case: Case, device: str, calls: int) -> Outcome:
        """The structural check ``target`` (``"package.module:function"``, called as
        ``function(kernel, case, device)``) on ``case``, run in the child with ``calls`` times
        the per-call time limit; the outcome's value is what the check returned."""
        if not isinstance(target, str) or ":" not in target:
            raise ValueError(f"a check is named 'package.module:function', got {target!r}")
        return self._request(("check", target, _checked(ref), case, device), self.timeout * calls)


def _checked(ref: KernelRef) -> KernelRef:
    if not isinstance(ref, KernelRef):
        raise TypeError(
            f"the worker takes a KernelRef (KernelRef.of(kernel, spec)), got {type(ref).__name__}"
        )
    return ref
