"""How the softmax options (soft-capping and sinks) reach a kernel: whether its contract takes
them, their values as the kernel's API hands them over, and the sinks' gradient.

A kernel takes ``softcap`` or ``sinks`` only when its signature names them (or its declaration
says so: ``flashcheck.kernel(fn, options=...)``); a case that sets one is outside the contract
of a kernel that does not. ``sinks`` reach a numpy kernel as the case's float32 array and a torch
kernel as a float32 tensor on its device (with ``requires_grad`` for an autograd backward,
whose gradient is the kernel's ``dσ``).

An FP8 case's descales (``descale_q``, ``descale_k``, ``descale_v``: float32 ``(B, Hk)``) reach
an FP8 kernel the same way, as FlashAttention-3's keyword arguments of those names.
"""

from __future__ import annotations

from typing import Any

from ..cases.case import Case

__all__ = ["SOFTMAX_OPTIONS", "option_values", "unsupported_option"]

SOFTMAX_OPTIONS = frozenset({"softcap", "sinks"})
_WORDS = {"softcap": "soft-capping", "sinks": "attention sinks"}


def unsupported_option(case: Case, options: frozenset[str] | None) -> str | None:
    """Why ``case`` needs an option the kernel does not take (``options``: the kernel's; ``None``
    means causal/window/mask/scale only), or ``None``."""
    for name in sorted(SOFTMAX_OPTIONS):
        if getattr(case, name) is not None and (options is None or name not in options):
            return f"{_WORDS[name]} unsupported (the kernel takes no {name} option)"
    return None


def option_values(case: Case, api: str, device: str = "cpu", grad: bool = False) -> dict:
    """The case's ``softcap`` and ``sinks`` as keyword arguments (only those set); ``grad``: a
    torch ``sinks`` that autograd differentiates."""
    out: dict[str, Any] = {}
    if case.softcap is not None:
        out["softcap"] = case.softcap
    if case.sinks is not None:
        if api == "numpy":
            out["sinks"] = case.sinks.copy()
        else:
            import torch

            out["sinks"] = torch.from_numpy(case.sinks.copy()).to(device).requires_grad_(grad)
    for name, d in case.descales.items():
        if api == "numpy":
            out[name] = d.copy()
        else:
            import torch

            out[name] = torch.from_numpy(d.copy()).to(device)
    return out
