"""The palette: the few values of a compiling kernel's compile keys that every generator uses.

A kernel with compile keys (:attr:`~flashcheck.harness.adapters.adapter.Kernel.compile_keys`)
pays a compile for every new combination of them; a campaign of distinct shapes would pay one
per case. The palette is a short list of combinations, ``size`` per dtype (default
:data:`DEFAULT_PALETTE`), taken in order from :data:`TEMPLATE` as fitted to the kernel's
contract (lengths rounded up to its multiple, ``Nk = Nq`` without unequal lengths, head dims
moved to the nearest it accepts, causal dropped if it takes no causal mask) and projected on
its keys, repeats left out. The template's order keeps the edges that find bugs first: a
block-aligned length with several key blocks, a ragged one past a 128-block, both head-dim
regimes (64 and 128), causal both ways, ``Nq < Nk`` and causal ``Nq > Nk`` (rows that keep no
key). A kernel with 4 keys per dtype over 3 dtypes compiles at most 12 times in a campaign.

Generators draw the key dimensions from the palette and everything else (batch, heads, values,
windows, masks, scale) freely: :meth:`Palette.snap` moves a recipe to the nearest entry (the
campaign's plan and search), :meth:`Palette.apply` to a chosen one (Hypothesis strategies).
A kernel without compile keys has no palette (``None``): its recipes are left alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..cases.families import HEAD_DIMS, Recipe
from .adapter import Kernel

__all__ = ["DEFAULT_PALETTE", "PALETTE_DIMS", "TEMPLATE", "Palette", "compile_key", "palette_for"]

DEFAULT_PALETTE = 4
# The shape dimensions a palette fixes (the dtype is a campaign's own loop).
PALETTE_DIMS = ("nq", "nk", "d", "dv", "causal")
# (nq, nk, d, dv, causal), in the order they join a palette. The first two causal keys sit at an
# odd and an even place: a campaign shares the keys among kernel workers in turn, and a causal
# key's structural check also compiles its non-causal variant.
TEMPLATE: tuple[tuple[int, int, int, int, bool], ...] = (
    (64, 64, 64, 64, False),  # block-aligned, several key blocks, the d <= 64 regime
    (129, 129, 128, 128, True),  # ragged past a 128-block, the d = 128 regime, causal
    (40, 17, 64, 64, True),  # causal Nq > Nk: the first rows keep no key
    (16, 33, 128, 128, False),  # one aligned query block, ragged keys, Nq < Nk
    (200, 200, 64, 64, False),
    (128, 256, 128, 128, True),
    (17, 17, 40, 40, False),
    (256, 129, 111, 111, True),
)


@dataclass(frozen=True)
class Palette:
    """``entries``: the values of ``dims`` (among :data:`PALETTE_DIMS`) of each key."""

    dims: tuple[str, ...]
    entries: tuple[tuple[Any, ...], ...]

    def __post_init__(self) -> None:
        bad = [x for x in self.dims if x not in PALETTE_DIMS]
        if bad or not self.entries or any(len(e) != len(self.dims) for e in self.entries):
            raise ValueError(
                f"a palette has dims among {PALETTE_DIMS} and at least one entry with one value "
                f"per dim; got dims {self.dims}, entries {self.entries}"
            )

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, r: Recipe, index: int) -> Recipe:
        """``r`` with the key dimensions of entry ``index``."""
        return replace(r, **dict(zip(self.dims, self.entries[index], strict=True)))

    def nearest(self, r: Recipe) -> int:
        """The entry closest to ``r``: the least sum of ``|log2(x / y)|`` over its lengths and
        head dims, plus 1 for a different causal flag (ties: the earlier entry)."""

        def distance(entry: tuple[Any, ...]) -> float:
            total = 0.0
            for dim, value in zip(self.dims, entry, strict=True):
                mine = getattr(r, dim)
                if dim == "causal":
                    total += float(bool(mine) != bool(value))
                else:
                    total += abs(math.log2(max(1, mine) / max(1, value)))
            return total

        return min(range(len(self.entries)), key=lambda i: (distance(self.entries[i]), i))

    def snap(self, r: Recipe) -> Recipe:
        """``r`` moved to its nearest entry (:meth:`nearest`)."""
        return self.apply(r, self.nearest(r))


def _fitted(entry: tuple[int, int, int, int, bool], kernel: Kernel) -> dict[str, Any]:
    nq, nk, d, dv, causal = entry
    dims = [x for x in (kernel.head_dims or HEAD_DIMS) if x <= kernel.max_head_dim]
    if kernel.head_dims is not None or max(d, dv) > kernel.max_head_dim:
        d = min(dims, key=lambda a: (abs(a - d), -a))
        dv = min(dims, key=lambda a: (abs(a - dv), -a))
    if not kernel.distinct_dv:
        dv = d
    if not kernel.unequal_lengths:
        nk = nq
    m = kernel.seq_multiple
    if m > 1:
        nq, nk = m * max(1, -(-nq // m)), m * max(1, -(-nk // m))
    causal = causal and "causal" in kernel.masks
    return {"nq": nq, "nk": nk, "d": d, "dv": dv, "causal": causal}


def palette_for(kernel: Kernel, size: int = DEFAULT_PALETTE) -> Palette | None:
    """The palette of ``kernel``: up to ``size`` entries (see the module), or ``None`` when it
    has no compile keys among :data:`PALETTE_DIMS`. Dimensions its contract ties together
    (``Nq = Nk`` without unequal lengths, ``dv = d`` without distinct ones) are keyed together."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"a palette size is a positive int (keys per dtype), got {size!r}")
    keys = set(kernel.compile_keys)
    if not kernel.unequal_lengths and keys & {"nq", "nk"}:
        keys |= {"nq", "nk"}
    if not kernel.distinct_dv and keys & {"d", "dv"}:
        keys |= {"d", "dv"}
    dims = tuple(x for x in PALETTE_DIMS if x in keys)
    if not dims:
        return None
    entries: list[tuple[Any, ...]] = []
    for entry in TEMPLATE:
        fitted = _fitted(entry, kernel)
        values = tuple(fitted[x] for x in dims)
        if values not in entries:
            entries.append(values)
        if len(entries) == size:
            break
    return Palette(dims, tuple(entries))


def compile_key(kernel: Kernel, r: Recipe) -> tuple[Any, ...]:
    """The values of ``kernel``'s compile keys in ``r``, its dtype first (a campaign groups its
    work by them); ``()`` for a kernel without compile keys."""
    if not kernel.compile_keys:
        return ()
    return (r.dtype, *(getattr(r, x) for x in PALETTE_DIMS if x in kernel.compile_keys))
