"""``flashcheck.assert_attention`` on a ragged case, how Hypothesis prints a drawn case, and
what a ragged kernel given dense arrays is told."""

from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)

from hypothesis.vendor.pretty import pretty  # noqa: E402

import flashcheck  # noqa: E402
from flashcheck import AttentionMismatch, assert_attention  # noqa: E402
from flashcheck.harness.adapters.registry import as_kernel  # noqa: E402
from flashcheck.harness.cases.ragged_inputs import varlen_case  # noqa: E402
from flashcheck.harness.cases.ragged_store import load_ragged_case, save_ragged_case  # noqa: E402
from flashcheck.harness.checks.ragged import RaggedCheckResult  # noqa: E402
from flashcheck.properties.strategies import Recipe, make_case  # noqa: E402

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


def test_a_ragged_kernel_given_dense_arrays_is_told_what_to_build(user):
    # It was told to "declare the contract wider (dtypes=..., masks=...)", and a merge kernel
    # was called "a dense combine kernel".
    q = torch.zeros(1, 2, 10, 16)
    with pytest.raises(ValueError, match=r"RaggedCase.from_arrays\('varlen', q=\.\.\., k=") as e:
        flashcheck.check(user.varlen_ok, q, q, q)
    assert "declare the contract wider" not in str(e.value)
    with pytest.raises(ValueError, match=r"from_arrays\('combine', out_partial=\.\.\."):
        flashcheck.check(user.combine_ok, q, q, q)
    with pytest.raises(ValueError, match="check_gradients takes dense kernels and varlen"):
        flashcheck.check_gradients(user.paged_ok, q, q, q)
    x = make_case(Recipe("fp16", "randn", 1, 1, 1, 9, 20, 16, 4, seed=5))
    assert as_kernel(user.combine_ok).supports(x) == (
        "a split-KV combine kernel takes no dense (B, H, N, d) case"
    )


def test_a_ragged_case_saved_by_two_checks_keeps_both(tmp_path):
    # One Hypothesis draw failing accuracy and sequence independence is one file; the second
    # save replaced the first's property (and would drop its verdict).
    case = varlen_case([3, 5], [4, 7], dtype="fp16", seed=1)
    acc = {"verdict": "FAIL-HARD", "reasons": ["x"]}
    cid = save_ragged_case(
        case,
        kernel="k",
        device="cpu",
        verdict=acc,
        context={"property": "accuracy"},
        directory=tmp_path,
    )
    again = save_ragged_case(
        case,
        kernel="k",
        device="cpu",
        context={"property": "sequence-independence"},
        directory=tmp_path,
    )
    grads = {"verdict": "FAIL", "reasons": ["y"]}
    save_ragged_case(
        case,
        kernel="k",
        device="cpu",
        context={"property": "gradients, accuracy"},
        directory=tmp_path,
        gradient_verdict=grads,
    )
    _, record = load_ragged_case(cid, tmp_path)
    assert again == cid
    assert record["context"]["property"] == "accuracy, sequence-independence, gradients"
    assert record["verdict"] == acc and record["gradient_verdict"] == grads
