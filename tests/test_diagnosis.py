"""A failing output is diagnosed: the common mistake it matches within the kernel's bound is
named in its reasons (kernels written outside the package, tests/user/user_kernels.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.core.semantics import make_problem
from flashcheck.harness.judging.diagnosis import CONSISTENT, diagnose

HERE = Path(__file__).parent / "user"


@pytest.fixture(scope="module")
def uk():
    sys.path.insert(0, str(HERE))
    try:
        import user_kernels

        yield user_kernels
    finally:
        sys.path.remove(str(HERE))


def _case(**kw):
    r = Recipe("fp16", "randn", 1, 2, 2, kw.pop("nq", 24), kw.pop("nk", 16), 16, 16, seed=0, **kw)
    return make_case(r)


@pytest.mark.parametrize(
    ("name", "options", "cause"),
    [
        ("top_left_causal", {"causal": True}, "a causal mask aligned top-left"),
        ("forgets_default_scale", {}, "the scale left out (scale 1)"),
    ],
)
def test_outside_kernels_get_the_cause_named(uk, name, options, cause):
    res = flashcheck.check(getattr(uk, name), _case(**options), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    named = [r for r in res.verdict.reasons if r.startswith(CONSISTENT)]
    assert named and named[0].startswith(CONSISTENT + cause), res.verdict.reasons


def test_a_correct_or_unrelated_failure_names_no_cause(uk):
    case = _case(causal=True)
    ok = flashcheck.check(uk.textbook, case, save="never")
    assert ok.passed and not ok.verdict.diagnosis
    p = make_problem(case.q, case.k, case.v, causal=True)
    noise = flashcheck.oracle(case.q, case.k, case.v, causal=True).o.hi + 0.05
    assert diagnose(p, noise, noise - 0.05, np.full_like(noise, 1e-3)) == []
