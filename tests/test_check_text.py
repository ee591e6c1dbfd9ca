"""The text of a forward check (what `print(flashcheck.check(...))` and a replay show): where
only LSE fails, its worst rows are listed beside the oracle (O's table alone showed zeros)."""

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)

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


def test_no_figure_reads_nan_where_none_applies(tmp_path):
    # A sequence without keys printed "naive same-precision NaN (ratio NaN); bound utilization
    # det NaN" and an error of 8.4e6 ulps of the smallest subnormal; a merge "naive nan ulp
    # (ratio nan)".
    import sys
    from pathlib import Path

    from flashcheck.harness.cases.ragged_inputs import combine_case, varlen_case

    sys.path.insert(0, str(Path(__file__).parent / "user"))
    try:
        import user_layouts
    finally:
        sys.path.pop(0)
    case = varlen_case([3, 4], [5, 0], dtype="fp16", seed=2)
    res = flashcheck.check(user_layouts.varlen_ok, case, save="never")
    keyless = format_check(res.sequences[1])
    assert "no keys: every row must be exactly O = 0, LSE = −inf" in keyless
    assert "0 of 128 O elements are not 0" in keyless and "NaN" not in keyless
    assert "normwise abs (the exact O is 0)" in keyless and "normwise rel" not in keyless
    merged = flashcheck.check(user_layouts.combine_nan_when_empty, combine_case(5), save="never")
    text = str(merged)
    body = text.split("\n", 1)[1]  # (the first line names the kernel, "..._nan_...")
    assert "no naive baseline" in body and "nan" not in body.replace("NaN", "")
