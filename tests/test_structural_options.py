"""The report's structural options-applied case with a soft-cap and sinks: a kernel that takes
either option and ignores it fails there (planted kernels), and kernels without the options get
the case without them."""

from dataclasses import replace

import pytest
from structural_helpers import naive_fn, planted

from flashcheck.harness.checks.registry import CHECKS
from flashcheck.harness.core.status import Status
from flashcheck.kernels.naive import naive_numpy

PASS, FAIL = Status.PASS, Status.FAIL


def _naive_options(q, k, v, *, causal=False, window=None, scale=None, softcap=None, sinks=None):
    return naive_numpy(
        q, k, v, causal=causal, window=window, scale=scale, softcap=softcap, sinks=sinks
    )


def ignores_softcap(q, k, v, *, causal=False, window=None, scale=None, softcap=None, sinks=None):
    """Takes ``softcap`` and drops it."""
    return _naive_options(q, k, v, causal=causal, window=window, scale=scale, sinks=sinks)


def ignores_sinks(q, k, v, *, causal=False, window=None, scale=None, softcap=None, sinks=None):
    """Takes ``sinks`` and drops them."""
    return _naive_options(q, k, v, causal=causal, window=window, scale=scale, softcap=softcap)


@pytest.mark.parametrize(
    ("fn", "label"), [(ignores_softcap, "softcap="), (ignores_sinks, "sinks")], ids=["cap", "sinks"]
)
def test_the_reports_options_case_catches_a_kernel_ignoring_a_softmax_option(fn, label):
    """The report's structural part sets a soft-cap and sinks in its options-applied case (for
    kernels that take them), so a kernel ignoring either fails there, not only through the
    accuracy of the options part."""
    from flashcheck.harness.campaign.fitting import fit_recipe
    from flashcheck.harness.campaign.plan import PRESETS, structural_items
    from flashcheck.harness.cases.families import make_case

    item = next(
        it
        for it in structural_items(PRESETS["smoke"], "fp16", 0)
        if it.tag.startswith("options-applied/")
    )
    bad = planted(
        fn, options=("causal", "window", "scale", "softcap", "sinks"), masks=("causal", "window")
    )
    good = replace(bad, fn=_naive_options)
    case = make_case(fit_recipe(item.recipe, bad))
    assert case.softcap is not None and case.sinks is not None
    found = CHECKS["options-applied"](bad, case, "cpu")
    assert found.status is FAIL and label in found.message, found
    assert CHECKS["options-applied"](good, case, "cpu").status is PASS
    # A kernel without the softmax options gets the case without them.
    plain = planted(naive_fn)
    fitted = make_case(fit_recipe(item.recipe, plain))
    assert fitted.softcap is None and fitted.sinks is None
