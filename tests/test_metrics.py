import numpy as np

from flashcheck.harness.core.formats import FP16, FP32
from flashcheck.harness.judging.metrics import (
    floored_ulp_error,
    nonfinite_mismatch,
    summarize,
    ulp_error_int,
)
from flashcheck.harness.oracle.evaluate import oracle


def test_correctly_rounded_output_scores_at_most_half_an_ulp():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 16, 8)).astype(np.float16)
    k = rng.standard_normal((1, 2, 16, 8)).astype(np.float16)
    v = rng.standard_normal((1, 2, 16, 8)).astype(np.float16)
    r = oracle(q, k, v)
    e = floored_ulp_error(r.o.rounded, r.o.hi, r.o.lo, r.o.floor, FP16)
    assert e.max() <= 0.5
    assert ulp_error_int(r.o.rounded, r.o.rounded, FP16).max() == 0
    # one ulp off everywhere: integer distance 1 and floored error in (0.5, 1.5]
    bumped = np.nextafter(r.o.rounded.astype(np.float16), np.float16(np.inf)).astype(np.float64)
    assert ulp_error_int(bumped, r.o.rounded, FP16).max() == 1
    s = summarize(bumped, r.o.hi, r.o.lo, r.o.floor, r.o.rounded, FP16)
    assert 0.5 < s.max_floored_ulp <= 1.5 and s.nonfinite_mismatches == 0 and s.max_ulp_int == 1


def test_floor_tames_cancelled_outputs():
    # y ≈ 0 but W = 1: an absolute error of one ulp(1) is one floored ulp, not millions.
    e = floored_ulp_error(
        np.array([2.0**-23]), np.array([1e-30]), np.array([0.0]), np.array([1.0]), FP32
    )
    assert 0.99 < e[0] <= 1.0
    e0 = floored_ulp_error(np.array([0.0]), np.array([0.0]), np.array([0.0]), np.array([0.0]), FP32)
    assert e0[0] == 0.0


def test_ulp_int_across_zero_and_to_infinity():
    assert ulp_error_int(np.array([-(2.0**-24)]), np.array([2.0**-24]), FP16)[0] == 2
    assert ulp_error_int(np.array([np.inf]), np.array([65504.0]), FP16)[0] == 1
    assert ulp_error_int(np.array([np.nan]), np.array([1.0]), FP16)[0] == -1


def test_nonfinite_mismatch_categories():
    a = np.array([np.nan, 1.0, np.inf, np.inf, np.nan, 2.0])
    b = np.array([np.nan, np.nan, np.inf, -np.inf, 1.0, 2.0])
    assert nonfinite_mismatch(a, b).tolist() == [False, True, False, True, True, False]
    s = summarize(a, b, np.zeros(6), np.ones(6), np.where(np.isfinite(b), b, 0), FP16)
    assert s.nonfinite_mismatches == 3 and s.max_floored_ulp == 0.0


def test_floored_ulp_at_a_power_of_two():
    # y just below 1 (binade [0.5, 1) in fp16: ulp 2^-11); ŷ = 1 is one such ulp away.
    y_hi, y_lo = np.array([1.0]), np.array([-(2.0**-60)])
    e = floored_ulp_error(np.array([1.0]), y_hi, y_lo, np.array([0.0]), FP16)
    assert e[0] < 2.0**-40  # tiny absolute error measured in the lower binade's ulp
    e = floored_ulp_error(
        np.array([1.0 - 2.0**-11]), np.array([1.0]), np.array([0.0]), np.zeros(1), FP16
    )
    assert e[0] == 0.5  # 2^-11 below 1 measured in ulp(1) = 2^-10
    # subnormal outputs: the spacing 2^-24 is the unit
    e = floored_ulp_error(np.array([2.0**-24]), np.array([0.0]), np.array([0.0]), np.zeros(1), FP16)
    assert e[0] == 1.0
    e = floored_ulp_error(
        np.array([65504.0]), np.array([65504.0 + 8]), np.zeros(1), np.zeros(1), FP16
    )
    assert e[0] == 0.25
