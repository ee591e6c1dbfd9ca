import math

import ml_dtypes
import mpmath
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flashcheck.harness.core.formats import (
    BF16,
    FP16,
    FP32,
    format_of,
    ordered_int,
    round_mpf,
    round_to_format,
    ulp,
    ulp_distance,
)

FMTS = [FP16, BF16, FP32]


def test_format_constants():
    assert FP16.max_finite == 65504.0
    assert BF16.max_finite == float(np.finfo(np.float32).max) * (1 - 2**-8) / (1 - 2**-24)
    assert FP32.max_finite == float(np.finfo(np.float32).max)
    assert (FP16.min_subnormal, BF16.min_subnormal, FP32.min_subnormal) == (
        2.0**-24,
        2.0**-133,
        2.0**-149,
    )
    assert FP16.u == 2.0**-11 and BF16.u == 2.0**-8 and FP32.u == 2.0**-24
    assert format_of(np.float16) is FP16 and format_of(ml_dtypes.bfloat16) is BF16
    with pytest.raises(TypeError, match="not a supported"):
        format_of(np.int32)


def test_bf16_rounding_is_direct_not_double():
    # ml_dtypes goes float64 -> float32 -> bf16 and loses the sticky bit; we must not.
    x = 1 + 2.0**-8 + 2.0**-40
    assert round_to_format(x, BF16) == 1 + 2.0**-7
    assert float(np.float64(x).astype(ml_dtypes.bfloat16)) == 1.0  # the upstream behaviour


def test_round_matches_numpy_casts():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(20000) * np.exp2(rng.uniform(-160, 140, 20000))
    with np.errstate(over="ignore"):  # the casts overflow to inf on purpose
        np.testing.assert_array_equal(round_to_format(x, FP32), x.astype(np.float32))
        np.testing.assert_array_equal(round_to_format(x, FP16), x.astype(np.float16))


def test_round_specials_and_overflow():
    assert round_to_format(65519.99, FP16) == 65504.0  # below the midpoint 65520
    assert round_to_format(65520.0, FP16) == np.inf  # midpoint rounds to even = 2^16: overflow
    assert np.signbit(round_to_format(-0.0, FP16))
    assert round_to_format(2.0**-25, FP16) == 0.0  # half the min subnormal: tie to even (0)
    assert round_to_format(3 * 2.0**-25, FP16) == 2.0**-23
    assert np.isnan(round_to_format(np.nan, BF16))


def _neighbours(r: float, fmt) -> tuple[float, float]:
    q = ulp(r, fmt)
    down = ulp(np.nextafter(r, -np.inf), fmt)
    return r - down, r + q


@pytest.mark.parametrize("fmt", FMTS, ids=lambda f: f.name)
@given(x=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e38, max_value=1e38))
def test_round_is_nearest(fmt, x):
    r = float(round_to_format(x, fmt))
    assert round_mpf(mpmath.mpf(x), fmt) == r
    if not math.isfinite(r):
        assert abs(x) >= fmt.max_finite
        return
    lo, hi = _neighbours(r, fmt)
    err = abs(mpmath.mpf(x) - r)
    for n in (lo, hi):
        if abs(n) <= fmt.max_finite:
            assert err <= abs(mpmath.mpf(x) - n)


def test_ulp_at_boundaries():
    assert ulp(1.0, FP16) == 2.0**-10 and ulp(-1.0, FP16) == 2.0**-10
    assert ulp(2.0**-14, FP16) == 2.0**-24  # smallest normal
    assert ulp(2.0**-20, FP16) == 2.0**-24  # subnormal spacing
    assert ulp(0.0, FP16) == 2.0**-24 and ulp(0.0, FP32) == 2.0**-149
    assert ulp(65504.0, FP16) == 32.0
    assert ulp(np.inf, FP16) == 32.0
    assert ulp(1.0, FP32) == 2.0**-23 and ulp(1.0, BF16) == 2.0**-7
    # a double-double just below a power of two lives in the binade below
    assert ulp(1.0, FP16, lo=-(2.0**-60)) == 2.0**-11
    assert ulp(1.0, FP16, lo=2.0**-60) == 2.0**-10


def test_ordered_int_exhaustive_fp16():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    vals = bits.view(np.float16).astype(np.float64)
    vals = vals[~np.isnan(vals)]
    vals = np.unique(vals)  # sorted; -0 and +0 collapse
    o = ordered_int(vals, FP16)
    assert np.all(np.diff(o) == 1)  # consecutive representable values are one step apart
    assert ordered_int(np.array([-0.0, 0.0]), FP16).tolist() == [0, 0]


def test_ulp_distance_cases():
    assert ulp_distance(65504.0, np.inf, FP16) == 1
    assert ulp_distance(FP32.min_subnormal, -FP32.min_subnormal, FP32) == 2
    assert ulp_distance(1.0, 1.0 + 2.0**-7, BF16) == 1
    assert ulp_distance(1.0, np.nextafter(np.float32(1), np.float32(2)), FP32) == 1
    with pytest.raises(ValueError, match="not representable"):
        ordered_int(np.array([1 + 2.0**-12]), FP16)
