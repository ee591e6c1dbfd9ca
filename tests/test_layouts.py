"""Varlen and paged batches: validation with messages that say how to fix the call (numpy and
torch alike), and the cut into dense per-sequence problems."""

from __future__ import annotations

import re

import numpy as np
import pytest

from flashcheck.harness.core.layouts import pack_varlen, paged_batch, paginate, varlen_batch

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)


def _f(rng, *shape, dt=np.float16):
    return rng.standard_normal(shape).astype(dt)


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _varlen(lens_q=(3, 0, 2), lens_k=(4, 2, 0), hq=2, hk=1, d=4, dv=3, seed=0):
    rng = np.random.default_rng(seed)
    q = _f(rng, sum(lens_q), hq, d)
    k = _f(rng, sum(lens_k), hk, d)
    v = _f(rng, sum(lens_k), hk, dv)
    return q, k, v, _cu(lens_q), _cu(lens_k)


def _paged(seed=0):
    rng = np.random.default_rng(seed)
    q = _f(rng, 2, 3, 2, 4)
    kc, vc = _f(rng, 5, 4, 1, 4), _f(rng, 5, 4, 1, 3)
    table = np.array([[4, 0, 1], [2, 3, 0]], dtype=np.int32)
    return q, kc, vc, table, np.array([6, 9], dtype=np.int32)


def test_varlen_sequences_are_the_packed_rows_transposed():
    q, k, v, cq, ck = _varlen()
    batch = varlen_batch(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert batch.batch == 3 and (batch.max_seqlen_q, batch.max_seqlen_k) == (3, 4)
    q0, k0, v0 = batch.sequence(0)
    assert q0.dtype == np.float16 and q0.shape == (1, 2, 3, 4) and k0.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(q0[0, 1], q[0:3, 1])
    np.testing.assert_array_equal(v0[0, 0], v[0:4, 0])
    q1, k1, _ = batch.sequence(1)
    assert q1.shape == (1, 2, 0, 4) and k1.shape == (1, 1, 2, 4)
    _, k2, v2 = batch.sequence(2)
    assert k2.shape == (1, 1, 0, 4) and v2.shape == (1, 1, 0, 3)


def test_paged_sequences_gather_pages_in_table_order_and_stop_at_the_length():
    q, kc, vc, table, lens = _paged()
    batch = paged_batch(q, kc, vc, block_table=table, cache_seqlens=lens)
    _, k0, v0 = batch.sequence(0)
    assert k0.shape == (1, 1, 6, 4) and v0.shape == (1, 1, 6, 3)
    np.testing.assert_array_equal(v0[0, 0, 4:], vc[0, :2, 0])
    np.testing.assert_array_equal(k0[0, 0], np.concatenate([kc[4, :, 0], kc[0, :2, 0]]))
    _, k1, _ = batch.sequence(1)
    want = np.concatenate([kc[2, :, 0], kc[3, :, 0], kc[0, :1, 0]])
    np.testing.assert_array_equal(k1[0, 0], want)
    np.testing.assert_array_equal(batch.pages(0), [4, 0])


@pytest.mark.parametrize("as_torch", [False, True])
def test_torch_and_numpy_inputs_are_read_alike(as_torch):
    q, k, v, cq, ck = _varlen()
    if as_torch:
        q, k, v = (torch.from_numpy(x).to(torch.bfloat16) for x in (q, k, v))
        cq, ck = torch.from_numpy(cq), torch.from_numpy(ck)
    batch = varlen_batch(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    assert batch.cu_seqlens_q.tolist() == [0, 3, 3, 5]
    assert batch.fmt.name == ("bf16" if as_torch else "fp16")


VARLEN_ERRORS = [
    (
        lambda a: {**a, "cu_seqlens_q": a["cu_seqlens_q"].astype(np.int64)},
        TypeError,
        "cu_seqlens_q has dtype int64; index tensors are int32 as in FlashAttention: cast with "
        "cu_seqlens_q.astype(np.int32)",
    ),
    (
        lambda a: {**a, "cu_seqlens_q": np.array([1, 3, 3, 5], np.int32)},
        ValueError,
        "cu_seqlens_q must start at 0",
    ),
    (
        lambda a: {**a, "cu_seqlens_q": np.array([0, 4, 3, 5], np.int32)},
        ValueError,
        "cu_seqlens_q must be non-decreasing (sequence lengths >= 0), but cu_seqlens_q[2] = 3 < "
        "cu_seqlens_q[1] = 4: build it as a cumulative sum of the lengths",
    ),
    (
        lambda a: {**a, "cu_seqlens_k": np.array([0, 4, 6, 5], np.int32)},
        ValueError,
        "cu_seqlens_k must be non-decreasing",
    ),
    (
        lambda a: {**a, "cu_seqlens_k": np.array([0, 4, 5, 5], np.int32)},
        ValueError,
        "cu_seqlens_k must end at the packed length 6 (k.shape[0]), got 5",
    ),
    (
        lambda a: {**a, "cu_seqlens_k": np.array([0, 6], np.int32)},
        ValueError,
        "cu_seqlens_q has 3 sequences but cu_seqlens_k has 1",
    ),
    (
        lambda a: {**a, "cu_seqlens_q": np.array([0], np.int32)},
        ValueError,
        "cu_seqlens_q must hold B+1 >= 2 prefix sums",
    ),
    (
        lambda a: {**a, "cu_seqlens_q": np.zeros((2, 2), np.int32)},
        ValueError,
        "cu_seqlens_q must have 1 dimension(s)",
    ),
    (
        lambda a: {**a, "cu_seqlens_q": [0, 3, 3, 5]},
        TypeError,
        "cu_seqlens_q must be an int32 numpy array or torch tensor, got list",
    ),
    (
        lambda a: {**a, "max_seqlen_q": 2},
        ValueError,
        "max_seqlen_q=2 is below the longest sequence (3); pass "
        "int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max()) or leave it out",
    ),
    (lambda a: {**a, "max_seqlen_k": 4.0}, TypeError, "max_seqlen_k must be an int or None"),
    (
        lambda a: {**a, "q": a["q"][:, :, None]},
        ValueError,
        "q must have 3 dimensions (total, heads, head_dim)",
    ),
    (
        lambda a: {**a, "k": a["k"].astype(np.float32)},
        TypeError,
        "q, k and v must share one format, got fp16, fp32, fp16",
    ),
    (lambda a: {**a, "q": a["q"][:, :, :3]}, ValueError, "q head_dim 3 != k head_dim 4"),
    (
        lambda a: {
            **a,
            "q": np.concatenate([a["q"]] * 2, axis=1)[:, :3],
            "k": np.concatenate([a["k"]] * 2, axis=1),
            "v": np.concatenate([a["v"]] * 2, axis=1),
        },
        ValueError,
        "q heads (3) must be a positive multiple of k/v heads (2) for MHA/GQA/MQA",
    ),
    (lambda a: {**a, "v": a["v"][:5]}, ValueError, "must agree in total_k and heads"),
]


@pytest.mark.parametrize("edit, exc, message", VARLEN_ERRORS)
def test_varlen_errors_say_how_to_fix_the_call(edit, exc, message):
    q, k, v, cq, ck = _varlen()
    args = edit({"q": q, "k": k, "v": v, "cu_seqlens_q": cq, "cu_seqlens_k": ck})
    with pytest.raises(exc, match=re.escape(message)):
        varlen_batch(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_torch_index_tensors_of_the_wrong_dtype_get_the_torch_cast():
    q, k, v, cq, ck = _varlen()
    with pytest.raises(TypeError, match=re.escape("cast with cu_seqlens_k.to(torch.int32)")):
        varlen_batch(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=torch.from_numpy(ck).long())


PAGED_ERRORS = [
    (
        lambda a: {**a, "block_table": a["block_table"].astype(np.int64)},
        TypeError,
        "block_table has dtype int64; index tensors are int32",
    ),
    (
        lambda a: {**a, "cache_seqlens": np.array([6, 13], np.int32)},
        ValueError,
        "cache_seqlens[1] = 13 must lie in [0, max_pages·page_size] = [0, 12]: widen block_table "
        "or shorten the sequence",
    ),
    (
        lambda a: {**a, "cache_seqlens": np.array([-1, 3], np.int32)},
        ValueError,
        "cache_seqlens[0] = -1 must lie in",
    ),
    (
        lambda a: {**a, "block_table": np.array([[4, 5, 1], [2, 3, 0]], np.int32)},
        ValueError,
        "block_table[0, 1] = 5 is not a page of the cache [0, 5); sequence 0 reads its first 2 "
        "table entries (cache_seqlens[0] = 6, page_size 4)",
    ),
    (
        lambda a: {**a, "block_table": np.array([[4, 0, 1], [-1, 3, 0]], np.int32)},
        ValueError,
        "block_table[1, 0] = -1 is not a page of the cache",
    ),
    (
        lambda a: {**a, "block_table": a["block_table"][:1]},
        ValueError,
        "q has batch 2: block_table must be (B, max_pages) and cache_seqlens (B,)",
    ),
    (
        lambda a: {**a, "v_cache": a["v_cache"][:, :2]},
        ValueError,
        "must agree in num_blocks, page_size and heads",
    ),
    (lambda a: {**a, "q": a["q"][0]}, ValueError, "q must have 4 dimensions"),
    (
        lambda a: {**a, "k_cache": a["k_cache"][:, :0], "v_cache": a["v_cache"][:, :0]},
        ValueError,
        "page_size (k_cache.shape[1]) must be >= 1",
    ),
]


@pytest.mark.parametrize("edit, exc, message", PAGED_ERRORS)
def test_paged_errors_say_how_to_fix_the_call(edit, exc, message):
    q, kc, vc, table, lens = _paged()
    args = edit({"q": q, "k_cache": kc, "v_cache": vc, "block_table": table, "cache_seqlens": lens})
    with pytest.raises(exc, match=re.escape(message)):
        paged_batch(args.pop("q"), args.pop("k_cache"), args.pop("v_cache"), **args)


def test_unused_table_entries_are_not_checked():
    # Entries past the pages a sequence uses are never read: any value is allowed there, as in
    # FlashAttention (tables are often padded with -1 or a garbage page).
    q, kc, vc, table, lens = _paged()
    table = table.copy()
    table[0, 2] = -7
    lens = np.array([8, 0], np.int32)
    table[1] = 99
    batch = paged_batch(q, kc, vc, block_table=table, cache_seqlens=lens)
    assert batch.pages(0).tolist() == [4, 0] and batch.pages(1).size == 0


def test_torch_paged_inputs_are_checked_as_numpy_ones():
    q, kc, vc, table, lens = _paged()
    tq, tkc, tvc = (torch.from_numpy(x) for x in (q, kc, vc))
    batch = paged_batch(
        tq, tkc, tvc, block_table=torch.from_numpy(table), cache_seqlens=torch.from_numpy(lens)
    )
    np.testing.assert_array_equal(
        batch.sequence(1)[1],
        paged_batch(q, kc, vc, block_table=table, cache_seqlens=lens).sequence(1)[1],
    )
    with pytest.raises(TypeError, match=re.escape("cast with block_table.to(torch.int32)")):
        paged_batch(tq, tkc, tvc, block_table=torch.from_numpy(table).long(), cache_seqlens=lens)
    bad = torch.from_numpy(np.array([6, 13], np.int32))
    with pytest.raises(ValueError, match=re.escape("cache_seqlens[1] = 13 must lie in")):
        paged_batch(tq, tkc, tvc, block_table=torch.from_numpy(table), cache_seqlens=bad)


def test_pack_varlen_round_trips():
    rng = np.random.default_rng(1)
    lens_q, lens_k = (2, 0, 3), (1, 4, 0)
    qs = [_f(rng, n, 2, 4) for n in lens_q]
    ks = [_f(rng, n, 1, 4) for n in lens_k]
    vs = [_f(rng, n, 1, 3) for n in lens_k]
    q, k, v, cq, ck = pack_varlen(qs, ks, vs)
    assert cq.dtype == np.int32 and cq.tolist() == [0, 2, 2, 5] and ck.tolist() == [0, 1, 5, 5]
    batch = varlen_batch(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck)
    for b in range(3):
        sq, sk, sv = batch.sequence(b)
        np.testing.assert_array_equal(sq[0].transpose(1, 0, 2), qs[b])
        np.testing.assert_array_equal(sk[0].transpose(1, 0, 2), ks[b])
        np.testing.assert_array_equal(sv[0].transpose(1, 0, 2), vs[b])
    with pytest.raises(ValueError, match="one query, key and value array per sequence"):
        pack_varlen(qs, ks[:2], vs)


@pytest.mark.parametrize("page", [1, 3, 16])
def test_paginate_round_trips_through_a_permuted_pool_with_nan_spares(page):
    rng = np.random.default_rng(page)
    lens = (7, 0, 3)
    ks = [_f(rng, n, 2, 4) for n in lens]
    vs = [_f(rng, n, 2, 5) for n in lens]
    counts = [-(-n // page) for n in lens]
    total = sum(counts) + 2
    order = rng.permutation(total)
    kc, vc, table, seqlens = paginate(
        ks, vs, page_size=page, spare_pages=2, pool_order=order, max_pages=max(counts) + 1
    )
    assert kc.shape == (total, page, 2, 4) and vc.shape == (total, page, 2, 5)
    assert table.dtype == np.int32 and seqlens.tolist() == list(lens)
    q = _f(rng, 3, 1, 2, 4)
    batch = paged_batch(q, kc, vc, block_table=table, cache_seqlens=seqlens)
    for b in range(3):
        _, sk, sv = batch.sequence(b)
        np.testing.assert_array_equal(sk[0].transpose(1, 0, 2), ks[b])
        np.testing.assert_array_equal(sv[0].transpose(1, 0, 2), vs[b])
    spare = order[sum(counts)]
    assert np.isnan(kc[spare]).all() and (table[:, -1] == spare).all()
    stored = sum(lens) * 2 * 4
    assert np.isnan(kc).sum() == kc.size - stored  # every slot not holding a key is NaN


def test_paginate_refuses_what_it_cannot_build():
    k = [np.zeros((5, 1, 2), np.float16)]
    with pytest.raises(ValueError, match="pool_order must be a permutation of the 2 pages"):
        paginate(k, k, page_size=4, pool_order=[0, 0])
    with pytest.raises(ValueError, match="max_pages=1 is below the 2 pages"):
        paginate(k, k, page_size=4, max_pages=1)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        paginate(k, k, page_size=0)
