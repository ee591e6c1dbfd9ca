"""``flashcheck.assert_attention`` on a ragged case, and how Hypothesis prints a drawn case."""

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is a tox dependency; bare envs may lack it")

from hypothesis.vendor.pretty import pretty

from flashcheck import AttentionMismatch, assert_attention
from flashcheck.harness.cases.ragged_inputs import varlen_case
from flashcheck.harness.cases.ragged_store import load_ragged_case
from flashcheck.harness.checks.ragged import RaggedCheckResult
from flashcheck.properties.strategies import Recipe, make_case

USER = Path(__file__).parent / "user"


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


def test_assert_attention_takes_a_ragged_case(user, tmp_path):
    # It raised "k and v are required with array inputs" on a RaggedCase.
    case = varlen_case([3, 0, 5], [4, 2, 7], dtype="fp16", seed=1)
    res = assert_attention(user.varlen_ok, case, case_dir=tmp_path)
    assert isinstance(res, RaggedCheckResult) and res.passed
    with pytest.raises(AttentionMismatch) as info:
        assert_attention(user.varlen_one_past, case, case_dir=tmp_path)
    err = info.value
    assert "key range one past the sequence's end" in err.summary
    assert "sequence 0 (Nq=3, Nk=4)" in str(err)
    assert err.case_id and f"flashcheck replay {err.case_id} --dir {tmp_path}" in str(err)
    saved, record = load_ragged_case(err.case_id, tmp_path)
    assert record["verdict"]["verdict"] == "FAIL-HARD" and saved.describe() == case.describe()
    with pytest.raises(ValueError, match="carries its own options"):
        assert_attention(user.varlen_ok, case, causal=True)


def test_hypothesis_prints_a_drawn_case_by_its_repr():
    # A falsifying example is printed with Hypothesis's pretty-printer, which spells a
    # dataclass field by field: every array in full (39 kB for one varlen case).
    ragged = varlen_case([3, 5], [4, 7], dtype="fp16", seed=1)
    assert pretty(ragged) == repr(ragged) == f"RaggedCase({ragged.describe()})"
    dense = make_case(Recipe("fp16", "randn", 1, 1, 1, 9, 20, 16, 4, seed=5))
    assert pretty(dense) == repr(dense) and repr(dense).startswith("make_case(Recipe(")
