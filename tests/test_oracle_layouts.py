"""The oracle of ragged batches: each sequence of a varlen or paged batch is answered exactly as
the dense problem it is, bit for bit in every field, whatever else the batch or the page pool
holds; the public entry point keeps its dense answers and refuses calls it cannot answer."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

import flashcheck
from flashcheck.harness.oracle.evaluate import oracle as dense_oracle
from flashcheck.harness.oracle.tensor import FIELDS

DT = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32}


def _f(rng, *shape, dt=np.float16, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dt)


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def _same(a, b):
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


VARLEN = [
    # lengths q, lengths k, hq, hk, options, dtype
    ((3, 0, 5, 2), (4, 3, 0, 7), 4, 2, {"causal": True}, "fp16"),
    ((1, 6, 2), (9, 6, 1), 2, 2, {"window": (2, 0)}, "bf16"),
    ((4, 4), (4, 17), 3, 1, {}, "fp32"),
    ((0, 0), (0, 5), 2, 1, {"causal": True}, "fp16"),
    ((2, 3), (3, 2), 2, 1, {"causal": True, "scale": 0.5}, "fp16"),
]


@pytest.mark.parametrize("lens_q, lens_k, hq, hk, opts, name", VARLEN)
def test_varlen_equals_the_dense_oracle_per_sequence_bit_for_bit(
    lens_q, lens_k, hq, hk, opts, name
):
    rng = np.random.default_rng(sum(lens_q) + 7 * sum(lens_k))
    dt = DT[name]
    d, dv = 5, 3
    q, k = _f(rng, sum(lens_q), hq, d, dt=dt), _f(rng, sum(lens_k), hk, d, dt=dt)
    v = _f(rng, sum(lens_k), hk, dv, dt=dt)
    do = _f(rng, sum(lens_q), hq, dv, dt=dt)
    cq, ck = _cu(lens_q), _cu(lens_k)
    ref = flashcheck.oracle(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, do=do, **opts)
    assert ref.layout == "varlen" and ref.o.shape == (sum(lens_q), hq, dv)
    assert ref.lse.shape == (hq, sum(lens_q)) and ref.dk.shape == (sum(lens_k), hk, d)
    for b in range(len(lens_q)):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        cut = lambda a, s: np.ascontiguousarray(a[s].transpose(1, 0, 2)[None])  # noqa: E731
        one = dense_oracle(cut(q, qs), cut(k, ks), cut(v, ks), do=cut(do, qs), **opts)
        _same(ref.sequences[b].o, one.o)
        for name_ in ("o", "dq"):
            _same(ref[name_].take(np.arange(qs.start, qs.stop), 0), _to_layout(one[name_]))
        for name_ in ("dk", "dv"):
            _same(ref[name_].take(np.arange(ks.start, ks.stop), 0), _to_layout(one[name_]))
        _same(ref.lse.take(np.arange(qs.start, qs.stop), 1), one.lse.take(0, 0))


def _to_layout(t):
    """A dense ``(1, H, N, c)`` tensor as the packed ``(N, H, c)`` rows of a varlen batch."""
    return type(t)(**{f: getattr(t, f)[0].transpose(1, 0, 2) for f in FIELDS})


def test_zero_length_sequences_keep_no_key_and_write_nothing_else():
    rng = np.random.default_rng(3)
    lens_q, lens_k = (2, 0, 3), (0, 4, 3)
    q, k, v = _f(rng, 5, 2, 4), _f(rng, 7, 2, 4), _f(rng, 7, 2, 4)
    ref = flashcheck.oracle(q, k, v, cu_seqlens_q=_cu(lens_q), cu_seqlens_k=_cu(lens_k))
    # Sequence 0 has queries but no keys: O = 0, LSE = −inf, both certified.
    assert np.all(ref.o.rounded[:2] == 0) and np.all(ref.o.certified[:2])
    assert np.all(np.isneginf(ref.lse.rounded[:, :2])) and np.all(ref.lse.certified[:, :2])
    # Sequence 2 is an ordinary problem: finite LSE.
    assert np.all(np.isfinite(ref.lse.rounded[:, 2:]))
    assert ref.sequences[1].o.shape == (1, 2, 0, 4)


def _scatter(dense, page, n_blocks, table, dt):
    """A page pool holding ``dense[b]`` (``(n_b, H, c)``) at the pages ``table[b]``; every
    other slot is NaN."""
    h, c = dense[0].shape[1:]
    pool = np.full((n_blocks, page, h, c), np.nan, dtype=np.float32).astype(dt)
    for b, keys in enumerate(dense):
        for j in range(keys.shape[0]):
            pool[table[b, j // page], j % page] = keys[j]
    return pool


@pytest.mark.parametrize("page", [1, 3, 16])
def test_paged_equals_dense_after_gathering_pages(page):
    rng = np.random.default_rng(page)
    bsz, nq, hq, hk, d, dv = 3, 2, 4, 2, 6, 5
    lens = [2 * page + 1, 0, page]
    max_pages = 4
    n_blocks = 12
    pages = rng.permutation(n_blocks)  # the pool in no particular order
    table = np.full((bsz, max_pages), -1, dtype=np.int32)
    table[0, :3] = pages[:3]
    table[1, :] = pages[3]  # unused entries: a page of NaN
    table[2, :1] = pages[0]  # prefix sharing: sequence 2 reuses sequence 0's first page
    table[2, 1:] = pages[4]  # unused entries pointing at NaN pages
    keys = [_f(rng, n, hk, d) for n in lens]
    vals = [_f(rng, n, hk, dv) for n in lens]
    keys[2], vals[2] = keys[0][:page], vals[0][:page]
    k_cache = _scatter(keys, page, n_blocks, table, np.float16)
    v_cache = _scatter(vals, page, n_blocks, table, np.float16)
    q = _f(rng, bsz, nq, hq, d)
    seqlens = np.array(lens, dtype=np.int32)
    ref = flashcheck.oracle(
        q, k_cache, v_cache, block_table=table, cache_seqlens=seqlens, causal=True
    )
    assert ref.layout == "paged" and ref.o.shape == (bsz, nq, hq, dv)
    assert ref.lse.shape == (bsz, hq, nq)
    assert not np.isnan(ref.o.rounded).any()  # no NaN page or slot leaked
    for b in range(bsz):
        dense = dense_oracle(
            q[b].transpose(1, 0, 2)[None],
            keys[b].transpose(1, 0, 2)[None],
            vals[b].transpose(1, 0, 2)[None],
            causal=True,
        )
        _same(
            ref.o.take(b, 0),
            type(ref.o)(**{f: getattr(dense.o, f)[0].transpose(1, 0, 2) for f in FIELDS}),
        )
        _same(ref.lse.take(b, 0), dense.lse.take(0, 0))


def test_permuting_the_pool_with_its_table_changes_nothing():
    rng = np.random.default_rng(11)
    q = _f(rng, 2, 1, 2, 4)
    k_cache, v_cache = _f(rng, 6, 4, 1, 4), _f(rng, 6, 4, 1, 4)
    table = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.int32)
    seqlens = np.array([10, 7], dtype=np.int32)
    perm = rng.permutation(6)
    inverse = np.argsort(perm).astype(np.int32)
    a = flashcheck.oracle(q, k_cache, v_cache, block_table=table, cache_seqlens=seqlens)
    b = flashcheck.oracle(
        q, k_cache[perm], v_cache[perm], block_table=inverse[table], cache_seqlens=seqlens
    )
    _same(a.o, b.o)
    _same(a.lse, b.lse)


def test_the_dense_call_is_unchanged():
    rng = np.random.default_rng(5)
    q, k, v = _f(rng, 1, 2, 5, 4), _f(rng, 1, 1, 6, 4), _f(rng, 1, 1, 6, 4)
    do = _f(rng, 1, 2, 5, 4)
    a = flashcheck.oracle(q, k, v, causal=True, rows=[1, 3], do=do, keys=[0, 5])
    b = dense_oracle(q, k, v, causal=True, rows=[1, 3], do=do, keys=[0, 5])
    assert type(a) is type(b)
    for name in ("o", "lse", "dq", "dk", "dv"):
        _same(a[name], b[name])


def test_strict_mode_agrees_on_a_varlen_batch():
    rng = np.random.default_rng(8)
    q, k, v = _f(rng, 4, 2, 3), _f(rng, 5, 1, 3), _f(rng, 5, 1, 2)
    cu = {"cu_seqlens_q": _cu((1, 3)), "cu_seqlens_k": _cu((2, 3))}
    fast = flashcheck.oracle(q, k, v, causal=True, **cu)
    strict = flashcheck.oracle(q, k, v, causal=True, mode="strict", **cu)
    np.testing.assert_array_equal(fast.o.rounded, strict.o.rounded)
    np.testing.assert_array_equal(fast.lse.rounded, strict.lse.rounded)
    assert strict.o.certified.all() and strict.mode == "strict"


def _calls():
    rng = np.random.default_rng(0)
    q, k, v = _f(rng, 3, 1, 4), _f(rng, 3, 1, 4), _f(rng, 3, 1, 4)
    cu = _cu((1, 2))
    qp, kc = _f(rng, 2, 1, 1, 4), _f(rng, 2, 4, 1, 4)
    table, lens = np.array([[0], [1]], np.int32), np.array([3, 4], np.int32)
    return q, k, v, cu, qp, kc, table, lens


def test_ragged_calls_that_cannot_be_answered_say_why():
    q, k, v, cu, qp, kc, table, lens = _calls()
    with pytest.raises(ValueError, match="needs both cu_seqlens_q and cu_seqlens_k"):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu)
    with pytest.raises(ValueError, match="needs both block_table and cache_seqlens"):
        flashcheck.oracle(qp, kc, kc, block_table=table)
    with pytest.raises(ValueError, match=re.escape("(varlen) or block_table/cache_seqlens")):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, cache_seqlens=lens)
    with pytest.raises(
        ValueError, match="a varlen batch takes no mask: ragged batches take causal/window masks"
    ):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, mask=True)
    with pytest.raises(ValueError, match=re.escape("a paged batch takes no rows")):
        flashcheck.oracle(qp, kc, kc, block_table=table, cache_seqlens=lens, rows=[0])
    with pytest.raises(
        ValueError, match=re.escape("rows are packed q rows and must lie in [0, 3)")
    ):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, rows=[3])
    with pytest.raises(ValueError, match="keys selects dK/dV rows: pass the upstream gradient"):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, keys=[0])
    with pytest.raises(ValueError, match="paged gradients are not offered"):
        flashcheck.oracle(qp, kc, kc, block_table=table, cache_seqlens=lens, do=qp)
    with pytest.raises(ValueError, match="op must be one of"):
        flashcheck.oracle(q, k, v, op="merge")
    with pytest.raises(TypeError, match="takes three tensors"):
        flashcheck.oracle(q, k)
    with pytest.raises(ValueError, match=re.escape("do must have O's shape (3, 1, 4)")):
        flashcheck.oracle(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, do=q[:2])


def test_torch_inputs_give_the_numpy_answer():
    torch = pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    rng = np.random.default_rng(12)
    q, k, v = (_f(rng, n, 2, 4, dt=ml_dtypes.bfloat16) for n in (5, 6, 6))
    cq, ck = _cu((2, 3)), _cu((4, 2))
    ref = flashcheck.oracle(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True)
    as_torch = [torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (q, k, v)]
    got = flashcheck.oracle(
        *as_torch,
        cu_seqlens_q=torch.from_numpy(cq),
        cu_seqlens_k=torch.from_numpy(ck),
        causal=True,
    )
    _same(ref.o, got.o)
    _same(ref.lse, got.lse)
    assert got.fmt.name == "bf16"


def test_grouped_query_decode_over_pages_of_one_slot():
    # Decode shape: one query per sequence, 8 query heads over 2 kv heads, page size 1 (every
    # key on its own page, in reverse pool order), ragged lengths.
    rng = np.random.default_rng(13)
    lens = [5, 1, 3]
    table = np.zeros((3, 5), dtype=np.int32)
    keys = [_f(rng, n, 2, 8) for n in lens]
    vals = [_f(rng, n, 2, 8) for n in lens]
    n_blocks = sum(lens)
    order = iter(range(n_blocks - 1, -1, -1))
    for b, n in enumerate(lens):
        table[b, :n] = [next(order) for _ in range(n)]
    k_cache = _scatter(keys, 1, n_blocks, table, np.float16)
    v_cache = _scatter(vals, 1, n_blocks, table, np.float16)
    q = _f(rng, 3, 1, 8, 8)
    ref = flashcheck.oracle(
        q, k_cache, v_cache, block_table=table, cache_seqlens=np.array(lens, np.int32)
    )
    for b in range(3):
        dense = dense_oracle(
            q[b].transpose(1, 0, 2)[None],
            keys[b].transpose(1, 0, 2)[None],
            vals[b].transpose(1, 0, 2)[None],
        )
        np.testing.assert_array_equal(ref.o.rounded[b], dense.o.rounded[0].transpose(1, 0, 2))
        np.testing.assert_array_equal(ref.lse.rounded[b], dense.lse.rounded[0])
    assert ref.o.certified.all()


@st.composite
def ragged(draw):
    bsz = draw(st.integers(1, 4))
    lens_q = draw(st.lists(st.integers(0, 5), min_size=bsz, max_size=bsz))
    lens_k = draw(st.lists(st.integers(0, 9), min_size=bsz, max_size=bsz))
    hk = draw(st.sampled_from([1, 2]))
    hq = hk * draw(st.sampled_from([1, 3]))
    opts = {"causal": draw(st.booleans())}
    if draw(st.booleans()):
        opts["window"] = (draw(st.integers(0, 3)), draw(st.sampled_from([0, 1, None])))
    name = draw(st.sampled_from(sorted(DT)))
    seed = draw(st.integers(0, 2**31))
    note(f"{lens_q} {lens_k} hq={hq} hk={hk} {opts} {name} seed={seed}")
    return lens_q, lens_k, hq, hk, opts, name, seed


@given(case=ragged())
def test_any_varlen_batch_is_its_sequences(case):
    # The packed answer, cut back into sequences, is each sequence's dense answer.
    lens_q, lens_k, hq, hk, opts, name, seed = case
    rng = np.random.default_rng(seed)
    dt = DT[name]
    q, k = _f(rng, sum(lens_q), hq, 3, dt=dt), _f(rng, sum(lens_k), hk, 3, dt=dt)
    v = _f(rng, sum(lens_k), hk, 2, dt=dt)
    cq, ck = _cu(lens_q), _cu(lens_k)
    ref = flashcheck.oracle(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, **opts)
    for b in range(len(lens_q)):
        rows = np.arange(cq[b], cq[b + 1])
        keys = slice(ck[b], ck[b + 1])
        one = dense_oracle(
            q[rows].transpose(1, 0, 2)[None],
            k[keys].transpose(1, 0, 2)[None],
            v[keys].transpose(1, 0, 2)[None],
            **opts,
        )
        _same(ref.o.take(rows, 0), _to_layout(one.o))
        _same(ref.lse.take(rows, 1), one.lse.take(0, 0))


def test_packed_rows_and_keys_select_slices_of_the_full_answer():
    rng = np.random.default_rng(14)
    lens_q, lens_k = (3, 0, 4), (2, 5, 3)
    q, k = _f(rng, 7, 2, 4), _f(rng, 10, 1, 4)
    v, do = _f(rng, 10, 1, 3), _f(rng, 7, 2, 3)
    cu = {"cu_seqlens_q": _cu(lens_q), "cu_seqlens_k": _cu(lens_k)}
    full = flashcheck.oracle(q, k, v, causal=True, do=do, **cu)
    rows, keys = np.array([6, 0, 4, 2]), np.array([9, 1, 3])
    part = flashcheck.oracle(q, k, v, causal=True, do=do, rows=rows, keys=keys, **cu)
    assert part.o.shape == (4, 2, 3) and part.lse.shape == (2, 4) and part.dk.shape == (3, 1, 4)
    for name in ("o", "dq"):
        _same(part[name], full[name].take(rows, 0))
    for name in ("dk", "dv"):
        _same(part[name], full[name].take(keys, 0))
    _same(part.lse, full.lse.take(rows, 1))
