from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.harness.oracle import exact as ex

finite = st.floats(min_value=-1e150, max_value=1e150, allow_nan=False, allow_subnormal=False)


@given(a=finite, b=finite)
def test_two_sum_and_two_prod_are_exact(a, b):
    s, e = ex.two_sum(np.float64(a), np.float64(b))
    assert Fraction(s) + Fraction(e) == Fraction(a) + Fraction(b)
    p, e = ex.two_prod(np.float64(a), np.float64(b))
    if a == 0 or b == 0 or abs(a * b) > 2.0**-900:
        assert Fraction(p) + Fraction(e) == Fraction(a) * Fraction(b)


def _dd(rng, n):
    h = rng.standard_normal(n) * np.exp2(rng.uniform(-30, 30, n))
    return h, h * rng.uniform(-1, 1, n) * 2.0**-53


def test_dd_add_and_mul_bounds_dominate():
    rng = np.random.default_rng(1)
    ah, al = _dd(rng, 3000)
    bh, bl = _dd(rng, 3000)
    bh[:1000] = -ah[:1000] * (1 + rng.uniform(-1e-9, 1e-9, 1000))  # cancellation
    zh, zl, err = ex.dd_add_err(ah, al, bh, bl)
    zh2, zl2, err2 = ex.dd_mul_err(ah, al, bh, bl)
    for i in range(0, 3000, 7):
        a = Fraction(ah[i]) + Fraction(al[i])
        b = Fraction(bh[i]) + Fraction(bl[i])
        assert abs(Fraction(zh[i]) + Fraction(zl[i]) - (a + b)) <= Fraction(err[i])
        assert abs(Fraction(zh2[i]) + Fraction(zl2[i]) - a * b) <= Fraction(err2[i])
    # and the bounds are not vacuous: of the order of u² relative
    assert np.median(err2 / np.abs(zh2)) < 4 * ex.U2


def test_dd_exp_bound_dominates_and_is_tight():
    rng = np.random.default_rng(2)
    x = -np.abs(rng.standard_normal(4000)) * np.exp2(rng.uniform(-40, 9, 4000))
    x[:6] = [0.0, -0.0, -1e-300, -739.9, -745.0, 1e-10]
    xl = x * rng.uniform(-0.5, 0.5, x.size) * 2.0**-53
    xl[:6] = 0.0
    h, lo, rel = ex.dd_exp(x, xl)
    assert h[0] == 1.0 and lo[0] == 0.0
    ratios = []
    with mpmath.workprec(300):
        for i in range(0, x.size, 3):
            e = mpmath.exp(mpmath.mpf(x[i]) + mpmath.mpf(xl[i]))
            got = mpmath.mpf(h[i]) + mpmath.mpf(lo[i])
            bound = rel[i] * e + ex.EXP_FLUSH_ABS
            assert abs(got - e) <= bound, (x[i], xl[i])
            if e > 2.0**-900:
                ratios.append(float(abs(got - e) / e))
    assert max(ratios) < 2.0**-102 and np.median(rel[x > -700]) < 8 * ex.U2


def test_dd_exp_third_term_joins_the_argument():
    # exp(xh + xl + xll) with xll about u²|x|: the bound covers the exact value of the whole
    # triple, and dropping xll would be visible (it moves the result by more than the bound).
    rng = np.random.default_rng(5)
    x = -np.abs(rng.standard_normal(600)) * 8 - 1
    xl = x * rng.uniform(-0.5, 0.5, x.size) * 2.0**-53
    xll = x * rng.uniform(0.25, 0.5, x.size) * 2.0**-106
    h, lo, rel = ex.dd_exp(x, xl, xll)
    moved = 0
    with mpmath.workprec(300):
        for i in range(0, x.size, 3):
            e = mpmath.exp(mpmath.mpf(x[i]) + mpmath.mpf(xl[i]) + mpmath.mpf(xll[i]))
            got = mpmath.mpf(h[i]) + mpmath.mpf(lo[i])
            assert abs(got - e) <= rel[i] * e, (x[i], xl[i], xll[i])
            without = e / mpmath.exp(mpmath.mpf(xll[i]))
            moved += abs(got - without) > rel[i] * e
    assert moved > 50
    assert np.median(rel) < 8 * ex.U2


def test_expansion_to_td_is_exact_within_its_tiny_bound():
    rng = np.random.default_rng(6)
    terms = [rng.standard_normal(200) * 2.0 ** (-30 * i) for i in range(6)]
    terms[1][:50] = -terms[0][:50]  # cancellation
    hi, mid, lo, err = ex.expansion_to_td(terms)
    for i in range(200):
        exact = sum(Fraction(t[i]) for t in terms)
        got = Fraction(hi[i]) + Fraction(mid[i]) + Fraction(lo[i])
        assert abs(got - exact) <= Fraction(err[i])
        assert abs(mid[i]) <= abs(hi[i]) * 2.0**-53
        if exact:
            assert err[i] <= 2.0**-150 * abs(float(exact))


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_sliced_matmul_is_exact(dtype):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((5, 17)) * np.exp2(rng.integers(-20, 15, (5, 17)))).astype(dtype)
    b = (rng.standard_normal((4, 17)) * np.exp2(rng.integers(-20, 15, (4, 17)))).astype(dtype)
    a, b = a.astype(np.float64), b.astype(np.float64)
    beta = ex.beta_for(17)
    sa, ra = ex.slice_rows(a, None, beta)
    sb, rb = ex.slice_rows(b, None, beta)
    assert not ra.any() and not rb.any()
    terms = ex.sliced_matmul(sa, sb)
    for i in range(5):
        for j in range(4):
            exact = sum(Fraction(a[i, t]) * Fraction(b[j, t]) for t in range(17))
            assert sum(Fraction(t[i, j]) for t in terms) == exact
    hi, lo, err = ex.expansion_to_dd(terms)
    for i in range(5):
        for j in range(4):
            exact = sum(Fraction(a[i, t]) * Fraction(b[j, t]) for t in range(17))
            assert abs(Fraction(hi[i, j]) + Fraction(lo[i, j]) - exact) <= Fraction(err[i, j])
