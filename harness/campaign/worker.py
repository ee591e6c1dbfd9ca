"""Running kernels in a child process, so a kernel that hangs or crashes cannot stop a campaign.

:class:`KernelWorker` keeps one child process (``multiprocessing`` *spawn*: no state inherited
from the parent, safe with CUDA) that resolves kernels by their spec and runs them on cases
sent over a pipe: a plain call (:meth:`KernelWorker.run`) or a structural property, which calls
the kernel several times (:meth:`KernelWorker.check`). The parent waits at most ``timeout``
seconds per kernel call; past that it kills the child (and its CUDA context with it) and starts
a fresh one for the next call. A kernel that raises is reported with its exception; a child
that dies (segfault, ``os._exit``) is reported as a crash.

The child is replaced only when it must be: after a crash, a timeout, or an exception that
mentions CUDA (a device error can leave the context unusable). A Python exception the kernel
raised (a shape it rejects, a bug) leaves the child as it is: starting a new one means importing
torch and initialising CUDA again, seconds per call.

``KernelWorker(isolate=False)`` runs kernels in the calling process instead (no timeout): for
debugging with pdb, and for tests of code that is not about isolation.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from ..adapters.adapter import (
    KernelGradients,
    KernelOutput,
    KernelOutputError,
    KernelUnsupported,
)
from ..adapters.probe import ProbeFailure, ProbeTimeout
from ..adapters.registry import resolve
from ..cases.case import Case
from ..judging.structural import CHECKS

__all__ = ["KernelFailure", "KernelWorker", "poisoned", "probe_runner"]

_ENV_LOCK = threading.Lock()


@dataclass(frozen=True)
class KernelFailure(Exception):
    """A kernel call that produced no judgeable output.

    ``status``: ``"ERROR"`` (the kernel raised, or its process died), ``"TIMEOUT"`` (it ran
    past the per-case limit), ``"BAD-OUTPUT"`` (it returned the wrong shape or type) or
    ``"SKIP"`` (it declined the input:
    :class:`flashcheck.harness.adapters.adapter.KernelUnsupported`).
    """

    status: str
    message: str

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


def _call(kernels: dict[str, Any], msg: tuple) -> tuple[str, Any]:
    """Execute one request: ``("run", spec, case, device)``, ``("backward", spec, case,
    device)`` or ``("check", name, spec, case, device)``; returns ``(status, payload)``."""
    kind, *args = msg
    try:
        if kind in ("run", "backward"):
            spec, case, device = args
            if spec not in kernels:
                kernels[spec] = resolve(spec)
            call = kernels[spec].run if kind == "run" else kernels[spec].run_backward
            return "ok", call(case, device)
        name, spec, case, device = args
        if spec not in kernels:
            kernels[spec] = resolve(spec)
        return "ok", CHECKS[name](kernels[spec], case, device)
    except KernelOutputError as err:
        return "BAD-OUTPUT", str(err)
    except KernelUnsupported as err:
        return "SKIP", str(err)
    except Exception as err:  # report anything the kernel raises; the parent decides
        tb = traceback.extract_tb(err.__traceback__)
        where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
        return "ERROR", f"{_with_causes(err)}{where}"


def _with_causes(err: BaseException) -> str:
    """``Type: message``, followed by the exceptions it was raised from: Triton's
    ``CompilationError`` shows only the source excerpt, and the reason is in its cause."""
    parts, seen = [], set()
    while err is not None and id(err) not in seen and len(parts) < 4:
        seen.add(id(err))
        parts.append(f"{type(err).__name__}: {err}")
        err = err.__cause__
    return " <- caused by ".join(parts)


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
    kernels: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        conn.send(_call(kernels, msg))


def poisoned(message: str) -> bool:
    """Whether an exception may have left the device unusable (then the child is replaced)."""
    low = message.lower()
    return "cuda" in low or "device-side" in low or "illegal memory" in low


class KernelWorker:
    """Run ``resolve(spec).run(case, device)`` (or a structural property) with a time limit,
    in a child process."""

    def __init__(
        self, *, timeout: float = 300.0, isolate: bool = True, env: dict[str, str] | None = None
    ) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.isolate = isolate
        self.env = dict(env or {})  # extra environment of the child (e.g. the GPU it sees)
        self._proc = None
        self._conn = None
        self._local: dict[str, Any] = {}
        self.restarts = 0

    def __enter__(self) -> KernelWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
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
        self._proc, self._conn = proc, parent

    def close(self) -> None:
        """Stop the child process (politely, then by force)."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is None:
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

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
            self._conn.close()
        self._proc = self._conn = None
        self.restarts += 1

    def _request(self, msg: tuple, timeout: float) -> Any:
        if not self.isolate:
            status, payload = _call(self._local, msg)
        else:
            status, payload = self._remote(msg, timeout)
        if status != "ok":
            raise KernelFailure(status, payload)
        return payload

    def _remote(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send(msg)
        except (OSError, BrokenPipeError):
            self._kill()
            return "ERROR", "the kernel process died before the call"
        deadline = time.monotonic() + timeout
        while not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            if not self._proc.is_alive():
                self._proc.join()  # reaped: its exit code is known
                code = self._proc.exitcode
                self._kill()
                return "ERROR", f"the kernel process died (exit code {code})"
            if time.monotonic() >= deadline:
                self._kill()
                return "TIMEOUT", f"no result within {timeout:g} s"
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self._proc.join()
            code = self._proc.exitcode
            self._kill()
            return "ERROR", f"the kernel process died (exit code {code})"
        if status == "ERROR" and poisoned(payload):
            self._kill()  # a fresh process and CUDA context for the next call
        return status, payload

    def run(self, spec: str, case: Case, device: str) -> KernelOutput:
        """The kernel's output, or :class:`KernelFailure` if it raised, hung or misbehaved."""
        return self._request(("run", spec, case, device), self.timeout)

    def backward(self, spec: str, case: Case, device: str) -> KernelGradients:
        """The kernel's gradients for the case's ``dO`` (``Kernel.run_backward``), or
        :class:`KernelFailure`; the time limit is twice a forward call's (a backward runs the
        forward too)."""
        return self._request(("backward", spec, case, device), 2 * self.timeout)

    def check(self, name: str, spec: str, case: Case, device: str, calls: int) -> tuple[bool, str]:
        """Structural property ``name`` of :data:`~flashcheck.harness.judging.structural.CHECKS`
        on ``case``, run in the child with ``calls`` times the per-call time limit."""
        return self._request(("check", name, spec, case, device), self.timeout * calls)


def probe_runner(call: Any, spec: str, device: str) -> Any:
    """A probe ``runner`` (:func:`flashcheck.harness.adapters.probe.probe`) over an isolated
    call ``call(spec, case, device)`` that raises :class:`KernelFailure`: a hang becomes
    :class:`ProbeTimeout`, a wrong output :class:`KernelOutputError`, anything else (an
    exception, a crash of the kernel's process) :class:`ProbeFailure` with its message."""

    def run(case: Case) -> None:
        try:
            call(spec, case, device)
        except KernelFailure as fail:
            if fail.status == "TIMEOUT":
                raise ProbeTimeout(fail.message) from None
            if fail.status == "BAD-OUTPUT":
                raise KernelOutputError(fail.message) from None
            raise ProbeFailure(fail.message) from None

    return run
