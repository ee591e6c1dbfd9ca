"""Integrity: a kernel must leave the arrays it is handed alone and must not hand back storage
it later reuses.

- ``integrity``: the forward is called on a case with bitwise snapshots of what it receives
  (``q``, ``k``, ``v`` and the mask, when there is one, as the very arrays or device tensors
  passed); after the call each must be bitwise unchanged (NaN payloads included: raw bits are
  compared). The returned ``O`` (and ``LSE``) are copied; a second call on the same case with
  ``q`` and ``v`` negated (same shape, same contract, different answer) must leave the first
  call's results bitwise unchanged: a kernel that writes every result into one persistent
  buffer fails here, since its caller's earlier result silently changes.
- ``gradient-integrity``: the same for the backward, with ``dO`` among the inputs and ``dQ``,
  ``dK``, ``dV`` as the results.

A failure names the tensor that changed and in how many elements. When the second call's
results equal the first's bit for bit, an overwrite could not show: NOT-APPLICABLE.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..adapters.adapter import Before, Kernel, KernelCall
from ..cases.case import Case
from .structural import StructuralResult

__all__ = ["gradient_integrity", "integrity", "negated"]

_LABELS = {"do": "dO"}
_FORWARD = ("O", "LSE")
_BACKWARD = ("dQ", "dK", "dV")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _snapshot(x: Any) -> Any:
    """A copy of ``x`` with the same bits, wherever ``x`` lives."""
    if _is_torch(x):
        return x.detach().clone()
    return np.array(x, copy=True)


def _changed(saved: Any, now: Any) -> int:
    """How many elements of ``now`` differ from ``saved`` in their raw bits (every element if
    the shape or type changed)."""
    if _is_torch(now):
        import torch

        now = now.detach()
        if saved.shape != now.shape or saved.dtype != now.dtype:
            return max(saved.numel(), 1)
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        bits = width[now.element_size()]
        return int((saved.view(bits) != now.view(bits)).sum())
    now = np.asarray(now)
    if saved.shape != now.shape or saved.dtype != now.dtype:
        return max(saved.size, 1)
    bits = np.dtype(f"u{now.itemsize}")
    return int(np.count_nonzero(saved.view(bits) != now.view(bits)))


def _first_change(saved: Any, now: Any) -> str:
    """Where ``now`` first differs from ``saved``: the index, and both bit patterns and
    values (what a user needs to see the overwrite for themselves)."""
    if _is_torch(now):
        import torch

        saved, now = saved.detach().cpu(), now.detach().cpu()
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        if saved.shape == now.shape and saved.dtype == now.dtype:
            a, b = (x.view(width[x.element_size()]).numpy() for x in (saved, now))
        else:
            a = b = None
    else:
        saved, now = np.asarray(saved), np.asarray(now)
        same = saved.shape == now.shape and saved.dtype == now.dtype
        a, b = (x.view(f"u{x.itemsize}") for x in (saved, now)) if same else (None, None)
    if a is None:
        return f"shape {tuple(saved.shape)} became {tuple(now.shape)}"
    at = tuple(int(i) for i in np.argwhere(a != b)[0])
    digits = 2 * a.dtype.itemsize
    bits_a = int(a[at]) & ((1 << (4 * digits)) - 1)
    bits_b = int(b[at]) & ((1 << (4 * digits)) - 1)
    return (
        f"first {list(at)}: 0x{bits_a:0{digits}x} ({float(saved[at])!r}) became "
        f"0x{bits_b:0{digits}x} ({float(now[at])!r})"
    )


def negated(case: Case) -> Case:
    """``case`` with ``q`` and ``v`` (and an explicit ``dO``) negated: exact in every format,
    inside the same contract, and a different answer (O and LSE both move)."""
    return replace(
        case,
        q=-case.q,
        v=-case.v,
        mask=None if case.mask is None else case.mask.copy(),
        do=None if case.do is None else -case.do,
    )


def _own_copy(case: Case) -> Case:
    """``case`` on copies of its arrays: a numpy kernel is handed the case's own arrays, and a
    kernel that writes into them must not spoil the case for the checks after this one."""
    return replace(
        case,
        q=case.q.copy(),
        k=case.k.copy(),
        v=case.v.copy(),
        mask=None if case.mask is None else case.mask.copy(),
        do=None if case.do is None else case.do.copy(),
    )


def _guarded(call: Callable[[Before], KernelCall]) -> tuple[KernelCall, str | None]:
    """Run ``call`` with snapshots of the arrays it hands the kernel: the call, and which input
    the kernel modified (``None`` if none)."""
    saved: dict[str, Any] = {}

    def before(args: dict[str, Any]) -> None:
        saved.update({name: _snapshot(x) for name, x in args.items()})

    got = call(before)
    for name, x in got.args.items():
        n = _changed(saved[name], x)
        if n:
            where = _first_change(saved[name], x)
            return got, (
                f"modified its input {_LABELS.get(name, name)}: {n} element{'s' * (n != 1)} "
                f"changed ({where})"
            )
    return got, None


def _results(result: Any, names: Sequence[str]) -> dict[str, Any]:
    parts = result if isinstance(result, tuple | list) else (result,)
    return {n: x for n, x in zip(names, parts, strict=False) if x is not None}


def _integrity(
    case: Case,
    call: Callable[[Case, Before], KernelCall],
    convert: Callable[[Case, KernelCall], Any],
    names: Sequence[str],
    who: str,
) -> StructuralResult:
    """The integrity check of one entry point (``who``: "the kernel" or "the backward")."""
    first, bad = _guarded(lambda before: call(_own_copy(case), before))
    if bad:
        return StructuralResult.failed(f"{who} {bad}")
    convert(case, first)  # an unusable output is reported as such, not as an overwrite
    kept = {n: _snapshot(x) for n, x in _results(first.result, names).items()}
    second, bad = _guarded(lambda before: call(negated(case), before))
    if bad:
        return StructuralResult.failed(f"{who} {bad} (on its second call)")
    for n, x in _results(first.result, names).items():
        changed = _changed(kept[n], x)
        if changed:
            return StructuralResult.failed(
                f"{who} returned storage that the next call overwrote: {n} changed in "
                f"{changed} elements ({_first_change(kept[n], x)})"
            )
    again = _results(second.result, names)
    if all(n in again and not _changed(kept[n], again[n]) for n in kept):
        return StructuralResult.not_applicable(
            "the second call's results equal the first's bit for bit: an overwrite would not show"
        )
    inputs = ", ".join(_LABELS.get(n, n) for n in first.args)
    return StructuralResult.passed(
        f"{inputs} bitwise unchanged by {who}; {', '.join(kept)} of one call bitwise unchanged "
        "by the next"
    )


def integrity(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The forward leaves ``q``, ``k``, ``v`` and the mask bitwise unchanged, and its ``O`` (and
    ``LSE``) stay bitwise unchanged through a second call on other inputs of the same shape."""
    return _integrity(
        case,
        lambda c, before: adapter.call(c, device, before=before),
        adapter.output,
        _FORWARD,
        "the kernel",
    )


def gradient_integrity(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The backward leaves ``q``, ``k``, ``v``, ``dO`` and the mask bitwise unchanged, and its
    ``dQ``, ``dK``, ``dV`` stay bitwise unchanged through a second backward on other inputs."""
    if adapter.backward is None:
        return StructuralResult.not_applicable(f"{adapter.name} declares no backward")
    return _integrity(
        case,
        lambda c, before: adapter.call_backward(c, device, before=before),
        adapter.gradients,
        _BACKWARD,
        "the backward",
    )
