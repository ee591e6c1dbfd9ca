"""What one kernel call gave: a value, or the status and message of why it gave none.

:class:`Outcome` is built once, where the kernel is called (:func:`call_kernel`, in a worker
process or in this one), and read as it is by everyone above: the kernel worker sends it across
the process boundary, the executors hand it out as their futures' results, the campaign records
its status and message, the probe reads its status. Nothing converts it into an exception and
back on the way.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.status import Status
from .adapter import KernelOutputError, KernelUnsupported
from .call_limit import KernelHung

__all__ = ["DIED", "Outcome", "call_kernel", "describe", "died", "with_causes"]

# How an outcome says the kernel's process died under it (a crash: a segfault, os._exit, an
# illegal memory access), in the local workers' words and Ray's.
DIED = "the kernel process died"

# The statuses a kernel call can end with: it returned (PASS), or why it did not.
CALL_STATUSES = (Status.PASS, Status.ERROR, Status.TIMEOUT, Status.BAD_OUTPUT, Status.SKIP)


@dataclass(frozen=True)
class Outcome:
    """One kernel call's result.

    ``status``: ``PASS`` (the call returned ``value``), ``ERROR`` (the kernel raised, or its
    process died), ``TIMEOUT`` (it ran past its time limit), ``BAD-OUTPUT`` (it returned the
    wrong shape or type) or ``SKIP`` (it declined the input:
    :class:`~flashcheck.harness.adapters.adapter.KernelUnsupported`). ``value``: what the call
    returned (``None`` unless ``PASS``). ``message``: why it gave no value (empty on ``PASS``).
    ``span``: the start and end (``time.time()``) of the call in the process that made it, for
    the phase timeline; not compared (equal outcomes may differ in it).
    """

    status: Status
    value: Any = None
    message: str = ""
    span: tuple[float, float] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        status = Status(self.status)
        if status not in CALL_STATUSES:
            raise ValueError(
                f"an Outcome's status is one of {[str(s) for s in CALL_STATUSES]}, got {status!r}"
            )
        object.__setattr__(self, "status", status)

    @classmethod
    def returned(cls, value: Any) -> Outcome:
        """The call returned ``value``."""
        return cls(Status.PASS, value)

    @classmethod
    def failed(cls, status: Status | str, message: str) -> Outcome:
        """The call gave no value: ``status`` and why."""
        if Status(status) is Status.PASS:
            raise ValueError("Outcome.failed needs a status other than PASS")
        return cls(Status(status), None, str(message))

    @property
    def ok(self) -> bool:
        """The call returned a value."""
        return self.status is Status.PASS

    def __str__(self) -> str:
        return "returned" if self.ok else f"{self.status}: {self.message}"


def died(out: Outcome) -> bool:
    """Whether the call ended with its process dying (:data:`DIED`)."""
    return out.status is Status.ERROR and out.message.startswith(DIED)


def with_causes(err: BaseException) -> str:
    """``Type: message``, followed by the exceptions it was raised from: Triton's
    ``CompilationError`` shows only the source excerpt, and the reason is in its cause."""
    parts, seen = [], set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen and len(parts) < 4:
        seen.add(id(cause))
        parts.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return " <- caused by ".join(parts)


def describe(err: BaseException) -> str:
    """:func:`with_causes`, and where the innermost exception of its chain was raised (an
    error re-raised with a message of ours, "cannot import ...", was placed at our line, not
    at the user's)."""
    inner, seen = err, {id(err)}
    while (nxt := inner.__cause__ or inner.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        inner = nxt
    tb = traceback.extract_tb(inner.__traceback__) or traceback.extract_tb(err.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return with_causes(err) + where


def call_kernel(call: Callable[..., Any], *args: Any) -> Outcome:
    """``call(*args)`` as an :class:`Outcome`: what it returned, or the status of what it
    raised (a wrong output is ``BAD-OUTPUT``, a declined input ``SKIP``, a call stopped by its
    time limit (:mod:`.call_limit`) ``TIMEOUT``, anything else ``ERROR`` with
    :func:`describe`'s message)."""
    try:
        return Outcome.returned(call(*args))
    except KernelHung as err:
        return Outcome.failed(Status.TIMEOUT, str(err))
    except KernelOutputError as err:
        return Outcome.failed(Status.BAD_OUTPUT, str(err))
    except KernelUnsupported as err:
        return Outcome.failed(Status.SKIP, str(err))
    except Exception as err:  # report anything the kernel raises; the caller decides
        return Outcome.failed(Status.ERROR, describe(err))
