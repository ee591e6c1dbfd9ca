"""How a failing suite property is shown (properties/brief.py): its message instead of a
traceback into the suite, for one failure and for the group Hypothesis raises when it finds
several distinct ones."""

from types import SimpleNamespace

from flashcheck.properties.assertions import AttentionMismatch
from flashcheck.properties.brief import Brief, Outcome


def _report(exc):
    call = SimpleNamespace(excinfo=SimpleNamespace(value=exc))
    return SimpleNamespace(longrepr="a traceback into the suite"), call


def test_one_failure_is_its_message_and_replay():
    report, call = _report(AttentionMismatch("accuracy failed: ...", "abc", None, "accuracy: bad"))
    out = Brief()._failure("test_x", "k fp16", report, call)
    assert report.longrepr == "accuracy failed: ..."
    assert (out.reason, out.replay) == ("accuracy: bad", "flashcheck replay abc")


def test_distinct_failures_found_together_are_each_shown_with_their_replays():
    one = AttentionMismatch("first failure", "a1", None, "accuracy: BAD-OUTPUT")
    two = AttentionMismatch("second failure", "b2", None, "accuracy: FAIL-HARD")
    report, call = _report(ExceptionGroup("Hypothesis found 2 distinct failures.", [one, two]))
    out = Brief()._failure("test_x", "k fp16", report, call)
    assert report.longrepr.startswith("2 distinct failures:")
    assert "first failure" in report.longrepr and "second failure" in report.longrepr
    assert out.reason == "accuracy: BAD-OUTPUT (and 1 other distinct failure(s))"
    assert out.replay == "flashcheck replay a1\n      flashcheck replay b2"


def test_another_exception_keeps_pytest_s_report():
    report, call = _report(ValueError("x"))
    report.longrepr = SimpleNamespace(reprcrash=SimpleNamespace(message="ValueError: x\nmore"))
    out = Brief()._failure("test_x", "k fp16", report, call)
    assert out.reason == "ValueError: x"


class _Terminal:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def line(self, text, **_):
        self.lines.append(text)


def test_an_output_that_cannot_be_judged_is_shown_once_for_every_property_it_fails():
    brief = Brief()
    shapes = [("(1, 1, 2, 1)", "(1, 2, 1, 1)"), ("(1, 32, 2, 64)", "(1, 2, 32, 64)")] * 2
    for i, (got, want) in enumerate(shapes):
        why = f"prop{i}: BAD-OUTPUT: k returned O of shape {got}, expected {want}"
        report, call = _report(AttentionMismatch("msg", f"id{i}", None, why))
        brief.outcomes.append(brief._failure(f"test_{i}", "k fp16", report, call))
    report, call = _report(AttentionMismatch("msg", "idx", None, "accuracy: FAIL-HARD"))
    brief.outcomes.append(brief._failure("test_numbers", "k fp16", report, call))
    tr = _Terminal()
    brief.pytest_terminal_summary(tr)
    assert tr.lines[1:] == [
        "k fp16: 5 FAILED",
        "  FAILED test_0: prop0: BAD-OUTPUT: k returned O of shape (1, 1, 2, 1), expected "
        "(1, 2, 1, 1)",
        "      flashcheck replay id0",
        "  FAILED the same way (3 more): test_1, test_2, test_3",
        "  FAILED test_numbers: accuracy: FAIL-HARD",
        "      flashcheck replay idx",
    ]


def test_skips_that_differ_only_in_which_pinned_case_or_layout_share_one_line():
    brief = Brief()
    whys = [
        "pinned case 227caa54621d21ae (negative_rows bf16 B=1 seed=7): this run tests fp32 only",
        "pinned case 4dd02ba923f821a2 (nonfinite fp16 B=1 seed=0): this run tests fp32 only",
        "pinned case b81c1a6a24dc3ea9 (subnormal fp32 window=(98, 0) seed=1) lies outside k's "
        "contract: windows unsupported",
        "k is a dense kernel: this test applies to varlen kernels only",
        "k is a dense kernel: this test applies to paged kernels only",
    ]
    brief.outcomes += [Outcome(f"test_{i}", "k", "skipped", w) for i, w in enumerate(whys)]
    tr = _Terminal()
    brief.pytest_terminal_summary(tr)
    assert tr.lines[1:] == [
        "k: 5 skipped",
        "  skipped 2: pinned cases: this run tests fp32 only",
        "  skipped 1: pinned cases lie outside k's contract: windows unsupported",
        "  skipped 2: k is a dense kernel: tests of the varlen, paged and split-KV layouts",
    ]
