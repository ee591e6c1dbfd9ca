"""``GPUSpec``: a simulated machine, in units of floats and cycles.

One "float" is ``bytes_per_float`` bytes (2: fp16/bf16). HBM moves ``hbm_bandwidth`` floats per
cycle and the SMs do ``flop_rate`` FLOPs per cycle; the ratio ``flop_rate / hbm_bandwidth`` is the
machine balance (FLOPs per float) that decides memory- vs compute-bound. ``sram_bandwidth`` is
carried for completeness: the seed's cost model never charges SRAM traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GPUSpec"]


@dataclass(frozen=True)
class GPUSpec:
    name: str
    bytes_per_float: int
    sram_size: int  # floats
    hbm_bandwidth: float  # floats / cycle
    sram_bandwidth: float  # floats / cycle (not charged by the model)
    flop_rate: float  # FLOPs / cycle

    def __post_init__(self) -> None:
        if self.sram_size <= 0 or self.hbm_bandwidth <= 0 or self.flop_rate <= 0:
            raise ValueError("sram_size, hbm_bandwidth and flop_rate must be positive")

    @property
    def balance(self) -> float:
        """FLOPs per float moved at which compute and HBM take equal time (the ridge)."""
        return self.flop_rate / self.hbm_bandwidth

    # Seed 000's presets: same bandwidth, SRAM and FLOP rate scaled like the real parts' ratios
    # (V100 ~125 TFLOP/s / 0.9 TB/s, A100 ~312 / 2, H100 ~990 / 3.35).
    @classmethod
    def sim_v100(cls) -> GPUSpec:
        return cls("Simulated V100", 2, 65_536, 1.0, 10.0, 70.0)

    @classmethod
    def sim_a100(cls) -> GPUSpec:
        return cls("Simulated A100", 2, 131_072, 1.0, 10.0, 150.0)

    @classmethod
    def sim_h100(cls) -> GPUSpec:
        return cls("Simulated H100", 2, 196_608, 1.0, 10.0, 300.0)

    # Real parts, datasheet figures, with one cycle = 1 ns: bandwidth in floats (2 bytes) per
    # ns, dense bf16 tensor-core FLOPs per ns, and one SM's shared memory (a tile lives in one
    # SM). Measured on this project's H100 run: 761–780 TFLOP/s and 2.98 TB/s
    # (benchmarks/RESULTS.md), below the datasheet's 989 TFLOP/s and 3.35 TB/s.
    @classmethod
    def h100_sxm(cls) -> GPUSpec:
        bw = 3.35e12 / 2 / 1e9
        return cls("H100 SXM (datasheet)", 2, 228 * 1024 // 2, bw, 10 * bw, 989e12 / 1e9)

    @classmethod
    def h200(cls) -> GPUSpec:
        bw = 4.8e12 / 2 / 1e9
        return cls("H200 (datasheet)", 2, 228 * 1024 // 2, bw, 10 * bw, 989e12 / 1e9)

    # Tile-size solvers (the seed's later version): the largest tiles whose working set fits
    # in ``usage`` of SRAM.
    def tile_2d(self, d: int, usage: float = 1.0) -> int:
        """Largest ``B`` with ``B² + 3·B·d ≤ usage·sram`` (a B×B score tile plus three B×d)."""
        avail = self.sram_size * usage
        return max(0, int((-3 * d + math.sqrt(9 * d * d + 4 * avail)) / 2))

    def tile_flash(self, d: int, usage: float = 1.0) -> int:
        """Largest ``B`` with ``2·B² + 4·B·d ≤ usage·sram`` (S and P tiles, Q/K/V/O blocks)."""
        avail = self.sram_size * usage
        return max(0, int(-d + math.sqrt(d * d + avail / 2)))
