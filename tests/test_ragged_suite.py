"""The property suite on kernels of ragged layouts: the strategy ``ragged_cases`` draws inside a
kernel's layout and contract, and `flashcheck test` run as a user runs it on the kernels of
tests/user/user_layouts.py (the correct ones pass, each planted bug class fails with its bug
named and a replayable case file)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from flashcheck.harness.adapters.probe import resolved
from flashcheck.harness.adapters.ragged_call import ragged_supports
from flashcheck.harness.cases.ragged_variants import owned_slots
from flashcheck.strategies import attention_cases, ragged_cases

USER = Path(__file__).parent / "user"


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


def _drawn(kernel, n=40, **kw):
    seen = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(ragged_cases(kernel, **kw))
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_ragged_cases_cover_the_layouts_edges_inside_the_contract(user):
    varlen = _drawn(user.varlen_ok, dtype="bf16")
    kern = resolved(user.varlen_ok)
    assert all(c.layout == "varlen" and c.dtype == "bf16" for c in varlen)
    assert all(ragged_supports(kern, c) is None for c in varlen)
    lens = [c.lengths(b) for c in varlen for b in range(c.sequences)]
    assert any(nq == 0 for nq, _ in lens) and any(nk == 0 for _, nk in lens)
    assert {15, 16, 17} & {n for pair in lens for n in pair}
    assert any(c.sequences > 1 for c in varlen) and any(c.causal for c in varlen)
    # The first example is the one shrinking ends at: one short sequence.
    assert varlen[0].sequences == 1 and max(varlen[0].lengths(0)) <= 1

    paged = _drawn(user.paged_ok, n=100, dtype="fp16")
    assert {c.tensors["k_cache"].shape[1] for c in paged} >= {1, 7, 16}
    assert {c.tensors["q"].shape[1] for c in paged} >= {1, 8}
    assert any(c.tensors["q"].shape[2] > c.tensors["k_cache"].shape[2] for c in paged)  # GQA
    shared = [c for c in paged if c.family == "randn" and c.params.get("shared_pages")]
    assert shared
    for c in shared:
        t = c.index["block_table"]
        n = c.params["shared_pages"]
        assert (t[0, :n] == t[1, :n]).all()
    for c in paged:  # every slot no sequence reads is NaN
        free = ~owned_slots(c).any(axis=0)
        assert np.isnan(c.tensors["k_cache"][free].astype(np.float32)).all()

    merge = _drawn(user.combine_ok, dtype="fp32")
    lse = [c.tensors["lse_partial"] for c in merge]
    assert any(np.isneginf(x).any() and not np.isneginf(x).all() for x in lse)
    assert any(np.isneginf(x).all(axis=0).any() for x in lse)  # a row with every split empty


def test_ragged_cases_say_how_to_fix_a_wrong_call(user):
    with pytest.raises(ValueError, match="attention_cases"):
        _drawn(lambda q, k, v: q, n=1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        ragged_cases(user.varlen_ok, dtype="fp8")
    with pytest.raises(ValueError, match="max_batch is a positive int"):
        ragged_cases(user.varlen_ok, max_batch=0)
    assert attention_cases is not None  # exported side by side
