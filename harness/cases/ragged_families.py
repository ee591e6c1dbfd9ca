"""The input families of a campaign on a ragged kernel, drawn deterministically from a seed.

Each family targets a place where varlen, paged and split-KV kernels go wrong:

varlen (packed sequences):
  ``block-edges``: lengths one below, at and one above multiples of the 16-row block, inside
  one batch; ``empty-sequences``: sequences with no query rows (one right before a sequence
  that has rows, whose first row a kernel "clearing" the empty one hits) or no keys;
  ``one-long``: one long sequence among short ones.
paged (a KV cache in pages; the pool always permuted, with a spare page and every slot no
sequence owns filled with NaN):
  ``page-sizes``: pages of 1, 16, 256 and 7 slots; ``shared-prefix``: two sequences whose
  block tables share their first pages (prefix caching); ``decode``: 1 to 8 queries per
  sequence against many more keys than any split, lengths ragged across the batch, four query
  heads on two key/value heads.
combine (split-KV partials):
  ``empty-splits``: splits with ``lse = −inf``; ``all-empty-rows``: rows whose every split is
  empty; ``huge-spread``: split LSEs hundreds apart.

:data:`SIZES` holds the sizes: ``small`` for the CPU presets (seconds), ``large`` for ``gpu``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ..core.layouts import paginate
from .case import DTYPES
from .ragged import RaggedCase
from .ragged_inputs import combine_case, paged_case, varlen_case

__all__ = ["FAMILIES", "SIZES", "RaggedSizes", "family_cases", "sizes_for"]


@dataclass(frozen=True)
class RaggedSizes:
    """How large a ragged campaign's cases are: ``long`` keys of the long varlen sequence,
    ``decode_keys`` the cache lengths of the decode family, ``splits`` and ``spread`` of the
    merge's partials, ``d`` the head dim; ``gqa``: whether query heads share key/value heads."""

    long: int
    decode_keys: tuple[int, ...]
    splits: int
    spread: float
    d: int
    gqa: bool = True  # False: as many key/value heads as query heads, for kernels without GQA

    def heads(self, hq: int, hk: int) -> dict[str, int]:
        """``hq`` query heads on ``hk`` key/value heads (on ``hq`` without GQA)."""
        return {"hq": hq, "hk": hk if self.gqa else hq}


SIZES = {
    "small": RaggedSizes(long=160, decode_keys=(300, 7, 0, 517), splits=6, spread=300.0, d=16),
    "large": RaggedSizes(
        long=2048, decode_keys=(4100, 33, 0, 9000, 1), splits=16, spread=1000.0, d=128
    ),
}


def sizes_for(preset: str) -> RaggedSizes:
    """``large`` for the ``gpu`` preset, ``small`` for every other."""
    return SIZES["large" if preset == "gpu" else "small"]


def _seed(seed: int, family: str, dtype: str, i: int) -> int:
    """A case's seed: a fixed hash of the campaign seed and where the case sits."""
    return zlib.crc32(f"{seed}/{family}/{dtype}/{i}".encode())


def _named(case: RaggedCase, family: str, seed: int) -> RaggedCase:
    return replace(case, family=family, seed=seed)


def _block_edges(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    lq, lk = [15, 16, 17, 1, 33], [16, 17, 15, 32, 31]
    return [
        varlen_case(lq, lk, dtype=dtype, **s.heads(4, 2), d=s.d, seed=seed),
        varlen_case(lq, lk, dtype=dtype, hq=2, hk=2, d=s.d, causal=True, seed=seed + 1),
    ]


def _empty_sequences(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    lq, lk = [3, 0, 5, 4, 0, 2], [4, 6, 7, 0, 0, 9]
    return [
        varlen_case(lq, lk, dtype=dtype, **s.heads(4, 2), d=s.d, seed=seed),
        varlen_case(lq, lk, dtype=dtype, **s.heads(2, 1), d=s.d, causal=True, seed=seed + 1),
    ]


def _one_long(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    lq, lk = [2, 1, s.long // 4, 3], [3, 2, s.long, 4]
    return [varlen_case(lq, lk, dtype=dtype, **s.heads(2, 1), d=s.d, causal=True, seed=seed)]


def _page_sizes(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    return [
        paged_case(
            [5, 33, 0, 130], nq=3, page_size=ps, dtype=dtype, **s.heads(2, 1), d=s.d, seed=seed + i
        )
        for i, ps in enumerate((1, 16, 256, 7))
    ]


def _shared_prefix(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    """Sequences 0 and 2 share their first two pages (the same physical pages, as a prefix
    cache gives them); the copies sequence 2 would have had are left unused, filled with NaN."""
    page, lengths, shared = 16, [40, 9, 50], 2
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]

    def draw(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32).astype(dt)

    heads = s.heads(4, 2)
    hq, hk = heads["hq"], heads["hk"]
    keys = [draw(n, hk, s.d) for n in lengths]
    values = [draw(n, hk, s.d) for n in lengths]
    for x in (keys, values):
        x[2][: shared * page] = x[0][: shared * page]
    counts = [-(-n // page) for n in lengths]
    order = rng.permutation(sum(counts) + 1)
    kc, vc, table, lens = paginate(keys, values, page_size=page, spare_pages=1, pool_order=order)
    own = table[2, :shared].copy()
    table[2, :shared] = table[0, :shared]
    kc[own] = np.nan
    vc[own] = np.nan
    case = RaggedCase(
        "paged",
        {"q": draw(len(lengths), 2, hq, s.d), "k_cache": kc, "v_cache": vc},
        {"block_table": table, "cache_seqlens": lens},
        params={"seqlens": lengths, "page_size": page, "shared_pages": shared},
    )
    return [case, replace(case, causal=True)]


def _decode(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    keys = list(s.decode_keys)
    return [
        paged_case(keys, nq=1, page_size=16, dtype=dtype, **s.heads(4, 2), d=s.d, seed=seed),
        paged_case(keys, nq=5, page_size=64, dtype=dtype, **s.heads(4, 2), d=s.d, seed=seed + 1),
        paged_case(
            keys,
            nq=8,
            page_size=16,
            dtype=dtype,
            **s.heads(4, 2),
            d=s.d,
            causal=True,
            seed=seed + 2,
        ),
    ]


def _empty_splits(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    return [combine_case(s.splits, (3, 4), dtype=dtype, empty=0.4, all_empty_rows=0, seed=seed)]


def _all_empty_rows(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    return [combine_case(s.splits, (2, 5), dtype=dtype, all_empty_rows=3, seed=seed)]


def _huge_spread(dtype: str, seed: int, s: RaggedSizes) -> list[RaggedCase]:
    return [combine_case(s.splits, (4, 3), dtype=dtype, lse_spread=s.spread, seed=seed)]


Builder = Callable[[str, int, RaggedSizes], list[RaggedCase]]

# Per layout (the case layout a kernel takes), its families in the order they run.
FAMILIES: dict[str, dict[str, Builder]] = {
    "varlen": {
        "block-edges": _block_edges,
        "empty-sequences": _empty_sequences,
        "one-long": _one_long,
    },
    "paged": {"page-sizes": _page_sizes, "shared-prefix": _shared_prefix, "decode": _decode},
    "combine": {
        "empty-splits": _empty_splits,
        "all-empty-rows": _all_empty_rows,
        "huge-spread": _huge_spread,
    },
}


def family_cases(
    layout: str,
    dtype: str,
    *,
    seed: int,
    preset: str,
    d: int | None = None,
    gqa: bool = True,
) -> list[RaggedCase]:
    """Every case of every family of ``layout`` in ``dtype``, the same for the same
    ``seed`` and ``preset``; each case carries its family's name and its own seed. ``d`` (the
    head dim, default the preset's) and ``gqa`` fit the cases to a kernel's contract."""
    if layout not in FAMILIES:
        raise ValueError(f"layout must be one of {sorted(FAMILIES)}, got {layout!r}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    sizes = replace(sizes_for(preset), gqa=gqa)
    if d is not None:
        if d < 1:
            raise ValueError(f"d must be a positive head dim, got {d}")
        sizes = replace(sizes, d=d)
    out = []
    for family, build in FAMILIES[layout].items():
        base = _seed(seed, family, dtype, 0)
        out += [_named(c, family, base) for c in build(dtype, base, sizes)]
    return out
