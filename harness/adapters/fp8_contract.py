"""What an FP8 kernel's contract is: the FP8 dtypes it declares and FlashAttention-3's descale
keywords its signature must take. An FP8 kernel is declared, never probed (the probe draws 16-
and 32-bit inputs): ``flashcheck.kernel(fn, dtypes=("e4m3",), ...)``; its campaign is the FP8
one (:mod:`flashcheck.harness.campaign.fp8_report`), and the property suite refuses it.
"""

from __future__ import annotations

import inspect

from ..cases.case import FP8_DTYPES
from ..core.fp8 import DESCALES
from .adapter import Kernel

__all__ = ["check_signature", "fp8_kernels", "suite_refusal"]


def fp8_kernels(kernel: Kernel) -> tuple[str, ...]:
    """The FP8 dtypes a kernel declares (``()`` for a 16-bit kernel or undeclared dtypes)."""
    if "dtypes" in kernel.pending:
        return ()
    return tuple(d for d in kernel.dtypes if d in FP8_DTYPES)


def suite_refusal(spec: str, kernel: Kernel) -> str | None:
    """Why the property suite does not take ``kernel`` (it declares FP8 dtypes), or ``None``."""
    fp8 = fp8_kernels(kernel)
    if not fp8:
        return None
    return (
        f"{spec} declares FP8 dtypes ({', '.join(fp8)}): the property suite covers fp16, bf16 "
        f"and fp32 inputs; run the FP8 campaign with flashcheck report --kernel {spec}, or judge "
        "one input with flashcheck.check(kernel, q8, k8, v8, descale_q=..., descale_k=..., "
        "descale_v=...)"
    )


def check_signature(spec: str, adapter: Kernel) -> None:
    """An FP8 kernel must take FlashAttention-3's descale keywords (or ``**kwargs``)."""
    try:
        params = inspect.signature(adapter.fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function: let the calls tell
        return
    names = {p.name for p in params}
    if any(p.kind is p.VAR_KEYWORD for p in params) or set(DESCALES) <= names:
        return
    missing = sorted(set(DESCALES) - names)
    raise ValueError(
        f"{spec} declares FP8 dtypes but takes no {', '.join(missing)} keyword: add "
        "descale_q=None, descale_k=None, descale_v=None to its signature (FlashAttention-3's)"
    )
