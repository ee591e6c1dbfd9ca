"""Soft-capping and sinks through the public checks, on kernels written outside the package
(tests/user/user_softcap.py): each real bug class fails with a reason, the correct kernels pass,
the options reach a kernel only through its signature, and a saved case replays them exactly."""

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

import flashcheck
from flashcheck.harness.adapters.declare import accepted_options
from flashcheck.harness.cases.store import load_case

pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
sys.path.insert(0, str(Path(__file__).parent / "user"))
import user_softcap as user

SINKS = np.array([2.0, -1.5], np.float32)


def _inputs(dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    # scores of several times the cap (FlashAttention's tests scale q for the same reason)
    q = (rng.standard_normal((1, 2, 6, 8)) * 3).astype(dtype)
    k = (rng.standard_normal((1, 2, 7, 8)) * 3).astype(dtype)
    v = rng.standard_normal((1, 2, 7, 8)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "opts", [{"softcap": 2.0}, {"sinks": SINKS}, {"softcap": 2.0, "sinks": SINKS}]
)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_the_correct_kernel_passes(opts, dtype):
    res = flashcheck.check(user.correct, *_inputs(dtype), causal=True, save="never", **opts)
    assert res.passed, res.verdict.reasons


@pytest.mark.parametrize(
    "bug,opts",
    [
        ("cap_unscaled", {"softcap": 2.0}),
        ("cap_ignored", {"softcap": 2.0}),
        ("sink_scaled", {"sinks": SINKS}),
    ],
)
def test_each_forward_bug_fails_with_a_reason(bug, opts):
    res = flashcheck.check(getattr(user, bug), *_inputs(), causal=True, save="never", **opts)
    assert res.verdict.verdict == "FAIL-HARD", bug
    assert any("exceed the deterministic bound" in r for r in res.verdict.reasons)


def test_a_kernel_that_does_not_name_an_option_is_told_so():
    def plain(q, k, v, *, causal=False, scale=None):
        return user.correct(q, k, v, causal=causal, scale=scale)

    assert "softcap" not in accepted_options(plain)
    assert {"softcap", "sinks"} <= accepted_options(user.correct)
    with pytest.raises(ValueError, match=r"needs \['softcap'\]"):
        flashcheck.check(plain, *_inputs(), softcap=2.0, save="never")

    def kw_only(q, k, v, **kw):
        return plain(q, k, v)

    # **kwargs is not taken to mean the softmax options, unless declared; the error says how
    assert "sinks" not in accepted_options(kw_only)
    with pytest.raises(ValueError, match=r"given them only when declared: flashcheck.kernel"):
        flashcheck.check(kw_only, *_inputs(), sinks=SINKS, save="never")
    declared = flashcheck.kernel(kw_only, options=("causal", "scale", "sinks"))
    res = flashcheck.check(declared, *_inputs(), sinks=SINKS, save="never")
    assert res.verdict.verdict == "FAIL-HARD"  # it ignores the sinks it declared


def test_a_saved_case_carries_both_options(tmp_path):
    res = flashcheck.check(
        user.cap_ignored, *_inputs(), softcap=2.5, sinks=SINKS, save="always", case_dir=tmp_path
    )
    case, record = load_case(res.case_id, tmp_path)
    assert case.softcap == 2.5 and case.sinks.dtype == np.float32
    np.testing.assert_array_equal(case.sinks, SINKS)
    assert record["options"]["softcap"] == 2.5
    again = flashcheck.check(user.cap_ignored, case, save="never")
    np.testing.assert_array_equal(again.output.o, res.output.o)
    assert again.verdict.verdict == res.verdict.verdict == "FAIL-HARD"
    assert "softcap=2.5" in case.describe() and "sinks=" in case.describe()


@pytest.mark.parametrize(
    "opts", [{"softcap": 2.0}, {"sinks": SINKS}, {"softcap": 2.0, "sinks": SINKS}]
)
@pytest.mark.parametrize("how", ["autograd", "manual"])
def test_correct_gradients_pass_dsinks_included(opts, how):
    kern = (
        flashcheck.kernel(user.correct, backward="autograd") if how == "autograd" else user.manual
    )
    res = flashcheck.check_gradients(kern, *_inputs(), causal=True, save="never", **opts)
    assert res.passed, res.reasons
    assert ("dsinks" in res.verdicts) == ("sinks" in opts)
    if "sinks" in opts:
        assert res.grads.dsinks.shape == (2,)


def test_a_sink_gradient_with_the_wrong_sign_fails_and_names_dsigma():
    res = flashcheck.check_gradients(user.sink_grad_sign, *_inputs(), sinks=SINKS, save="never")
    assert res.verdict == "FAIL-HARD"
    assert res.verdicts["dsinks"].verdict == "FAIL-HARD"
    assert all(res.verdicts[n].verdict == "PASS" for n in ("dq", "dk", "dv"))
    assert any(r.startswith("FAIL-HARD") and "dσ" in r for r in res.reasons)


def test_the_cap_on_the_unscaled_dot_product_fails_in_the_gradients_too():
    kern = flashcheck.kernel(user.cap_unscaled, backward="autograd")
    res = flashcheck.check_gradients(kern, *_inputs(), softcap=2.0, save="never")
    assert res.verdict == "FAIL-HARD"
    assert any("dQ elements exceed the deterministic bound" in r for r in res.reasons)


def test_probing_records_the_options_a_kernel_runs_with():
    from flashcheck.harness.adapters.probe import resolved

    def refuses_sinks(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
        if sinks is not None:
            raise NotImplementedError("sinks are not implemented")
        return user.correct(q, k, v, causal=causal, scale=scale, softcap=softcap)

    got = resolved(flashcheck.kernel(refuses_sinks), device="cpu")
    assert "softcap" in got.options and "sinks" not in got.options
    case = flashcheck.Case.from_arrays(*_inputs(), sinks=SINKS)
    assert "sinks" in got.supports(case)


def test_flashcheck_replay_reruns_a_saved_case_with_its_options(tmp_path, monkeypatch):
    from flashcheck.harness.checks.replay import replay

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "user"))
    res = flashcheck.check(
        "user_softcap:sink_scaled", *_inputs(), sinks=SINKS, save="always", case_dir=tmp_path
    )
    assert res.verdict.verdict == "FAIL-HARD"
    again, verdict, record = replay(res.case_id, directory=tmp_path, echo=lambda *a: None)
    assert verdict == "FAIL-HARD" and record["options"]["sinks"] == [2.0, -1.5]
    np.testing.assert_array_equal(again.output.o, res.output.o)
    # the same case on the correct kernel passes: the options reached the kernel and the oracle
    fixed = replay(res.case_id, directory=tmp_path, kernel="user_softcap:correct", echo=print)
    assert fixed[1] == "PASS"


_OPTION_CASES = flashcheck.strategies.attention_cases(
    user.correct, dtype="fp16", max_len=12, max_work=256, softmax_options=True
)


@settings(max_examples=8, deadline=None, database=None, derandomize=True)
@given(case=_OPTION_CASES)
def test_the_correct_kernel_passes_on_drawn_option_cases(case):
    assert case.softcap is not None or case.sinks is not None
    res = flashcheck.check(user.correct, case, save="never")
    assert res.passed, (case.describe(), res.verdict.reasons)


def test_drawn_option_cases_find_the_ignored_cap():
    from hypothesis import find

    def fails(case):
        return not flashcheck.check(user.cap_ignored, case, save="never").passed

    settings_ = settings(max_examples=40, database=None, derandomize=True, deadline=None)
    case = find(_OPTION_CASES, fails, settings=settings_)
    assert case.softcap is not None


def test_a_kwargs_kernel_is_handed_only_the_options_a_case_sets():
    # A user's **kwargs kernel forwarded its keywords to a function without `window` and
    # raised on every call when handed window=None; so did the declaration the error above
    # suggests, which names window and mask.
    def inner(q, k, v, *, causal=False, scale=None):
        return user.correct(q, k, v, causal=causal, scale=scale)

    def fwd(q, k, v, **kw):
        return inner(q, k, v, **kw)

    assert flashcheck.check(fwd, *_inputs(), causal=True, save="never").passed
    declared = flashcheck.kernel(fwd, options=("causal", "mask", "scale", "softcap", "window"))
    assert flashcheck.check(declared, *_inputs(), scale=0.3, save="never").passed


def test_softmax_options_need_a_kernel_that_takes_them():
    def plain(q, k, v, *, causal=False):
        return user.correct(q, k, v, causal=causal)

    strat = flashcheck.strategies.attention_cases(plain, dtype="fp16", softmax_options=True)
    with pytest.raises(ValueError, match="takes softcap or sinks"):
        find_one(strat)


def find_one(strategy):
    from hypothesis import find

    return find(strategy, lambda _: True, settings=settings(database=None, max_examples=1))


def test_assert_attention_takes_both_options(tmp_path):
    flashcheck.assert_attention(user.correct, *_inputs(), softcap=2.0, sinks=SINKS)
    with pytest.raises(AssertionError, match="FAIL-HARD"):
        flashcheck.assert_attention(user.sink_scaled, *_inputs(), sinks=SINKS, case_dir=tmp_path)


@pytest.mark.parametrize(
    "name,opts,want",
    [
        ("correct", {"softcap": 1.0, "sinks": SINKS}, "PASS"),
        ("cap_ignored", {"softcap": 1.0}, "FAIL"),
        ("cap_ignored", {"softcap": 1.0, "sinks": SINKS}, "FAIL"),
    ],
)
def test_the_options_applied_property_covers_both(name, opts, want):
    from flashcheck.harness.adapters.registry import as_kernel
    from flashcheck.harness.checks.structural import options_applied

    case = flashcheck.Case.from_arrays(*_inputs(), **opts)
    res = options_applied(as_kernel(getattr(user, name)), case, "cpu")
    assert res.status == want, res.message
    if want == "FAIL":
        assert "softcap=1.0 did not change the output" in res.message


def test_a_kernel_that_ignores_its_sinks_fails_options_applied():
    from flashcheck.harness.adapters.registry import as_kernel
    from flashcheck.harness.checks.structural import options_applied

    def sinks_ignored(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
        return user.correct(q, k, v, causal=causal, scale=scale, softcap=softcap)

    case = flashcheck.Case.from_arrays(*_inputs(), sinks=np.array([3.0, 2.5], np.float32))
    res = options_applied(as_kernel(sinks_ignored), case, "cpu")
    assert res.status == "FAIL" and res.message.startswith("sinks did not change")
