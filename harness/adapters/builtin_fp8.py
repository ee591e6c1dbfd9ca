"""The project's FP8 kernel as a built-in: ``triton-fp8``, the Triton FP8 forward
(:mod:`flashcheck.kernels.triton_flash_fp8`) declared in the flash-fp8 class: e4m3 inputs with
FlashAttention-3's descales (the exact input is the FP8 value times its descale), bf16 output.

On Hopper its fp8 tensor-core products keep a narrower running sum than fp32 (measured in
benchmarks/RESULTS.md); the declaration states the class the kernel is meant to meet, so a
campaign shows whether that accumulation stays inside the class's bounds."""

from __future__ import annotations

from .adapter import Kernel
from .availability import triton_available

__all__ = ["fp8_kernels"]


def _triton_fp8(q, k, v, *, causal=False, scale=None, descale_q=None, descale_k=None,
                descale_v=None):  # fmt: skip
    from ...kernels.triton_flash_fp8 import flash_attention_fp8

    return flash_attention_fp8(
        q, k, v, causal=causal, scale=scale, descale_q=descale_q, descale_k=descale_k,
        descale_v=descale_v,
    )  # fmt: skip


def fp8_kernels() -> dict[str, Kernel]:
    """``{"triton-fp8": Kernel}``."""
    return {
        "triton-fp8": Kernel(
            "triton-fp8",
            _triton_fp8,
            "flash-fp8",
            api="torch",
            dtypes=("e4m3",),
            masks=frozenset({"causal"}),
            options=frozenset({"causal", "scale"}),
            check_available=triton_available,
            deterministic=True,
            batch_invariant=True,
        ),
    }
