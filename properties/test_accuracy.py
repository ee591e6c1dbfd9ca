"""Accuracy of the kernel under test against the oracle and its bounds (docs/error-bounds.md §8).

One property covers, per case: error ≤ deterministic bound (else FAIL-HARD); error ≤
max(2 × same-precision naive error + 1 floored ulp, probabilistic bound) (else FAIL); no NaN/Inf
where the oracle has none; fully masked rows exactly ``O = 0``, ``LSE = −inf``; LSE within its
bounds. Kernels of unknown arithmetic are held to the loosest bound of every known class.
``hypothesis.target`` steers the search toward the kernel's largest error.
"""

import math

import pytest
from hypothesis import assume, given, target
from hypothesis import strategies as st

from flashcheck.harness.checks.accuracy import check_case, format_check
from flashcheck.properties.assertions import fail
from flashcheck.properties.support import case_strategy, run_or_fail, slow_ok


@pytest.mark.slow
@slow_ok()
@given(data=st.data())
def test_error_within_bounds_and_policy(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    case = data.draw(case_strategy(kern, dtype), label="case")
    assume(kern.supports(case, dev) is None)
    out = run_or_fail(kern, case, dev, "accuracy", lambda: kern.run(case, dev))
    res = check_case(kern, case, device=dev, output=out)
    v = res.verdict
    # Bounded transforms: log keeps one huge error from dominating the search.
    worst = v.max_ulp if math.isfinite(v.max_ulp) else 2.0**60  # NaN/Inf where finite: worst
    target(math.log2(1 + worst), label=f"log2(1 + floored ulp) {kern.name} {dtype}")
    if not math.isnan(v.det_util):
        target(min(v.det_util, 1e6), label=f"det-bound utilization {kern.name} {dtype}")
    if v.verdict != "PASS":
        fail(case, kern.name, dev, "accuracy", "\n" + format_check(res), v.as_dict(), result=res)
