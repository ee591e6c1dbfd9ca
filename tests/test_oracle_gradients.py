"""The gradient oracle (``oracle(..., do=dO)``): fast and strict paths agree within their
bounds, closed forms hold exactly, and finite differences of the oracle's own forward agree
with its gradients."""

from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle_inputs import FMTS, cast, small_cases

from flashcheck.harness.core.formats import FP16, round_mpf, round_to_format
from flashcheck.harness.core.semantics import make_problem
from flashcheck.harness.oracle.common import scale_of
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.harness.oracle.exact import U2
from flashcheck.harness.oracle.fast import fast_rows

GRADS = ("dq", "dk", "dv")


def _do_for(q, v, seed, family="normal"):
    rng = np.random.default_rng(seed)
    b, hq, nq, _ = q.shape
    do = rng.standard_normal((b, hq, nq, v.shape[-1]))
    if family == "huge":
        do *= 2.0**10
    name = {np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}.get(q.dtype, "bf16")
    return cast(do, name)


def _dd_diff(a_hi, a_lo, b_hi, b_lo):
    with np.errstate(invalid="ignore"):
        return np.abs((a_hi - b_hi) + (a_lo - b_lo))


@given(case=small_cases(), seed=st.integers(0, 2**32 - 1), big=st.booleans())
def test_fast_and_strict_gradients_agree_within_bounds(case, seed, big):
    q, k, v, causal, extra = case
    do = _do_for(q, v, seed, "huge" if big else "normal")
    f = oracle(q, k, v, causal=causal, do=do, **extra)
    s = oracle(q, k, v, causal=causal, do=do, mode="strict", **extra)
    for g in GRADS:
        fh, fl, fe = (getattr(f[g], x) for x in ("hi", "lo", "err"))
        sh, sl, se = (getattr(s[g], x) for x in ("hi", "lo", "err"))
        fin = np.isfinite(sh)
        np.testing.assert_array_equal(fin, np.isfinite(fh))
        assert np.all(_dd_diff(fh, fl, sh, sl)[fin] <= (fe + se)[fin]), g
        both = f[g].certified & s[g].certified
        np.testing.assert_array_equal(f[g].rounded[both], s[g].rounded[both])
        # the 100-bit contract on certified elements
        cert = f[g].certified & fin
        tgt = np.maximum(np.ldexp(f[g].floor, -100), f.fmt.min_subnormal * 2.0**-100)
        assert np.all(fe[cert] <= tgt[cert]), g


def test_one_key_gives_zero_dq_and_dv_equal_to_do():
    # One key: P = 1 whatever the score, so dS = 0 (dQ = dK = 0) and dV = Σ over the group's
    # rows of dO, exactly.
    rng = np.random.default_rng(1)
    q = cast(rng.standard_normal((2, 4, 5, 8)) * 30, "fp16")
    k = cast(rng.standard_normal((2, 2, 1, 8)), "fp16")
    v = cast(rng.standard_normal((2, 2, 1, 3)), "fp16")
    do = cast(rng.standard_normal((2, 4, 5, 3)), "fp16")
    for mode in ("fast", "strict"):
        r = oracle(q, k, v, do=do, mode=mode)
        assert np.all(r.dq.rounded == 0) and np.all(r.dk.rounded == 0)
        want = do.astype(np.float64).reshape(2, 2, 10, 3).sum(axis=2, keepdims=True)
        np.testing.assert_array_equal(r.dv.rounded, round_to_format(want, FP16))
        assert r.dq.certified.all() and r.dk.certified.all() and r.dv.certified.all()


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_uniform_scores_match_exact_rationals(name):
    # q = 0: every kept weight is 1/N exactly, and with a power-of-two scale every gradient is a
    # rational number: compared after correct rounding, element by element.
    fmt = FMTS[name][0]
    rng = np.random.default_rng(2)
    nq, nk, d, dv = 3, 5, 4, 2
    q = cast(np.zeros((1, 1, nq, d)), name)
    k = cast(rng.standard_normal((1, 1, nk, d)), name)
    v = cast(rng.standard_normal((1, 1, nk, dv)), name)
    do = cast(rng.standard_normal((1, 1, nq, dv)), name)
    r = oracle(q, k, v, do=do, scale=0.5)
    fr = lambda x: Fraction(float(x))  # noqa: E731
    kk, vv, dd = k[0, 0], v[0, 0], do[0, 0]
    p = Fraction(1, nk)
    dp = [
        [sum(fr(dd[i, c]) * fr(vv[j, c]) for c in range(dv)) for j in range(nk)] for i in range(nq)
    ]
    big_d = [sum(p * x for x in row) for row in dp]
    ds = [[p * (dp[i][j] - big_d[i]) for j in range(nk)] for i in range(nq)]
    half = Fraction(1, 2)
    for i in range(nq):
        for c in range(d):
            exact = half * sum(ds[i][j] * fr(kk[j, c]) for j in range(nk))
            assert r.dq.rounded[0, 0, i, c] == _round_fraction(exact, fmt)
    for j in range(nk):
        for c in range(d):
            exact = half * sum(ds[i][j] * fr(q[0, 0, i, c]) for i in range(nq))
            assert r.dk.rounded[0, 0, j, c] == _round_fraction(exact, fmt)
        for c in range(dv):
            exact = sum(p * fr(dd[i, c]) for i in range(nq))
            assert r.dv.rounded[0, 0, j, c] == _round_fraction(exact, fmt)


def _round_fraction(x: Fraction, fmt) -> float:
    # 400 bits: wrong only if x lay within 2^-400 of a rounding midpoint without being on it,
    # which a rational with these small denominators cannot.
    with mpmath.workprec(400):
        return round_mpf(mpmath.mpf(x.numerator) / x.denominator, fmt)


def _loss(q, k, v, do, **kw):
    """``Σ dO ∘ O`` to ~1e-30 relative (mpmath over the oracle's dd outputs)."""
    r = oracle(q, k, v, **kw)
    with mpmath.workprec(200):
        total = mpmath.mpf(0)
        for hi, lo, g in zip(
            r.o.hi.ravel(), r.o.lo.ravel(), do.astype(np.float64).ravel(), strict=True
        ):
            total += (mpmath.mpf(hi) + mpmath.mpf(lo)) * mpmath.mpf(g)
    return total


@pytest.mark.parametrize("causal", [False, True])
def test_finite_differences_of_the_forward_agree_with_the_gradients(causal):
    # Inputs with 11 significant bits stored in fp32, so that x ± 2^-20 is exact in fp32; the
    # central difference of Σ dO∘O then has a truncation error ~ eps²·|third derivative| ≈ 1e-12.
    rng = np.random.default_rng(3)
    q = cast(cast(rng.standard_normal((1, 2, 4, 3)), "fp16"), "fp32")
    k = cast(cast(rng.standard_normal((1, 1, 5, 3)), "fp16"), "fp32")
    v = cast(cast(rng.standard_normal((1, 1, 5, 2)), "fp16"), "fp32")
    do = cast(cast(rng.standard_normal((1, 2, 4, 2)), "fp16"), "fp32")
    r = oracle(q, k, v, do=do, causal=causal)
    eps = 2.0**-20
    spots = {
        "q": (q, r.dq.hi, [(0, 1, 2, 0), (0, 0, 3, 2)]),
        "k": (k, r.dk.hi, [(0, 0, 1, 1), (0, 0, 4, 0)]),
        "v": (v, r.dv.hi, [(0, 0, 0, 1), (0, 0, 3, 0)]),
    }
    for name, (x, grad, idxs) in spots.items():
        for idx in idxs:
            plus, minus = x.copy(), x.copy()
            plus[idx] += np.float32(eps)
            minus[idx] -= np.float32(eps)
            assert plus[idx] - x[idx] == eps and x[idx] - minus[idx] == eps  # exact steps
            args = {"q": q, "k": k, "v": v}
            lp = _loss(**{**args, name: plus}, do=do, causal=causal)
            lm = _loss(**{**args, name: minus}, do=do, causal=causal)
            fd = float((lp - lm) / (2 * eps))
            assert abs(fd - grad[idx]) <= 1e-9 * (1 + abs(grad[idx])), (name, idx, fd, grad[idx])


def test_masked_rows_and_keys_get_zero_gradients_never_nan():
    rng = np.random.default_rng(4)
    q = cast(rng.standard_normal((1, 2, 4, 4)), "bf16")
    k = cast(rng.standard_normal((1, 1, 6, 4)), "bf16")
    v = cast(rng.standard_normal((1, 1, 6, 3)), "bf16")
    do = cast(rng.standard_normal((1, 2, 4, 3)), "bf16")
    mask = np.ones((1, 2, 4, 6), dtype=bool)
    mask[0, 0, 1] = False  # a fully masked row
    mask[:, :, :, 5] = False  # a key no row keeps
    for mode in ("fast", "strict"):
        r = oracle(q, k, v, do=do, mask=mask, mode=mode)
        for g in GRADS:
            assert not np.isnan(r[g].rounded).any()
        assert np.all(r.dq.rounded[0, 0, 1] == 0)
        assert np.all(r.dk.rounded[0, 0, 5] == 0) and np.all(r.dv.rounded[0, 0, 5] == 0)


def test_gradient_nan_rule():
    rng = np.random.default_rng(5)
    q = cast(rng.standard_normal((1, 1, 4, 3)), "fp16")
    k = cast(rng.standard_normal((1, 1, 4, 3)), "fp16")
    v = cast(rng.standard_normal((1, 1, 4, 2)), "fp16")
    do = cast(rng.standard_normal((1, 1, 4, 2)), "fp16")
    do[0, 0, 3, 1] = np.inf  # row 3 is poisoned: D_3 is infinite
    r = oracle(q, k, v, do=do, causal=True)
    assert np.isnan(r.dq.rounded[0, 0, 3]).all()
    assert not np.isnan(r.dq.rounded[0, 0, :3]).any()
    # causal: row 3 keeps every key, so every dK, dV row is poisoned
    assert np.isnan(r.dk.rounded).all() and np.isnan(r.dv.rounded).all()
    do[0, 0, 3, 1] = 0
    q[0, 0, 0, 0] = np.nan  # row 0 keeps key 0 only
    r = oracle(q, k, v, do=do, causal=True)
    assert np.isnan(r.dq.rounded[0, 0, 0]).all() and not np.isnan(r.dq.rounded[0, 0, 1:]).any()
    assert np.isnan(r.dk.rounded[0, 0, 0]).all() and not np.isnan(r.dk.rounded[0, 0, 1:]).any()


def test_rows_and_keys_select_slices_of_the_full_result():
    rng = np.random.default_rng(6)
    q = cast(rng.standard_normal((2, 4, 7, 5)), "fp16")
    k = cast(rng.standard_normal((2, 2, 9, 5)), "fp16")
    v = cast(rng.standard_normal((2, 2, 9, 4)), "fp16")
    do = cast(rng.standard_normal((2, 4, 7, 4)), "fp16")
    full = oracle(q, k, v, do=do, window=(3, 1))
    part = oracle(q, k, v, do=do, window=(3, 1), rows=[6, 2], keys=[0, 8, 3])
    np.testing.assert_array_equal(part.dq.rounded, full.dq.rounded[:, :, [6, 2]])
    np.testing.assert_array_equal(part.dk.rounded, full.dk.rounded[:, :, [0, 8, 3]])
    np.testing.assert_array_equal(part.dv.hi, full.dv.hi[:, :, [0, 8, 3]])
    np.testing.assert_array_equal(part.keys, [0, 8, 3])
    plain = oracle(q, k, v, window=(3, 1))
    assert plain.dq is None and plain.dk is None and plain.keys is None
    np.testing.assert_array_equal(plain.o.rounded, full.o.rounded)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"do": np.zeros((1, 1, 3, 2), np.float32)}, TypeError, "inputs' format"),
        ({"do": np.zeros((1, 1, 2, 2), np.float16)}, ValueError, "O's shape"),
        ({"keys": [0]}, ValueError, "do="),
        ({"do": np.zeros((1, 1, 3, 2), np.float16), "keys": [4]}, ValueError, "keys must lie"),
    ],
)
def test_bad_gradient_arguments_get_clear_errors(kwargs, exc, match):
    q = np.zeros((1, 1, 3, 4), np.float16)
    k = np.zeros((1, 1, 4, 4), np.float16)
    v = np.zeros((1, 1, 4, 2), np.float16)
    with pytest.raises(exc, match=match):
        oracle(q, k, v, **kwargs)


def test_gradients_of_a_longer_case_are_certified_quickly():
    # The fast path on a campaign-sized case: every element certified, no strict fallback.
    rng = np.random.default_rng(7)
    q = cast(rng.standard_normal((1, 4, 128, 64)) * 3, "bf16")
    k = cast(rng.standard_normal((1, 2, 160, 64)) * 3, "bf16")
    v = cast(rng.standard_normal((1, 2, 160, 64)), "bf16")
    do = cast(rng.standard_normal((1, 4, 128, 64)), "bf16")
    r = oracle(q, k, v, do=do, causal=True)
    for g in GRADS:
        assert r[g].certified.all(), g
    assert r.stats["seconds"] < 30


def test_one_hot_rows_are_certified_by_the_fast_path():
    # Logit gaps of ~1e60 make each row's softmax one-hot to double precision, so the exact dQ
    # and dK are astronomically small (they round to ±0). A bound on dP − D relative to |D|
    # cannot decide that rounding: every dQ element then went to the strict path (minutes for
    # the gpu preset's bf16 negative_rows case). docs/oracle.md §7.1 step 3.
    rng = np.random.default_rng(3)
    q = cast(rng.standard_normal((1, 2, 6, 8)) * 1e30, "bf16")
    k = cast(rng.standard_normal((1, 1, 6, 8)) * 1e30, "bf16")
    v = cast(rng.standard_normal((1, 1, 6, 8)), "bf16")
    # dO in {1/2, 1}: dV's sums are representable and cannot cancel, so no dV lands on a
    # rounding tie or near 0 (those, times 1 − ε, are the strict path's job).
    do = cast(rng.choice([0.5, 1.0], size=(1, 2, 6, 8)), "bf16")
    fast = oracle(q, k, v, do=do)
    assert fast.stats["fallback_elements"] == 0, fast.stats
    strict = oracle(q, k, v, do=do, mode="strict")
    for g in ("dq", "dk"):
        assert not np.any(fast[g].rounded), g  # every element rounds to ±0
        assert np.array_equal(fast[g].rounded, strict[g].rounded)


def test_fp32_gradients_are_certified_without_the_strict_path():
    # fp32 scores make x = τ·(t − m) need more than a double-double: carried as one, its error
    # (about 3u²|x|) reached the weights and, through dS, pushed about 1.5 % of this case's dQ
    # and dK elements (a quarter of a 512 × 2048 sequence's) past the 2^−100 target. With x
    # as a triple-double every element is certified by the fast path. docs/oracle.md §7.1.
    rng = np.random.default_rng(1)
    q = cast(rng.standard_normal((1, 2, 64, 128)), "fp32")
    k = cast(rng.standard_normal((1, 1, 256, 128)), "fp32")
    v = cast(rng.standard_normal((1, 1, 256, 128)), "fp32")
    do = cast(rng.standard_normal((1, 2, 64, 128)), "fp32")
    r = oracle(q, k, v, do=do, causal=True)
    assert r.stats["fallback_elements"] == 0, r.stats


def test_fp32_weights_carry_only_exp_own_error():
    # x = τ·(t − m) as a triple-double: the weights' relative bound is exp's own (about u²),
    # not x's dd rounding (about 3u²|x|, 2^−103 and worse for arguments of a few units).
    rng = np.random.default_rng(2)
    q = cast(rng.standard_normal((1, 1, 32, 128)), "fp32")
    k = cast(rng.standard_normal((1, 1, 256, 128)), "fp32")
    problem = make_problem(q, k, k)
    keep = np.ones((32, 256), dtype=bool)
    res = fast_rows(
        problem.q[0, 0], problem.k[0, 0], problem.v[0, 0], keep, scale_of(problem), weights=True
    )
    assert np.median(res["e_rel"]) < 2 * U2 and np.max(res["e_rel"]) < 8 * U2
