"""The gradient diagnosis (harness/judging/gradient_diagnosis.py): a gradient that leaks past
the mask, a gradient off by a constant factor (a sign flip among them, dσ too); on arrays,
then through check_gradients on planted backwards."""

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
    one = EXACT[:1, :1, :1, :1]  # any ratio fits a single element: no reading
    assert diagnose_gradient("dv", 0.19 * one, one, DET[:1, :1, :1, :1]) == []
    # two elements fit by 0.19 to fp32's precision are (an unrelated pair fits by chance
    # about 1 time in 128, test_a_factor_of_dsinks_needs_heads_enough_or_an_exact_fit)
    two = EXACT[..., :1, :1]
    assert len(diagnose_gradient("dv", 0.19 * two, two, DET[..., :1, :1])) == 1


def test_a_sign_flip_is_a_factor_of_minus_one():
    said = diagnose_gradient("dk", -EXACT, EXACT, DET)
    assert said == [
        "consistent with dK off by a constant factor: the kernel's is −1 × the exact one "
        "everywhere: a sign flipped"
    ]
    said = diagnose_gradient("dq", -4 * EXACT, EXACT, DET)
    assert len(said) == 1 and "dQ off by a constant factor: the kernel's is −4 ×" in said[0]
    assert "a sign flipped, and a scale applied" in said[0] and "1/c = −0.25" in said[0]
    noisy = -EXACT + RNG.standard_normal(EXACT.shape) * 1e-2  # not a clean factor
    assert diagnose_gradient("dk", noisy, EXACT, DET) == []
    assert diagnose_gradient("dk", 0 * EXACT, EXACT, DET) == []  # no gradient is no factor


def test_a_factor_of_dsinks_needs_heads_enough_or_an_exact_fit():
    # dσ has one value per head, and a low-precision bound may exceed |dσ| (a user's bf16
    # case: 0.22 against 0.08 to 0.12), so the bound alone pins no factor on a few heads.
    x = np.array([0.08, -0.12, 0.10, 0.5])
    det = np.full(4, 0.22)
    off = 1 + np.array([0.01, -0.02, 0.015, 0.005])  # a bf16 kernel's own error
    said = diagnose_gradient("dsinks", -x * off, x, det)
    assert said == [
        "consistent with dσ off by a constant factor: the kernel's is −1 × the exact one "
        "everywhere: a sign flipped"
    ]
    said = diagnose_gradient("dsinks", 2 * x * off, x, det)
    assert len(said) == 1 and "dσ off by a constant factor: the kernel's is 2.0" in said[0]
    # an unrelated dσ that a factor of about −1 holds within the loose bound
    assert diagnose_gradient("dsinks", np.array([-0.2, 0.05, -0.02, -0.5]), x, det) == []
    # two heads: a fit within 2^-8 is named, one within 2% is not; one head never is
    assert len(diagnose_gradient("dsinks", -x[2:] * (1 + 1e-3), x[2:], det[2:])) == 1
    assert diagnose_gradient("dsinks", -x[2:] * off[2:], x[2:], det[2:]) == []
    assert diagnose_gradient("dsinks", -x[3:], x[3:], det[3:]) == []


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


def _fwd_sinks(q, k, v, *, causal=False, scale=None, sinks=None):
    return naive_numpy(q, k, v, causal=causal, scale=scale, sinks=sinks)


def _planted(change):
    def bwd(q, k, v, do, *, causal=False, scale=None, sinks=None):
        grads = naive_numpy_backward(q, k, v, do, causal=causal, scale=scale, sinks=sinks)
        return tuple((g * change.get(i, 1)).astype(g.dtype) for i, g in enumerate(grads))

    return bwd


def test_planted_sink_backwards_get_their_factor_named():
    # a user's four planted backwards: dσ negated, dK negated, dK doubled, dσ doubled; only
    # dK doubled was named
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 4, n, 16)).astype(np.float32) for n in (6, 9, 9))
    sinks = rng.standard_normal(4).astype(np.float32)
    for change, name, factor in [
        ({3: -1}, "dsinks", "−1 × the exact one everywhere: a sign flipped"),
        ({1: -1}, "dk", "−1 × the exact one everywhere: a sign flipped"),
        ({1: 2}, "dk", "2 × the exact one everywhere (a scale"),
        ({3: 2}, "dsinks", "2 × the exact one everywhere (a scale"),
    ]:
        kern = flashcheck.kernel(_fwd_sinks, name="planted", api="numpy", backward=_planted(change))
        res = flashcheck.check_gradients(kern, q, k, v, sinks=sinks, save="never")
        label = {"dk": "dK", "dsinks": "dσ"}[name]
        want = f"consistent with {label} off by a constant factor: the kernel's is {factor}"
        assert not res.passed and any(r.startswith(want) for r in res.verdicts[name].reasons), (
            change,
            res.verdicts[name].reasons,
        )
        others = {n: v.verdict for n, v in res.verdicts.items() if n != name}
        assert all(s == "PASS" for s in others.values()), (change, others)
