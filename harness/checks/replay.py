"""``flashcheck replay <id>``: re-run a saved case and print kernel vs oracle side by side.

A replay needs only the case's two files and the kernel: it rebuilds the inputs from their bit
patterns, resolves the kernel by the name or ``module:function`` spec stored in the record, and
runs the same :func:`flashcheck.harness.checks.accuracy.check_case` as the failing test did.
"""

from __future__ import annotations

import os
from typing import Any

from ..adapters.adapter import Kernel
from ..adapters.registry import as_kernel
from ..cases.store import load_case
from .accuracy import CheckResult, check_case, check_gradients_case
from .registry import CHECKS, GRADIENT_CHECKS
from .text import format_check, format_gradient_check

__all__ = ["default_device", "replay"]


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
) -> tuple[CheckResult, str, dict[str, Any]]:
    """Re-run case ``ref`` (an id or a path): the accuracy check, plus the structural property
    the case failed if it was one. ``kernel`` (a spec or a Kernel) replaces the recorded
    kernel. Returns the check, the replayed verdict and the record."""
    case, record = load_case(ref, directory)
    adapter = as_kernel(kernel if kernel is not None else record["kernel"])
    dev = device or default_device(adapter.devices, record.get("device"))
    why = adapter.unavailable(case.dtype, dev) or adapter.supports(case, dev)
    if why:
        raise RuntimeError(f"cannot replay {record['id']} on {adapter.name} here: {why}")
    res = check_case(adapter, case, device=dev)
    recorded = (record.get("verdict") or {}).get("verdict")
    prop = (record.get("context") or {}).get("property", "accuracy")
    echo(
        f"case {record['id']} (property {prop}, recorded on {record.get('device')}): "
        f"{record.get('description', '')}"
    )
    echo(format_check(res))
    verdict = res.verdict.verdict
    if prop in CHECKS:
        # A structural property failed: re-run that property, which decides the verdict; the
        # accuracy check above is shown for reference.
        found = CHECKS[prop](adapter, case, dev)
        verdict = str(found.status)
        echo(
            f"\n(the accuracy verdict above is for reference; the case was saved by property "
            f"{prop})\nproperty {prop}: {verdict}: {found.message}"
        )
    if prop == "gradients" or prop in GRADIENT_CHECKS:
        echo(
            f"\n(the forward verdict above is for reference; the case was saved by property {prop})"
        )
        if prop == "gradients":
            g = check_gradients_case(adapter, case, device=dev)
            echo(format_gradient_check(g))
            verdict = g.verdict
        else:
            found = GRADIENT_CHECKS[prop](adapter, case, dev)
            verdict = str(found.status)
            echo(f"property {prop}: {verdict}: {found.message}")
    if recorded is not None:
        same = "same verdict" if recorded == verdict else "DIFFERENT verdict"
        echo(f"\nrecorded verdict: {recorded}; replayed: {verdict} ({same})")
    return res, verdict, record
