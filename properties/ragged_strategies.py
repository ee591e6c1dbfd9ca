"""Hypothesis strategies for kernels of a ragged layout: varlen and paged batches, split-KV
partials (docs/properties.md, "Ragged layouts").

Every case is built by the generators the report campaign's ragged families use
(:mod:`flashcheck.harness.cases.ragged_inputs`), with their parameters drawn: the lengths per
sequence, the heads, the page size, the number of queries, the number of splits, the fraction
of empty splits. A second branch draws one of the campaign's own family cases
(:func:`~flashcheck.harness.cases.ragged_families.family_cases`) by seed and index, so the suite
explores at least the space the campaign does.

Shrinking works on those parameters: toward one sequence, short lengths, one query, few
splits; the first branch (drawn parameters) is the one Hypothesis shrinks toward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..harness.adapters.probe import resolved
from ..harness.adapters.ragged_call import head_dim_for, kernel_layout
from ..harness.adapters.registry import as_kernel
from ..harness.cases.case import DTYPES
from ..harness.cases.ragged import RaggedCase
from ..harness.cases.ragged_families import family_cases
from ..harness.cases.ragged_inputs import combine_case, paged_case, varlen_case

__all__ = ["PAGE_SIZES", "ragged_cases", "ragged_lengths", "share_pages"]

# Block edges of 16-row tiles, and 0: a sequence with no query rows or no keys is valid.
_EDGES = (1, 0, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
# Pages of one slot, a common size, a size no power of two, one page larger than most caches.
PAGE_SIZES = (16, 1, 7, 256)


def ragged_lengths(max_len: int) -> st.SearchStrategy[int]:
    """Sequence lengths ``0 <= n <= max_len``, mostly at block edges (0 included)."""
    return st.one_of(st.sampled_from([n for n in _EDGES if n <= max_len]), st.integers(0, max_len))


def share_pages(case: RaggedCase, pages: int) -> RaggedCase:
    """A paged case whose sequence 1 reads its first ``pages`` pages from sequence 0's (a
    prefix cache), as far as both sequences fill them; the pages sequence 1 owned before are
    left unused and filled with NaN. Unchanged where no whole page can be shared."""
    lens = case.index["cache_seqlens"]
    page = case.tensors["k_cache"].shape[1]
    n = min(pages, int(min(lens[0], lens[1])) // page) if len(lens) > 1 else 0
    if n < 1:
        return case
    table = case.index["block_table"].copy()
    own = table[1, :n].copy()
    table[1, :n] = table[0, :n]
    tensors = dict(case.tensors)
    for name in ("k_cache", "v_cache"):
        pool = tensors[name].copy()
        pool[own] = np.nan
        tensors[name] = pool
    index = {**case.index, "block_table": table}
    return replace(case, tensors=tensors, index=index, params={**case.params, "shared_pages": n})


def _heads(draw: Any, kern: Any) -> dict[str, int]:
    hk = draw(st.sampled_from([1, 2]))
    return {"hq": hk * draw(st.sampled_from([1, 2])) if kern.gqa else hk, "hk": hk}


def _dims(draw: Any, kern: Any) -> tuple[int, int]:
    pool = kern.head_dims or (16, 32, 64)
    dims = [x for x in pool if x <= kern.max_head_dim] or [min(pool)]
    d = draw(st.sampled_from(dims))
    return d, (d if not kern.distinct_dv or draw(st.booleans()) else draw(st.sampled_from(dims)))


def _options(draw: Any, kern: Any, *, window: bool) -> dict[str, Any]:
    opts: dict[str, Any] = {"causal": "causal" in kern.masks and draw(st.booleans())}
    if window and "window" in kern.masks and draw(st.integers(0, 3)) == 0:
        opts["window"] = (
            draw(st.one_of(st.none(), st.integers(0, 64))),
            draw(st.one_of(st.none(), st.integers(0, 64))),
        )
    if kern.options is None or "scale" in kern.options:
        opts["scale"] = draw(st.sampled_from([None, None, 0.5, 0.125, 2.0]))
    return opts


@st.composite
def _varlen(draw: Any, kern: Any, dtype: str, max_len: int, max_batch: int) -> RaggedCase:
    lens = ragged_lengths(max_len)
    nq = draw(st.lists(lens, min_size=1, max_size=max_batch))
    nk = [draw(lens) for _ in nq] if kern.unequal_lengths else list(nq)
    d, dv = _dims(draw, kern)
    return varlen_case(
        nq,
        nk,
        dtype=dtype,
        **_heads(draw, kern),
        d=d,
        dv=dv,
        **_options(draw, kern, window=True),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def _paged(draw: Any, kern: Any, dtype: str, max_len: int, max_batch: int) -> RaggedCase:
    # A pool of no pages is no cache: at least one sequence holds a key.
    caches = st.lists(ragged_lengths(2 * max_len), min_size=1, max_size=max_batch)
    seqlens = draw(caches.filter(lambda lens: max(lens) > 0))
    d, dv = _dims(draw, kern)
    case = paged_case(
        seqlens,
        nq=draw(st.integers(1, 8)),
        page_size=draw(st.sampled_from(PAGE_SIZES)),
        dtype=dtype,
        **_heads(draw, kern),
        d=d,
        dv=dv,
        **_options(draw, kern, window=False),
        seed=draw(st.integers(0, 2**32 - 1)),
    )
    shared = draw(st.sampled_from([0, 1, 2]))
    return share_pages(case, shared) if shared else case


@st.composite
def _combine(draw: Any, kern: Any, dtype: str, max_len: int, max_batch: int) -> RaggedCase:
    rows = draw(st.lists(st.integers(1, 4), min_size=1, max_size=2))
    dv = draw(st.sampled_from([x for x in (8, 16, 64) if x <= kern.max_head_dim] or [8]))
    return combine_case(
        draw(st.integers(1, 8)),
        tuple(rows),
        dv=dv,
        dtype=dtype,
        empty=draw(st.sampled_from([0.25, 0.0, 0.5, 1.0])),
        all_empty_rows=draw(st.sampled_from([1, 0, 2])),
        lse_spread=draw(st.sampled_from([4.0, 300.0, 1000.0])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


_DRAWN = {"varlen": _varlen, "paged": _paged, "combine": _combine}


def _family_case(kern: Any, layout: str, dtype: str) -> st.SearchStrategy[RaggedCase]:
    """One case of the campaign's families for ``layout`` (cpu sizes, fitted to the
    kernel's head dims and GQA as the campaign fits them), by seed and index."""

    def pick(seed_and_index: tuple[int, int]) -> RaggedCase:
        seed, i = seed_and_index
        d = head_dim_for(kern, 16)
        out = family_cases(layout, dtype, seed=seed, preset="cpu", d=d, gqa=kern.gqa)
        return out[i % len(out)]

    return st.tuples(st.integers(0, 2**16), st.integers(0, 15)).map(pick)


def ragged_cases(
    kernel: Any,
    *,
    dtype: str | None = None,
    max_len: int = 65,
    max_batch: int = 4,
    campaign_families: bool = True,
) -> st.SearchStrategy[RaggedCase]:
    """Ragged inputs for ``kernel`` (declared with ``flashcheck.kernel(fn, layout="varlen")``,
    ``layout="paged"`` or ``op="combine"``; a function, declaration or spec string) as
    :class:`~flashcheck.harness.cases.ragged.RaggedCase` objects in its layout, inside its
    contract (dtypes, head dims, GQA, causal, window, explicit scale).

    varlen: ``1..max_batch`` sequences, query and key lengths ``0..max_len`` each, mostly at
    block edges (a zero-length sequence is valid: its rows, if any, are ``O = 0``,
    ``LSE = −inf``). paged: ``1..max_batch`` caches of ``0..2·max_len`` keys, ``Nq`` from 1 to
    8 queries per sequence (decode), pages of 1, 7, 16 or 256 slots, the pool permuted with
    NaN in every slot no sequence owns, and sometimes two sequences sharing their first pages.
    combine: ``S`` from 1 to 8 splits of fp32 LSEs spread up to ``±1000``, some splits
    ``lse = −inf``, some rows with every split empty. ``dtype``: one input format (default:
    any the kernel takes). ``campaign_families``: also draw the report campaign's own family
    cases (larger: up to 517 keys)."""
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    for name, val in (("max_len", max_len), ("max_batch", max_batch)):
        if not isinstance(val, int) or isinstance(val, bool) or val < 1:
            raise ValueError(f"{name} is a positive int, got {val!r}")

    def build() -> st.SearchStrategy[RaggedCase]:
        kern = resolved(as_kernel(kernel))
        layout = kernel_layout(kern)
        if layout not in _DRAWN:
            raise ValueError(
                f"{kern.name} takes dense inputs: draw its cases with attention_cases, or "
                "declare it with flashcheck.kernel(fn, layout='varlen' | 'paged') or "
                "op='combine'"
            )
        dtypes = [dt for dt in ([dtype] if dtype else list(DTYPES)) if dt in kern.dtypes]
        if not dtypes:
            raise ValueError(f"{kern.name} takes none of {dtype or sorted(DTYPES)}")

        def for_dtype(dt: str) -> st.SearchStrategy[RaggedCase]:
            drawn = _DRAWN[layout](kern, dt, max_len, max_batch)
            return st.one_of(drawn, _family_case(kern, layout, dt)) if campaign_families else drawn

        return st.sampled_from(dtypes).flatmap(for_dtype)

    # Deferred: a contract is probed on the first draw, not when a test module is imported.
    return st.deferred(build)
