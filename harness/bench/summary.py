"""What a benchmark run measured, read back from its ``results.jsonl``: the records grouped by
shape, the Triton kernel's speed and memory side by side with its peers (ratios to SDPA flash
and cuDNN, extra memory against what any kernel must return) and the correctness tally.
:mod:`~flashcheck.harness.bench.render` and :mod:`~flashcheck.harness.bench.figures` draw from
this.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.status import Status
from .benchrecords import BenchResults, SpeedRecord, load_bench
from .providers import PROVIDERS

__all__ = [
    "ORDER",
    "PASS_ORDER",
    "BenchSummary",
    "backward_memory_line",
    "bench_summary",
    "counts",
    "load_results",
    "memory_line",
    "only_pass",
    "ordered",
    "passes_in",
    "ratio",
    "shape_keys",
    "user_providers",
]

ORDER = tuple(PROVIDERS)  # column and legend order
PASS_ORDER = ("fwd", "bwd", "fwd+bwd")


def ordered(names: Iterable[str], user: Iterable[str] = ()) -> list[str]:
    """``names`` in column and legend order: the built-ins in :data:`ORDER`, then the others
    (a user's kernels) in the order of ``user``, then any left sorted by name."""
    seen, user = set(names), list(user)
    rest = [p for p in user if p in seen and p not in ORDER]
    rest += sorted(seen - set(ORDER) - set(rest))
    return [p for p in ORDER if p in seen] + rest


def user_providers(data: BenchResults) -> list[str]:
    """The providers of ``data`` that are not built in (a user's ``--kernel``), in the order
    the run's configuration names them; read from the records, so no kernel is imported."""
    seen = {p for row in data.shapes.values() for p in row}
    named = data.header.get("config", {}).get("kernels") or ()
    return [p for p in ordered(seen, named) if p not in ORDER]


def counts(rec: SpeedRecord | None) -> bool:
    """A speed that counts: measured, and its output passed the oracle check."""
    return rec is not None and rec.counts


def ratio(a: SpeedRecord | None, b: SpeedRecord | None) -> float | None:
    """``a``'s TFLOP/s over ``b``'s, where both count."""
    if counts(a) and counts(b):
        return a.tflops / b.tflops
    return None


def load_results(path: Path) -> BenchResults:
    """The benchmark results at ``path``, typed and grouped by shape."""
    return load_bench(path)


def passes_in(data: BenchResults) -> list[str]:
    """The passes a results file holds, in :data:`PASS_ORDER`."""
    seen = {m.pass_ for m in data.meta.values()}
    return [p for p in PASS_ORDER if p in seen]


def only_pass(data: BenchResults, pass_: str) -> BenchResults:
    """``data`` restricted to the shapes of one pass: every table and ratio is drawn from one
    such view, so speeds of different passes are never compared."""
    return data.only(k for k, m in data.meta.items() if m.pass_ == pass_)


def shape_keys(data: BenchResults, part: str, **match: Any) -> list[str]:
    """The keys of ``part``'s shapes whose fields equal ``match``, by N then heads."""
    ks = [
        k
        for k, m in data.meta.items()
        if m.part == part and all(m.value(f) == v for f, v in match.items())
    ]
    return sorted(ks, key=lambda k: (data.meta[k].n, data.meta[k].h))


def _order(m: SpeedRecord) -> tuple:
    return (m.dtype, m.n, m.causal)


@dataclass(frozen=True)
class BenchSummary:
    """The Triton kernel beside its peers, and the correctness tally (see
    :func:`bench_summary`)."""

    vs_flash: list[tuple[float, str]]
    vs_cudnn: list[tuple[float, str]]
    checks: dict[str, dict[str, int]]
    failures: list[tuple[str, str, str, list[str]]]
    triton_unscored: list[str]
    # Per user kernel: (triton / kernel, key) where both scored, lowest first.
    vs_kernels: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bench_summary(data: BenchResults) -> BenchSummary:
    """The Triton kernel's speed ratios to its peers and the correctness tally.

    ``vs_flash``: ``(triton / sdpa-flash, key)`` at every grid and width shape where both
    scored, lowest first; ``vs_cudnn``: ``(triton / sdpa-cudnn, key)`` at the grid's d = 128,
    N ≥ 4096 shapes (the long sequences at the head dim cuDNN is tuned for), in dtype, N and
    causality order; ``checks``: per provider, how many outputs got each oracle verdict;
    ``failures``: each output whose check was not PASS; ``triton_unscored``: the shapes where
    Triton's speed does not count (error, skip or failed check); ``vs_kernels``: per user
    kernel (:func:`user_providers`), ``(triton / kernel, key)`` as ``vs_flash``."""
    vs_flash, vs_cudnn = [], []
    users = user_providers(data)
    vs_kernels: dict[str, list[tuple[float, str]]] = {u: [] for u in users}
    for key, provs in data.shapes.items():
        m = data.meta[key]
        if m.part not in ("grid", "width"):
            continue
        r = ratio(provs.get("triton"), provs.get("sdpa-flash"))
        if r is not None:
            vs_flash.append((r, key))
        for u in users:
            if (r := ratio(provs.get("triton"), provs.get(u))) is not None:
                vs_kernels[u].append((r, key))
        if m.part == "grid" and m.d == 128 and m.n >= 4096:
            g = ratio(provs.get("triton"), provs.get("sdpa-cudnn"))
            if g is not None:
                vs_cudnn.append((g, key))
    checks: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    failures = []
    for key, provs in data.shapes.items():
        for p, rec in provs.items():
            if rec.status != "ok":
                continue
            v = rec.check.verdict if rec.check is not None else "unchecked"
            checks[p][v] += 1
            if v != Status.PASS:
                failures.append((key, p, v, list(rec.check.reasons) if rec.check else []))
    triton_unscored = [
        k for k, provs in data.shapes.items() if "triton" in provs and not counts(provs["triton"])
    ]
    return BenchSummary(
        vs_flash=sorted(vs_flash),
        vs_cudnn=sorted(vs_cudnn, key=lambda x: _order(data.meta[x[1]])),
        checks={p: dict(v) for p, v in checks.items()},
        failures=failures,
        triton_unscored=triton_unscored,
        vs_kernels={u: sorted(v) for u, v in vs_kernels.items()},
    )


def memory_line(data: BenchResults) -> str | None:
    """The Triton kernel's peak extra memory at the largest N of the ``memory`` part, beside
    the size of O + LSE (what any forward that returns them must allocate)."""
    keys = shape_keys(data, "memory", **{"pass": "fwd"})
    recs = [(data.meta[k].n, data.shapes[k].get("triton")) for k in keys]
    recs = [(n, r) for n, r in recs if r and r.status == "ok" and r.peak_extra_bytes is not None]
    if not recs:
        return None
    n, r = max(recs, key=lambda x: x[0])
    base = r.out_bytes + r.lse_bytes
    return (
        f"- **Memory** at N = {n}: Triton's peak extra memory is "
        f"{r.peak_extra_bytes / 2**20:,.1f} MiB; O + LSE take {base / 2**20:,.1f} MiB "
        f"({r.peak_extra_bytes / base:.2f}×)."
    )


def backward_memory_line(data: BenchResults) -> str | None:
    """The Triton backward's peak extra memory over the size of ``dQ + dK + dV`` (which any
    backward returns) at the smallest and the largest N of the ``memory`` part: materializing
    the N × N scores would grow that ratio in proportion to N, an O(N·d) workspace keeps it
    flat."""
    keys = shape_keys(data, "memory", **{"pass": "bwd"})
    recs = [(data.meta[k].n, data.shapes[k].get("triton")) for k in keys]
    recs = [
        (n, r) for n, r in recs if r and r.status == "ok" and r.bwd_peak_extra_bytes is not None
    ]
    if len(recs) < 2:
        return None
    (n0, r0), (n1, r1) = min(recs, key=lambda x: x[0]), max(recs, key=lambda x: x[0])
    a, b = (r.bwd_peak_extra_bytes / r.grad_bytes for r in (r0, r1))
    return (
        f"- **Backward memory**: Triton's peak extra memory of the backward over dQ + dK + dV "
        f"is {a:.2f}× at N = {n0} and {b:.2f}× at N = {n1} "
        f"({r1.bwd_peak_extra_bytes / 2**20:,.1f} MiB)."
    )
