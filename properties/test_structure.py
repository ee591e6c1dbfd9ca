"""Structural properties (flashcheck.harness.checks): independence of batch and heads,
out-of-bounds safety, determinism, invariance under key permutation, the NaN rule, options
applied, integrity of inputs and results, conformance of flash-class kernels to their
declared arithmetic, and batch invariance (gated only where declared).

A kernel that does not promise bitwise determinism or batch invariance is compared with itself
within its error bound instead of bit for bit. A draw the check finds nothing to test on
(NOT-APPLICABLE) is rejected, never counted as a pass; the draws are made inside the space where
each check applies.
"""

import pytest
from hypothesis import assume, given, reject
from hypothesis import strategies as st

from flashcheck.harness.checks.batch_invariance import NOT_BATCH_INVARIANT, NOT_GATED
from flashcheck.harness.checks.registry import CHECKS
from flashcheck.harness.checks.structural import ONE_BLOCK
from flashcheck.harness.core.status import Status
from flashcheck.properties.assertions import fail
from flashcheck.properties.plugin import note_measurement
from flashcheck.properties.strategies import FAMILIES
from flashcheck.properties.support import (
    case_strategy,
    family_outside_contract,
    fewer,
    no_softmax_options,
    run_or_fail,
)

# Dense (B, H, N, d) inputs: on a kernel of another layout each is skipped, saying why.
pytestmark = pytest.mark.layouts("dense")

FINITE = tuple(f for f in FAMILIES if f != "nonfinite")


def _check(name, kern, dtype, dev, data, **kw):
    case = data.draw(case_strategy(kern, dtype, **kw), label="case")
    assume(kern.supports(case, dev) is None)
    res = run_or_fail(kern, case, dev, name, lambda: CHECKS[name](kern, case, dev))
    if res.status is Status.NOT_APPLICABLE:
        reject()  # nothing was tested on this draw: not a pass
    if res.status is Status.FAIL:
        verdict = {"verdict": "FAIL", "property": name, "message": res.message}
        fail(case, kern.name, dev, name, res.message, verdict)


@fewer(10)
@given(data=st.data())
def test_batch_and_head_independence(flashcheck_kernel, flashcheck_dtype, flashcheck_device, data):
    if not flashcheck_kernel.batched:
        pytest.skip("the kernel takes one (batch, head) slice per call (its contract)")
    _check(
        "batch-head-independence",
        flashcheck_kernel,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
        min_slices=2,
    )


@fewer(10)
@given(data=st.data())
def test_padded_buffers_give_the_same_output(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # Inputs inside NaN-filled buffers (non-contiguous views): any read outside the logical
    # tensor would change the result.
    _check(
        "padded-buffers",
        flashcheck_kernel,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
    )


@fewer(10)
@given(data=st.data())
def test_repeated_runs_agree(flashcheck_kernel, flashcheck_dtype, flashcheck_device, data):
    _check("determinism", flashcheck_kernel, flashcheck_dtype, flashcheck_device, data)


@fewer(10)
@given(data=st.data())
def test_key_permutation_changes_output_only_within_bounds(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # The permutation is drawn from the case's seed, so a replay permutes the same way.
    _check(
        "key-permutation",
        flashcheck_kernel,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
        masks=(),
    )


@fewer(15)
@given(data=st.data())
def test_nan_inputs_propagate_and_stay_contained(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # The NaN rule (docs/oracle.md §1): an output whose exact computation involves a NaN input
    # is NaN; outputs that involve only finite inputs stay finite (no leak across rows, heads
    # or batches).
    why = family_outside_contract(
        flashcheck_kernel, flashcheck_dtype, flashcheck_device, "nonfinite"
    )
    if why:
        pytest.skip(why)
    _check(
        "nan-rule",
        flashcheck_kernel,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=("nonfinite",),
    )


@fewer(20)
@given(data=st.data())
def test_flash_kernel_matches_its_declared_arithmetic(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # Catches kernels that are *more* accurate than declared (P not rounded), which the
    # accuracy bounds cannot see; see flashcheck.harness.checks.conformance.
    if flashcheck_kernel.arithmetic != "flash":
        pytest.skip(f"conformance applies to the flash class, not {flashcheck_kernel.arithmetic}")
    if flashcheck_kernel.seq_multiple > ONE_BLOCK:
        pytest.skip(
            f"needs keys within one {ONE_BLOCK}-key block; lengths are multiples of "
            f"{flashcheck_kernel.seq_multiple}"
        )
    _check(
        "conformance",
        flashcheck_kernel,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
        max_len=ONE_BLOCK,
        masks=("causal", "window"),
    )


@fewer(10)
@given(data=st.data())
def test_options_change_the_output_where_they_should(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # A kernel that ignores causal, window or scale is caught even where its error would be
    # small: the option must change the output wherever it changes the exact answer.
    kern = flashcheck_kernel
    if not (set(kern.masks) & {"causal", "window"}) and not (
        kern.options is None or "scale" in kern.options
    ):
        pytest.skip("the kernel takes none of causal, window, scale")
    # Every draw sets at least one option the kernel takes: a draw without one tests nothing.
    _check(
        "options-applied",
        kern,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
        with_option=True,
    )


# An eighth of the profile's examples (5 under ci): each costs two oracle calls per option.
@fewer(5, share=8)
@given(data=st.data())
def test_softcap_and_sinks_change_the_output_where_they_should(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # A kernel that takes softcap= or sinks= and ignores it, on cases where they bite: a cap
    # around or far below the scores, a sink among or above them.
    kern = flashcheck_kernel
    if (why := no_softmax_options(kern)) is not None:
        pytest.skip(why)
    _check(
        "options-applied",
        kern,
        flashcheck_dtype,
        flashcheck_device,
        data,
        families=FINITE,
        softmax_options=True,
    )


@fewer(10)
@given(data=st.data())
def test_inputs_and_returned_results_stay_intact(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # q, k, v and the mask bitwise unchanged by the call (NaN payloads included); the O and
    # LSE it returned bitwise unchanged by the next call on other inputs.
    _check("integrity", flashcheck_kernel, flashcheck_dtype, flashcheck_device, data)


@fewer(5)
@given(data=st.data())
def test_a_sequence_alone_and_inside_batches_gives_the_same_bits(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    # Measured for every kernel that takes several sequences per call; a failure only for a
    # kernel that declares batch_invariant=True. Otherwise the terminal summary reports it.
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    if not kern.batched:
        pytest.skip("the kernel takes one (batch, head) slice per call (its contract)")
    case = data.draw(case_strategy(kern, dtype, families=FINITE), label="case")
    assume(kern.supports(case, dev) is None)
    name = "batch-invariance"
    res = run_or_fail(kern, case, dev, name, lambda: CHECKS[name](kern, case, dev))
    if res.status is Status.FAIL:
        note_measurement(kern.name, dtype, "batch-invariant", "no, though declared (the failure)")
        fail(case, kern.name, dev, name, res.message, {"verdict": "FAIL", "message": res.message})
    varies = res.message.startswith(NOT_BATCH_INVARIANT)
    finding = f"{NOT_GATED}{res.message.removeprefix(NOT_BATCH_INVARIANT)}; {case.describe()}"
    note_measurement(kern.name, dtype, "batch-invariant", finding if varies else None)
