"""Running kernels in a child process, so a kernel that hangs or crashes cannot stop a campaign.

:class:`KernelWorker` keeps one child process (``multiprocessing`` *spawn*: no state inherited
from the parent, safe with CUDA) that resolves kernels by their spec and runs them on cases
sent over a pipe. The parent waits at most ``timeout`` seconds per call; past that it kills the
child (and its CUDA context with it) and starts a fresh one for the next call. A kernel that
raises is reported with its exception; a child that dies (segfault, ``os._exit``) is reported
as a crash. After any failure the child is replaced: a CUDA error can leave a context unusable.

``KernelWorker(isolate=False)`` runs kernels in the calling process instead (no timeout): for
debugging with pdb, and for tests of code that is not about isolation.
"""

from __future__ import annotations

import multiprocessing as mp
import time
import traceback
from dataclasses import dataclass

from flashcheck.harness.adapters.adapter import KernelOutput, KernelOutputError, KernelUnsupported
from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.cases.case import Case

__all__ = ["KernelFailure", "KernelWorker"]


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


def _serve(conn) -> None:  # pragma: no cover - runs in the child process
    import signal

    # Ctrl-C reaches the whole process group; the parent handles it and stops this process.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    adapters: dict[str, object] = {}
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        spec, case, device = msg
        try:
            if spec not in adapters:
                adapters[spec] = resolve(spec)
            out = adapters[spec].run(case, device)
            conn.send(("ok", out))
        except KernelOutputError as err:
            conn.send(("BAD-OUTPUT", str(err)))
        except KernelUnsupported as err:
            conn.send(("SKIP", str(err)))
        except BaseException as err:  # report anything the kernel raises; the parent decides
            tb = traceback.extract_tb(err.__traceback__)
            where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
            conn.send(("ERROR", f"{type(err).__name__}: {err}{where}"))


class KernelWorker:
    """Run ``resolve(spec).run(case, device)`` with a time limit, in a child process."""

    def __init__(self, *, timeout: float = 300.0, isolate: bool = True) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.timeout = float(timeout)
        self.isolate = isolate
        self._proc = None
        self._conn = None
        self.restarts = 0

    def __enter__(self) -> KernelWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="flashcheck-kernel")
        proc.start()
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

    def run(self, spec: str, case: Case, device: str) -> KernelOutput:
        """The kernel's output, or :class:`KernelFailure` if it raised, hung or misbehaved."""
        if not self.isolate:
            try:
                return resolve(spec).run(case, device)
            except KernelOutputError as err:
                raise KernelFailure("BAD-OUTPUT", str(err)) from None
            except KernelUnsupported as err:
                raise KernelFailure("SKIP", str(err)) from None
            except Exception as err:
                raise KernelFailure("ERROR", f"{type(err).__name__}: {err}") from None
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((spec, case, device))
        except (OSError, BrokenPipeError):
            self._kill()
            raise KernelFailure("ERROR", "the kernel process died before the call") from None
        deadline = time.monotonic() + self.timeout
        while not self._conn.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            if not self._proc.is_alive():
                code = self._proc.exitcode
                self._kill()
                raise KernelFailure("ERROR", f"the kernel process died (exit code {code})")
            if time.monotonic() >= deadline:
                self._kill()
                raise KernelFailure("TIMEOUT", f"no result within {self.timeout:g} s")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            code = self._proc.exitcode if self._proc is not None else None
            self._kill()
            raise KernelFailure("ERROR", f"the kernel process died (exit code {code})") from None
        if status == "SKIP":
            raise KernelFailure(status, payload)  # a clean refusal: the process is fine
        if status != "ok":
            self._kill()  # a fresh process for the next call: the failure may have left state
            raise KernelFailure(status, payload)
        return payload
