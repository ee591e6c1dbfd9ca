import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flashcheck.harness.adapters.adapter import score_magnitude
from flashcheck.properties.strategies import FAMILIES, Recipe, make_case, recipes


@settings(max_examples=80)
@given(rec=st.sampled_from(["fp16", "bf16", "fp32"]).flatmap(lambda dt: recipes(dtype=dt)))
def test_recipes_build_valid_cases(rec):
    case = make_case(rec)
    assert case.dtype == rec.dtype
    assert case.shape == (rec.b, rec.hq, rec.hk, rec.nq, rec.nk, rec.d, rec.dv)
    again = make_case(rec)
    for name in ("q", "k", "v"):
        assert np.array_equal(case.bits(name), again.bits(name))  # deterministic in the recipe
    if rec.family != "nonfinite":
        assert all(np.isfinite(getattr(case, n).astype(np.float64)).all() for n in "qkv")


@settings(max_examples=40)
@given(rec=recipes(dtype="fp16", families=("huge_logits", "spike", "one_hot"), score_limit=65504.0))
def test_score_limit_is_respected(rec):
    assert score_magnitude(make_case(rec)) < 65504


def _r(family, **kw):
    base = dict(dtype="fp32", family=family, b=1, hq=1, hk=1, nq=4, nk=64, d=16, dv=4, seed=1)
    base.update(kw)
    return make_case(Recipe(**base))


def test_families_have_their_structure():
    q, k = _r("monotone", magnitude=30.0).q[0, 0].astype(float), _r("monotone", magnitude=30.0).k
    s = q @ k[0, 0].astype(float).T / 4
    assert (np.diff(s, axis=1) > 0).mean() > 0.95  # running max grows at (almost) every key
    c = _r("nonfinite")
    assert not all(np.isfinite(getattr(c, n).astype(float)).all() for n in "qkv")
    c = _r("huge_logits", magnitude=1e6)
    assert 1e5 < score_magnitude(c) < 2e6
    c = _r("uniform")
    assert (c.k[0, 0] == c.k[0, 0, :1]).all()
    c = _r("subnormal", dtype="fp16")
    assert np.abs(c.v.astype(float)).max() < 2e-3
    c = _r("exact_ties")
    rows = {tuple(r) for r in c.k[0, 0].astype(float)}
    assert len(rows) < 64
    assert set(FAMILIES) >= {"randn", "sink", "cancel_v", "fa3_outliers", "near_ties"}
