"""PNG figures of a benchmark run (matplotlib, Agg backend), from the loaded results only.

- ``tflops_vs_n``: TFLOP/s vs N per provider, one panel per head dim × causality (bf16);
- ``memory_vs_n``: peak extra memory of one call vs N (log-log), with O + LSE for reference;
- ``wallclock_vs_n``: milliseconds per call vs N at fixed batch and heads (log-log);
- ``width``: TFLOP/s vs model width H·d at N = 4096.

Only speeds whose output passed the oracle check are drawn. Every provider of the records is
drawn, a user's kernels (``--kernel``) after the built-ins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .benchrecords import BenchResults
from .summary import ORDER, counts, ordered, user_providers

__all__ = ["make_bench_figures"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _style(p: str, order: list[str]) -> dict[str, Any]:
    if p not in ORDER:  # a user's kernel: dashed, with markers no built-in has
        j = [x for x in order if x not in ORDER].index(p)
        return {"marker": "XPd8"[j % 4], "linestyle": "--", "label": p, "linewidth": 2.0}
    i = ORDER.index(p)  # a built-in keeps its marker from run to run
    return {"marker": "osD^v<>ph*x"[i % 11], "label": p, "linewidth": 2.6 if p == "triton" else 1.3}


def _order(data: BenchResults) -> list[str]:
    """Every provider of ``data``, in legend order (one marker each, the same in every
    figure)."""
    return ordered({p for row in data.shapes.values() for p in row}, user_providers(data))


def _series(data, keys, prov, x, y):
    pts = []
    for k in keys:
        rec = data.shapes[k].get(prov)
        if counts(rec) and getattr(rec, y) is not None:
            pts.append((x(data.meta[k]), getattr(rec, y)))
    return sorted(pts)


def make_bench_figures(data: BenchResults, out: Path) -> list[str]:
    """Draw every figure the data supports into ``out``; returns the names drawn."""
    plt = _plt()
    made: list[str] = []
    _grid_figure(plt, data, out, made)
    _memory_figures(plt, data, out, made)
    _width_figure(plt, data, out, made)
    return made


def _grid_figure(plt, data: BenchResults, out: Path, made: list[str]) -> None:
    """Forward TFLOP/s vs N of the bf16 grid, per head dim and causality."""
    meta, order = data.meta, _order(data)
    grid = [k for k, m in meta.items() if m.part == "grid" and m.dtype == "bf16"]
    if grid:
        dims = sorted({meta[k].d for k in grid})
        fig, axes = plt.subplots(2, len(dims), figsize=(5.0 * len(dims), 7.6), squeeze=False)
        fig.suptitle("Forward TFLOP/s, bf16, B·N = 16384, H·d = 2048 (checked outputs only)")
        for col, d in enumerate(dims):
            for row, causal in enumerate((False, True)):
                ax = axes[row][col]
                ks = [k for k in grid if meta[k].d == d and meta[k].causal == causal]
                for p in order:
                    pts = _series(data, ks, p, lambda m: m.n, "tflops")
                    if pts:
                        ax.plot(*zip(*pts, strict=True), **_style(p, order))
                ax.set_xscale("log", base=2)
                ax.set_title(f"d = {d}, {'causal' if causal else 'non-causal'}")
                ax.set_xlabel("N")
                ax.set_ylabel("TFLOP/s")
                ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "tflops_vs_n.png", dpi=110)
        plt.close(fig)
        made.append("tflops_vs_n")


def _memory_figures(plt, data: BenchResults, out: Path, made: list[str]) -> None:
    """Peak extra memory and wall-clock of one call vs N (the memory part)."""
    meta, order = data.meta, _order(data)
    mem = [k for k, m in meta.items() if m.part == "memory"]
    if mem:
        for name, field, ylabel, title in (
            ("memory_vs_n", "peak_extra_bytes", "MiB", "Peak extra memory of one call"),
            ("wallclock_vs_n", "ms", "ms", "Wall-clock of one call"),
        ):
            fig, ax = plt.subplots(figsize=(6.4, 4.6))
            for p in order:
                pts = _series(data, mem, p, lambda m: m.n, field)
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    if field == "peak_extra_bytes":
                        ys = [y / 2**20 for y in ys]
                    ax.plot(xs, ys, **_style(p, order))
            if field == "peak_extra_bytes":
                base = sorted(
                    (
                        meta[k].n,
                        (next(iter(data.shapes[k].values())).out_bytes or 0)
                        / 2**20
                        * (1 + 4 / (2 * meta[k].d)),
                    )
                    for k in mem
                )
                ax.plot(*zip(*base, strict=True), "k--", label="O + LSE")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("N")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{title}: bf16, B = 1, H = 8, d = 128")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(out / f"{name}.png", dpi=110)
            plt.close(fig)
            made.append(name)


def _width_figure(plt, data: BenchResults, out: Path, made: list[str]) -> None:
    """TFLOP/s vs model width (the width part)."""
    meta, order = data.meta, _order(data)
    width = [k for k, m in meta.items() if m.part == "width"]
    if width:
        fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.2), squeeze=False)
        fig.suptitle("TFLOP/s vs model width H·d: bf16, N = 4096, d = 128, B = 4")
        for ax, causal in zip(axes[0], (False, True), strict=True):
            ks = [k for k in width if meta[k].causal == causal]
            for p in order:
                pts = _series(data, ks, p, lambda m: m.h * m.d, "tflops")
                if pts:
                    ax.plot(*zip(*pts, strict=True), **_style(p, order))
            ax.set_xscale("log", base=2)
            ax.set_xlabel("H·d")
            ax.set_ylabel("TFLOP/s")
            ax.set_title("causal" if causal else "non-causal")
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "width.png", dpi=110)
        plt.close(fig)
        made.append("width")
