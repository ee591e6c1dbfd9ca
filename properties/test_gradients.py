"""Gradients of the kernel under test, for kernels that declare a backward (docs/properties.md).

- accuracy of dQ, dK and dV against the oracle's exact gradients: each within its
  deterministic bound (else FAIL-HARD), within max(2 × the naive backward's error + 1 floored
  ulp, probabilistic bound) (else FAIL), and never NaN/Inf where the exact gradient is finite;
  also on a soft-capped case with sinks, for kernels that take them (dσ judged too);
- fixed cases where backward bugs live: rows that keep no key (causal with Nq > Nk), lengths
  off every power-of-two block grid, grouped-query heads (dK, dV summed over a group) and 1024
  keys (error that grows with length);
- determinism of the backward: bitwise for a kernel declared deterministic, else within twice
  the gradient bound;
- the same gradients whatever the memory layout of dO (strided, expanded with stride 0);
- inputs and dO left intact, returned gradients not overwritten by the next call;
- conformance of a flash-class backward to its declared roundings within one block.

A kernel without a backward is skipped with that reason.
"""

import math
from dataclasses import replace

import pytest
from hypothesis import assume, given, reject, target
from hypothesis import strategies as st

from flashcheck.harness.campaign.fitting import fit_recipe
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.cases.softmax_families import with_softmax_options
from flashcheck.harness.checks.accuracy import check_gradients_case, format_gradient_check
from flashcheck.harness.checks.conformance import NO_LSE
from flashcheck.harness.checks.do_layouts import LAYOUT_BITS
from flashcheck.harness.checks.registry import GRADIENT_CHECKS
from flashcheck.harness.checks.structural import ONE_BLOCK
from flashcheck.harness.core.status import Status
from flashcheck.properties.assertions import fail
from flashcheck.properties.plugin import note_measurement
from flashcheck.properties.strategies import FAMILIES, softmax_options_taken
from flashcheck.properties.support import (
    case_strategy,
    fewer,
    no_softmax_options,
    no_target_phase_in_ci,
    run_or_fail,
)

# Every example calls the gradient oracle (10-30 s per kernel and dtype under the ci profile).
# Dense (B, H, N, d) inputs: on a kernel of another layout each is skipped, saying why.
pytestmark = [pytest.mark.slow, pytest.mark.layouts("dense")]

FINITE = tuple(f for f in FAMILIES if f != "nonfinite")


def _needs_backward(kern):
    if kern.backward is None:
        pytest.skip(f"{kern.name} declares no backward (flashcheck.kernel(..., backward=...))")


def _judge(kern, case, dev, prop="gradients"):
    res = run_or_fail(kern, case, dev, prop, lambda: check_gradients_case(kern, case, device=dev))
    if res.verdict != "PASS":
        summary = res.reasons[0] if res.reasons else str(res.verdict)
        message = "\n" + format_gradient_check(res)
        fail(case, kern.name, dev, prop, message, res.as_dict(), summary=summary)
    return res


@no_target_phase_in_ci()
@given(data=st.data())
def test_gradients_within_bounds_and_policy(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    # Non-finite inputs give NaN gradients by the oracle's NaN rule; the accuracy of finite
    # gradients is what is judged here.
    case = data.draw(case_strategy(kern, dtype, families=FINITE), label="case")
    assume(kern.backward_supports(case, dev) is None)
    res = _judge(kern, case, dev)
    worst = max(v.max_ulp for v in res.verdicts.values())
    target(
        math.log2(1 + (worst if math.isfinite(worst) else 2.0**60)),
        label=f"log2(1 + floored ulp) of gradients {kern.name} {dtype}",
    )


def _fixed_cases(kern, dtype):
    """Masked rows, off-grid lengths and GQA, each inside the kernel's contract (or skipped)."""
    m = kern.seq_multiple
    d = 16 if kern.head_dims is None else kern.head_dims[0]
    if m == 1:
        # causal, Nq > Nk, bottom-right aligned: the first Nq − Nk rows keep no key
        masked = (41, 16)
        # 17 and 129 sit just past the 16-, 32-, 64- and 128-wide block edges
        off_grid = (17, 129)
        square = 33
    else:
        masked, off_grid, square = (2 * m, m), (m, 3 * m), 2 * m
    # Error that grows with the number of keys (dV and dK sum over rows, dQ over keys) shows
    # past a thousand keys; the drawn cases stay short. Fitted to the contract (a kernel that
    # needs Nq = Nk gets 1024 rows), not to a compiling kernel's palette.
    long = Recipe(dtype, "randn", 1, 2, 2, 32, 1024, d, d, seed=4)
    return {
        "masked-rows": Recipe(dtype, "randn", 1, 2, 2, *masked, d, d, seed=1, causal=True),
        "off-grid": Recipe(dtype, "randn", 1, 2, 2, *off_grid, d, d, seed=2),
        "gqa": Recipe(dtype, "randn", 2, 4, 2, square, square, d, d, seed=3),
        "1024-keys": fit_recipe(long, replace(kern, compile_keys=())),
    }


@pytest.mark.parametrize("which", ["masked-rows", "off-grid", "gqa", "1024-keys"])
def test_gradients_on_the_cases_backward_bugs_live_in(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, which
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    case = make_case(_fixed_cases(kern, dtype)[which])
    why = kern.backward_supports(case, dev)
    if why is not None:
        pytest.skip(f"the {which} case is outside {kern.name}'s contract: {why}")
    _judge(kern, case, dev)


def test_gradients_with_softcap_and_sinks(flashcheck_kernel, flashcheck_dtype, flashcheck_device):
    # One fixed case with the options the kernel takes: a cap at 0.3 of the largest score (tanh
    # far from linear, so a backward without the slope 1 − tanh² misses by a factor ~2 there)
    # and a sink level with each head's largest score (dσ large; a wrong sign shows). Fixed,
    # not drawn: the few examples CI could afford start with shapes too small to show either
    # (one key: dS = 0 whatever the slope).
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    if (why := no_softmax_options(kern)) is not None:
        pytest.skip(why)
    takes = softmax_options_taken(kern)
    d = 16 if kern.head_dims is None else kern.head_dims[0]
    recipe = fit_recipe(Recipe(dtype, "randn", 1, 2, 2, 33, 33, d, d, seed=5), kern)
    case = with_softmax_options(
        make_case(recipe),
        cap_factor=0.3 if "softcap" in takes else None,
        sink_offset=0.0 if "sinks" in takes else None,
    )
    why = kern.backward_supports(case, dev)
    if why is not None:
        pytest.skip(f"the soft-capped case is outside {kern.name}'s contract: {why}")
    _judge(kern, case, dev)


@fewer(5, share=8)  # (5 under ci: a nondeterministic sum shows on almost any case)
@given(data=st.data())
def test_backward_is_deterministic_or_within_its_bound(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    case = data.draw(case_strategy(kern, dtype, families=FINITE), label="case")
    assume(kern.backward_supports(case, dev) is None)
    _structural("gradient-determinism", kern, case, dev)


@fewer(5)
@given(data=st.data())
def test_backward_leaves_its_inputs_and_returned_gradients_intact(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # q, k, v, dO and the mask bitwise unchanged by the backward; its dQ, dK, dV bitwise
    # unchanged by the next backward call (flashcheck.harness.checks.integrity).
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    case = data.draw(case_strategy(kern, dtype), label="case")
    assume(kern.backward_supports(case, dev) is None)
    _structural("gradient-integrity", kern, case, dev)


@fewer(5, share=8)  # (5 under ci: a stride bug reads NaN padding on almost any case)
@given(data=st.data())
def test_backward_gives_the_same_gradients_whatever_the_layout_of_do(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # dO handed over as a strided view into a NaN-filled buffer and as one row expanded with
    # stride 0 (autograd's gradient of O.sum()), against the same values contiguous.
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    case = data.draw(case_strategy(kern, dtype, families=FINITE), label="case")
    assume(kern.backward_supports(case, dev) is None)
    _structural("gradient-do-layouts", kern, case, dev)


_LAYOUT_BITS_NOTE = "gradient bits the same for every dO layout"


def _structural(name, kern, case, dev):
    check = GRADIENT_CHECKS[name]
    layouts = name == "gradient-do-layouts"
    try:
        res = run_or_fail(kern, case, dev, name, lambda: check(kern, case, dev))
    except BaseException:  # raised, hung, a wrong shape: the failure, not "yes" in the summary
        if layouts:
            note_measurement(kern.name, case.dtype, _LAYOUT_BITS_NOTE, "not known: it failed")
        raise
    if res.status is Status.NOT_APPLICABLE:
        reject()  # nothing was tested on this draw: not a pass
    if res.status is Status.FAIL:
        if layouts:
            note_measurement(kern.name, case.dtype, _LAYOUT_BITS_NOTE, "not known: it failed")
        verdict = {"verdict": "FAIL", "property": name, "message": res.message}
        fail(case, kern.name, dev, name, res.message, verdict)
    if layouts:
        # Bits that differ within the bounds pass (no kernel promises bits across layouts);
        # the terminal summary says so, as the report does.
        varies = res.message.startswith(LAYOUT_BITS)
        finding = f"no ({res.message.removeprefix(LAYOUT_BITS)}; {case.describe()})"
        note_measurement(kern.name, case.dtype, _LAYOUT_BITS_NOTE, finding if varies else None)


_LSE: dict = {}


def _returns_lse(kern, dtype, dev):
    """Whether the kernel's forward returns LSE, asked once on a small case of its contract."""
    key = (kern.name, dtype, dev)
    if key not in _LSE:
        _LSE[key] = _forward_lse(kern, dtype, dev)
    return _LSE[key]


def _forward_lse(kern, dtype, dev):
    m = kern.seq_multiple
    d = 16 if kern.head_dims is None else kern.head_dims[0]
    case = make_case(Recipe(dtype, "randn", 1, 1, 1, m, m, d, d, seed=0))
    out = run_or_fail(kern, case, dev, "gradient-conformance", lambda: kern.run(case, dev))
    return out.lse is not None


@fewer(10)
@given(data=st.data())
def test_flash_backward_matches_its_declared_arithmetic(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # Catches a backward *more* accurate than its declared class (dS kept in fp32, D from an
    # unrounded O), which no accuracy bound can see.
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    _needs_backward(kern)
    if kern.backward_arithmetic != "flash":
        pytest.skip(
            f"conformance applies to the flash backward class, not {kern.backward_arithmetic}"
        )
    if kern.seq_multiple > ONE_BLOCK:
        pytest.skip(
            f"needs one {ONE_BLOCK}-row block; lengths are multiples of {kern.seq_multiple}"
        )
    if not _returns_lse(kern, dtype, dev):
        pytest.skip(f"backward conformance is not applicable: {NO_LSE}")
    case = data.draw(
        case_strategy(kern, dtype, families=FINITE, max_len=ONE_BLOCK, masks=("causal", "window")),
        label="case",
    )
    assume(kern.backward_supports(case, dev) is None)
    _structural("gradient-conformance", kern, case, dev)
