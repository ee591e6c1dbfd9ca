"""The seeds' GPU memory-hierarchy simulator (seed 000): an additive cycle model of HBM traffic
and compute, used to explain why FlashAttention wins. See docs/iomodel.md (to come) and
:mod:`harness.iomodel.attention` for the standard and flash traces."""

from harness.iomodel.attention import flash_attention, standard_attention
from harness.iomodel.gpu import GPUSpec
from harness.iomodel.profiler import Profiler
from harness.iomodel.tensor import Tensor

__all__ = ["GPUSpec", "Profiler", "Tensor", "flash_attention", "standard_attention"]
