"""PNG figures of an error report (matplotlib, Agg backend), drawn from the JSONL records only.

- ``error_vs_n``: max floored-ULP error vs sequence length (the ``length`` part), per dtype;
- ``error_vs_logit``: max floored-ULP error vs the case's max |logit| (the ``logit`` part);
- ``ulp_histogram``: the per-element floored-ULP distribution, pooled over all judged cases;
- ``bound_utilization``: each case's deterministic-bound utilization (kernels with bounds).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..judging.metrics import ULP_EDGES
from .logrecords import (
    ResultsFile,
)

__all__ = ["figures_unavailable", "make_figures", "unbinned", "utilization_points"]


def figures_unavailable() -> str | None:
    """Why no figure can be drawn here (matplotlib, an optional dependency, not installed), or
    ``None``."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed (pip install 'flashcheck[report]' draws them)"
    return None


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes(plt, n: int, title: str):
    fig, axes = plt.subplots(1, n, figsize=(5.2 * n, 4.0), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def _styles(kernels: list[str]) -> dict[str, dict[str, Any]]:
    markers = "osD^v<>ph*xP"
    return {k: {"marker": markers[i % len(markers)], "label": k} for i, k in enumerate(kernels)}


def _save(fig, out: Path, name: str) -> None:
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)


def _line_plot(data, out, kernels, dtypes, part: str, xkey, name: str, title: str, xlabel: str):
    plt = _plt()
    rows = [r for r in data.results if r.part == part and r.status.judged]
    dts = [dt for dt in dtypes if any(r.dtype == dt for r in rows)]
    if not dts:
        return False
    fig, axes = _axes(plt, len(dts), title)
    sty = _styles(kernels)
    for ax, dt in zip(axes, dts, strict=True):
        broken = []
        for k in kernels:
            pts = sorted(
                (xkey(r), float(r.metrics.max_ulp)) for r in rows if r.kernel == k and r.dtype == dt
            )
            broken += [x for x, y in pts if x > 0 and not math.isfinite(y)]
            pts = [(x, max(y, 1e-3)) for x, y in pts if x > 0 and math.isfinite(y)]  # 0 -> 1e-3
            if pts:
                ax.plot(*zip(*pts, strict=True), **sty[k], linewidth=1, markersize=4)
        if broken:
            # NaN/Inf outputs where the exact result is finite have no finite error: marked
            # along the top edge, never plotted as a small error.
            top = max(ax.get_ylim()[1], 1e3) if ax.has_data() else 1e3
            ax.scatter(
                broken,
                [top] * len(broken),
                marker="X",
                color="red",
                zorder=5,
                label="NaN/Inf output",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(dt)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("max floored-ULP error (0 drawn at 1e-3)")
        ax.axhline(0.5, color="grey", linewidth=0.6, linestyle=":")
        ax.grid(True, which="major", alpha=0.3)
    axes[-1].legend(fontsize=7, loc="best")
    _save(fig, out, name)
    plt.close(fig)
    return True


def _histograms(data, out, kernels, dtypes) -> bool:
    plt = _plt()
    rows = [r for r in data.results if r.status.judged and r.ulp_hist is not None]
    dts = [dt for dt in dtypes if any(r.dtype == dt for r in rows)]
    if not dts:
        return False
    fig, axes = _axes(plt, len(dts), "Per-element floored-ULP error, all judged cases")
    # Bin i holds [ULP_EDGES[i], ULP_EDGES[i+1]); bin 0 starts at 0 and is drawn at 2^-7.
    lefts = [2.0**-7, *ULP_EDGES[1:-1]]
    for ax, dt in zip(axes, dts, strict=True):
        for k in kernels:
            hist = None
            for r in rows:
                if r.kernel == k and r.dtype == dt:
                    h = r.ulp_hist
                    hist = (
                        list(h) if hist is None else [a + b for a, b in zip(hist, h, strict=True)]
                    )
            if not hist or not sum(hist):
                continue
            total = sum(hist)
            frac = [c / total for c in hist]
            ax.step(lefts[: len(frac)], frac, where="post", label=k, linewidth=1.2)
        n_el, n_cases = unbinned(data, dt)
        if n_el:
            ax.set_title(
                f"{dt}: {n_el} NaN/Inf mismatches ({n_cases} cases), not binned", color="red"
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("floored-ULP error (bin lower edge)")
        ax.set_ylabel("fraction of elements")
        if not n_el:
            ax.set_title(dt)
        ax.axvline(0.5, color="grey", linewidth=0.6, linestyle=":")
        ax.grid(True, alpha=0.3)
    axes[-1].legend(fontsize=7, loc="best")
    _save(fig, out, "ulp_histogram")
    plt.close(fig)
    return True


def unbinned(data: ResultsFile, dtype: str) -> tuple[int, int]:
    """The NaN/Inf mismatches (elements, cases) of ``dtype``'s judged cases: outputs with no
    floored-ULP error to bin, named in the histogram's title instead of dropped silently."""
    counts = [
        int(r.metrics.nonfinite_mismatches)
        for r in data.results
        if r.dtype == dtype and r.status.judged and r.metrics is not None
    ]
    return sum(counts), sum(c > 0 for c in counts)


def utilization_points(
    data: ResultsFile, kernels: list[str], dtypes: list[str]
) -> dict[str, dict[str, tuple[list[float], int]]]:
    """Per dtype and kernel, what ``bound_utilization.png`` draws: the finite utilizations of
    the judged cases, and how many cases had none (∞: a NaN/Inf output, or an error with a
    zero bound), drawn as red crosses on the top edge and counted in the legend."""
    out: dict[str, dict[str, tuple[list[float], int]]] = {}
    for dt in dtypes:
        per: dict[str, tuple[list[float], int]] = {}
        for k in kernels:
            rows = (r for r in data.results if r.kernel == k and r.dtype == dt)
            us = [r.utilization for r in rows if r.status.judged]
            us = [u for u in us if u is not None]
            if us:
                per[k] = (
                    [u for u in us if math.isfinite(u)],
                    sum(not math.isfinite(u) for u in us),
                )
        if per:
            out[dt] = per
    return out


def _utilization(data, out, kernels, dtypes) -> bool:
    plt = _plt()
    points = utilization_points(data, kernels, dtypes)
    if not points:
        return False
    fig, axes = _axes(plt, len(points), "Deterministic-bound utilization per case (1 = FAIL-HARD)")
    for ax, (dt, per) in zip(axes, points.items(), strict=True):
        ks = list(per)
        finite = [u for ys, _ in per.values() for u in ys]
        top = max(10.0, 3 * max(finite, default=1.0))
        crosses: list[float] = []
        for i, k in enumerate(ks):
            ys, n_inf = per[k]
            ys = [max(u, 1e-6) for u in ys]
            xs = [i + 0.3 * ((j * 0.618) % 1 - 0.5) for j in range(len(ys))]
            ax.scatter(xs, ys, s=8, alpha=0.6)
            crosses += [i + 0.3 * ((j * 0.618) % 1 - 0.5) for j in range(n_inf)]
        if crosses:
            ax.scatter(
                crosses,
                [top] * len(crosses),
                marker="X",
                color="red",
                zorder=5,
                label=f"∞: NaN/Inf output ({len(crosses)} cases)",
            )
            ax.legend(fontsize=7, loc="lower right")
        ax.axhline(1.0, color="red", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(len(ks)))
        ax.set_xticklabels(ks, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("max |error| / deterministic bound")
        ax.set_title(dt)
        ax.grid(True, axis="y", alpha=0.3)
    _save(fig, out, "bound_utilization")
    plt.close(fig)
    return True


def make_figures(data: ResultsFile, out: Path, kernels: list[str], dtypes: list[str]):
    """Draw every figure the data supports into ``out``; returns the names drawn."""
    made = []
    if _line_plot(
        data,
        out,
        kernels,
        dtypes,
        "length",
        lambda r: r.shape.Nk,
        "error_vs_n",
        "Error vs sequence length, N(0,1) inputs",
        "Nq = Nk",
    ):
        made.append("error_vs_n")
    if _line_plot(
        data,
        out,
        kernels,
        dtypes,
        "logit",
        lambda r: float(r.max_logit),
        "error_vs_logit",
        "Error vs max |logit|",
        "max |scale·q·k|",
    ):
        made.append("error_vs_logit")
    if _histograms(data, out, kernels, dtypes):
        made.append("ulp_histogram")
    if _utilization(data, out, kernels, dtypes):
        made.append("bound_utilization")
    return made
