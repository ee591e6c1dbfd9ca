"""Ragged-layout kernels as a user would write them, outside the flashcheck package.

Each is declared with ``flashcheck.kernel(fn, layout=...)`` (or ``op="combine"``) at module
level, so ``flashcheck replay`` finds it again by its ``module:attribute`` name. The buggy ones
are real bug classes of varlen, paged and split-KV kernels; the others are correct.
"""

import torch

import flashcheck


def _attend(q, k, v, causal, scale):
    """fp32 attention of one sequence, ``q (Nq, Hq, d)``, ``k``/``v`` ``(Nk, Hk, ·)`` with GQA;
    causal bottom-right aligned; rows that keep no key give ``O = 0``, ``LSE = −inf``."""
    nq, hq, d = q.shape
    nk, hk, dv = v.shape
    rep = hq // hk
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(rep, 1).transpose(0, 1)
    vf = v.float().repeat_interleave(rep, 1).transpose(0, 1)
    s = (qf @ kf.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    if causal:
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (Hq, Nq); −inf for rows that keep no key
    p = torch.exp(s - lse[..., None].clamp(min=-1e30))
    o = (p @ vf).transpose(0, 1) if nk else torch.zeros(nq, hq, dv)
    return o.to(q.dtype), lse


def _varlen(
    q,
    k,
    v,
    cu_q,
    cu_k,
    causal,
    scale,
    *,
    extra_key=False,
    fill_empty=False,
    keys_by_q=False,
    key_start_by_q=False,
):
    o = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for b in range(cu_q.numel() - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if extra_key:
            k1 = min(k1 + 1, k.shape[0])  # the bug: the key range runs one past the end
        if keys_by_q:  # the bug: the key range read from cu_seqlens_q
            k1 = min(q1, k.shape[0])
            k0 = min(q0, k1)
        if key_start_by_q:  # the bug: the key start read from cu_seqlens_q, its count not
            k0, k1 = min(q0, k.shape[0]), min(q0 + k1 - k0, k.shape[0])
        if q1 > q0:
            o[q0:q1], lse[:, q0:q1] = _attend(q[q0:q1], k[k0:k1], v[k0:k1], causal, scale)
    if fill_empty:
        for b in range(cu_q.numel() - 1):
            q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
            if q1 == q0 and q0 < o.shape[0]:
                o[q0] = 0  # the bug: "clears" one row for an empty sequence: its neighbour's
    return o, lse


def _varlen_ok(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale)


def _varlen_one_past(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, extra_key=True)


def _varlen_keys_by_q(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, keys_by_q=True)


def _varlen_key_start_by_q(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, key_start_by_q=True)


def _varlen_empty_writes(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, fill_empty=True)


def _varlen_skips_keyless(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    """Skips a sequence without keys, so its rows keep what a reused output buffer held
    (0.5, LSE 0) where they must be O = 0, LSE = −inf: the bug."""
    o, lse = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale)
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        if cu_seqlens_k[b + 1] == cu_seqlens_k[b]:
            o[q0:q1], lse[:, q0:q1] = 0.5, 0.0
    return o, lse


def _varlen_hangs_on_long(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    # The bug: key tiles of 64, and past one tile a step that integer division makes 0.
    for b in range(cu_seqlens_k.numel() - 1):
        n = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
        step, i = (64 if n <= 64 else n // 64 // 1000), 0
        while i < n:
            i += step
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale)


def _paged(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    causal,
    scale,
    *,
    whole_page=False,
    lse_mod=False,
):
    bsz, nq, hq, _ = q.shape
    page = k_cache.shape[1]
    o = torch.zeros(bsz, nq, hq, v_cache.shape[3], dtype=q.dtype)
    lse = torch.full((bsz, hq, nq), float("-inf"))
    for b in range(bsz):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // page)].long()
        keys = n if not whole_page else pages.numel() * page  # the bug: the last page whole
        kb = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:keys]
        vb = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:keys]
        ob, lb = _attend(q[b], kb, vb, causal, scale)
        if lse_mod:
            # The bug: LSE stored as (kv head, group member) but indexed as (group member, kv
            # head): query heads mapped to k/v heads by modulo, for grouped heads only.
            hk = k_cache.shape[2]
            lb = lb.reshape(hk, hq // hk, nq).transpose(0, 1).reshape(hq, nq)
        o[b], lse[b] = ob, lb
    return o, lse


def _paged_ok(q, k_cache, v_cache, *, cache_seqlens, block_table, causal=False, scale=None):
    return _paged(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale)


def _paged_whole_page(q, k_cache, v_cache, *, cache_seqlens, block_table, causal=False, scale=None):
    return _paged(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, whole_page=True)


def _paged_lse_heads_by_modulo(
    q, k_cache, v_cache, *, cache_seqlens, block_table, causal=False, scale=None
):
    return _paged(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, lse_mod=True)


def _paged_splits_by_batch(q, k_cache, v_cache, *, cache_seqlens, block_table, scale=None):
    """Split-KV decode whose number of splits fills the machine: more splits for a small
    batch. Each split's output is rounded to the input format before the merge, so a
    sequence's bits depend on the batch it came in. Declared batch-invariant below: the bug."""
    bsz, nq, hq, _ = q.shape
    page = k_cache.shape[1]
    splits = max(1, 8 // bsz)
    o = torch.zeros(bsz, nq, hq, v_cache.shape[3], dtype=q.dtype)
    lse = torch.full((bsz, hq, nq), float("-inf"))
    for b in range(bsz):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // page)].long()
        kb = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]
        vb = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n]
        size = max(1, -(-n // splits))
        parts = [
            _attend(q[b], kb[j : j + size], vb[j : j + size], False, scale)
            for j in range(0, n, size)
        ] or [_attend(q[b], kb, vb, False, scale)]
        o_p = torch.stack([p[0] for p in parts])
        l_p = torch.stack([p[1].transpose(0, 1) for p in parts])  # (S, Nq, Hq)
        ob, lb = _merge(o_p, l_p, guard=True)
        o[b], lse[b] = ob, lb.transpose(0, 1)
    return o, lse


def _varlen_max_over_neighbour(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    """Takes each row's maximum over its keys and the next sequence's first key, then sums
    its own keys only: exact in real arithmetic, but a sequence's roundings depend on its
    neighbour (and its probabilities underflow when the neighbour's score is huge)."""
    o = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if q1 == q0 or k1 == k0:
            continue
        hk = k.shape[1]
        rep = q.shape[1] // hk
        qf = q[q0:q1].float().transpose(0, 1)
        kf = k[k0 : min(k1 + 1, k.shape[0])].float().repeat_interleave(rep, 1).transpose(0, 1)
        vf = v[k0:k1].float().repeat_interleave(rep, 1).transpose(0, 1)
        s = (qf @ kf.transpose(-1, -2)) * (q.shape[2] ** -0.5 if scale is None else scale)
        m = s.max(dim=-1, keepdim=True).values
        p = torch.exp(s[..., : k1 - k0] - m)
        den = p.sum(-1, keepdim=True)
        o[q0:q1] = ((p @ vf) / den).transpose(0, 1).to(q.dtype)
        lse[:, q0:q1] = (m + torch.log(den))[..., 0]
    return o, lse


def _paged_pool_order(q, k_cache, v_cache, *, cache_seqlens, block_table, scale=None):
    """Visits a sequence's pages in the order they lie in the pool, not in the block table's:
    the same keys (attention does not care about their order), summed in another order, so
    the result's bits depend on where the allocator put the pages."""
    bsz, nq, hq, _ = q.shape
    page = k_cache.shape[1]
    o = torch.zeros(bsz, nq, hq, v_cache.shape[3], dtype=q.dtype)
    lse = torch.full((bsz, hq, nq), float("-inf"))
    for b in range(bsz):
        n = int(cache_seqlens[b])
        pages = block_table[b, : -(-n // page)].long()
        slots = torch.arange(pages.numel() * page)[:n]
        order = torch.argsort(pages[slots // page] * page + slots % page)
        kb = k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n][order]
        vb = v_cache[pages].reshape(-1, *v_cache.shape[2:])[:n][order]
        o[b], lse[b] = _attend(q[b], kb, vb, False, scale)
    return o, lse


def _merge(out_partial, lse_partial, guard):
    lse = torch.logsumexp(lse_partial, dim=0)  # −inf where every split is empty
    base = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse) if guard else lse
    w = torch.exp(lse_partial - base)  # the unguarded −inf − (−inf) is NaN
    o = (w[..., None] * out_partial.float()).sum(0)
    return o.to(out_partial.dtype), lse


def _combine_ok(out_partial, lse_partial):
    return _merge(out_partial, lse_partial, guard=True)


def _combine_nan_when_empty(out_partial, lse_partial):
    return _merge(out_partial, lse_partial, guard=False)


varlen_ok = flashcheck.kernel(_varlen_ok, name="user_layouts:varlen_ok", layout="varlen")
varlen_one_past = flashcheck.kernel(
    _varlen_one_past, name="user_layouts:varlen_one_past", layout="varlen"
)
varlen_keys_by_q = flashcheck.kernel(
    _varlen_keys_by_q, name="user_layouts:varlen_keys_by_q", layout="varlen"
)
varlen_key_start_by_q = flashcheck.kernel(
    _varlen_key_start_by_q, name="user_layouts:varlen_key_start_by_q", layout="varlen"
)
varlen_empty_writes = flashcheck.kernel(
    _varlen_empty_writes, name="user_layouts:varlen_empty_writes", layout="varlen"
)
varlen_skips_keyless = flashcheck.kernel(
    _varlen_skips_keyless, name="user_layouts:varlen_skips_keyless", layout="varlen"
)
paged_ok = flashcheck.kernel(_paged_ok, name="user_layouts:paged_ok", layout="paged")
paged_whole_page = flashcheck.kernel(
    _paged_whole_page, name="user_layouts:paged_whole_page", layout="paged"
)
paged_lse_heads_by_modulo = flashcheck.kernel(
    _paged_lse_heads_by_modulo, name="user_layouts:paged_lse_heads_by_modulo", layout="paged"
)
combine_ok = flashcheck.kernel(_combine_ok, name="user_layouts:combine_ok", op="combine")
combine_nan_when_empty = flashcheck.kernel(
    _combine_nan_when_empty, name="user_layouts:combine_nan_when_empty", op="combine"
)
paged_splits_by_batch = flashcheck.kernel(
    _paged_splits_by_batch,
    name="user_layouts:paged_splits_by_batch",
    layout="paged",
    batch_invariant=True,
)
varlen_max_over_neighbour = flashcheck.kernel(
    _varlen_max_over_neighbour, name="user_layouts:varlen_max_over_neighbour", layout="varlen"
)
paged_pool_order = flashcheck.kernel(
    _paged_pool_order, name="user_layouts:paged_pool_order", layout="paged"
)
varlen_hangs_on_long = flashcheck.kernel(
    _varlen_hangs_on_long, name="user_layouts:varlen_hangs_on_long", layout="varlen"
)
