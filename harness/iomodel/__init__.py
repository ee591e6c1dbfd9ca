"""A GPU memory-hierarchy simulator (HBM and SRAM traffic, cycles) and roofline arithmetic.

An additive cycle model of HBM traffic and compute that explains why FlashAttention wins;
docs/iomodel.md describes the model and its limits."""

from .analytic import Roofline, attention_flops, flash_bytes, naive_bytes
from .attention import flash_attention, standard_attention
from .gpu import GPUSpec
from .profiler import Profiler
from .tensor import Tensor

__all__ = [
    "GPUSpec",
    "Profiler",
    "Roofline",
    "Tensor",
    "attention_flops",
    "flash_attention",
    "flash_bytes",
    "naive_bytes",
    "standard_attention",
]
