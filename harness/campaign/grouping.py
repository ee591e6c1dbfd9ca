"""A campaign's work grouped by compile key, for kernels that compile per shape.

A kernel with compile keys (:attr:`~flashcheck.harness.adapters.adapter.Kernel.compile_keys`)
pays a compile the first time a kernel worker sees one of its keys. :func:`grouped` orders its
work so that one key's cases run together (the keys in the order the plan first reaches them,
the cases of a key in plan order), and :func:`affinity` names each key's group of calls, which
the executor runs on one kernel worker, so that it compiles once. Work of kernels without
compile keys keeps the plan's order, ahead of the grouped work: a campaign without compiling
kernels runs exactly as before.

The order is a function of the configuration and the contracts only, so results still are.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

from ..adapters.adapter import ALL_DTYPES, Kernel
from ..adapters.palette import DEFAULT_PALETTE, compile_key, palette_for
from ..cases.families import Recipe
from .fitting import fit_recipe
from .plan import Item

__all__ = ["affinity", "compile_waits", "grouped", "palette_first"]

Work = list[tuple[Item, list[str]]]


def affinity(kernel: Kernel, recipe: Recipe, *, palette: int = DEFAULT_PALETTE) -> int | None:
    """The group of ``kernel``'s call on the fitted ``recipe``: ``None`` (any kernel worker)
    without compile keys; else one int per compile key (the palette's keys numbered dtype by
    dtype, any other key by its CRC-32). An executor runs a group's calls on one worker, so
    that one worker compiles the key (the local one binds a group to the first free worker)."""
    key = compile_key(kernel, recipe)
    if not key:
        return None
    keys = palette_for(kernel, palette)
    if keys is not None:
        values = tuple(getattr(recipe, dim) for dim in keys.dims)
        if values in keys.entries and recipe.dtype in ALL_DTYPES:
            return ALL_DTYPES.index(recipe.dtype) * len(keys.entries) + keys.entries.index(values)
    return zlib.crc32(repr(key).encode())


def compile_waits(
    work: Sequence[tuple[Item, Sequence[str]]],
    kernels: Mapping[str, Kernel],
    *,
    palette: int = DEFAULT_PALETTE,
) -> tuple[int, float]:
    """How many ``(spec, compile key)`` pairs ``work`` calls compiling kernels on, and the
    longest compile among those kernels (seconds; 0 where unknown)."""
    keys = {
        (spec, compile_key(kernels[spec], fit_recipe(it.recipe, kernels[spec], palette=palette)))
        for it, specs in work
        for spec in specs
        if kernels[spec].compile_keys
    }
    cost = max((kernels[spec].compile_seconds for spec, _ in keys), default=0.0)
    return len(keys), cost


def grouped(
    work: Sequence[tuple[Item, Sequence[str]]],
    kernels: Mapping[str, Kernel],
    *,
    palette: int = DEFAULT_PALETTE,
) -> Work:
    """``work`` (items, each with the specs that run it) with the compiling kernels' part
    grouped by ``(spec, compile key)``, after the rest in its own order (see the module)."""
    plain: Work = []
    groups: dict[tuple[str, tuple], Work] = {}
    for it, specs in work:
        rest = [s for s in specs if not kernels[s].compile_keys]
        if rest:
            plain.append((it, rest))
        for spec in specs:
            kern = kernels[spec]
            if kern.compile_keys:
                key = compile_key(kern, fit_recipe(it.recipe, kern, palette=palette))
                groups.setdefault((spec, key), []).append((it, [spec]))
    return plain + [entry for run in groups.values() for entry in run]


def _rank(item: Item, specs: Sequence[str], kernels: Mapping[str, Kernel], palette: int) -> int:
    """The place of ``item``'s compile key in its compiling kernels' palettes (the least over
    them; 0 for work of kernels without compile keys, past the end for a key off the palette)."""
    ranks = []
    for spec in specs:
        kern = kernels[spec]
        keys = palette_for(kern, palette) if kern.compile_keys else None
        if keys is None:
            continue
        r = fit_recipe(item.recipe, kern, palette=palette)
        values = tuple(getattr(r, dim) for dim in keys.dims)
        ranks.append(keys.entries.index(values) if values in keys.entries else len(keys.entries))
    return min(ranks, default=0)


def palette_first(
    work: Sequence[tuple[Item, Sequence[str]]],
    kernels: Mapping[str, Kernel],
    *,
    palette: int = DEFAULT_PALETTE,
) -> list[tuple[Item, Sequence[str]]]:
    """``work`` stably ordered by the palette place of its compile key. Under a time budget a
    compiling kernel spends most of it compiling: the palette's first key (a block-aligned
    length with several key blocks, where indexing bugs show) is compiled first, in each dtype,
    and its cases run before the next key is compiled. Work of kernels without compile keys
    keeps its order."""
    return sorted(work, key=lambda e: _rank(e[0], e[1], kernels, palette))
