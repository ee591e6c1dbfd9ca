"""Properties of kernels of a ragged layout (varlen, paged, split-KV merge; docs/properties.md,
"Ragged layouts"), on cases drawn by :func:`flashcheck.strategies.ragged_cases`.

- Accuracy per sequence: the kernel runs once on the batch, each sequence is judged against
  the oracle and its bounds as the dense case it is, and the worst sequence decides (a merge:
  against the merge oracle and its bounds). The failure names the bug class where the
  output's pattern points at one.
- Gradients per sequence (varlen kernels with a backward): each sequence's dQ, dK, dV against
  the gradient oracle and bounds as the dense gradient check judges them, and exact zeros for
  a sequence with no query rows or no keys.
- Sequence independence: a sequence's bits do not change when every other sequence's inputs
  are drawn again.
- Page independence (paged): moving the pages in the pool, and 0 instead of NaN in the slots
  no sequence owns, change no bit.
- Batch invariance: each sequence alone and inside the batch, bitwise; measured for every
  kernel and a failure only for a kernel declared ``batch_invariant=True``.

The checks are the report campaign's (:mod:`flashcheck.harness.checks.ragged`,
:mod:`~flashcheck.harness.checks.ragged_gradients`,
:mod:`flashcheck.harness.checks.ragged_properties`), so a case the suite saves replays with
``flashcheck replay`` as a campaign's does. A draw a property finds nothing to compare on (a
kernel that does not reproduce its own bits, a batch of one) is rejected, never a pass.
"""

import math

import pytest
from hypothesis import assume, given, reject, settings, target
from hypothesis import strategies as st

from flashcheck.harness.adapters.ragged_call import ragged_supports
from flashcheck.harness.checks.batch_invariance import NOT_BATCH_INVARIANT, NOT_GATED
from flashcheck.harness.checks.ragged import check_ragged_case, format_ragged_check
from flashcheck.harness.checks.ragged_diagnosis import diagnose_ragged
from flashcheck.harness.checks.ragged_gradients import (
    check_varlen_gradients,
    varlen_backward_supports,
)
from flashcheck.harness.checks.ragged_properties import RAGGED_PROPERTIES
from flashcheck.harness.core.status import Status
from flashcheck.properties.assertions import fail
from flashcheck.properties.plugin import note_measurement, profile_name
from flashcheck.properties.ragged_strategies import ragged_cases
from flashcheck.properties.support import run_or_fail, slow_ok

pytestmark = pytest.mark.layouts("varlen", "paged", "combine")

# The longest drawn sequence per profile (the campaign's own family cases ride along, up to
# 517 keys); every other profile (ci, dev) draws up to 65: 16-row block edges up to 4 blocks.
MAX_LEN = {"thorough": 257, "sweep": 513}


def _examples(share: int) -> settings:
    """``1/share`` of the profile's examples (at least 4): each ragged example is a whole batch
    of sequences, each judged by the oracle."""
    return settings(slow_ok(), max_examples=max(4, settings.default.max_examples // share))


def _draw(kern, dtype, dev, data, *, batch: bool = False):
    case = data.draw(ragged_cases(kern, dtype=dtype, max_len=MAX_LEN.get(profile_name(), 65)))
    assume(ragged_supports(kern, case) is None)
    if batch:
        assume(case.sequences > 1)  # a batch of one has no other sequence to compare with
    return case


@pytest.mark.slow
@_examples(4)
@given(data=st.data())
def test_ragged_error_within_bounds_per_sequence(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    case = _draw(kern, dtype, dev, data)
    res = run_or_fail(
        kern, case, dev, "accuracy", lambda: check_ragged_case(kern, case, device=dev)
    )
    utils = [r.verdict.det_util for r in res.sequences if r is not None]
    utils += [] if res.merge is None else [res.merge.det_util]
    worst = max((u for u in utils if not math.isnan(u)), default=0.0)
    target(min(worst, 1e6), label=f"det-bound utilization {kern.name} {dtype}")
    if not res.passed:
        res.diagnosis = found = diagnose_ragged(res, kern)  # (printed under its sequence)
        text = "\n" + format_ragged_check(res)
        summary = "; ".join([*found[:1], *res.reasons[:1]]) or str(res.verdict)
        fail(case, kern.name, dev, "accuracy", text, res.as_dict(), summary=summary)


@pytest.mark.slow
@pytest.mark.layouts("varlen")
@_examples(8)
@given(data=st.data())
def test_ragged_gradients_within_bounds_per_sequence(
    flashcheck_kernel, flashcheck_dtype, flashcheck_device, data
):
    kern, dtype, dev = flashcheck_kernel, flashcheck_dtype, flashcheck_device
    if kern.backward is None:
        pytest.skip(f"{kern.name} declares no backward (its contract)")
    case = _draw(kern, dtype, dev, data)
    assume(varlen_backward_supports(kern, case) is None)
    res = run_or_fail(
        kern, case, dev, "gradients", lambda: check_varlen_gradients(kern, case, device=dev)
    )
    if not res.passed:
        summary = res.reasons[0] if res.reasons else str(res.verdict)
        fail(case, kern.name, dev, "gradients", f"\n{res}", res.as_dict(), summary=summary)


def _property(name, kern, dtype, dev, data, *, measured: str | None = None):
    """Draw a batch, run property ``name`` on it; fail with the saved case where it fails
    (``measured``: the measurement a failure records first)."""
    case = _draw(kern, dtype, dev, data, batch=True)
    prop = RAGGED_PROPERTIES[name]
    # seed 0: the seed `flashcheck replay` runs a saved case's property with.
    res = run_or_fail(kern, case, dev, name, lambda: prop(kern, case, dev, seed=0))
    if res.status is Status.NOT_APPLICABLE:
        reject()  # nothing was compared on this draw: not a pass
    if res.status is Status.FAIL:
        if measured is not None:
            note_measurement(kern.name, dtype, measured, "no, though declared (the failure)")
        # No accuracy verdict to record: the replay runs the property again and compares.
        fail(case, kern.name, dev, name, res.message, None)
    return case, res


@pytest.mark.layouts("varlen", "paged")
@_examples(8)
@given(data=st.data())
def test_ragged_sequence_independence(flashcheck_kernel, flashcheck_dtype, flashcheck_device, data):
    _property("sequence-independence", flashcheck_kernel, flashcheck_dtype, flashcheck_device, data)


@pytest.mark.layouts("paged")
@_examples(8)
@given(data=st.data())
def test_ragged_page_independence(flashcheck_kernel, flashcheck_dtype, flashcheck_device, data):
    _property("page-independence", flashcheck_kernel, flashcheck_dtype, flashcheck_device, data)


@pytest.mark.layouts("varlen", "paged")
@_examples(8)
@given(data=st.data())
def test_ragged_batch_invariance(flashcheck_kernel, flashcheck_dtype, flashcheck_device, data):
    # Measured for every kernel; a failure only for a kernel that declares
    # batch_invariant=True. Otherwise the terminal summary reports what differed.
    kern, dtype, what = flashcheck_kernel, flashcheck_dtype, "batch-invariant"
    name = "batch-invariance"
    case, res = _property(name, kern, dtype, flashcheck_device, data, measured=what)
    varies = res.message.startswith(NOT_BATCH_INVARIANT)
    finding = f"{NOT_GATED}{res.message.removeprefix(NOT_BATCH_INVARIANT)}; {case.describe()}"
    note_measurement(kern.name, dtype, what, finding if varies else None)
