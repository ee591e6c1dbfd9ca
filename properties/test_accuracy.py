"""Accuracy of the kernel under test against the oracle and its bounds (docs/error-bounds.md §8).

One property covers, per case: error ≤ deterministic bound (else FAIL-HARD); error ≤
max(2 × same-precision naive error + 1 floored ulp, probabilistic bound) (else FAIL); no NaN/Inf
where the oracle has none; fully masked rows exactly ``O = 0``, ``LSE = −inf``; LSE within its
bounds. Kernels of unknown arithmetic are held to the loosest bound of every known class.
``hypothesis.target`` steers the search toward the kernel's largest error.

The drawn cases stay short (lengths up to 129 under the ci profile); error that grows with the
number of keys (an accumulator in the input format, a sum without compensation) shows only
past a thousand keys, so two fixed cases with 2048 keys (32 query rows, the sample judged;
all of them for a kernel that needs Nq = Nk) run on every kernel and dtype as well.
"""

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, target
from hypothesis import strategies as st

from flashcheck.harness.campaign.fitting import fit_recipe
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.checks.accuracy import check_case, format_check
from flashcheck.properties.assertions import fail
from flashcheck.properties.strategies import FAMILIES
from flashcheck.properties.support import (
    case_strategy,
    fewer,
    no_softmax_options,
    run_or_fail,
    slow_ok,
)

# Dense (B, H, N, d) inputs: on a kernel of another layout each is skipped, saying why.
pytestmark = pytest.mark.layouts("dense")

FINITE = tuple(f for f in FAMILIES if f != "nonfinite")


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


@pytest.mark.slow
@fewer(5, share=8)  # (5 examples under ci; the plain accuracy property above takes 40)
@given(data=st.data())
def test_error_within_bounds_with_softcap_and_sinks(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # The accuracy property on cases with a soft-cap, sinks or both (those the kernel takes):
    # a cap applied to the unscaled score, a sink multiplied by the scale or left out of LSE.
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    if (why := no_softmax_options(kern)) is not None:
        pytest.skip(why)
    strategy = case_strategy(kern, dtype, families=FINITE, softmax_options=True)
    case = data.draw(strategy, label="case")
    assume(kern.supports(case, dev) is None)
    out = run_or_fail(kern, case, dev, "accuracy", lambda: kern.run(case, dev))
    res = check_case(kern, case, device=dev, output=out)
    if res.verdict.verdict != "PASS":
        msg = "\n" + format_check(res)
        fail(case, kern.name, dev, "accuracy", msg, res.verdict.as_dict(), result=res)


@pytest.mark.parametrize("family", ["randn", "monotone"])
def test_error_within_bounds_and_policy_over_2048_keys(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, family
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    # Fitted to the contract, but not to a compiling kernel's palette: one more compile per
    # dtype is the price of looking at long sequences at all.
    recipe = fit_recipe(
        Recipe(dtype, family, 1, 2, 2, 32, 2048, 64, 64, seed=11), replace(kern, compile_keys=())
    )
    case = make_case(recipe)
    why = kern.supports(case, dev)
    if why is not None:
        pytest.skip(f"a 2048-key case is outside {kern.name}'s contract: {why}")
    out = run_or_fail(kern, case, dev, "accuracy", lambda: kern.run(case, dev))
    res = check_case(kern, case, device=dev, output=out)
    if res.verdict.verdict != "PASS":
        msg = "\n" + format_check(res)
        fail(case, kern.name, dev, "accuracy", msg, res.verdict.as_dict(), result=res)
