"""How the softmax options (soft-capping and sinks) reach a kernel: whether its contract takes
them, their values as the kernel's API hands them over, and the sinks' gradient.

A kernel takes ``softcap`` or ``sinks`` only when its signature names them (or its declaration
says so: ``flashcheck.kernel(fn, options=...)``); a case that sets one is outside the contract
of a kernel that does not. ``sinks`` reach a numpy kernel as the case's float32 array and a torch
kernel as a float32 tensor on its device (with ``requires_grad`` for an autograd backward,
whose gradient is the kernel's ``dσ``).

An FP8 case's descales (``descale_q``, ``descale_k``, ``descale_v``: float32 ``(B, Hk)``) reach
an FP8 kernel the same way, as FlashAttention-3's keyword arguments of those names: always all
three, ones for a descale the case leaves unset (``None`` means 1 to the oracle too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cases.case import FP8_DTYPES, Case
from ..core.fp8 import DESCALES

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
    for name, d in _all_descales(case).items():
        if api == "numpy":
            out[name] = d.copy()
        else:
            import torch

            out[name] = torch.from_numpy(d.copy()).to(device)
    return out


def _all_descales(case: Case) -> dict[str, np.ndarray]:
    """All three descales of an FP8 case, ones where it sets none (``{}`` for other cases).

    The docs promise an FP8 kernel three float32 ``(B, Hk)`` descales, so a kernel written to
    them calls ``descale_q.float()`` unconditionally; families that need only ``descale_k``
    handed it ``None`` for the others, and such a kernel raised. The case itself keeps them
    unset (its id and case file stay as they were), and 1 is what the oracle reads for them."""
    if case.dtype not in FP8_DTYPES:
        return {}
    ones = np.ones((case.q.shape[0], case.k.shape[1]), np.float32)
    return {n: ones if getattr(case, n) is None else getattr(case, n) for n in DESCALES}
