"""Accuracy of every built-in kernel against the oracle and its bounds (SPEC 3.4).

One property covers, per case: error ≤ deterministic bound (else FAIL-HARD); error ≤
max(2 × same-precision naive error + 1 floored ulp, probabilistic bound) (else FAIL); no NaN/Inf
where the oracle has none; fully masked rows exactly ``O = 0``, ``LSE = −inf``; LSE within its
bounds. ``hypothesis.target`` steers the search toward each kernel's largest error.
"""

import math

import pytest
from hypothesis import assume, given, note, target
from hypothesis import strategies as st

from harness.assertions import fail
from harness.checking import check_case, format_check
from properties.support import adapter_or_skip, case_strategy, kernel_dtype_params


@pytest.mark.parametrize(("kernel", "dtype"), kernel_dtype_params())
@given(data=st.data())
def test_error_within_bounds_and_policy(kernel, dtype, data):
    adapter, dev = adapter_or_skip(kernel, dtype)
    case = data.draw(case_strategy(adapter, dtype), label="case")
    assume(adapter.supports(case, dev) is None)
    res = check_case(adapter, case, device=dev)
    v = res.verdict
    note(format_check(res))
    # Bounded transforms: log keeps one huge error from dominating the search.
    target(math.log2(1 + v.max_ulp), label=f"log2(1 + floored ulp) {kernel} {dtype}")
    if not math.isnan(v.det_util):
        target(min(v.det_util, 1e6), label=f"det-bound utilization {kernel} {dtype}")
    if v.verdict != "PASS":
        fail(case, kernel, dev, "accuracy", "\n" + format_check(res), v.as_dict())
