"""Repeated campaign speed runs: the order to run them in, their medians, and a side-by-side
reading of saved results files (``benchmarks/campaign_speed.py --repeat`` and ``--compare``).

A configuration ``N:K`` (``N`` reference workers, ``K`` kernel workers) run ``r`` times has
walls ``w_1 .. w_r``. Per configuration: ``median(w)``, ``min(w)``, ``max(w)``. Its speedup over
the first configuration ``c_0`` is ``median(w(c_0)) / median(w(c))``. The runs alternate
configurations (``c_0, c_1, c_0, c_1, ...``), so the ``j``-th run of each forms a *pair* run
close in time, under similar machine conditions; ``w_j(c_0) / w_j(c)`` over the pairs gives the
spread of the speedup (its min and max), which one pair alone hides.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..core.resultlog import read_records
from .kernel_time import KernelRow
from .phases import PhaseTimeline

__all__ = [
    "ConfigSummary",
    "SavedRun",
    "SpeedRun",
    "compare_lines",
    "read_saved_run",
    "run_order",
    "summarize",
    "summary_table",
]


@dataclass(frozen=True)
class SpeedRun:
    """One run: its configuration (``"N:K"``), wall seconds, result count, and whether its
    results are the first run's, bit for bit."""

    config: str
    wall: float
    results: int
    same: bool


@dataclass(frozen=True)
class ConfigSummary:
    """A configuration's runs (module docstring): how many, the median, min and max wall,
    the speedup (ratio of medians) over the first configuration, the min and max of its
    pairs' ratios (``None`` without pairs), and whether every run had the first run's
    results."""

    config: str
    runs: int
    median: float
    low: float
    high: float
    speedup: float
    pair_low: float | None
    pair_high: float | None
    same: bool


def run_order(configs: Sequence[str], *, repeat: int) -> list[str]:
    """``configs`` ``repeat`` times over, alternating: ``[a, b, a, b, ...]`` for ``[a, b]``."""
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1 (the number of runs of each), got {repeat}")
    if not configs:
        raise ValueError("give at least one configuration to run")
    return [c for _ in range(repeat) for c in configs]


def summarize(runs: Sequence[SpeedRun]) -> tuple[ConfigSummary, ...]:
    """One :class:`ConfigSummary` per configuration, in the order they first ran; the first
    configuration is the speedups' reference."""
    if not runs:
        raise ValueError("summarize needs at least one run")
    walls: dict[str, list[float]] = {}
    same: dict[str, bool] = {}
    for r in runs:
        if not r.wall > 0:
            raise ValueError(f"a run's wall time must be > 0, got {r.wall} for {r.config}")
        walls.setdefault(r.config, []).append(r.wall)
        same[r.config] = same.get(r.config, True) and r.same
    base = next(iter(walls.values()))
    out = []
    for config, w in walls.items():
        pairs = [a / b for a, b in zip(base, w, strict=False)]
        out.append(
            ConfigSummary(
                config=config,
                runs=len(w),
                median=statistics.median(w),
                low=min(w),
                high=max(w),
                speedup=statistics.median(base) / statistics.median(w),
                pair_low=None if w is base else min(pairs),
                pair_high=None if w is base else max(pairs),
                same=same[config],
            )
        )
    return tuple(out)


def summary_table(summaries: Sequence[ConfigSummary]) -> list[str]:
    """A markdown table of :func:`summarize`'s summaries."""
    lines = [
        "| workers:kernel workers | runs | median wall (s) | min (s) | max (s) | "
        "speedup (ratio of medians) | pairs' speedup min-max | same results |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        pairs = "–" if s.pair_low is None else f"{s.pair_low:.2f}x-{s.pair_high:.2f}x"
        lines.append(
            f"| {s.config} | {s.runs} | {s.median:.1f} | {s.low:.1f} | {s.high:.1f} | "
            f"{s.speedup:.2f}x | {pairs} | {'yes' if s.same else 'NO'} |"
        )
    return lines


@dataclass(frozen=True)
class SavedRun:
    """What a saved results file says about its run: its configuration (from the command
    line recorded in its last session; ``"?"`` if absent), its last phase timeline (``None``
    if not profiled), its results without their timings, and per kernel the sums of each
    ``seconds`` field of its results (``oracle``: the case's reference work; ``wait``: how long
    the campaign waited for a structural check)."""

    path: str
    config: str
    timeline: PhaseTimeline | None
    results: tuple[str, ...]
    seconds: dict[str, dict[str, float]]


def _config(argv: str) -> str:
    n = re.search(r"--workers[ =](\d+)", argv)
    k = re.search(r"--kernel-workers[ =](\d+)", argv)
    if not n:
        return "?"
    return f"{n.group(1)}:{k.group(1) if k else n.group(1)}"


def read_saved_run(path: str | Path) -> SavedRun:
    """The :class:`SavedRun` of the results file at ``path``."""
    argv, timeline, results = "", None, []
    seconds: dict[str, dict[str, float]] = {}
    for rec in read_records(path):
        kind = rec.get("type")
        if kind == "session":
            argv = str(rec.get("env", {}).get("argv", ""))
        elif kind == "phases":
            timeline = PhaseTimeline.from_json(rec)
        elif kind == "result":
            sums = seconds.setdefault(str(rec.get("kernel")), {})
            for field, value in (rec.get("seconds") or {}).items():
                sums[field] = sums.get(field, 0.0) + float(value)
            results.append(json.dumps({k: v for k, v in rec.items() if k != "seconds"}))
    return SavedRun(str(path), _config(argv), timeline, tuple(results), seconds)


def _side_by_side(head: str, keys: Sequence[str], cells: Sequence[dict[str, str]]) -> list[str]:
    """A markdown table: one row per key, one column per run (``–`` where a run has none)."""
    names = [chr(ord("A") + i) for i in range(len(cells))]
    lines = [f"| {head} | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in keys:
        lines.append(f"| {key} | " + " | ".join(c.get(key, "–") for c in cells) + " |")
    return lines


def _kernel_cells(rows: Sequence[KernelRow]) -> dict[str, str]:
    """Each row's cell: busy / first calls / in the worker process (seconds) / calls."""
    return {
        f"{r.kernel} {r.call}": f"{r.busy:.1f} / {r.first_busy:.1f} / "
        f"{'–' if r.inside is None else f'{r.inside:.1f}'} / {r.calls}"
        for r in rows
    }


def compare_lines(runs: Sequence[SavedRun]) -> list[str]:
    """Saved runs side by side: each run's summary line, the phases' busy and exclusive
    seconds, kernel work per kernel (runs that recorded it), the ``seconds`` sums per kernel
    and field, and the repeat summary over the runs with a phase timeline."""
    if not runs:
        raise ValueError("compare needs at least one saved results file")
    out = []
    for i, r in enumerate(runs):
        t = r.timeline
        same = "yes" if r.results == runs[0].results else "NO"
        desc = "no phase timeline"
        if t is not None:
            starts = t.row("worker start")
            desc = (
                f"wall {t.wall:.1f} s, serial {t.serial_share:.1%}, kernel busy per worker "
                f"{', '.join(f'{b:.1f}' for b in t.kernel_busy) or '?'} s, "
                f"{starts.spans if starts else 0} worker starts, load {t.load[0]:.2f}-"
                f"{t.load[1]:.2f}"
            )
        out.append(
            f"{chr(ord('A') + i)}: {r.path} ({r.config}): {len(r.results)} results "
            f"(same as A: {same}); {desc}"
        )
    timed = [r.timeline for r in runs]
    phases = [row.name for t in timed if t is not None for row in t.rows]
    cells = [
        {} if t is None else {x.name: f"{x.busy:.1f} / {x.exclusive:.1f}" for x in t.rows}
        for t in timed
    ]
    out += ["", "phases, busy / exclusive seconds:", ""]
    out += _side_by_side("phase", list(dict.fromkeys(phases)), cells)
    if any(t is not None and t.kernels for t in timed):
        cells = [{} if t is None else _kernel_cells(t.kernels) for t in timed]
        keys = list(dict.fromkeys(k for c in cells for k in c))
        out += ["", "kernel work: busy / first calls / in the worker process (s) / calls:", ""]
        out += _side_by_side("kernel call", keys, cells)
    fields = list(dict.fromkeys(f for r in runs for sums in r.seconds.values() for f in sums))
    kernels = list(dict.fromkeys(k for r in runs for k in r.seconds))
    for field in fields:
        cells = [{k: f"{s[field]:.1f}" for k, s in r.seconds.items() if field in s} for r in runs]
        for c, r in zip(cells, runs, strict=True):
            c["all"] = f"{sum(s.get(field, 0.0) for s in r.seconds.values()):.1f}"
        out += ["", f"results' `seconds.{field}` summed per kernel:", ""]
        out += _side_by_side("kernel", [*kernels, "all"], cells)
    walls = [
        SpeedRun(r.config, r.timeline.wall, len(r.results), r.results == runs[0].results)
        for r in runs
        if r.timeline is not None and r.timeline.wall > 0
    ]
    if walls:
        out += ["", "walls from the phase timelines, in the order given:", ""]
        out += summary_table(summarize(walls))
    return out
