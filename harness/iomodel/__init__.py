"""A GPU memory-hierarchy simulator (HBM and SRAM traffic, cycles) and roofline arithmetic.

An additive cycle model of HBM traffic and compute that explains why FlashAttention wins;
docs/iomodel.md describes the model and its limits."""

from .analytic import Roofline, attention_flops, flash_bytes, naive_bytes
from .attention import (
    SCHEDULES,
    BlockTooLarge,
    flash_attention,
    largest_flash_block,
    standard_attention,
)
from .gpu import GPUSpec
from .profiler import Profiler
from .tensor import Tensor

__all__ = [
    "SCHEDULES",
    "BlockTooLarge",
    "GPUSpec",
    "Profiler",
    "Roofline",
    "Tensor",
    "attention_flops",
    "flash_attention",
    "flash_bytes",
    "largest_flash_block",
    "naive_bytes",
    "standard_attention",
]
