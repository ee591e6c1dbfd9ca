"""The judge's decision table, rule by rule, on tiny hand-made oracle tensors and bounds.

O is ``1×1×2×2`` in fp16 with floor ``W = 1``: one floored ulp is ``U = 2^-10`` for every
element (|O| < 2), so errors and bounds below are written in units of ``U``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashcheck.harness.checks.check_results import GradientCheckResult
from flashcheck.harness.core.formats import FP16, FP32, ulp
from flashcheck.harness.core.status import Status
from flashcheck.harness.judging.roundoff import TensorBounds
from flashcheck.harness.judging.verdict import (
    CONVENTION,
    judge,
    judge_gradients,
    judge_tensor,
)
from flashcheck.harness.oracle.evaluate import OracleResult
from flashcheck.harness.oracle.tensor import CertifiedTensor

U = 2.0**-10
O_HI = np.array([[[[0.5, 0.25], [1.0, -0.75]]]])
LSE_HI = np.array([[1.5, 2.0]])


def certified(hi, floor=1.0) -> CertifiedTensor:
    hi = np.asarray(hi, dtype=np.float64)
    zero = np.zeros_like(hi)
    return CertifiedTensor(hi, zero, zero, zero + floor, hi.copy(), np.ones(hi.shape, bool))


def bounds(det_ulps, prob_ulps, shape=O_HI.shape, unit=U) -> TensorBounds:
    return TensorBounds(np.full(shape, det_ulps * unit), np.full(shape, prob_ulps * unit))


def o_with(error_ulps: float, at=(0, 0, 1, 0)) -> np.ndarray:
    y = O_HI.copy()
    y[at] += error_ulps * U
    return y


def oracle(o_hi=O_HI, lse_hi=LSE_HI) -> OracleResult:
    tensors = {"o": certified(o_hi), "lse": certified(lse_hi, floor=0.0)}
    return OracleResult(FP16, np.arange(o_hi.shape[2]), "fast", tensors)


def judge_o(y, det=100, prob=50, naive=1.0):
    b = None if det is None else bounds(det, prob)
    return judge_tensor("o", y, certified(O_HI), b, fmt=FP16, naive=naive)


def test_pass_within_every_limit():
    v = judge_o(o_with(0.5), det=10, prob=5, naive=1.0)
    assert v.verdict == Status.PASS and v.reasons == []
    assert v.max_err == 0.5 and v.naive_ratio == 0.5
    assert v.det_util == pytest.approx(0.05) and v.prob_util == pytest.approx(0.1)


def test_fail_by_the_empirical_rule():
    # 2·naive + 1 = 3 ulps; the probabilistic bound (2 ulps) is tighter, so 4 ulps fail.
    v = judge_o(o_with(4.0), det=100, prob=2, naive=1.0)
    assert v.verdict == Status.FAIL
    assert len(v.reasons) == 1
    assert "1 O elements above max(2·naive + 1 ulp, probabilistic bound)" in v.reasons[0]
    assert v.max_err == 4.0 and v.naive_ratio == 4.0


def test_empirical_limit_at_the_boundary_passes():
    assert judge_o(o_with(3.0), det=100, prob=2, naive=1.0).verdict == Status.PASS


def test_no_fail_when_the_probabilistic_bound_is_looser_than_the_empirical_limit():
    v = judge_o(o_with(4.0), det=100, prob=6, naive=1.0)
    assert v.verdict == Status.PASS and v.reasons == []


def test_fail_by_the_probabilistic_bound_without_a_naive_baseline():
    v = judge_o(o_with(4.0), det=100, prob=2, naive=None)
    assert v.verdict == Status.FAIL
    assert v.reasons == ["FAIL: 1 O elements above the probabilistic bound"]
    assert math.isnan(v.naive_ulp) and math.isnan(v.naive_ratio)
    assert judge_o(o_with(1.5), det=100, prob=2, naive=None).verdict == Status.PASS


def test_fail_hard_above_the_deterministic_bound():
    v = judge_o(o_with(4.0), det=3, prob=2, naive=10.0)
    assert v.verdict == Status.FAIL_HARD
    assert v.reasons[0].startswith("FAIL-HARD: 1 O elements exceed the deterministic bound")
    assert v.det_util == pytest.approx(4 / 3)
    assert v.worst[0]["index"] == [0, 0, 1, 0] and v.worst[0]["floor_W"] == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_fail_hard_for_nan_or_inf_where_the_oracle_is_finite(bad):
    y = O_HI.copy()
    y[0, 0, 0, 1] = bad
    v = judge_o(y, det=100, prob=50, naive=1.0)
    assert v.verdict == Status.FAIL_HARD
    assert "1 O elements NaN/Inf where the oracle is finite" in v.reasons[0]
    # never reported as a small error: NaN for NaN, inf for ±Inf, and listed first
    assert math.isnan(v.max_err) if math.isnan(bad) else v.max_err == math.inf
    assert v.worst[0]["index"] == [0, 0, 0, 1]


def test_masked_row_nan_is_the_convention_difference():
    lse = LSE_HI.copy()
    lse[0, 1] = -np.inf  # row 1 keeps no key: O = 0 exactly
    o_hi = O_HI.copy()
    o_hi[0, 0, 1] = 0.0
    y = o_hi.copy()
    y[0, 0, 1] = np.nan
    v = judge(y, None, oracle(o_hi, lse), None, naive_ulp=1.0)
    assert v.verdict == Status.FAIL_HARD
    assert v.reasons[0] == (
        f"FAIL-HARD: {CONVENTION}1 fully masked rows give NaN, not O = 0 (flashcheck's "
        "contract, as FlashAttention)"
    )
    # not counted among the NaN/Inf elements, but never a small error either
    assert not any("NaN/Inf where the oracle is finite" in r for r in v.reasons)
    assert math.isnan(v.max_ulp)


def test_masked_row_nonzero_fails_hard():
    lse = LSE_HI.copy()
    lse[0, 1] = -np.inf
    o_hi = O_HI.copy()
    o_hi[0, 0, 1] = 0.0
    y = o_hi.copy()
    y[0, 0, 1, 1] = 2.0**-24  # the smallest fp16 subnormal: still not O = 0
    v = judge(y, None, oracle(o_hi, lse), None, naive_ulp=1.0)
    assert v.verdict == Status.FAIL_HARD
    assert "FAIL-HARD: 1 fully masked rows with O != 0" in v.reasons


def test_lse_finiteness():
    lse = LSE_HI.copy()
    lse[0, 1] = -np.inf
    o_hi = O_HI.copy()
    o_hi[0, 0, 1] = 0.0
    ref = oracle(o_hi, lse)
    good = judge(o_hi, lse, ref, None, naive_ulp=1.0, naive_lse_err=0.0)
    assert good.verdict == Status.PASS and good.lse_err == 0.0
    for wrong in ([[1.5, 0.0]], [[np.inf, -np.inf]], [[np.nan, -np.inf]]):
        v = judge(o_hi, np.array(wrong), ref, None, naive_ulp=1.0, naive_lse_err=0.0)
        assert v.verdict == Status.FAIL_HARD, wrong
        assert v.reasons == [
            "FAIL-HARD: 1 LSE values wrong in finiteness (masked rows must give -inf, "
            "others finite)"
        ]
        assert v.lse_err == math.inf and v["o"].verdict == Status.PASS


def lse_bounds(det, prob) -> TensorBounds:
    return TensorBounds(np.full(LSE_HI.shape, det), np.full(LSE_HI.shape, prob))


def test_lse_deterministic_bound():
    ref = oracle()
    lse = LSE_HI + np.array([[0.0, 3e-6]])
    tb = {"o": bounds(100, 50), "lse": lse_bounds(2e-6, 1e-6)}
    v = judge(O_HI, lse, ref, tb, naive_ulp=1.0, naive_lse_err=10.0)
    assert v.verdict == Status.FAIL_HARD
    assert v.reasons[0].startswith("FAIL-HARD: LSE exceeds its deterministic bound")
    assert v.lse_det_util == pytest.approx(1.5)
    ok = judge(O_HI, LSE_HI + 1e-6, ref, tb, naive_ulp=1.0, naive_lse_err=10.0)
    assert ok.verdict == Status.PASS


def test_lse_empirical_rule_in_absolute_errors():
    ref = oracle()
    naive = 1e-6
    ulp2 = float(ulp(np.array(2.0), FP32))  # the floor: one fp32 ulp of |LSE| = 2
    limit = 2 * naive + ulp2
    tb = {"o": bounds(100, 50), "lse": lse_bounds(1.0, 1e-7)}
    over = judge(
        O_HI, LSE_HI + np.array([[0.0, 2 * limit]]), ref, tb, naive_ulp=1.0, naive_lse_err=naive
    )
    assert over.verdict == Status.FAIL
    assert over.reasons[0].startswith("FAIL: LSE error") and "2·naive + ulp" in over.reasons[0]
    under = judge(
        O_HI, LSE_HI + np.array([[0.0, 0.5 * limit]]), ref, tb, naive_ulp=1.0, naive_lse_err=naive
    )
    assert under.verdict == Status.PASS
    # a looser probabilistic bound lifts the limit
    loose = {"o": bounds(100, 50), "lse": lse_bounds(1.0, 3 * limit)}
    lifted = judge(
        O_HI, LSE_HI + np.array([[0.0, 2 * limit]]), ref, loose, naive_ulp=1.0, naive_lse_err=naive
    )
    assert lifted.verdict == Status.PASS


def grad_ref():
    dq = O_HI * 2  # |dQ| < 2: one floored ulp is U with floor 1
    return OracleResult(
        FP16,
        np.arange(2),
        "fast",
        {"o": certified(O_HI), "lse": certified(LSE_HI, 0.0), "dq": certified(dq)},
    )


def test_the_same_rules_on_a_gradient():
    ref = grad_ref()
    exact = ref.dq.hi
    cases = [
        (0.5, 10, 5, 1.0, Status.PASS, None),
        (4.0, 100, 2, 1.0, Status.FAIL, "1 dQ elements above max(2·naive + 1 ulp"),
        (4.0, 100, 6, 1.0, Status.PASS, None),
        (4.0, 100, 2, None, Status.FAIL, "1 dQ elements above the probabilistic bound"),
        (4.0, 3, 2, 10.0, Status.FAIL_HARD, "1 dQ elements exceed the deterministic bound"),
    ]
    for err, det, prob, naive, status, gist in cases:
        y = exact.copy()
        y[0, 0, 1, 1] += err * U
        got = judge_gradients(
            {"dq": y},
            ref,
            {"dq": bounds(det, prob)},
            naive=None if naive is None else {"dq": naive},
        )["dq"]
        assert got.verdict == status, (err, det, prob, naive)
        assert (got.reasons == []) if gist is None else gist in got.reasons[0]
    y = exact.copy()
    y[0, 0, 0, 0] = np.nan
    got = judge_gradients({"dq": y}, ref, {"dq": bounds(100, 50)}, naive={"dq": 1.0})["dq"]
    assert got.verdict == Status.FAIL_HARD and math.isnan(got.max_ulp)
    assert "1 dQ elements NaN/Inf where the oracle is finite" in got.reasons[0]


def test_the_case_status_is_the_worst_tensors():
    ref = oracle()
    tb = {"o": bounds(100, 2), "lse": lse_bounds(1e-7, 1e-8)}
    v = judge(
        o_with(4.0), LSE_HI + np.array([[1e-6, 0.0]]), ref, tb, naive_ulp=1.0, naive_lse_err=0.0
    )
    assert v["o"].verdict == Status.FAIL and v["lse"].verdict == Status.FAIL_HARD
    assert v.verdict == Status.FAIL_HARD
    assert [r.split(":")[0] for r in v.reasons] == ["FAIL", "FAIL-HARD", "FAIL"]
    gref = grad_ref()
    dq_fail = gref.dq.hi.copy()
    dq_fail[0, 0, 0, 0] += 4 * U
    verdicts = judge_gradients({"dq": dq_fail}, gref, {"dq": bounds(100, 2)}, naive={"dq": 1.0})
    verdicts["dk"] = judge_tensor(
        "dq", gref.dq.hi, gref.dq, bounds(100, 2), fmt=FP16, naive=1.0
    )  # a passing tensor beside it
    res = GradientCheckResult("k", "cpu", None, None, gref, None, verdicts)
    assert res.verdict == Status.FAIL and not res.passed


def test_a_check_result_s_repr_is_one_line_with_its_verdict():
    import flashcheck
    from flashcheck.kernels.naive import naive_numpy

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float16) for _ in range(3))
    res = flashcheck.check(flashcheck.kernel(naive_numpy, api="numpy"), q, k, v, save="never")
    assert repr(res) == (
        "<CheckResult flashcheck.kernels.naive:naive_numpy: PASS on manual fp16 B=1 Hq=2 Hk=2 "
        "Nq=8 Nk=8 d=16 dv=16 seed=None>"
    )
