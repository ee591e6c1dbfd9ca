"""``flashcheck replay <id>``: re-run a saved case and print kernel vs oracle side by side.

A replay needs only the case's two files and the kernel: it rebuilds the inputs from their bit
patterns, resolves the kernel by the name or ``module:function`` spec stored in the record, and
runs the one check the case was saved for (the forward's or the gradients' accuracy, or a
structural property), as the failing test ran it: one verdict, in the words it was recorded in.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel, KernelOutputError
from ..adapters.call_limit import KernelHung
from ..adapters.kernel_call import kernel_raised
from ..adapters.registry import as_kernel
from ..cases.ragged_store import is_ragged_case
from ..cases.store import case_path, load_case
from ..core.status import Status
from .accuracy import check_case, check_gradients_case
from .check_results import recorded_line, replayed_as
from .ragged_replay import replay_ragged
from .registry import CHECKS, GRADIENT_CHECKS
from .text import format_check, format_gradient_check

__all__ = ["SMALL", "default_device", "input_lines", "replay"]


def default_device(adapter_devices: tuple[str, ...], recorded: str | None) -> str:
    """The recorded device if it is usable here, else CUDA when available, else CPU."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        has_cuda = False
    if recorded == "cuda" and has_cuda:
        return "cuda"
    if recorded == "cpu" and "cpu" in adapter_devices:
        return "cpu"
    return "cuda" if has_cuda and "cuda" in adapter_devices else "cpu"


def replay(
    ref: str,
    *,
    directory: str | os.PathLike | None = None,
    device: str | None = None,
    kernel: str | Kernel | None = None,
    echo: Any = print,
) -> tuple[Any, str, dict[str, Any]]:
    """Re-run case ``ref`` (an id or a path) through the one check it was saved for: the
    forward's accuracy, the gradients' accuracy, or a structural property. ``kernel`` (a spec
    or a Kernel) replaces the recorded kernel. Returns that check's result (a
    :class:`~flashcheck.harness.checks.check_results.CheckResult`, a ``GradientCheckResult`` or a
    ``StructuralResult``; ``None`` for a kernel stopped by the time limit of
    :mod:`~flashcheck.harness.adapters.call_limit`, verdict ``TIMEOUT``, or for an output of
    the wrong shape or type, verdict ``BAD-OUTPUT``), its verdict and the
    record; a ragged case
    (:func:`~flashcheck.harness.checks.ragged_replay.replay_ragged`) its ``RaggedCheckResult``."""
    if is_ragged_case(ref, directory):
        return replay_ragged(ref, directory=directory, device=device, kernel=kernel, echo=echo)
    case, record = load_case(ref, directory)
    adapter = as_kernel(kernel if kernel is not None else record["kernel"])
    dev = device or default_device(adapter.devices, record.get("device"))
    prop = (record.get("context") or {}).get("property", "accuracy")
    backward = prop == "gradients" or prop in GRADIENT_CHECKS
    contract = adapter.backward_supports if backward else adapter.supports
    why = adapter.unavailable(case.dtype, dev) or contract(case, dev)
    if why:
        hint = ""
        if kernel is None and backward and adapter.backward is None:
            hint = (
                f"; the case file names {record['kernel']}, which declares none: if the case "
                "came from a flashcheck.kernel(..., backward=...) declaration, name it with "
                "--kernel module:declaration (kernel= in Python)"
            )
        raise RuntimeError(f"cannot replay {record['id']} on {adapter.name} here: {why}{hint}")
    recorded = (record.get("verdict") or {}).get("verdict")
    echo(
        f"case {record['id']} (saved by {prop}, on {record.get('device')}): "
        f"{record.get('description', '')}"
    )
    layout = None  # for a backward's case: dO, and how it is handed over
    if prop == "gradient-do-layouts":  # the property hands it over in each layout itself
        layout = "as a contiguous array, a strided view and one row expanded with stride 0"
    elif backward:
        layout = case.do_layout
    for line in input_lines(case, str(case_path(ref, directory)), do_layout=layout):
        echo(line)
    try:
        res, verdict = _check(prop, adapter, case, dev, echo)
    except KernelHung as err:  # under a time limit (the command line's --timeout)
        res, verdict = None, str(Status.TIMEOUT)
        echo(f"{verdict}: {err}")
    except KernelOutputError as err:  # a wrong shape or type: the kernel's verdict, as recorded
        res, verdict = None, str(Status.BAD_OUTPUT)
        echo(f"{verdict}: {err}")
    except Exception as err:  # the kernel raised: its verdict (as the campaigns record it)
        if not kernel_raised(err):  # an error of the harness around the kernel is not its own
            raise
        res, verdict = None, str(Status.ERROR)
        echo(f"{verdict}: the kernel raised inside {prop}: {type(err).__name__}: {err}")
    line = recorded_line(
        recorded, verdict, saved_by=record["kernel"], now=replayed_as(adapter, record)
    )
    if line is not None:
        echo(line)
    return res, verdict, record


SMALL = 64  # the most elements a tensor may have to be printed by value


def input_lines(case: Any, ref: str, *, do_layout: str | None = None) -> list[str]:
    """How to get the case's inputs and, for a small case (every tensor of at most
    :data:`SMALL` elements), their exact values: a failure on a handful of numbers is read
    more easily than loaded. ``ref``: the case's id or the path of its record; ``do_layout``
    (for a backward): how the upstream gradient dO is handed over, and dO is shown too."""
    named = {"q": case.q, "k": case.k, "v": case.v}
    if case.mask is not None:
        named["mask"] = case.mask
    lines = [f"inputs: flashcheck.load_case({ref!r}) rebuilds them bit for bit"]
    if do_layout is not None:
        named["dO"] = case.grad_output()
        lines[0] += f" (dO: its grad_output(), handed over {do_layout})"
    if any(np.asarray(x).size > SMALL for x in named.values()):
        return lines
    for name, x in named.items():
        arr = np.asarray(x)
        if arr.dtype != bool:  # (every value of a 16- or 32-bit format is a float64 exactly)
            arr = arr.astype(np.float64)
        text = np.array2string(arr, separator=", ", floatmode="unique", max_line_width=96)
        lines.append(f"  {name} {tuple(arr.shape)} = " + text.replace("\n", "\n      "))
    return lines


def _check(prop: str, adapter: Kernel, case: Any, dev: str, echo: Any) -> tuple[Any, str]:
    """Run the check ``prop`` names on the case and print its result; the result and its
    verdict."""
    if prop in CHECKS or prop in GRADIENT_CHECKS:
        res = (CHECKS.get(prop) or GRADIENT_CHECKS[prop])(adapter, case, dev)
        echo(f"property {prop}: {res.status}: {res.message}")
        return res, str(res.status)
    if prop == "gradients":
        res = check_gradients_case(adapter, case, device=dev)
        echo(format_gradient_check(res))
        return res, str(res.verdict)
    res = check_case(adapter, case, device=dev)
    echo(format_check(res))
    return res, str(res.verdict.verdict)
