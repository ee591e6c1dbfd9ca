"""The gradient diagnosis (harness/judging/gradient_diagnosis.py): a gradient that leaks past
the mask, a gradient off by a constant factor; on arrays, then through check_gradients on
planted backwards."""

import numpy as np

import flashcheck
from flashcheck.harness.judging.gradient_diagnosis import diagnose_gradient
from flashcheck.kernels.naive import naive_numpy, naive_numpy_backward

RNG = np.random.default_rng(0)
EXACT = RNG.standard_normal((1, 2, 5, 4))
DET = np.full(EXACT.shape, 1e-6)


def test_a_constant_factor_is_named_with_its_value():
    said = diagnose_gradient("dk", 4 * EXACT, EXACT, DET)
    assert len(said) == 1 and "dK off by a constant factor: the kernel's is 4 ×" in said[0]
    assert "1/c = 0.25" in said[0]
    assert diagnose_gradient("dk", EXACT + 1e-7, EXACT, DET) == []  # within the bound
    noisy = 4 * EXACT + RNG.standard_normal(EXACT.shape) * 1e-2  # not a clean factor
    assert diagnose_gradient("dk", noisy, EXACT, DET) == []
    one = EXACT[..., :1, :1]  # any ratio fits a single element: no reading
    assert diagnose_gradient("dv", 0.19 * one, one, DET[..., :1, :1]) == []


def test_gradient_where_nothing_may_flow_is_named():
    exact, det = EXACT.copy(), DET.copy()
    exact[:, :, 0], det[:, :, 0] = 0.0, 0.0  # a row that keeps no key
    y = exact.copy()
    y[0, 1, 0, 2] = 1e-3
    said = diagnose_gradient("dq", y, exact, det)
    assert len(said) == 1 and "dQ is nonzero in 1 element whose exact value is 0" in said[0]
    y[0, 1, 0, 2] = 0.0
    assert diagnose_gradient("dq", y, exact, det) == []


def _fwd(q, k, v, *, causal=False, scale=None):
    return naive_numpy(q, k, v, causal=causal, scale=scale)


def _no_scale_in_dk(q, k, v, do, *, causal=False, scale=None):
    s = q.shape[-1] ** -0.5 if scale is None else scale
    dq, dk, dv = naive_numpy_backward(q, k, v, do, causal=causal, scale=scale)
    return dq, (dk / s).astype(dk.dtype), dv


def _no_mask(q, k, v, do, *, causal=False, scale=None):
    return naive_numpy_backward(q, k, v, do, scale=scale)


def test_planted_backwards_get_their_mistake_named():
    q, k, v = (RNG.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (6, 9, 9))
    kern = flashcheck.kernel(_fwd, name="no-scale", api="numpy", backward=_no_scale_in_dk)
    res = flashcheck.check_gradients(kern, q, k, v, save="never")
    assert not res.passed and any(
        "dK off by a constant factor: the kernel's is 4 ×" in r for r in res.reasons
    ), res.reasons
    q, k, v = (RNG.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (9, 6, 6))
    kern = flashcheck.kernel(_fwd, name="no-mask", api="numpy", backward=_no_mask)
    res = flashcheck.check_gradients(kern, q, k, v, causal=True, save="never")
    assert not res.passed
    assert any("gradient flowing where the mask lets none through: dQ" in r for r in res.reasons), (
        res.reasons
    )


def test_a_backward_that_ignores_the_mask_is_named_when_no_element_leaks():
    # Nq = Nk: no row is empty, so no gradient leaks where the exact one is 0, and the
    # no-mask backward got no reading at all (a user's trial: FAIL-HARD with no diagnosis).
    rng = np.random.default_rng(3)  # inputs of its own, whatever ran before it
    kern = flashcheck.kernel(_fwd, name="no-mask", api="numpy", backward=_no_mask)
    for draw in range(4):
        q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float32) for _ in range(3))
        res = flashcheck.check_gradients(kern, q, k, v, causal=True, save="never")
        named = [r for r in res.reasons if "causal=True ignored: dQ, dK and dV match" in r]
        assert not res.passed and len(named) == 1, (draw, res.reasons)
    # another mistake under the same mask is not read as an ignored mask
    kern = flashcheck.kernel(_fwd, name="no-scale", api="numpy", backward=_no_scale_in_dk)
    res = flashcheck.check_gradients(kern, q, k, v, causal=True, save="never")
    assert not res.passed and not any("ignored" in r for r in res.reasons), res.reasons
