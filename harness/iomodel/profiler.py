"""``Profiler``: accounts HBM allocation, HBM reads/writes, SRAM push/pop and cycles.

The cost model (docs/iomodel.md): a load or store of ``n`` floats costs
``n / hbm_bandwidth`` cycles; a matmul ``(M×K)·(K×N)`` costs ``2·M·N·K / flop_rate``; an
elementwise pass costs ``n·ops / flop_rate``; the total is the *sum* of compute and HBM cycles
(no overlap). SRAM overflow is recorded, never raised: it shows that a schedule does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .gpu import GPUSpec

__all__ = ["Profiler"]


@dataclass
class Profiler:
    spec: GPUSpec
    name: str = ""
    cycles_compute: float = 0.0
    cycles_hbm: float = 0.0
    current_hbm_usage: int = 0
    peak_hbm_usage: int = 0
    current_sram_usage: int = 0
    peak_sram_usage: int = 0
    total_hbm_reads: int = 0
    total_hbm_writes: int = 0
    log: list[tuple[str, str, float]] = field(default_factory=list)

    def allocate_hbm(self, n: int, name: str = "") -> None:
        self.current_hbm_usage += n
        self.peak_hbm_usage = max(self.peak_hbm_usage, self.current_hbm_usage)
        self.log.append(("hbm_alloc", name, n))

    def free_hbm(self, n: int, name: str = "") -> None:
        self.current_hbm_usage -= n
        self.log.append(("hbm_free", name, n))

    def sram_push(self, n: int, name: str = "") -> None:
        self.current_sram_usage += n
        self.peak_sram_usage = max(self.peak_sram_usage, self.current_sram_usage)
        self.log.append(("sram_push", name, n))
        excess = self.current_sram_usage - self.spec.sram_size
        if excess > 0:
            self.log.append(("sram_overflow", name, excess))

    def sram_pop(self, n: int, name: str = "") -> None:
        self.current_sram_usage -= n
        self.log.append(("sram_pop", name, n))

    @property
    def sram_overflowed(self) -> bool:
        return self.peak_sram_usage > self.spec.sram_size

    def load_from_hbm(self, n: int, name: str = "") -> None:
        self.cycles_hbm += n / self.spec.hbm_bandwidth
        self.total_hbm_reads += n
        self.log.append(("hbm_read", name, n))

    def store_to_hbm(self, n: int, name: str = "") -> None:
        self.cycles_hbm += n / self.spec.hbm_bandwidth
        self.total_hbm_writes += n
        self.log.append(("hbm_write", name, n))

    def matmul(self, m: int, n: int, k: int, name: str = "") -> None:
        flops = 2 * m * n * k
        self.cycles_compute += flops / self.spec.flop_rate
        self.log.append(("compute_matmul", name, flops))

    def elementwise(self, n: int, ops_per_element: float = 1, name: str = "") -> None:
        flops = n * ops_per_element
        self.cycles_compute += flops / self.spec.flop_rate
        self.log.append(("compute_elementwise", name, flops))

    @property
    def hbm_traffic(self) -> int:
        return self.total_hbm_reads + self.total_hbm_writes

    @property
    def total_cycles(self) -> float:
        return self.cycles_compute + self.cycles_hbm

    @property
    def hbm_fraction(self) -> float:
        return self.cycles_hbm / self.total_cycles if self.total_cycles else 0.0

    def hbm_traffic_log(self) -> list[tuple[str, str, float]]:
        return [e for e in self.log if e[0] in ("hbm_read", "hbm_write")]

    def report(self) -> str:
        b = self.spec.bytes_per_float

        def mib(n: float) -> float:
            return n * b / 2**20

        sram_pct = 100 * self.peak_sram_usage / self.spec.sram_size
        bound = (
            "Memory-bound (HBM is the bottleneck)"
            if self.cycles_hbm > self.cycles_compute
            else "Compute-bound (compute is the bottleneck)"
        )
        lines = [
            f"== {self.name or 'profile'} on {self.spec.name} ==",
            f"Peak HBM:   {self.peak_hbm_usage:,} floats ({mib(self.peak_hbm_usage):.1f} MiB)",
            f"Peak SRAM:  {self.peak_sram_usage:,} floats ({sram_pct:.0f}% of capacity)"
            + (" OVERFLOW" if self.sram_overflowed else ""),
            f"HBM reads:  {self.total_hbm_reads:,} floats ({mib(self.total_hbm_reads):.1f} MiB)",
            f"HBM writes: {self.total_hbm_writes:,} floats ({mib(self.total_hbm_writes):.1f} MiB)",
            f"HBM total:  {self.hbm_traffic:,} floats ({mib(self.hbm_traffic):.1f} MiB)",
            f"Cycles: compute {self.cycles_compute:,.0f}, HBM {self.cycles_hbm:,.0f}, total "
            f"{self.total_cycles:,.0f} ({100 * self.hbm_fraction:.1f}% on HBM)",
            bound,
        ]
        return "\n".join(lines)
