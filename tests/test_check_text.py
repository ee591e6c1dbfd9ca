"""The text of a forward check (what `print(flashcheck.check(...))` and a replay show): where
only LSE fails, its worst rows are listed beside the oracle (O's table alone showed zeros)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a tox dependency; bare envs may lack it")

import flashcheck  # noqa: E402
from flashcheck.harness.checks.text import format_check, format_reason_groups  # noqa: E402


def _attention(q, k, v, *, lse_shift):
    q, k, v = (torch.as_tensor(x).double() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    o = (torch.softmax(s, -1) @ v).float().numpy()
    return o, (torch.logsumexp(s, -1) + lse_shift).float().numpy()


def test_an_lse_only_failure_lists_the_worst_lse_rows():
    g = np.random.default_rng(0)
    q, k, v = (g.standard_normal((1, 1, 8, 8)).astype(np.float32) for _ in range(3))

    def shifted(q, k, v, *, causal=False, scale=None):
        return _attention(q, k, v, lse_shift=1e-4)

    def right(q, k, v, *, causal=False, scale=None):
        return _attention(q, k, v, lse_shift=0.0)

    res = flashcheck.check(flashcheck.kernel(shifted, api="numpy"), q, k, v, save="never")
    assert res.verdict.verdict == "FAIL-HARD" and res.verdict.max_ulp < 1
    text = format_check(res)
    assert "worst LSE rows, by bound utilization:" in text, text
    assert "| 9.99" in text.split("worst LSE rows")[1], text  # the 1e-4 error, shown
    ok = flashcheck.check(flashcheck.kernel(right, api="numpy"), q, k, v, save="never")
    assert ok.passed and "worst LSE rows" not in format_check(ok)


def test_reason_groups_name_each_heading_once():
    groups = [
        ("sequence 0 (Nq=3, Nk=4)", ["FAIL-HARD: a", "FAIL: b"]),
        ("sequence 1 (Nq=2, Nk=2)", ["FAIL: c"]),
        ("sequence 2 (Nq=5, Nk=1)", []),
        ("sequence 3 (Nq=1, Nk=9)", ["FAIL-HARD: d", "FAIL: e", "FAIL: f"]),
    ]
    assert format_reason_groups(groups, full=1) == [
        "  - sequence 0 (Nq=3, Nk=4):",
        "      FAIL-HARD: a",
        "      FAIL: b",
        "  - sequence 1 (Nq=2, Nk=2): FAIL: c",
        "  - sequence 3 (Nq=1, Nk=9): FAIL-HARD: d (and 2 more reasons)",
    ]
