from fractions import Fraction

import ml_dtypes
import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle_inputs import small_cases

from flashcheck.harness.core.formats import FP16, round_to_format, ulp
from flashcheck.harness.oracle.evaluate import oracle


def _dd_diff(a_hi, a_lo, b_hi, b_lo):
    with np.errstate(invalid="ignore"):
        return np.abs((a_hi - b_hi) + (a_lo - b_lo))


@given(case=small_cases())
def test_fast_and_strict_agree_within_bounds(case):
    q, k, v, causal, extra = case
    f = oracle(q, k, v, causal=causal, **extra)
    s = oracle(q, k, v, causal=causal, mode="strict", **extra)
    fin = np.isfinite(s.o.hi)
    diff = _dd_diff(f.o.hi, f.o.lo, s.o.hi, s.o.lo)
    assert np.all(diff[fin] <= (f.o.err + s.o.err)[fin])
    both = f.o.certified & s.o.certified
    np.testing.assert_array_equal(f.o.rounded[both], s.o.rounded[both])
    finl = np.isfinite(s.lse.hi)
    dl = _dd_diff(f.lse.hi, f.lse.lo, s.lse.hi, s.lse.lo)
    assert np.all(dl[finl] <= (f.lse.err + s.lse.err)[finl])
    np.testing.assert_array_equal(np.isneginf(f.lse.hi), np.isneginf(s.lse.hi))
    # the correctly rounded value is nearer to the exact value than both format neighbours
    fmt = f.fmt
    ok = f.o.certified & np.isfinite(f.o.rounded)
    r = f.o.rounded[ok]
    y_hi, y_lo = s.o.hi[ok], s.o.lo[ok]
    with np.errstate(over="ignore"):
        for step in (-1, 1):
            nb = np.where(step > 0, r + ulp(r, fmt), r - ulp(np.nextafter(r, -np.inf), fmt))
            keep = np.abs(nb) <= fmt.max_finite
            d_r = np.abs((r - y_hi) - y_lo)
            d_n = np.abs((nb - y_hi) - y_lo)
            assert np.all((d_r <= d_n + s.o.err[ok])[keep])
    # the 100-bit contract: certified elements have err <= 2^-100 W (or a sub-subnormal floor)
    tgt = np.maximum(np.ldexp(f.o.floor, -100), f.fmt.min_subnormal * 2.0**-100)
    assert np.all(f.o.err[f.o.certified] <= tgt[f.o.certified])


@given(case=small_cases())
def test_doubling_precision_moves_less_than_the_bound(case):
    q, k, v, causal, extra = case
    a = oracle(q, k, v, causal=causal, mode="strict", prec=128, max_prec=128, **extra)
    b = oracle(q, k, v, causal=causal, mode="strict", prec=256, max_prec=256, **extra)
    fin = np.isfinite(a.o.hi)
    assert np.all(_dd_diff(a.o.hi, a.o.lo, b.o.hi, b.o.lo)[fin] <= (a.o.err + b.o.err)[fin])
    assert np.all(b.o.err[fin] <= a.o.err[fin] + 2.0**-1000)


def test_uniform_scores_give_the_mean_of_v():
    rng = np.random.default_rng(5)
    q = np.zeros((1, 1, 3, 8), np.float16)
    k = rng.standard_normal((1, 1, 7, 8)).astype(np.float16)
    v = rng.standard_normal((1, 1, 7, 4)).astype(np.float16)
    r = oracle(q, k, v)
    for c in range(4):
        mean = sum(Fraction(float(x)) for x in v[0, 0, :, c]) / 7
        got = Fraction(r.o.hi[0, 0, 0, c]) + Fraction(r.o.lo[0, 0, 0, c])
        assert abs(got - mean) <= Fraction(r.o.err[0, 0, 0, c])
        assert r.o.rounded[0, 0, 0, c] == round_to_format(float(mean), FP16)


def test_exact_midpoint_falls_back_to_an_exact_strict_result():
    # Uniform weights over v = 1 and 1 + 2^-10 give exactly 1 + 2^-11, a tie in fp16. The fast
    # path's interval straddles it, so it must hand the element to the strict path; there every
    # operation is exact (exp(0) = 1, sums of doubles, division by 2), the interval is a point,
    # and ties-to-even (1.0) is then the proven correctly rounded value.
    q = np.zeros((1, 1, 1, 2), np.float16)
    k = np.ones((1, 1, 2, 2), np.float16)
    v = np.array([1.0, 1.0 + 2.0**-10], np.float16).reshape(1, 1, 2, 1)
    r = oracle(q, k, v)
    assert r.stats["fallback_elements"] >= 1 and r.stats["strict_evaluations"] >= 1
    assert r.o.certified[0, 0, 0, 0] and r.o.err[0, 0, 0, 0] <= 2.0**-1000
    assert r.o.rounded[0, 0, 0, 0] == 1.0 and r.o.hi[0, 0, 0, 0] == 1 + 2.0**-11
    # in fp32 the same value is no tie, and the fast path certifies it alone
    r32 = oracle(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    assert r32.stats["fallback_elements"] == 0
    assert r32.o.certified.all() and r32.o.rounded[0, 0, 0, 0] == 1 + 2.0**-11


def test_one_key_gives_its_value_row():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((1, 1, 4, 5)).astype(np.float32) * 30
    k = rng.standard_normal((1, 1, 1, 5)).astype(np.float32)
    v = rng.standard_normal((1, 1, 1, 3)).astype(np.float32)
    r = oracle(q, k, v)
    np.testing.assert_array_equal(r.o.rounded[0, 0], np.broadcast_to(v[0, 0], (4, 3)))
    assert r.o.certified.all()


@pytest.mark.parametrize("gap", [0.0, 0.75, 9.5, 40.0])
def test_two_keys_give_logistic_weights(gap):
    # q = [gap], k = [[1], [0]], scale 1: scores (gap, 0), weights (σ(gap), 1 − σ(gap)).
    q = np.array([[[[gap]]]], np.float32)
    k = np.array([[[[1.0], [0.0]]]], np.float32)
    v = np.array([[[[1.5, -2.0], [0.25, 3.0]]]], np.float32)
    r = oracle(q, k, v, scale=1.0)
    with mpmath.workprec(300):
        w = 1 / (1 + mpmath.exp(-gap))
        for c in range(2):
            exact = w * float(v[0, 0, 0, c]) + (1 - w) * float(v[0, 0, 1, c])
            got = mpmath.mpf(r.o.hi[0, 0, 0, c]) + r.o.lo[0, 0, 0, c]
            assert abs(got - exact) <= r.o.err[0, 0, 0, c]
        lse = mpmath.log(mpmath.exp(gap) + 1)
        assert abs(mpmath.mpf(r.lse.hi[0, 0, 0]) + r.lse.lo[0, 0, 0] - lse) <= r.lse.err[0, 0, 0]


@given(case=small_cases(), perm_seed=st.integers(0, 1000))
def test_key_permutation_and_row_shift_leave_o_unchanged(case, perm_seed):
    q, k, v, _, _ = case
    base = oracle(q, k, v, scale=0.5)
    perm = np.random.default_rng(perm_seed).permutation(k.shape[2])
    p = oracle(q, k[:, :, perm], v[:, :, perm], scale=0.5)
    fin = np.isfinite(base.o.hi)
    assert np.all(
        _dd_diff(base.o.hi, base.o.lo, p.o.hi, p.o.lo)[fin] <= (base.o.err + p.o.err)[fin]
    )
    # shift every score of a row by 0.5·c: append c to q and 1 to every key
    c = np.full((*q.shape[:3], 1), 3, dtype=q.dtype)
    q2 = np.concatenate([q, c], axis=-1)
    k2 = np.concatenate([k, np.ones((*k.shape[:3], 1), dtype=k.dtype)], axis=-1)
    s = oracle(q2, k2, v, scale=0.5)
    assert np.all(
        _dd_diff(base.o.hi, base.o.lo, s.o.hi, s.o.lo)[fin] <= (base.o.err + s.o.err)[fin]
    )


def test_causal_bottom_right_and_fully_masked_rows():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 5, 4)).astype(np.float16)
    k = rng.standard_normal((1, 1, 3, 4)).astype(np.float16)
    v = rng.standard_normal((1, 1, 3, 2)).astype(np.float16)
    r = oracle(q, k, v, causal=True)  # query i sees j <= i - 2: rows 0, 1 see nothing
    assert np.all(r.o.hi[0, 0, :2] == 0) and np.all(np.isneginf(r.lse.hi[0, 0, :2]))
    assert not np.isnan(r.o.hi).any()
    # row 2 sees only key 0: exactly v[0]
    np.testing.assert_array_equal(r.o.rounded[0, 0, 2], v[0, 0, 0].astype(np.float64))
    # the same through an explicit boolean mask
    i, j = np.arange(5)[:, None], np.arange(3)[None, :]
    m = oracle(q, k, v, mask=j <= i - 2)
    np.testing.assert_array_equal(m.o.rounded, r.o.rounded)
    w = oracle(q, k, v, window=(0, 0))  # each query sees only key i - 2
    np.testing.assert_array_equal(w.o.rounded[0, 0, 2:], v[0, 0].astype(np.float64))


def test_nan_rule():
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 1, 4, 3)).astype(np.float32)
    k = rng.standard_normal((1, 1, 4, 3)).astype(np.float32)
    v = rng.standard_normal((1, 1, 4, 2)).astype(np.float32)
    v[0, 0, 3, 1] = np.nan  # key 3 is kept only by query 3 under causal
    k[0, 0, 2, 0] = np.inf  # key 2 is kept by queries 2 and 3
    r = oracle(q, k, v, causal=True)
    assert not np.isnan(r.o.hi[0, 0, :2]).any() and not np.isnan(r.lse.hi[0, 0, :2]).any()
    assert np.isnan(r.o.hi[0, 0, 2:]).all() and np.isnan(r.lse.hi[0, 0, 2:]).all()
    k[0, 0, 2, 0] = 1.0
    r = oracle(q, k, v, causal=True)
    assert np.isnan(r.o.hi[0, 0, 3, 1]) and not np.isnan(r.o.hi[0, 0, 3, 0])
    assert not np.isnan(r.o.hi[0, 0, :3]).any() and not np.isnan(r.lse.hi).any()


def test_gqa_rows_subset_and_torch_input():
    torch = pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    rng = np.random.default_rng(9)
    q = rng.standard_normal((2, 4, 6, 5)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((2, 2, 7, 5)).astype(ml_dtypes.bfloat16)
    v = rng.standard_normal((2, 2, 7, 3)).astype(ml_dtypes.bfloat16)
    g = oracle(q, k, v)
    rep = oracle(q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1))
    np.testing.assert_array_equal(g.o.hi, rep.o.hi)
    sub = oracle(q, k, v, rows=[4, 1])
    np.testing.assert_array_equal(sub.o.hi, g.o.hi[:, :, [4, 1]])
    tq, tk, tv = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16) for x in (q, k, v))
    t = oracle(tq, tk, tv)
    np.testing.assert_array_equal(t.o.hi, g.o.hi)


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"k": np.zeros((1, 1, 3, 5), np.float16)}, ValueError, "head_dim"),
        (
            {
                "q": np.zeros((1, 3, 2, 4), np.float16),
                "k": np.zeros((1, 2, 3, 4), np.float16),
                "v": np.zeros((1, 2, 3, 2), np.float16),
            },
            ValueError,
            "multiple",
        ),
        (
            {"q": np.zeros((1, 1, 2, 4), np.int32)},
            TypeError,
            "int32; attention inputs must be float16, bfloat16 or float32: cast",
        ),
        ({"q": np.zeros((1, 1, 2, 4), np.float64)}, TypeError, "float16, bfloat16"),
        ({"q": np.zeros((2, 4), np.float16)}, ValueError, "4 dimensions"),
        ({"mask": np.ones((3, 3), bool)}, ValueError, "broadcast"),
        (
            {"q": np.zeros((1, 2, 2, 0), np.float16), "k": np.zeros((1, 1, 3, 0), np.float16)},
            ValueError,
            "head_dim",
        ),
        ({"mask": np.ones((2, 3))}, TypeError, "boolean"),
        ({"prec": 60}, ValueError, "prec"),
        ({"window": (1, -5)}, ValueError, "window"),
        ({"scale": float("nan")}, ValueError, "finite"),
        ({"causal": "yes"}, TypeError, "causal must be True or False, got 'yes'"),
        ({"mode": "exact"}, ValueError, "mode"),
        ({"rows": [7]}, ValueError, "rows"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, exc, match):
    args = {
        "q": np.zeros((1, 2, 2, 4), np.float16),
        "k": np.zeros((1, 1, 3, 4), np.float16),
        "v": np.zeros((1, 1, 3, 2), np.float16),
    }
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        oracle(args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize("mode", ["fast", "strict"])
@pytest.mark.parametrize(("nq", "nk"), [(0, 5), (3, 0), (0, 0)])
def test_empty_sequences_give_empty_or_masked_rows(mode, nq, nk):
    q = np.ones((1, 2, nq, 4), np.float16)
    k = np.ones((1, 2, nk, 4), np.float16)
    ref = oracle(q, k, k, mode=mode)
    assert ref.o.hi.shape == (1, 2, nq, 4) and ref.lse.hi.shape == (1, 2, nq)
    # no key at all: every row is a fully masked row, O = 0 and LSE = -inf (SPEC 3.1)
    assert np.all(ref.o.rounded == 0) and np.all(np.isneginf(ref.lse.rounded))
