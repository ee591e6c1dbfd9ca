"""Triton paged split-KV decode attention (FlashDecoding) and its split-KV merge kernel.

Layout of ``flash_attn_with_kvcache``: ``q (B, Nq, Hq, d)`` with a few queries per sequence
(decode: ``Nq`` of 1 to 8), a paged cache ``k_cache (num_blocks, page_size, Hk, d)`` and
``v_cache (num_blocks, page_size, Hk, dv)``, ``block_table`` int32 ``(B, max_pages)`` and
``cache_seqlens`` int32 ``(B,)``: key ``j`` of sequence ``b`` sits in slot ``j % page_size`` of
page ``block_table[b, j // page_size]``, for ``j < cache_seqlens[b]``.

Algorithm (two launches):

1. Partials, one program per (sequence ``b``, key/value head ``h``, split ``s``). The keys of
   split ``s`` are ``[s·SPLIT, min((s+1)·SPLIT, n_b))``; ``SPLIT`` (``split_size``) is a fixed
   number of keys, never derived from the batch, so the work done for a sequence — and every
   rounding in it — is the same whatever else is in the batch (batch invariance). The program
   holds the ``Hq/Hk·Nq`` query rows of every query head that shares key/value head ``h`` in
   one tile, so each key and value row is read once for its whole group. Per block of
   ``BLOCK_N`` keys it gathers their rows page by page through the block table (any page size:
   1, 7, 16, 256...; the key's page and slot are computed per key), masks keys at or past
   ``n_b`` before they are loaded (nothing past ``cache_seqlens`` is read, so NaN in unused
   slots cannot leak) and runs the online softmax (c = |scale|·log2 e, one fp32 constant)::

       S   = q·kᵀ                      tl.dot, fp32 accumulation (IEEE fp32 for fp32 inputs)
       t   = ±S, −inf where masked     (the sign of scale, so m is the maximum of scale·S)
       m'  = max(m, rowmax t);  α = exp2((m − m')·c);  p = exp2((t − m')·c)
       l   = α·l + Σ p;  acc = α·acc + (p rounded to the input dtype)·V

   and writes fp32 partials ``o_s = acc / l`` and ``lse_s = (m·c + log2 l)·ln 2``; a row that
   keeps no key of the split (a split past the sequence's end, a causal row before its first
   key) writes ``o_s = 0``, ``lse_s = −inf``. Causal masks are bottom-right aligned per
   sequence (``j ≤ i + n_b − Nq``). The number of split programs is
   ``⌈max_pages·page_size / SPLIT⌉``, read from the block table's shape, so no host sync.
2. Merge (:func:`combine_partials`, also usable alone as ``op="combine"``), one program per
   block of rows, the splits in order, in fp32::

       m = max_s lse_s;  w_s = exp2((lse_s − m)·log2 e);  Z = Σ_s w_s
       O = (Σ_s w_s·o_s) / Z;   LSE = m + ln Z

   A ``−inf`` split has weight exactly 0 and adds exact zeros (the sums start at +0, so not
   even a zero's sign changes): the merge of a sequence does not depend on how many empty
   splits the batch's longest sequence adds. A row whose splits are all ``−inf`` gives
   ``O = 0``, ``LSE = −inf`` (no 0/0); a NaN ``lse_s`` gives NaN.

Arithmetic class "flash" per split (fp32 scores, softmax and accumulators, P rounded to the
input format before P·V) followed by an fp32 merge; the merge's own error is within
docs/error-bounds.md's "The split-KV merge".

Known limits: ``cache_seqlens[b] ≤ max_pages·page_size`` is the caller's promise on a GPU
(checked on the CPU only: a check there would cost a host sync per call); forward only; no
sliding window, soft-cap, sinks or ALiBi; head dims up to 256 (padded to a power of two
≥ 16); at most 128 query rows per group (``Hq/Hk·Nq``); one fixed split size means few
programs for a short cache at batch 1 (the price of batch invariance: a FlashDecoding
heuristic picking splits per batch would be faster there and not invariant); the paged
gather is per key, without TMA; not yet timed or tuned on a GPU by its author. Under
``TRITON_INTERPRET=1`` bf16 ``tl.dot`` is broken upstream (triton-lang/triton#11584): bf16
then raises ``NotImplementedError``. The merge has no dot and runs bf16 there, but the
interpreter converts fp32 to bf16 by truncation, so under it a bf16 ``O`` is written in fp32
and rounded to nearest by torch.
"""

from __future__ import annotations

import math
import os
from typing import Any

import triton
import triton.language as tl

__all__ = ["DEFAULT_SPLIT", "combine_partials", "decode_partials", "flash_decode_paged"]

DEFAULT_SPLIT = 128  # keys per split: fixed, so results do not depend on the batch
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_MAX_ROWS = 128


@triton.jit
def _decode_split_kernel(
    Q, K, V, BT, LENS, OP, LP,
    sqb, sqn, sqh, sqd, skb, sks, skh, skd, svb, svs, svh, svd, stb, stp,
    sos, sob, son, soh, sod, sls, slb, sln, slh,
    HK, NQ, D, DV, PAGE, c,
    GROUP: tl.constexpr, SPLIT: tl.constexpr, CAUSAL: tl.constexpr, POS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HK
    h = pid % HK
    n = tl.load(LENS + b)
    lo = split * SPLIT
    hi = tl.minimum(lo + SPLIT, n)
    rows = tl.arange(0, BLOCK_M)
    member = rows // NQ  # rows are (group member, query) pairs, query fastest
    qi = rows % NQ
    row_ok = rows < GROUP * NQ
    head = h * GROUP + member
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)
    q_ptrs = Q + b * sqb + qi[:, None] * sqn + head[:, None] * sqh + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    last = qi + (n - NQ)  # the last key a causal row keeps (bottom-right aligned)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        live = cols < hi
        # Keys past the split (and the sequence) are neither looked up nor loaded.
        page = tl.load(BT + b * stb + (cols // PAGE) * stp, mask=live, other=0).to(tl.int64)
        slot = cols % PAGE
        k_ptrs = K + page[:, None] * skb + slot[:, None] * sks + h * skh + offs_d[None, :] * skd
        k = tl.load(k_ptrs, mask=live[:, None] & (offs_d[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if not POS:
            s = -s  # exact: the maximum of t is then the maximum of scale·S
        keep = live[None, :] & row_ok[:, None]
        if CAUSAL:
            keep = keep & (cols[None, :] <= last[:, None])
        t = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(t, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        # Masked entries and untouched rows give exactly 0 (never ±inf·0 = NaN, even at c = 0);
        # the largest score's exponent is exactly 0 (t − m' before the scaling).
        alpha = tl.where(m_i == float("-inf"), 0.0, tl.math.exp2((m_i - m_safe) * c))
        p = tl.where(keep, tl.math.exp2((t - m_safe[:, None]) * c), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + page[:, None] * svb + slot[:, None] * svs + h * svh + offs_dv[None, :] * svd
        v = tl.load(v_ptrs, mask=live[:, None] & (offs_dv[None, :] < DV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    kept = l_i > 0.0
    o = tl.where(kept[:, None], acc / tl.where(kept, l_i, 1.0)[:, None], 0.0)
    m_out = tl.where(kept, m_i, 0.0)
    log_l = tl.math.log2(tl.where(kept, l_i, 1.0))
    lse = tl.where(kept, (m_out * c + log_l) * 0.6931471805599453, float("-inf"))
    base_o = OP + split * sos + b * sob + qi[:, None] * son + head[:, None] * soh
    tl.store(base_o + offs_dv[None, :] * sod, o, mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    tl.store(LP + split * sls + b * slb + qi * sln + head * slh, lse, mask=row_ok)


@triton.jit
def _combine_kernel(
    OP, LP, OUT, L, S, R, DV, sos, sor, sod, sls, slr, oor, ood,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_DV)
    row_ok = rows < R
    tile_ok = row_ok[:, None] & (cols[None, :] < DV)
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for s in range(0, S):
        lse = tl.load(LP + s * sls + rows * slr, mask=row_ok, other=float("-inf"))
        m = tl.maximum(m, lse, propagate_nan=tl.PropagateNan.ALL)
    # NaN counts as live (it must reach the output); only an all −inf row is empty.
    live = m != float("-inf")
    m_safe = tl.where(live, m, 0.0)
    z = tl.zeros([BLOCK_R], tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], tl.float32)
    for s in range(0, S):
        lse = tl.load(LP + s * sls + rows * slr, mask=row_ok, other=float("-inf"))
        w = tl.math.exp2((lse - m_safe) * 1.4426950408889634)  # the largest: exp2(0) = 1
        o_s = tl.load(OP + s * sos + rows[:, None] * sor + cols[None, :] * sod, mask=tile_ok,
                      other=0.0).to(tl.float32)  # fmt: skip
        z = z + w
        acc = acc + w[:, None] * o_s
    out = tl.where(live[:, None], acc / tl.where(live, z, 1.0)[:, None], 0.0)
    lse_out = tl.where(live, m_safe + tl.log(tl.where(live, z, 1.0)), float("-inf"))
    out_ptrs = OUT + rows[:, None] * oor + cols[None, :] * ood
    tl.store(out_ptrs, out.to(OUT.dtype.element_ty), mask=tile_ok)
    tl.store(L + rows, lse_out, mask=row_ok)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _pow2(x: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(int(x)))


def _check_paged(q, k_cache, v_cache, cache_seqlens, block_table, split_size) -> None:
    import torch

    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D torch.Tensor, got {getattr(x, 'shape', x)}")
        if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"{name} dtype {x.dtype}: use float16, bfloat16 or float32")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise ValueError("q, k_cache and v_cache must share one dtype: cast them first")
    bsz, nq, hq, d = q.shape
    nb, page, hk, dk = k_cache.shape
    if v_cache.shape[:3] != (nb, page, hk) or dk != d:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} must be (num_blocks, page_size, Hk, d) with q's d "
            f"and v_cache {tuple(v_cache.shape)} (num_blocks, page_size, Hk, dv)"
        )
    if hq % hk or (hq // hk) * nq > _MAX_ROWS:
        raise ValueError(
            f"Hq ({hq}) must be a multiple of Hk ({hk}) with Hq/Hk·Nq <= {_MAX_ROWS}: "
            "pass fewer queries per call"
        )
    if max(d, v_cache.shape[3]) > 256 or nq < 1:
        raise ValueError(f"head dims must be <= 256 and Nq >= 1, got d={d}, Nq={nq}")
    for name, x, shape in (
        ("cache_seqlens", cache_seqlens, (bsz,)),
        ("block_table", block_table, (bsz, block_table.shape[-1] if block_table.dim() else 0)),
    ):
        if x.dtype != torch.int32 or tuple(x.shape) != shape or x.device != q.device:
            raise ValueError(f"{name} must be int32 {shape} on q's device, got {x.dtype} {x.shape}")
    if cache_seqlens.device.type == "cpu" and bsz:
        # On a GPU this would cost a host sync per call: there it is the caller's promise.
        low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
        if low < 0 or high > block_table.shape[1] * page:
            raise ValueError(
                f"cache_seqlens must lie in [0, max_pages·page_size = "
                f"{block_table.shape[1] * page}], got [{low}, {high}]: widen the block table"
            )
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 16:
        raise ValueError(f"split_size must be an int >= 16 keys, got {split_size!r}")
    if q.dtype == torch.bfloat16 and _interpreting():
        raise NotImplementedError(
            "bf16 under TRITON_INTERPRET=1: the interpreter's bf16 tl.dot returns wrong values "
            "(triton-lang/triton#11584); run bf16 on a GPU"
        )


def decode_partials(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    cache_seqlens: Any,
    block_table: Any,
    causal: bool = False,
    scale: float | None = None,
    split_size: int = DEFAULT_SPLIT,
) -> tuple[Any, Any]:
    """The fp32 split partials of :func:`flash_decode_paged` (step 1 of the module docstring):
    ``out_partial (S, B, Nq, Hq, dv)`` and ``lse_partial (S, B, Nq, Hq)`` with
    ``S = ⌈max_pages·page_size / split_size⌉`` (at least 1)."""
    import torch

    _check_paged(q, k_cache, v_cache, cache_seqlens, block_table, split_size)
    bsz, nq, hq, d = q.shape
    _, page, hk, dv = v_cache.shape
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(sc):
        raise ValueError(f"scale must be finite, got {scale}")
    splits = max(1, -(-block_table.shape[1] * page // split_size))
    o_p = torch.empty((splits, bsz, nq, hq, dv), dtype=torch.float32, device=q.device)
    l_p = torch.empty((splits, bsz, nq, hq), dtype=torch.float32, device=q.device)
    group = hq // hk
    if bsz == 0:
        return o_p, l_p
    _decode_split_kernel[(bsz * hk, splits)](
        q, k_cache, v_cache, block_table, cache_seqlens, o_p, l_p,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_table.stride(),
        *o_p.stride(), *l_p.stride(),
        hk, nq, d, dv, page, abs(sc) * _LOG2E,
        GROUP=group, SPLIT=split_size, CAUSAL=bool(causal), POS=sc >= 0,
        BLOCK_M=_pow2(group * nq), BLOCK_N=min(64, _pow2(split_size)),
        BLOCK_D=_pow2(d), BLOCK_DV=_pow2(dv), PRECISION="ieee",
        num_warps=4, num_stages=2,
    )  # fmt: skip
    return o_p, l_p


def combine_partials(out_partial: Any, lse_partial: Any, *, out_dtype: Any = None) -> tuple:
    """Merge split-KV partials ``out_partial (S, ..., dv)`` and fp32 ``lse_partial (S, ...)``
    (step 2 of the module docstring): ``LSE = ln Σ_s exp(lse_s)``,
    ``O = Σ_s exp(lse_s − LSE)·o_s``; returns ``(O (..., dv), LSE (...) fp32)``, ``O`` in
    ``out_dtype`` (default: the partials' dtype)."""
    import torch

    if not isinstance(out_partial, torch.Tensor) or not isinstance(lse_partial, torch.Tensor):
        raise ValueError("out_partial and lse_partial must be torch tensors")
    if out_partial.dim() < 2 or tuple(lse_partial.shape) != tuple(out_partial.shape[:-1]):
        raise ValueError(
            f"out_partial must be (S, ..., dv) and lse_partial (S, ...) with the same leading "
            f"axes, got {tuple(out_partial.shape)} and {tuple(lse_partial.shape)}"
        )
    if lse_partial.dtype != torch.float32 or out_partial.device != lse_partial.device:
        raise ValueError("lse_partial must be float32 on out_partial's device")
    lead, dv = tuple(out_partial.shape[1:-1]), out_partial.shape[-1]
    if dv > 256:
        raise ValueError(f"dv must be <= 256, got {dv}")
    splits, rows = out_partial.shape[0], math.prod(lead)
    o_p = out_partial.reshape(splits, rows, dv)
    l_p = lse_partial.reshape(splits, rows)
    dt = out_partial.dtype if out_dtype is None else out_dtype
    # The interpreter converts fp32 to bf16 by truncation (measured: errors of one bf16 ulp
    # where rounding to nearest leaves half): there O is written in fp32 and rounded by torch.
    truncates = dt == torch.bfloat16 and _interpreting()
    kernel_dt = torch.float32 if truncates else dt
    out = torch.empty((rows, dv), dtype=kernel_dt, device=out_partial.device)
    lse = torch.empty((rows,), dtype=torch.float32, device=out_partial.device)
    if rows:
        block_r = 16 if dv > 64 else 32
        _combine_kernel[(triton.cdiv(rows, block_r),)](
            o_p, l_p, out, lse, splits, rows, dv,
            *o_p.stride(), *l_p.stride(), *out.stride(),
            BLOCK_R=block_r, BLOCK_DV=_pow2(dv), num_warps=4,
        )  # fmt: skip
    return out.to(dt).reshape(*lead, dv), lse.reshape(lead)


def flash_decode_paged(
    q: Any,
    k_cache: Any,
    v_cache: Any,
    *,
    cache_seqlens: Any,
    block_table: Any,
    causal: bool = False,
    scale: float | None = None,
    split_size: int = DEFAULT_SPLIT,
) -> tuple[Any, Any]:
    """Paged split-KV decode attention ``softmax(scale·QKᵀ + mask)·V`` per sequence (module
    docstring): returns ``O (B, Nq, Hq, dv)`` in q's dtype and fp32 ``LSE (B, Hq, Nq)`` (a
    transposed view of the merge's ``(B, Nq, Hq)``, which saves a copy; natural log;
    ``O = 0``, ``LSE = −inf`` for rows that keep no key). ``scale`` defaults to ``1/sqrt(d)``;
    ``split_size`` keys per split (fixed: results do not depend on the batch)."""
    o_p, l_p = decode_partials(
        q,
        k_cache,
        v_cache,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        causal=causal,
        scale=scale,
        split_size=split_size,
    )
    o, lse = combine_partials(o_p, l_p, out_dtype=q.dtype)
    return o, lse.transpose(1, 2)
