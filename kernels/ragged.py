"""The numpy recurrences in FlashAttention's ragged layouts: varlen and paged decode.

- :func:`varlen_attention`: ``flash_attn_varlen_func``'s layout; each sequence is attended to
  by :func:`flashcheck.kernels.recurrence.online_attention` as the dense problem it is.
- :func:`paged_attention`: ``flash_attn_with_kvcache``'s layout; each sequence's keys are
  gathered page by page from the block table (only its first ``cache_seqlens[b]`` slots) and
  attended to by :func:`flashcheck.kernels.split_kv.split_kv_attention` with a fixed split
  size, so a sequence's result does not depend on the rest of the batch.

Masks are aligned to each sequence's bottom-right corner; a sequence with no keys gives
``O = 0``, ``LSE = −inf``. This module imports nothing from the harness.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .recurrence import FORMAT_DTYPES, PrecisionPolicy, online_attention
from .split_kv import split_kv_attention

__all__ = ["paged_attention", "varlen_attention"]


def _empty(nq: int, hq: int, dv: int, policy: PrecisionPolicy) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros((1, hq, nq, dv), dtype=FORMAT_DTYPES[policy.output or policy.input])
    return out, np.full((1, hq, nq), -np.inf, dtype=FORMAT_DTYPES[policy.accum])


def varlen_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    *,
    policy: PrecisionPolicy,
    block_q: int = 16,
    block_k: int = 16,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``O (total_q, Hq, dv)`` and ``LSE (Hq, total_q)`` of a packed batch: sequence ``b`` owns
    query rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]``; ``scale`` defaults to ``1/sqrt(d)``."""
    cu_q = np.asarray(cu_seqlens_q, dtype=np.int64)
    cu_k = np.asarray(cu_seqlens_k, dtype=np.int64)
    total_q, hq, d = q.shape
    dv = v.shape[2]
    scale = d**-0.5 if scale is None else scale
    o = np.zeros((total_q, hq, dv), dtype=FORMAT_DTYPES[policy.output or policy.input])
    lse = np.full((hq, total_q), -np.inf, dtype=FORMAT_DTYPES[policy.accum])
    for b in range(cu_q.size - 1):
        rows = slice(cu_q[b], cu_q[b + 1])
        keys = slice(cu_k[b], cu_k[b + 1])
        if rows.stop == rows.start:
            continue
        qb, kb, vb = (x[s].transpose(1, 0, 2)[None] for x, s in ((q, rows), (k, keys), (v, keys)))
        if keys.stop == keys.start:
            ob, lb = _empty(qb.shape[2], hq, dv, policy)
        else:
            ob, lb = online_attention(
                np.ascontiguousarray(qb),
                np.ascontiguousarray(kb),
                np.ascontiguousarray(vb),
                policy=policy,
                block_q=block_q,
                block_k=block_k,
                causal=causal,
                window=window,
                scale=scale,
            )
        o[rows] = ob[0].transpose(1, 0, 2)
        lse[:, rows] = lb[0]
    return o, lse


def paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    *,
    cache_seqlens: Any,
    block_table: Any,
    policy: PrecisionPolicy,
    split_size: int = 64,
    block_k: int = 16,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``O (B, Nq, Hq, dv)`` and ``LSE (B, Hq, Nq)`` of a paged batch, split-KV with
    ``split_size`` keys per split: sequence ``b``'s key ``j`` is in slot ``j % page_size`` of
    page ``block_table[b, j // page_size]``, for ``j < cache_seqlens[b]``."""
    lens = np.asarray(cache_seqlens, dtype=np.int64)
    table = np.asarray(block_table, dtype=np.int64)
    bsz, nq, hq, d = q.shape
    page, dv = k_cache.shape[1], v_cache.shape[3]
    scale = d**-0.5 if scale is None else scale
    o = np.zeros((bsz, nq, hq, dv), dtype=FORMAT_DTYPES[policy.output or policy.input])
    lse = np.full((bsz, hq, nq), -np.inf, dtype=FORMAT_DTYPES[policy.accum])
    for b in range(bsz):
        n = int(lens[b])
        if n == 0:
            continue
        pages = table[b, : -(-n // page)]
        kb, vb = (c[pages].reshape(-1, *c.shape[2:])[:n] for c in (k_cache, v_cache))
        ob, lb = split_kv_attention(
            np.ascontiguousarray(q[b].transpose(1, 0, 2)[None]),
            np.ascontiguousarray(kb.transpose(1, 0, 2)[None]),
            np.ascontiguousarray(vb.transpose(1, 0, 2)[None]),
            policy=policy,
            split_size=split_size,
            block_k=block_k,
            causal=causal,
            window=window,
            scale=scale,
        )
        o[b] = ob[0].transpose(1, 0, 2)
        lse[b] = lb[0]
    return o, lse
