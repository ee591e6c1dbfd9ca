"""The decode attention forwards ``flashcheck bench --decode`` compares, on one paged batch.

Every provider gets the same :class:`PagedBatch` (a permuted pool of pages, a block table,
the cache lengths, the queries) and returns a zero-argument callable that computes
``O (B, Nq, Hq, dv)``; what a serving system does once per batch (building masks, gathering
layouts, compiling) happens when the callable is made, never in the timed calls.

- ``triton-decode-paged``: this project's paged split-KV kernel
  (:func:`flashcheck.kernels.triton_decode.flash_decode_paged`) on the pages themselves.
- ``sdpa``: ``scaled_dot_product_attention`` on the keys gathered contiguous once (the batch
  padded to its longest sequence). Uniform non-causal batches: the flash backend, grouped heads
  native (``enable_gqa``), no mask. Ragged or causal ones need a boolean key mask (bottom-right
  causal), which only the memory-efficient backend takes, and it takes no grouped heads: K/V
  heads are repeated to Hq (so it reads Hq/Hk times the bytes the others read).
- ``flex-paged``: compiled FlexAttention on the page pool through torch's experimental
  ``PagedAttention`` helper (a logical block mask of the cache lengths converted to physical
  pages by the block table); its pool is laid out ``(1, Hk, pages·page, d)`` once, its KV block
  size is the page size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DECODE_PROVIDERS", "PagedBatch", "make_batch"]


@dataclass
class PagedBatch:
    """One decode batch on the GPU: ``q (B, Nq, Hq, d)``, ``k_cache``/``v_cache``
    ``(pages, page, Hk, d)``, int32 ``block_table (B, max_pages)`` and ``cache_seqlens (B,)``,
    ``lengths`` on the host."""

    q: Any
    k_cache: Any
    v_cache: Any
    block_table: Any
    cache_seqlens: Any
    lengths: list[int]
    causal: bool


def make_batch(
    lengths: list[int],
    *,
    nq: int,
    hq: int,
    hk: int,
    d: int,
    page: int,
    dtype: str,
    causal: bool,
    seed: int,
    device: str = "cuda",
) -> PagedBatch:
    """Standard-normal queries, keys and values in a permuted pool holding exactly the
    sequences' pages (one spare page), on ``device``."""
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator(device=device).manual_seed(seed)
    counts = [-(-n // page) for n in lengths]
    total = sum(counts) + 1
    pool = (total, page, hk, d)
    kc = torch.randn(pool, device=device, dtype=dt, generator=g)
    vc = torch.randn(pool, device=device, dtype=dt, generator=g)
    order = torch.randperm(total, device=device, generator=g).to(torch.int32)
    table = torch.zeros((len(lengths), max(1, max(counts))), dtype=torch.int32, device=device)
    start = 0
    for i, c in enumerate(counts):
        table[i, :c] = order[start : start + c]
        start += c
    q = torch.randn((len(lengths), nq, hq, d), device=device, dtype=dt, generator=g)
    lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    return PagedBatch(q, kc, vc, table, lens, list(lengths), causal)


def gathered(batch: PagedBatch) -> tuple[Any, Any]:
    """K and V ``(B, Hk, N_max, d)``: each sequence's rows in order, zero past its length."""
    import torch

    page = batch.k_cache.shape[1]
    n_max = max(batch.lengths)
    pages = -(-n_max // page)
    out = []
    for cache in (batch.k_cache, batch.v_cache):
        rows = cache[batch.block_table[:, :pages].long()]  # (B, pages, page, Hk, d)
        rows = rows.reshape(len(batch.lengths), pages * page, *cache.shape[2:])[:, :n_max]
        keep = torch.arange(n_max, device=cache.device)[None, :] < batch.cache_seqlens[:, None]
        out.append((rows * keep[..., None, None]).transpose(1, 2).contiguous())
    return out[0], out[1]


def _key_mask(batch: PagedBatch, n_max: int) -> Any:
    """Boolean ``(B, 1, Nq, N_max)``: key ``j`` kept for query ``i`` of sequence ``b``."""
    import torch

    nq = batch.q.shape[1]
    j = torch.arange(n_max, device=batch.q.device)[None, None, :]
    n = batch.cache_seqlens.long()[:, None, None]
    keep = j < n
    if batch.causal:
        i = torch.arange(nq, device=batch.q.device)[None, :, None]
        keep = keep & (j <= i + n - nq)
    return keep[:, None]


def _triton(batch: PagedBatch) -> Callable[[], Any]:
    from ...kernels.triton_decode import DEFAULT_SPLIT, flash_decode_paged

    def fn():
        return flash_decode_paged(
            batch.q,
            batch.k_cache,
            batch.v_cache,
            cache_seqlens=batch.cache_seqlens,
            block_table=batch.block_table,
            causal=batch.causal,
        )[0]

    fn.note = f"{DEFAULT_SPLIT} keys per split (fixed), fp32 partials, Triton merge"
    return fn


def _sdpa(batch: PagedBatch) -> Callable[[], Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    k, v = gathered(batch)
    q = batch.q.transpose(1, 2).contiguous()
    if len(set(batch.lengths)) == 1 and not batch.causal:

        def fn():
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return sdpa(q, k, v, enable_gqa=True).transpose(1, 2)

        fn.note = "flash backend, grouped heads native"
        return fn
    # The flash backend takes no mask, and the efficient one no grouped heads (torch 2.11):
    # a ragged or causal batch needs the mask, so K/V heads are repeated to Hq (once, untimed).
    group = q.shape[1] // k.shape[1]
    k, v = (x.repeat_interleave(group, dim=1) for x in (k, v))
    mask = _key_mask(batch, k.shape[2])

    def masked():
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return sdpa(q, k, v, attn_mask=mask).transpose(1, 2)

    masked.note = "efficient backend, key mask, K/V heads repeated to Hq"
    return masked


_FLEX: dict[str, Any] = {}


def _flex(batch: PagedBatch) -> Callable[[], Any]:
    import torch
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        from ..adapters.library import raise_recompile_limits

        raise_recompile_limits()  # past dynamo's limit flex would run its eager reference
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    pages, page, hk, d = batch.k_cache.shape
    bsz, nq = batch.q.shape[:2]
    width = batch.block_table.shape[1]
    helper = PagedAttention(pages, page, bsz, device=str(batch.q.device))
    table = batch.block_table.long()
    helper.page_table[:, :width] = table
    for b, n in enumerate(batch.lengths):
        owned = table[b, : -(-n // page)]
        helper.physical_to_logical[b, owned] = torch.arange(owned.numel(), device=owned.device)
    lens = batch.cache_seqlens.long()

    def logical(b, h, i, j):
        keep = j < lens[b]
        if batch.causal:
            keep = keep & (j <= i + lens[b] - nq)
        return keep

    block = create_block_mask(logical, bsz, None, nq, width * page, BLOCK_SIZE=(128, page))
    mask = helper.convert_logical_block_mask(block, kv_len=lens)
    k = batch.k_cache.reshape(1, pages * page, hk, d).transpose(1, 2).contiguous()
    v = batch.v_cache.reshape(1, pages * page, hk, d).transpose(1, 2).contiguous()
    q = batch.q.transpose(1, 2).contiguous()
    compiled = _FLEX["fn"]

    def fn():
        return compiled(q, k, v, block_mask=mask, enable_gqa=True).transpose(1, 2)

    fn.note = "torch.compile'd flex_attention, PagedAttention block mask, KV block = page size"
    return fn


DECODE_PROVIDERS: dict[str, Callable[[PagedBatch], Callable[[], Any]]] = {
    "triton-decode-paged": _triton,
    "sdpa": _sdpa,
    "flex-paged": _flex,
}
