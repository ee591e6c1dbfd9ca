"""One call of a kernel as the harness makes it: the record of what the kernel was handed and
what it returned (:class:`KernelCall`), the arrays of a call by name, the hook run just before
the kernel, numpy's floating-point warnings kept quiet while the kernel runs, and an
exception the kernel raises noted with what raised it.

The integrity check compares a call's arrays and result bitwise with snapshots taken by the
hook, so the record holds the very objects the kernel saw, unconverted.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Before",
    "KernelCall",
    "ieee_quiet",
    "kernel_raised",
    "named_arrays",
    "notify_before",
    "raised_by",
]

# The start of the note :func:`raised_by` adds (and :func:`kernel_raised` looks for).
_RAISED_BY = "flashcheck: raised by "


@dataclass(frozen=True)
class KernelCall:
    """One call of a kernel as it happened: ``args``, the arrays it was handed by name (``q``,
    ``k``, ``v``, and ``mask`` or ``do`` where passed; the very numpy arrays or device tensors
    the kernel received), and ``result``, what it returned, unconverted (the integrity check
    compares both bitwise with snapshots)."""

    args: dict[str, Any]
    result: Any


Before = Callable[[dict[str, Any]], None]


def named_arrays(q: Any, k: Any, v: Any, opts: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The arrays of one call by name: ``q``, ``k``, ``v``, the ``mask`` if passed, ``more``."""
    args = {"q": q, "k": k, "v": v, **more}
    if opts.get("mask") is not None:
        args["mask"] = opts["mask"]
    return args


def notify_before(before: Before | None, args: dict[str, Any]) -> None:
    """Call ``before(args)`` if a hook was given (it snapshots the arrays the kernel gets)."""
    if before is not None:
        before(args)


@contextlib.contextmanager
def ieee_quiet() -> Iterator[None]:
    """numpy's floating-point warnings off while a kernel runs: overflow and NaN are results to
    be judged (by the bound and NaN-rule properties), not errors. Only RuntimeWarning is
    silenced (numpy's "invalid value", "All-NaN slice"), and only inside the kernel call."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@contextlib.contextmanager
def raised_by(what: str, case: Any) -> Iterator[None]:
    """Let an exception of the block (a kernel's own function) through with a note (PEP 678:
    shown under its traceback) naming ``what`` raised it and on which input: a user's backward
    raised a bare torch size error inside ``flashcheck.check_gradients``, with nothing to say
    it came from their backward or on what shapes."""
    try:
        yield
    except Exception as err:
        err.add_note(f"{_RAISED_BY}{what} on {case.describe()}")
        raise


def kernel_raised(err: BaseException) -> bool:
    """Whether ``err`` came out of a kernel's own function (it carries :func:`raised_by`'s
    note), not out of the harness around it."""
    return any(note.startswith(_RAISED_BY) for note in getattr(err, "__notes__", ()))
