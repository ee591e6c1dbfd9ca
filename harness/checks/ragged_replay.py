"""``flashcheck replay <id>`` for a saved ragged case: the same check, the same words; a case a
campaign saved for a failed property also runs that property again."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..adapters.adapter import Kernel, KernelOutputError
from ..adapters.call_limit import KernelHung
from ..adapters.declare import kernel
from ..adapters.kernel_call import kernel_raised
from ..adapters.ragged_call import kernel_layout
from ..adapters.registry import as_kernel
from ..cases.ragged import RaggedCase
from ..cases.ragged_store import load_ragged_case
from ..cases.store import case_path
from ..core.status import Status
from .check_results import recorded_line, replayed_as
from .ragged import RaggedCheckResult, check_ragged_case, format_ragged_check
from .ragged_diagnosis import diagnose_ragged
from .ragged_gradients import check_varlen_gradients
from .ragged_properties import RAGGED_PROPERTIES

__all__ = ["replay_ragged"]


def _in_layout(adapter: Kernel, layout: str) -> Kernel:
    """``adapter`` as a kernel of ``layout``: a plain function found by its spec (a
    ``module:function`` whose contract is probed, not declared) is declared in the layout its
    case was saved in; a declared kernel must already take it."""
    if kernel_layout(adapter) == layout:
        return adapter
    if adapter.pending and adapter.layout == "dense" and adapter.op == "attention":
        spec = {"op": "combine"} if layout == "combine" else {"layout": layout}
        return replace(kernel(adapter.fn, **spec), name=adapter.name)
    raise RuntimeError(
        f"{adapter.name} takes {kernel_layout(adapter)} inputs but the case is {layout}: "
        "replay it with a kernel of that layout (--kernel)"
    )


def replay_ragged(
    ref: str,
    *,
    directory: str | os.PathLike | None = None,
    device: str | None = None,
    kernel: str | Kernel | None = None,
    echo: Any = print,
) -> tuple[RaggedCheckResult | None, str, dict[str, Any]]:
    """Re-run the saved ragged case ``ref`` (an id or a path) through its accuracy check;
    ``kernel`` (a spec or a Kernel) replaces the recorded one. Returns the result (``None`` for
    a kernel stopped by its time limit: verdict ``TIMEOUT``), its verdict and the record."""
    case, record = load_ragged_case(ref, directory)
    adapter = _in_layout(as_kernel(kernel if kernel is not None else record["kernel"]), case.layout)
    recorded_dev = record.get("device")
    dev = device or (recorded_dev if recorded_dev in adapter.devices else adapter.devices[0])
    why = adapter.unavailable(case.dtype, dev)
    if why:
        raise RuntimeError(f"cannot replay {record['id']} on {adapter.name} here: {why}")
    context = record.get("context") or {}
    prop = context.get("property") or "accuracy"
    echo(f"case {record['id']} (saved by {prop}, on {recorded_dev}): {case.describe()}")
    path = str(case_path(ref, directory))
    echo(f"inputs: flashcheck.load_case({path!r}) rebuilds them bit for bit")
    kernels = (record["kernel"], replayed_as(adapter, record))
    res, verdict = _attempt(lambda: _forward(adapter, case, dev), prop, echo)
    if prop == "gradients":
        # Saved for its gradients alone: that check first, with its recorded verdict; the
        # forward as one line of context (a user read the forward's "verdict PASS" and its
        # table first, and no recorded-vs-replayed line at all).
        grads, replayed = _attempt(
            lambda: check_varlen_gradients(adapter, case, device=dev), prop, echo
        )
        if grads is not None:
            echo(str(grads))
        _compare((record.get("gradient_verdict") or {}).get("verdict"), replayed, echo, kernels)
        if res is None or res.passed:
            echo(f"the forward on the same case: {verdict}")
        else:
            echo("\nthe forward on the same case:\n" + format_ragged_check(res))
        return res, str(Status.worst([verdict, replayed])), record
    if res is not None:
        echo(format_ragged_check(res))
    _compare((record.get("verdict") or {}).get("verdict"), verdict, echo, kernels)
    if res is None:
        return res, verdict, record
    grads_recorded = (record.get("gradient_verdict") or {}).get("verdict")
    found = _replay_properties(adapter, case, dev, context, grads_recorded, echo, kernels)
    return res, str(Status.worst([res.verdict, *found])), record


def _forward(adapter: Kernel, case: RaggedCase, dev: str) -> RaggedCheckResult:
    res = check_ragged_case(adapter, case, device=dev)
    if not res.passed:
        res.diagnosis = diagnose_ragged(res, adapter)
    return res


def _attempt(run: Callable[[], Any], prop: str, echo: Any) -> tuple[Any, str]:
    """``run()``'s result and verdict; for a kernel that gave none (it ran past the time
    limit, returned something that is not an attention output, or raised: the verdicts the
    campaigns and the checks record), ``None`` and that verdict, said in one line."""
    try:
        res = run()
    except KernelHung as err:  # under a time limit (the command line's --timeout)
        verdict, why = str(Status.TIMEOUT), str(err)
    except KernelOutputError as err:
        verdict, why = str(Status.BAD_OUTPUT), str(err)
    except Exception as err:  # the kernel raised (a harness error carries no such note)
        if not kernel_raised(err):
            raise
        verdict = str(Status.ERROR)
        why = f"the kernel raised inside {prop}: {type(err).__name__}: {err}"
    else:
        return res, str(res.verdict)
    echo(f"{verdict}: {why}")
    return None, verdict


def _compare(recorded: str | None, replayed: str, echo: Any, kernels: tuple[str, str]) -> None:
    """The recorded-versus-replayed line; ``kernels``: the one the file names, the one run."""
    line = recorded_line(recorded, replayed, saved_by=kernels[0], now=kernels[1])
    if line is not None:
        echo(line)


def _replay_properties(
    adapter: Kernel,
    case: RaggedCase,
    dev: str,
    context: dict,
    grads_recorded: str | None,
    echo: Any,
    kernels: tuple[str, str],
) -> list[Status]:
    """The properties a campaign found failing on the case (its ``context``), run again with
    the campaign's seed (the gradient check's against ``grads_recorded``); their statuses."""
    given = str(context.get("property", "")).split(", ")
    names = [p for p in given if p in RAGGED_PROPERTIES]
    out = []
    if "gradients" in given:
        grads = check_varlen_gradients(adapter, case, device=dev)
        echo(f"\n{grads}")
        _compare(grads_recorded, str(grads.verdict), echo, kernels)
        out.append(grads.verdict)
    for name in names:
        got = RAGGED_PROPERTIES[name](adapter, case, dev, seed=int(context.get("seed", 0)))
        line = recorded_line("FAIL", str(got.status), saved_by=kernels[0], now=kernels[1])
        echo(f"property {name}: {got}{line}")
        out.append(got.status)
    return out
