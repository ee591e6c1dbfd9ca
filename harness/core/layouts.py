"""Ragged batches in FlashAttention's public layouts, validated and cut into dense problems.

Two layouts (docs/api.md, "Ragged batches"):

``varlen`` (``flash_attn_varlen_func``): the sequences of a batch packed along the first axis,
``q (total_q, Hq, d)``, ``k (total_k, Hk, d)``, ``v (total_k, Hk, dv)``, with ``cu_seqlens_q``
and ``cu_seqlens_k`` int32 ``(B+1,)`` the prefix sums of the lengths: sequence ``b`` owns the
query rows ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` and the key rows
``cu_seqlens_k[b] : cu_seqlens_k[b+1]``.

``paged`` (``flash_attn_with_kvcache``): ``q (B, Nq, Hq, d)`` and a pool of key/value pages,
``k_cache (num_blocks, page_size, Hk, d)``, ``v_cache (num_blocks, page_size, Hk, dv)``;
sequence ``b`` has ``n_b = cache_seqlens[b]`` keys, key ``j`` in slot ``j % page_size`` of the
page ``block_table[b, j // page_size]``. Slots past ``n_b`` and table entries past the pages a
sequence uses are never read.

Either way sequence ``b`` is the dense problem ``q_b (1, Hq, Nq_b, d)``, ``k_b (1, Hk, Nk_b, d)``,
``v_b (1, Hk, Nk_b, dv)`` of :mod:`flashcheck.harness.core.semantics`: masks are aligned to the
bottom-right corner of each sequence, and a sequence with no queries or no keys is valid (its
rows keep no key: ``O = 0``, ``LSE = −inf``).

:func:`varlen_batch` and :func:`paged_batch` validate a call's inputs; :func:`pack_varlen`
and :func:`paginate` build the layouts from per-sequence arrays (a permuted page pool, spare
pages and unused slots filled with NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import Format
from .semantics import as_exact_array

__all__ = [
    "LAYOUTS",
    "PagedBatch",
    "VarlenBatch",
    "index_array",
    "pack_varlen",
    "paged_batch",
    "paginate",
    "varlen_batch",
]

LAYOUTS = ("dense", "varlen", "paged")


def index_array(x: Any, name: str, *, ndim: int) -> np.ndarray:
    """An int32 index tensor (numpy array or torch tensor, any device) as a host int64 array.

    FlashAttention's functions take int32 only; anything else is refused with the cast to use.
    """
    mod = type(x).__module__
    if mod.startswith("torch"):
        dtype = str(x.dtype).removeprefix("torch.")
        arr = x.detach().cpu().numpy() if dtype == "int32" else None
    elif isinstance(x, np.ndarray):
        dtype = str(x.dtype)
        arr = x
    else:
        raise TypeError(
            f"{name} must be an int32 numpy array or torch tensor, got {type(x).__name__}; "
            f"build it with np.asarray(..., dtype=np.int32) or torch.tensor(..., dtype=torch.int32)"
        )
    if dtype != "int32":
        torch_cast = mod.startswith("torch")
        cast = f"{name}.to(torch.int32)" if torch_cast else f"{name}.astype(np.int32)"
        raise TypeError(
            f"{name} has dtype {dtype}; index tensors are int32 as in FlashAttention: "
            f"cast with {cast}"
        )
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(arr.shape)}")
    return np.asarray(arr, dtype=np.int64)


def _same_format(named: list[tuple[str, Any]], ndim: int, axes: str) -> tuple[list, Format]:
    arrays, fmts = [], []
    for name, x in named:
        arr, fmt = as_exact_array(x, name)
        if arr.ndim != ndim:
            raise ValueError(f"{name} must have {ndim} dimensions {axes}, got shape {arr.shape}")
        arrays.append(arr)
        fmts.append(fmt)
    if len(set(fmts)) != 1:
        got = ", ".join(f.name for f in fmts)
        raise TypeError(f"q, k and v must share one format, got {got}; cast them to one dtype")
    return arrays, fmts[0]


def _heads(hq: int, hk: int) -> None:
    if hk == 0 or hq % hk:
        raise ValueError(
            f"q heads ({hq}) must be a positive multiple of k/v heads ({hk}) for MHA/GQA/MQA"
        )


def _cu_seqlens(x: Any, name: str, total: int, axis_name: str) -> np.ndarray:
    cu = index_array(x, name, ndim=1)
    if cu.size < 2:
        raise ValueError(
            f"{name} must hold B+1 >= 2 prefix sums (0, len_0, len_0+len_1, ...), got {cu.tolist()}"
        )
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0 (it is a prefix sum of lengths), got {cu[0]}")
    steps = np.diff(cu)
    if (steps < 0).any():
        b = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name} must be non-decreasing (sequence lengths >= 0), but {name}[{b + 1}] = "
            f"{cu[b + 1]} < {name}[{b}] = {cu[b]}: build it as a cumulative sum of the lengths"
        )
    if cu[-1] != total:
        raise ValueError(
            f"{name} must end at the packed length {total} ({axis_name}.shape[0]), got {cu[-1]}"
        )
    return cu


def _max_seqlen(given: Any, lengths: np.ndarray, name: str, cu_name: str) -> int:
    longest = int(lengths.max(initial=0))
    if given is None:
        return longest
    if isinstance(given, bool) or not isinstance(given, int | np.integer):
        raise TypeError(f"{name} must be an int or None, got {type(given).__name__}")
    if given < longest:
        raise ValueError(
            f"{name}={int(given)} is below the longest sequence ({longest}); pass "
            f"int(({cu_name}[1:] - {cu_name}[:-1]).max()) or leave it out"
        )
    return int(given)


@dataclass(frozen=True)
class VarlenBatch:
    """A validated varlen batch: inputs as exact float64 arrays, the prefix sums as int64."""

    q: np.ndarray  # (total_q, Hq, d)
    k: np.ndarray  # (total_k, Hk, d)
    v: np.ndarray  # (total_k, Hk, dv)
    fmt: Format
    cu_seqlens_q: np.ndarray  # (B+1,)
    cu_seqlens_k: np.ndarray  # (B+1,)
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return self.cu_seqlens_q.size - 1

    def query_rows(self, b: int) -> slice:
        return slice(int(self.cu_seqlens_q[b]), int(self.cu_seqlens_q[b + 1]))

    def key_rows(self, b: int) -> slice:
        return slice(int(self.cu_seqlens_k[b]), int(self.cu_seqlens_k[b + 1]))

    def sequence(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence ``b`` as dense ``(1, H, N_b, ·)`` arrays in the input dtype (exact)."""
        dt = self.fmt.numpy_dtype
        qs, ks = self.query_rows(b), self.key_rows(b)
        return tuple(
            a[rows].transpose(1, 0, 2)[None].astype(dt)
            for a, rows in ((self.q, qs), (self.k, ks), (self.v, ks))
        )


def varlen_batch(
    q: Any,
    k: Any,
    v: Any,
    *,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> VarlenBatch:
    """Validate a varlen batch; every error says how to fix the call."""
    (qa, ka, va), fmt = _same_format([("q", q), ("k", k), ("v", v)], 3, "(total, heads, head_dim)")
    if qa.shape[2] != ka.shape[2]:
        raise ValueError(f"q head_dim {qa.shape[2]} != k head_dim {ka.shape[2]}; they must match")
    if ka.shape[:2] != va.shape[:2]:
        raise ValueError(f"k {ka.shape} and v {va.shape} must agree in total_k and heads")
    if qa.shape[2] == 0 or va.shape[2] == 0:
        raise ValueError("head_dim of q/k and of v must be >= 1")
    _heads(qa.shape[1], ka.shape[1])
    cu_q = _cu_seqlens(cu_seqlens_q, "cu_seqlens_q", qa.shape[0], "q")
    cu_k = _cu_seqlens(cu_seqlens_k, "cu_seqlens_k", ka.shape[0], "k")
    if cu_q.size != cu_k.size:
        raise ValueError(
            f"cu_seqlens_q has {cu_q.size - 1} sequences but cu_seqlens_k has {cu_k.size - 1}: "
            "both hold B+1 entries, one per sequence boundary"
        )
    mq = _max_seqlen(max_seqlen_q, np.diff(cu_q), "max_seqlen_q", "cu_seqlens_q")
    mk = _max_seqlen(max_seqlen_k, np.diff(cu_k), "max_seqlen_k", "cu_seqlens_k")
    return VarlenBatch(qa, ka, va, fmt, cu_q, cu_k, mq, mk)


@dataclass(frozen=True)
class PagedBatch:
    """A validated paged batch: inputs as exact float64 arrays, the tables as int64."""

    q: np.ndarray  # (B, Nq, Hq, d)
    k_cache: np.ndarray  # (num_blocks, page_size, Hk, d)
    v_cache: np.ndarray  # (num_blocks, page_size, Hk, dv)
    fmt: Format
    block_table: np.ndarray  # (B, max_pages)
    cache_seqlens: np.ndarray  # (B,)

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def page_size(self) -> int:
        return self.k_cache.shape[1]

    def pages(self, b: int) -> np.ndarray:
        """The pages sequence ``b`` reads, in order (``ceil(n_b / page_size)`` of them)."""
        used = -(-int(self.cache_seqlens[b]) // self.page_size)
        return self.block_table[b, :used]

    def sequence(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sequence ``b`` as dense ``(1, H, N, ·)`` arrays in the input dtype (exact): its
        pages gathered in table order and cut at ``cache_seqlens[b]``."""
        dt, n, pages = self.fmt.numpy_dtype, int(self.cache_seqlens[b]), self.pages(b)
        out = [self.q[b].transpose(1, 0, 2)[None].astype(dt)]
        for cache in (self.k_cache, self.v_cache):
            keys = cache[pages].reshape(-1, *cache.shape[2:])[:n]
            out.append(keys.transpose(1, 0, 2)[None].astype(dt))
        return tuple(out)


def paged_batch(
    q: Any, k_cache: Any, v_cache: Any, *, block_table: Any, cache_seqlens: Any
) -> PagedBatch:
    """Validate a paged batch; every error says how to fix the call."""
    (qa, ka, va), fmt = _same_format(
        [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)],
        4,
        "(batch, seq, heads, head_dim) for q, (num_blocks, page_size, heads, head_dim) for caches",
    )
    if qa.shape[3] != ka.shape[3]:
        raise ValueError(f"q head_dim {qa.shape[3]} != k_cache head_dim {ka.shape[3]}")
    if ka.shape[:3] != va.shape[:3]:
        raise ValueError(
            f"k_cache {ka.shape} and v_cache {va.shape} must agree in num_blocks, page_size "
            "and heads"
        )
    if qa.shape[3] == 0 or va.shape[3] == 0:
        raise ValueError("head_dim of q/k_cache and of v_cache must be >= 1")
    if ka.shape[1] == 0:
        raise ValueError("page_size (k_cache.shape[1]) must be >= 1")
    _heads(qa.shape[2], ka.shape[2])
    bsz, blocks, page = qa.shape[0], ka.shape[0], ka.shape[1]
    table = index_array(block_table, "block_table", ndim=2)
    seqlens = index_array(cache_seqlens, "cache_seqlens", ndim=1)
    if table.shape[0] != bsz or seqlens.shape[0] != bsz:
        raise ValueError(
            f"q has batch {bsz}: block_table must be (B, max_pages) and cache_seqlens (B,), "
            f"got {table.shape} and {seqlens.shape}"
        )
    room = table.shape[1] * page
    for b, n in enumerate(seqlens.tolist()):
        if n < 0 or n > room:
            raise ValueError(
                f"cache_seqlens[{b}] = {n} must lie in [0, max_pages·page_size] = [0, {room}]: "
                "widen block_table or shorten the sequence"
            )
        used = table[b, : -(-n // page)]
        bad = (used < 0) | (used >= blocks)
        if bad.any():
            slot = int(np.argmax(bad))
            raise ValueError(
                f"block_table[{b}, {slot}] = {used[slot]} is not a page of the cache "
                f"[0, {blocks}); sequence {b} reads its first {used.size} table entries "
                f"(cache_seqlens[{b}] = {n}, page_size {page})"
            )
    return PagedBatch(qa, ka, va, fmt, table, seqlens)


def pack_varlen(
    queries: list[np.ndarray], keys: list[np.ndarray], values: list[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A varlen batch from its sequences: ``queries[b]`` ``(Nq_b, Hq, d)``, ``keys[b]``
    ``(Nk_b, Hk, d)``, ``values[b]`` ``(Nk_b, Hk, dv)`` numpy arrays (one dtype). Returns
    ``(q, k, v, cu_seqlens_q, cu_seqlens_k)``, the sequences concatenated in order and the
    int32 prefix sums of their lengths."""
    if not (len(queries) == len(keys) == len(values)) or not queries:
        raise ValueError(
            f"pass one query, key and value array per sequence (B >= 1), got {len(queries)}, "
            f"{len(keys)} and {len(values)}"
        )
    cu = [np.concatenate([[0], np.cumsum([x.shape[0] for x in xs])]) for xs in (queries, keys)]
    return (
        np.concatenate(queries),
        np.concatenate(keys),
        np.concatenate(values),
        cu[0].astype(np.int32),
        cu[1].astype(np.int32),
    )


def paginate(
    keys: list[np.ndarray],
    values: list[np.ndarray],
    *,
    page_size: int,
    spare_pages: int = 0,
    pool_order: np.ndarray | None = None,
    max_pages: int | None = None,
    fill: float = float("nan"),
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A paged KV cache holding ``keys[b]`` ``(N_b, Hk, d)`` and ``values[b]`` ``(N_b, Hk, dv)``.

    Sequence ``b`` gets ``⌈N_b / page_size⌉`` pages of its own, in order; ``spare_pages``
    more pages hold nothing. Page ``i`` of that list is stored at pool position
    ``pool_order[i]`` (a permutation of every page; default in order). Slots past a sequence's
    end and the spare pages are ``fill`` (NaN by default: a kernel that reads them shows it);
    table entries past a sequence's pages point at the first spare page (page 0 without one).
    Returns ``(k_cache, v_cache, block_table, cache_seqlens)``, the tables int32.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError(
            f"pass one key and one value array per sequence, got {len(keys)} and {len(values)}"
        )
    if page_size < 1 or spare_pages < 0:
        raise ValueError(
            f"page_size must be >= 1 and spare_pages >= 0, got {page_size}, {spare_pages}"
        )
    lengths = [k.shape[0] for k in keys]
    counts = [-(-n // page_size) for n in lengths]
    total = sum(counts) + spare_pages
    order = np.arange(total) if pool_order is None else np.asarray(pool_order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(total)):
        raise ValueError(f"pool_order must be a permutation of the {total} pages")
    width = max(counts) if max_pages is None else max_pages
    if width < max(counts) or width < 1:
        raise ValueError(
            f"max_pages={width} is below the {max(counts)} pages of the longest "
            "sequence (and must be >= 1)"
        )
    pad = int(order[sum(counts)]) if spare_pages else 0
    table = np.full((len(keys), width), pad, dtype=np.int32)
    caches = []
    for seqs in (keys, values):
        pool = np.full((total, page_size, *seqs[0].shape[1:]), fill, dtype=np.float64)
        caches.append(pool.astype(seqs[0].dtype))
    first = 0
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        pages = order[first : first + counts[b]]
        table[b, : counts[b]] = pages
        for j in range(lengths[b]):
            caches[0][pages[j // page_size], j % page_size] = k[j]
            caches[1][pages[j // page_size], j % page_size] = v[j]
        first += counts[b]
    return caches[0], caches[1], table, np.asarray(lengths, dtype=np.int32)
