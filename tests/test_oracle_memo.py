"""The oracle's memo (harness/oracle/memo.py): the same answers as the oracle, each a fresh copy,
looked up by the problem's and dO's exact bits, and bounded."""

import numpy as np
import pytest

from flashcheck.harness.core.semantics import make_problem
from flashcheck.harness.oracle import memo
from flashcheck.harness.oracle.evaluate import problem_oracle


@pytest.fixture(autouse=True)
def _empty_memo():
    memo.memo_clear()
    yield
    memo.memo_clear()


def _problem(seed=0, n=5, causal=False):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((1, 2, n, 4)).astype(np.float16) for _ in range(3))
    return make_problem(q, k, v, causal=causal)


def _do(seed=1, n=5):
    return np.random.default_rng(seed).standard_normal((1, 2, n, 4)).astype(np.float16)


def _counts():
    c = memo.memo_counts()
    return {"hits": c["hits"], "misses": c["misses"]}


def _same(a, b):
    assert sorted(a.tensors) == sorted(b.tensors)
    for name in a.tensors:
        for part in ("hi", "lo", "err", "floor", "rounded"):
            x, y = getattr(a[name], part), getattr(b[name], part)
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), (name, part)


def test_a_repeated_problem_is_answered_from_the_memo_with_the_oracles_bits():
    p, do = _problem(), _do()
    first = memo.memoized_oracle(p, do=do)
    again = memo.memoized_oracle(_problem(), do=_do())  # equal inputs, other objects
    assert _counts() == {"hits": 1, "misses": 1}
    _same(first, problem_oracle(p, do=do))
    _same(again, first)
    assert "dq" in again.tensors


def test_a_hit_is_a_copy_the_caller_may_change():
    p = _problem()
    first = memo.memoized_oracle(p)
    first["o"].hi[...] = 7.0
    again = memo.memoized_oracle(p)
    assert _counts()["hits"] == 1
    _same(again, problem_oracle(p))


@pytest.mark.parametrize(
    "other",
    [
        lambda: (_problem(seed=2), None),  # other bits
        lambda: (_problem(causal=True), None),  # other options
        lambda: (_problem(), _do()),  # with dO: the gradients too
    ],
)
def test_other_inputs_miss(other):
    memo.memoized_oracle(_problem())
    p, do = other()
    answer = memo.memoized_oracle(p, do=do)
    assert _counts() == {"hits": 0, "misses": 2}
    _same(answer, problem_oracle(p, do=do))


def test_the_memo_keeps_at_most_its_bytes(monkeypatch):
    memo.memoized_oracle(_problem(seed=0))
    one = memo.memo_counts()["bytes"]
    assert one > 0 and memo.memo_counts()["answers"] == 1
    monkeypatch.setattr(memo, "MEMO_BYTES", one)  # room for one answer of this size
    memo.memoized_oracle(_problem(seed=3))  # evicts the first
    memo.memoized_oracle(_problem(seed=3))
    memo.memoized_oracle(_problem(seed=0))
    assert _counts() == {"hits": 1, "misses": 3}
    assert memo.memo_counts()["answers"] == 1 and memo.memo_counts()["bytes"] <= one


def test_an_answer_above_the_size_of_one_is_not_kept(monkeypatch):
    monkeypatch.setattr(memo, "ANSWER_BYTES", 100)  # below any answer's size
    memo.memoized_oracle(_problem())
    memo.memoized_oracle(_problem())
    assert _counts() == {"hits": 0, "misses": 2}
    assert memo.memo_counts()["answers"] == 0
