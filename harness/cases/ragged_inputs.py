"""Seeded ragged cases: varlen and paged batches of N(0, σ²) sequences, split-KV partials.

Each builder draws every float from one seeded generator, rounds it once into the format and
builds the layout with :func:`~flashcheck.harness.core.layouts.pack_varlen` or
:func:`~flashcheck.harness.core.layouts.paginate`: pages permuted across the pool, spare pages
and the slots past each sequence's end filled with NaN, so that a kernel reading anything
outside its sequences gives NaN and fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..core.layouts import pack_varlen, paginate
from .case import DTYPES
from .ragged import RaggedCase

__all__ = ["combine_case", "paged_case", "varlen_case"]


def _draw(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, sigma: float):
    return (rng.standard_normal(shape) * sigma).astype(np.float32).astype(DTYPES[dtype])


def _heads(hq: int, hk: int) -> None:
    if hk < 1 or hq % hk:
        raise ValueError(f"hq ({hq}) must be a positive multiple of hk ({hk})")


def varlen_case(
    lengths_q: Sequence[int],
    lengths_k: Sequence[int],
    *,
    dtype: str = "fp16",
    hq: int = 2,
    hk: int = 1,
    d: int = 16,
    dv: int | None = None,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    sigma: float = 1.0,
    seed: int = 0,
) -> RaggedCase:
    """A varlen batch of sequences with ``lengths_q[b]`` query rows and ``lengths_k[b]`` keys
    (zero allowed), inputs ``σ·N(0, 1)`` rounded into ``dtype``."""
    if len(lengths_q) != len(lengths_k) or not lengths_q:
        raise ValueError("pass one query and one key length per sequence (B >= 1)")
    _heads(hq, hk)
    dv = d if dv is None else dv
    rng = np.random.default_rng(seed)
    qs = [_draw(rng, (n, hq, d), dtype, sigma) for n in lengths_q]
    ks = [_draw(rng, (n, hk, d), dtype, sigma) for n in lengths_k]
    vs = [_draw(rng, (n, hk, dv), dtype, 1.0) for n in lengths_k]
    q, k, v, cu_q, cu_k = pack_varlen(qs, ks, vs)
    return RaggedCase(
        "varlen",
        {"q": q, "k": k, "v": v},
        {"cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k},
        causal=causal,
        window=window,
        scale=scale,
        family="randn",
        seed=seed,
        params={"lengths_q": list(lengths_q), "lengths_k": list(lengths_k), "sigma": sigma},
    )


def paged_case(
    seqlens: Sequence[int],
    *,
    nq: int = 1,
    page_size: int = 16,
    dtype: str = "fp16",
    hq: int = 2,
    hk: int = 1,
    d: int = 16,
    dv: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    spare_pages: int = 1,
    permute: bool = True,
    sigma: float = 1.0,
    seed: int = 0,
) -> RaggedCase:
    """A paged batch (decode: ``nq`` queries per sequence) whose sequence ``b`` has
    ``seqlens[b]`` keys in pages of ``page_size`` slots; the pool is permuted (``permute``),
    with ``spare_pages`` unused pages, and every slot no sequence owns is NaN."""
    if not seqlens:
        raise ValueError("pass one cache length per sequence (B >= 1)")
    _heads(hq, hk)
    dv = d if dv is None else dv
    rng = np.random.default_rng(seed)
    q = _draw(rng, (len(seqlens), nq, hq, d), dtype, sigma)
    ks = [_draw(rng, (n, hk, d), dtype, sigma) for n in seqlens]
    vs = [_draw(rng, (n, hk, dv), dtype, 1.0) for n in seqlens]
    total = sum(-(-n // page_size) for n in seqlens) + spare_pages
    order = rng.permutation(total) if permute else None
    kc, vc, table, lens = paginate(
        ks, vs, page_size=page_size, spare_pages=spare_pages, pool_order=order
    )
    return RaggedCase(
        "paged",
        {"q": q, "k_cache": kc, "v_cache": vc},
        {"block_table": table, "cache_seqlens": lens},
        causal=causal,
        scale=scale,
        family="randn",
        seed=seed,
        params={"seqlens": list(seqlens), "page_size": page_size, "nq": nq},
    )


def combine_case(
    splits: int,
    rows: tuple[int, ...] = (2, 3),
    *,
    dv: int = 8,
    dtype: str = "fp32",
    empty: float = 0.25,
    all_empty_rows: int = 1,
    lse_spread: float = 4.0,
    seed: int = 0,
) -> RaggedCase:
    """Split-KV partials: ``out_partial (S, *rows, dv)`` in ``dtype`` (values in (−1, 1), a
    normalized split's output is a convex combination of values) and fp32 ``lse_partial``
    ``(S, *rows)`` spread over ``±lse_spread``; about a fraction ``empty`` of the splits are
    empty (``lse = −inf``, ``o = 0``), and the first ``all_empty_rows`` rows have every split
    empty."""
    if splits < 1:
        raise ValueError(f"splits must be >= 1, got {splits}")
    rng = np.random.default_rng(seed)
    o = (rng.uniform(-1, 1, (splits, *rows, dv))).astype(np.float32).astype(DTYPES[dtype])
    lse = (rng.standard_normal((splits, *rows)) * lse_spread).astype(np.float32)
    gone = rng.random((splits, *rows)) < empty
    flat = gone.reshape(splits, -1)
    flat[:, : min(all_empty_rows, flat.shape[1])] = True
    lse[gone] = -np.inf
    o[gone] = 0
    return RaggedCase(
        "combine",
        {"out_partial": o, "lse_partial": lse},
        family="partials",
        seed=seed,
        params={"splits": splits, "rows": list(rows), "empty": empty},
    )
