"""The campaign's worst-case search: each generation mutates the highest-scoring cases found so
far for one kernel and dtype.

The score is the *failure margin* (:func:`~flashcheck.harness.campaign.records.failure_margin`):
above 1 the case fails. Parents come from the fixed parts and earlier generations only, so a
resumed generation sees exactly the pool the uninterrupted run saw, and the children are drawn
from an RNG seeded by (seed, kernel, dtype, generation): a generation is the same on every run.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..adapters.adapter import Kernel
from ..cases.families import Recipe, make_case
from ..core.status import Status
from .plan import Item, Preset, mutate, rng_for
from .resultrecords import (
    GradientResult,
    ResultRecord,
    StructuralResult,
)

__all__ = ["children", "parents"]


def parents(
    results: Iterable[ResultRecord], spec: str, dtype: str, gen: int, count: int
) -> list[Recipe]:
    """The recipes of the ``count`` highest-scoring forward results of ``spec`` and ``dtype``
    from before generation ``gen`` (SKIPs and the ``options`` part left out; ties broken by
    key)."""
    pool = [
        r
        for r in results
        if r.kernel == spec
        and r.dtype == dtype
        and r.status != Status.SKIP
        and r.part != "options"  # (the search mutates plain cases; options have their part)
        and not isinstance(r, StructuralResult | GradientResult)
        and r.generation < gen
    ]
    pool.sort(key=lambda r: (-r.score, r.key))
    return [r.recipe for r in pool[:count]]


def children(
    pool: list[Recipe],
    *,
    spec: str,
    dtype: str,
    gen: int,
    preset: Preset,
    seed: int,
    adapter: Kernel,
    device: str,
) -> list[Item]:
    """Generation ``gen`` of the search for ``spec`` and ``dtype``: ``preset.search_population``
    mutations of the parents ``pool`` in turn, each retried (up to 20 times) until the kernel
    supports it on ``device``. None without parents."""
    if not pool:
        return []
    rng = rng_for(seed, "search", spec, dtype, gen)
    out = []
    for c in range(preset.search_population):
        parent = pool[c % len(pool)]
        child = parent
        for _ in range(20):
            child = mutate(rng, parent, preset, adapter)
            if adapter.supports(make_case(child), device) is None:
                break
        out.append(Item("search", f"{gen}/{c}", child))
    return out
