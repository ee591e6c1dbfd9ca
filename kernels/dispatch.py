"""Platform dispatch: Triton on CUDA, a PyTorch fallback elsewhere.

``attention(q, k, v, ...)`` runs :func:`flashcheck.kernels.triton_flash.flash_attention` when the
tensors are on CUDA, or on CPU when ``TRITON_INTERPRET=1`` is set and ``backend="triton"`` is asked
for; otherwise (CPU, MPS) it runs :func:`flashcheck.kernels.naive.naive_torch`, which implements the
same semantics (bottom-right causal, windows, GQA) with torch eager ops. Returns ``(O, LSE)``.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["attention"]


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    backend: str = "auto",
    allow_tf32: bool = False,
) -> tuple[Any, Any]:
    """``softmax(scale·QKᵀ + mask)·V`` and LSE with the best implementation for the device.

    ``backend``: ``"auto"`` (Triton on CUDA, torch fallback elsewhere), ``"triton"`` (CUDA, or
    CPU under ``TRITON_INTERPRET=1``) or ``"torch"``.
    """
    if backend not in ("auto", "triton", "torch"):
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    on_cuda = getattr(q, "device", None) is not None and q.device.type == "cuda"
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    use_triton = backend == "triton" or (backend == "auto" and on_cuda)
    if use_triton:
        if not (on_cuda or interp):
            raise ValueError(
                "backend='triton' needs CUDA tensors, or TRITON_INTERPRET=1 set before triton is "
                "imported; use backend='auto' for the torch fallback"
            )
        from flashcheck.kernels.triton_flash import flash_attention

        return flash_attention(
            q, k, v, causal=causal, window=window, scale=scale, allow_tf32=allow_tf32
        )
    from flashcheck.kernels.naive import naive_torch

    return naive_torch(q, k, v, causal=causal, window=window, scale=scale)
