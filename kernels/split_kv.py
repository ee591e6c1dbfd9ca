"""Split-KV (FlashDecoding) attention in numpy: fixed-size key chunks, then an fp32 merge.

Per batch and head, the keys ``0 … Nk−1`` are cut into ``S = ⌈Nk / split_size⌉`` chunks of
``split_size`` keys (the last one shorter). ``split_size`` is a parameter, never derived from
the batch, so a sequence's result does not depend on what else is in the batch.

1. Partials. Chunk ``s`` is attended to by the online-softmax recurrence of
   :func:`flashcheck.kernels.recurrence.online_attention` (same policy, variant and blocks),
   with the masks evaluated at the keys' positions in the whole sequence (causal stays
   bottom-right aligned to ``Nk``): ``o_s`` normalized within the chunk and stored in the
   accumulator format, ``lse_s`` in the accumulator format, ``−inf`` where a row keeps no key
   of the chunk (``o_s`` is then 0).
2. Merge, in the accumulator format ``fl`` (fp32 for the flash policy), over the chunks in
   order::

       m   = max_s lse_s                           (exact)
       w_s = fl(exp(fl(lse_s − m)))                exp in float64, rounded once; w_s = 0 for
                                                   lse_s = −inf, and w = 1 for the largest
       Z   = fl(… fl(w_0 + w_1) … + w_{S−1})       sequential, so 1 ≤ Z ≤ S
       O   = fl(fl(Σ_s fl(w_s·o_s)) / Z)           the sum sequential over s
       LSE = fl(m + fl(log Z))                     log in float64, rounded once

   A row whose chunks are all ``−inf`` gives ``O = 0``, ``LSE = −inf``; a NaN ``lse_s`` makes
   ``m`` NaN and the row's outputs NaN. ``O`` is then rounded to the output format.

Exactness notes: ``m`` is one of the ``lse_s``, so the largest weight is exactly 1 and nothing
overflows; with one chunk (``split_size ≥ Nk``) the merge is exact (``O = o_0``,
``LSE = lse_0``) and the result equals :func:`online_attention`'s bit for bit.

This module imports nothing from the harness.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .recurrence import FORMAT_DTYPES, PrecisionPolicy, keep_mask, online_attention

__all__ = ["merge_partials", "split_kv_attention"]


def merge_partials(
    out_partial: np.ndarray, lse_partial: np.ndarray, *, accum: str = "fp32"
) -> tuple[np.ndarray, np.ndarray]:
    """Merge split-KV partials ``(S, ..., dv)`` and ``(S, ...)`` with the module's arithmetic
    (step 2), in the ``accum`` format; returns ``(O, LSE)`` in that format."""
    da = FORMAT_DTYPES[accum]
    o = np.asarray(out_partial).astype(da)
    lse = np.asarray(lse_partial).astype(da)
    if o.ndim < 2 or lse.shape != o.shape[:-1]:
        raise ValueError(
            f"out_partial must be (S, ..., dv) and lse_partial (S, ...) with the same leading "
            f"axes, got {o.shape} and {lse.shape}"
        )
    with np.errstate(invalid="ignore", over="ignore"):
        m = lse.max(axis=0) if lse.shape[0] else np.full(lse.shape[1:], -np.inf, da)
        live = m != -np.inf  # a NaN maximum counts as live, so the NaN propagates
        m_safe = np.where(live, m, da.type(0))
        z = np.zeros(lse.shape[1:], dtype=da)
        num = np.zeros(o.shape[1:], dtype=da)
        for s in range(lse.shape[0]):
            arg = (lse[s] - m_safe).astype(da)
            w = np.exp(arg.astype(np.float64)).astype(da)
            z = (z + w).astype(da)
            num = (num + (w[..., None] * o[s]).astype(da)).astype(da)
        safe_z = np.where(live, z, da.type(1))
        out = np.where(live[..., None], (num / safe_z[..., None]).astype(da), da.type(0))
        log_z = np.log(safe_z.astype(np.float64)).astype(da)
        lse_out = np.where(live, (m_safe + log_z).astype(da), da.type(-np.inf))
    return out.astype(da), lse_out.astype(da)


def split_kv_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    policy: PrecisionPolicy,
    split_size: int,
    variant: str = "fa2",
    block_q: int = 16,
    block_k: int = 16,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    partials: bool = False,
) -> tuple[np.ndarray, ...]:
    """Attention ``softmax(scale·QKᵀ + mask)·V`` and its natural-log LSE, split over the keys.

    Arguments as :func:`flashcheck.kernels.recurrence.online_attention` (dense
    ``(B, H, N, d)`` arrays in ``policy.input``'s dtype), plus ``split_size`` (keys per chunk,
    ``>= 1``). Returns ``(O, LSE)``: ``O`` in the output format, ``LSE`` in the accumulator
    format; with ``partials=True`` also ``out_partial (S, B, Hq, Nq, dv)`` and
    ``lse_partial (S, B, Hq, Nq)`` in the accumulator format.
    """
    if isinstance(split_size, bool) or not isinstance(split_size, int | np.integer):
        raise TypeError(f"split_size must be an int, got {type(split_size).__name__}")
    if split_size < 1:
        raise ValueError(f"split_size must be >= 1 keys per chunk, got {split_size}")
    if not isinstance(q, np.ndarray) or q.ndim != 4 or not isinstance(k, np.ndarray) or k.ndim != 4:
        raise ValueError("q, k and v must be 4-D numpy arrays (B, H, N, d), as online_attention's")
    bsz, hq, nq, _ = q.shape
    nk = k.shape[2]
    chunk_policy = dataclasses.replace(policy, output=policy.accum)
    full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    rows = np.arange(nq)
    outs, lses = [], []
    for c0 in range(0, nk, split_size):
        cols = np.arange(c0, min(c0 + split_size, nk))
        keep = np.empty((bsz, hq, nq, cols.size), dtype=bool)
        for b in range(bsz):
            for h in range(hq):
                mk = None if full is None else full[b, h]
                keep[b, h] = keep_mask(nq, nk, rows, cols, causal, window, mk)
        o_s, lse_s = online_attention(
            q,
            k[:, :, cols],
            v[:, :, cols],
            policy=chunk_policy,
            variant=variant,
            block_q=block_q,
            block_k=block_k,
            mask=keep,
            scale=scale,
        )
        outs.append(o_s)
        lses.append(lse_s)
    da = FORMAT_DTYPES[policy.accum]
    out_p = np.stack(outs) if outs else np.zeros((0, bsz, hq, nq, v.shape[3]), dtype=da)
    lse_p = np.stack(lses) if lses else np.zeros((0, bsz, hq, nq), dtype=da)
    o, lse = merge_partials(out_p, lse_p, accum=policy.accum)
    o = o.astype(FORMAT_DTYPES[policy.output or policy.input])
    return (o, lse, out_p, lse_p) if partials else (o, lse)
