"""The numpy split-KV recurrence: exact structure in float64, one chunk equal to the plain
recurrence bit for bit, its fp32 merge within a derived bound of the merge oracle, the flash
policy within the project's empirical rule, and a result that does not depend on the batch."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from flashcheck.harness.core.formats import BF16, FP16
from flashcheck.harness.judging.metrics import floored_ulp_error
from flashcheck.harness.oracle.combine import combine_oracle
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_numpy
from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention
from flashcheck.kernels.split_kv import merge_partials, split_kv_attention

DT = {"fp16": (np.float16, FP16), "bf16": (ml_dtypes.bfloat16, BF16), "fp32": (np.float32, None)}
U32 = 2.0**-24


def _inputs(seed, b, hq, hk, nq, nk, d, dv, dt, scale=1.0):
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * scale).astype(np.float32).astype(dt)  # noqa: E731
    return f(b, hq, nq, d), f(b, hk, nk, d), f(b, hk, nk, dv)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(DT)))
    shape = dict(
        b=draw(st.integers(1, 2)),
        hk=draw(st.sampled_from([1, 2])),
        nq=draw(st.integers(1, 7)),
        nk=draw(st.integers(0, 23)),
        d=draw(st.integers(1, 6)),
        dv=draw(st.integers(1, 3)),
    )
    shape["hq"] = shape["hk"] * draw(st.sampled_from([1, 2]))
    opts = {"causal": draw(st.booleans())}
    if draw(st.booleans()):
        opts["window"] = (draw(st.integers(0, 4)), draw(st.sampled_from([0, 2, None])))
    split = draw(st.sampled_from([1, 2, 3, 5, 8, 64]))
    seed = draw(st.integers(0, 2**31))
    note(f"{name} {shape} {opts} split={split} seed={seed}")
    return name, shape, opts, split, seed


@given(case=cases(), variant=st.sampled_from(["fa1", "fa2"]))
def test_fp64_split_kv_matches_the_oracle(case, variant):
    # Every intermediate in float64: only the algorithm's own rounding is left (~1e-15 of W),
    # so each chunk's masks (at the keys' positions in the whole sequence), the −inf chunks and
    # the merge must be exactly right to pass.
    name, shape, opts, split, seed = case
    q, k, v = _inputs(seed, dt=DT[name][0], **shape)
    pol = PrecisionPolicy.fp64(name)
    o, lse = split_kv_attention(q, k, v, policy=pol, split_size=split, variant=variant, **opts)
    ref = oracle(q, k, v, **opts)
    err = np.abs((o - ref.o.hi) - ref.o.lo)
    assert np.all(err <= 1e-13 * np.maximum(ref.o.floor, 1e-300) + 1e-300)
    masked = np.isneginf(ref.lse.hi)
    np.testing.assert_array_equal(np.isneginf(lse), masked)
    assert np.all(o[masked] == 0)
    live = ~masked
    assert np.all(np.abs(lse[live] - ref.lse.hi[live]) <= 1e-13 * (1 + np.abs(ref.lse.hi[live])))


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_one_chunk_is_the_plain_recurrence_bit_for_bit(name):
    q, k, v = _inputs(1, 2, 2, 1, 5, 37, 8, 4, DT[name][0])
    pol = PrecisionPolicy.flash(name) if name != "fp32" else PrecisionPolicy.fp32()
    plain = online_attention(q, k, v, policy=pol, causal=True, block_k=8)
    split = split_kv_attention(q, k, v, policy=pol, split_size=37, causal=True, block_k=8)
    for a, b in zip(plain, split, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_the_fp32_merge_is_within_its_derived_bound_of_the_merge_oracle():
    # The merge's rounding error (module docstring, step 2), to first order in u = 2^-24, with
    # x_s = lse_s − m ≤ 0 and p_s = exp(lse_s − LSE):
    #   |Ô_c − O_c| ≤ u·(Σ_s p_s·|o_sc|·|x_s| + (3S + 4)·W_c),   W_c = Σ_s p_s·|o_sc|,
    #   |LSE^ − LSE| ≤ u·(2S + 2 + |LSE|),
    # from |fl(x_s)| error u|x_s| in the exponent, one rounding of exp, S−1 of each sum (Z ≥ 1
    # because the largest weight is exactly 1, and p_s·|x_s| ≤ 1/e), one of the division and
    # of log Z and of the final add.
    q, k, v = _inputs(2, 2, 4, 2, 3, 700, 16, 8, np.float16, scale=3.0)
    pol = PrecisionPolicy.flash("fp16")
    _, _, out_p, lse_p = split_kv_attention(
        q, k, v, policy=pol, split_size=64, causal=True, partials=True
    )
    n_split = out_p.shape[0]
    assert n_split == 11
    o_hat, lse_hat = merge_partials(out_p, lse_p)
    exact = combine_oracle(out_p, lse_p)
    o_ex = exact.o.hi + exact.o.lo
    lse_ex = exact.lse.hi + exact.lse.lo
    x = lse_p.astype(np.float64) - lse_p.max(axis=0)
    p = np.exp(lse_p.astype(np.float64) - lse_ex)
    spread = np.einsum("s...,s...c->...c", p * np.abs(x), np.abs(out_p.astype(np.float64)))
    bound_o = 1.01 * U32 * (spread + (3 * n_split + 4) * exact.o.floor)
    err_o = np.abs(o_hat.astype(np.float64) - o_ex)
    assert np.all(err_o <= bound_o)
    err_l = np.abs(lse_hat.astype(np.float64) - lse_ex)
    assert np.all(err_l <= 1.01 * U32 * (2 * n_split + 2 + np.abs(lse_ex)))
    assert err_o.max() > 0  # real rounding errors were compared, not identical values


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_flash_split_kv_within_twice_the_naive_error(name):
    # The project's empirical rule for the flash class: error <= 2 x same-precision naive error
    # + 1 ulp(W); decode-shaped (few queries, many keys, grouped heads), keys far past the split.
    dt, fmt = DT[name]
    worst = []
    for seed in range(4):
        causal = seed % 2 == 0
        q, k, v = _inputs(seed, 2, 4, 2, 1 + seed, 300, 16, 8, dt, scale=2.0)
        ref = oracle(q, k, v, causal=causal)
        o, _ = split_kv_attention(
            q, k, v, policy=PrecisionPolicy.flash(name), split_size=48, causal=causal
        )
        n, _ = naive_numpy(q, k, v, causal=causal)
        e_split = floored_ulp_error(o.astype(np.float64), ref.o.hi, ref.o.lo, ref.o.floor, fmt)
        e_naive = floored_ulp_error(n.astype(np.float64), ref.o.hi, ref.o.lo, ref.o.floor, fmt)
        assert e_split.max() <= 2 * e_naive.max() + 1.0
        worst.append(e_split.max())
    assert max(worst) > 0


def test_a_sequence_alone_and_in_a_batch_is_bitwise_equal():
    q, k, v = _inputs(7, 3, 2, 2, 2, 150, 8, 8, np.float16)
    pol = PrecisionPolicy.flash("fp16")
    batch = split_kv_attention(q, k, v, policy=pol, split_size=32, causal=True)
    alone = split_kv_attention(q[1:2], k[1:2], v[1:2], policy=pol, split_size=32, causal=True)
    for a, b in zip(batch, alone, strict=True):
        assert a[1:2].tobytes() == b.tobytes()


def test_partials_hold_empty_chunks_as_minus_inf_and_zero():
    # Causal with Nq = Nk: query 0 keeps only key 0, so every later chunk is empty for it.
    q, k, v = _inputs(3, 1, 1, 1, 9, 9, 4, 2, np.float16)
    pol = PrecisionPolicy.flash("fp16")
    o, lse, out_p, lse_p = split_kv_attention(
        q, k, v, policy=pol, split_size=4, causal=True, partials=True
    )
    assert out_p.shape == (3, 1, 1, 9, 2) and lse_p.shape == (3, 1, 1, 9)
    assert out_p.dtype == np.float32 and lse_p.dtype == np.float32
    assert np.all(np.isneginf(lse_p[1:, 0, 0, 0])) and np.all(out_p[1:, 0, 0, 0] == 0)
    assert np.isfinite(lse).all() and not np.isnan(o).any()


def test_no_keys_and_all_empty_rows_give_zero_and_minus_inf():
    q, k, v = _inputs(4, 1, 1, 1, 3, 0, 4, 2, np.float16)
    o, lse = split_kv_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), split_size=4)
    assert np.all(o == 0) and np.all(np.isneginf(lse))
    merged_o, merged_lse = merge_partials(
        np.full((2, 3, 2), np.nan, np.float32), np.full((2, 3), -np.inf, np.float32)
    )
    assert np.all(merged_o == 0) and np.all(np.isneginf(merged_lse))


def test_bad_split_sizes_say_what_is_wanted():
    q, k, v = _inputs(5, 1, 1, 1, 2, 4, 4, 2, np.float16)
    pol = PrecisionPolicy.flash("fp16")
    with pytest.raises(ValueError, match=re.escape("split_size must be >= 1 keys per chunk")):
        split_kv_attention(q, k, v, policy=pol, split_size=0)
    with pytest.raises(TypeError, match="split_size must be an int, got float"):
        split_kv_attention(q, k, v, policy=pol, split_size=2.0)
    with pytest.raises(ValueError, match=re.escape("out_partial must be (S, ..., dv)")):
        merge_partials(np.zeros((2, 3), np.float32), np.zeros((2, 2), np.float32))
