"""A traced 2-D tensor: PyTorch-like syntax whose every HBM and SRAM movement is charged to a
:class:`~flashcheck.harness.iomodel.profiler.Profiler` (the simplest model: loads and stores
are implicit in ``@`` and ``softmax``).

- A tensor lives in HBM from its creation until :meth:`free`; ``.T`` is a free view.
- ``A @ B``: if both operands fit in SRAM, load both, multiply, store the result. Otherwise tile
  the output in 2-D: with ``s = sram // K`` floats of operand rows per tile, ``M_t = min(M, s//2)``
  and ``N_t = min(N, s − M_t)``; every tile reloads its A row-block and B column-block (no reuse
  across tiles) and stores its C tile. The C tile is not counted in SRAM.
- ``softmax()``: row chunks of ``sram // (2·cols)`` rows; each chunk is loaded, costs 5 ops per
  element (max, subtract, exp, sum, divide), and is stored.
"""

from __future__ import annotations

from .profiler import Profiler

__all__ = ["SOFTMAX_OPS", "Tensor"]

SOFTMAX_OPS = 5


class Tensor:
    def __init__(self, shape: tuple[int, int], name: str, profiler: Profiler, *, view=False):
        if len(shape) != 2 or min(shape) < 1:
            raise ValueError(f"Tensor shapes are 2-D with positive sizes, got {shape}")
        self.shape = (int(shape[0]), int(shape[1]))
        self.name = name
        self.prof = profiler
        self.view = view
        self.freed = False
        if not view:
            profiler.allocate_hbm(self.size, name)

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def T(self) -> Tensor:
        return Tensor((self.shape[1], self.shape[0]), f"{self.name}.T", self.prof, view=True)

    def free(self) -> None:
        if not self.view and not self.freed:
            self.prof.free_hbm(self.size, self.name)
            self.freed = True

    def __matmul__(self, other: Tensor) -> Tensor:
        (m, k), (k2, n) = self.shape, other.shape
        if k != k2:
            raise ValueError(f"shapes {self.shape} and {other.shape} do not chain for matmul")
        p = self.prof
        out = Tensor((m, n), f"{self.name}@{other.name}", p)
        sram = p.spec.sram_size
        if self.size + other.size <= sram:
            p.load_from_hbm(self.size, self.name)
            p.load_from_hbm(other.size, other.name)
            p.sram_push(self.size + other.size, out.name)
            p.matmul(m, n, k, out.name)
            p.store_to_hbm(out.size, out.name)
            p.sram_pop(self.size + other.size, out.name)
            return out
        per = sram // k
        m_t = min(m, per // 2)
        n_t = min(n, per - m_t)
        if m_t < 1 or n_t < 1:
            raise ValueError(f"inner dimension {k} leaves no room for a tile in {sram} floats")
        for i0 in range(0, m, m_t):
            mi = min(m_t, m - i0)
            for j0 in range(0, n, n_t):
                nj = min(n_t, n - j0)
                p.load_from_hbm(mi * k, f"{self.name}[{i0}:{i0 + mi}]")
                p.load_from_hbm(k * nj, f"{other.name}[:, {j0}:{j0 + nj}]")
                p.sram_push(mi * k + k * nj, f"{out.name} tile")
                p.matmul(mi, nj, k, f"{out.name} tile")
                p.store_to_hbm(mi * nj, f"{out.name}[{i0}, {j0}]")
                p.sram_pop(mi * k + k * nj, f"{out.name} tile")
        return out

    def softmax(self, name: str | None = None) -> Tensor:
        p = self.prof
        rows, cols = self.shape
        out = Tensor(self.shape, name or f"softmax({self.name})", p)
        chunk = max(1, min(rows, p.spec.sram_size // (2 * cols)))
        for r0 in range(0, rows, chunk):
            n = min(chunk, rows - r0) * cols
            p.load_from_hbm(n, f"{self.name}[{r0}:]")
            p.sram_push(n, out.name)
            p.elementwise(n, SOFTMAX_OPS, out.name)
            p.store_to_hbm(n, f"{out.name}[{r0}:]")
            p.sram_pop(n, out.name)
        return out

    def __repr__(self) -> str:
        return f"Tensor({self.name}, shape={self.shape}{', view' if self.view else ''})"
