"""A kernel that raised inside a public check (``flashcheck.check``, ``check_gradients``): its
case is saved as the suite saves it (verdict ``ERROR``, or ``BAD-OUTPUT`` for an output of the
wrong shape or type) and the exception goes on to the caller with a note (PEP 678) naming the
case and its replay command, so the input that broke the kernel is kept exactly.

Only exceptions of the kernel's own function count (they carry the note of
:func:`~flashcheck.harness.adapters.kernel_call.raised_by`); an error of the harness around it
is let through unsaved.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..adapters.kernel_call import kernel_raised
from ..adapters.kernel_output import KernelOutputError
from ..core.status import Status

__all__ = ["saved_if_raised"]


@contextlib.contextmanager
def saved_if_raised(
    save: str,
    write: Callable[[dict[str, Any]], str | None],
    case_dir: str | os.PathLike | None,
) -> Iterator[None]:
    """Run the block; where the kernel raised in it (or returned something that is not an
    attention output) and ``save`` is not ``"never"``, ``write(verdict)`` saves the case and
    the exception carries the saved case's replay command out."""
    try:
        yield
    except Exception as err:
        if save == "never":
            raise
        if isinstance(err, KernelOutputError):
            status = Status.BAD_OUTPUT
        elif kernel_raised(err):
            status = Status.ERROR
        else:
            raise
        cid = write({"verdict": str(status), "message": f"{type(err).__name__}: {err}"})
        if cid is not None:
            where = "" if case_dir is None else f" --dir {os.fspath(case_dir)}"
            replay = f"flashcheck replay {cid}{where}"
            err.add_note(f"flashcheck: saved case {cid}; replay with: {replay}")
        raise
