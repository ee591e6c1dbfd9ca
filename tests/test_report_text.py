"""What the report's failure list and the terminal's summary say about failing results."""

from types import SimpleNamespace

from record_helpers import result_record as _res

from flashcheck.harness.campaign.summary import terminal_summary
from flashcheck.harness.campaign.tables import failures


def test_a_diagnosis_is_named_wherever_it_stands_among_the_reasons():
    diagnosis = "consistent with a causal mask aligned top-left (query i keeps keys j <= i)"
    many = ("FAIL-HARD: 3 fully masked rows with O != 0", "FAIL-HARD: 2 O elements exceed", "x")
    rows = [_res("FAIL-HARD", reasons=(*many, diagnosis)), _res("PASS")]
    listed = failures(SimpleNamespace(results=rows), ["k"], ["fp16"])
    assert any(diagnosis in line and "in 1 of 2 results" in line for line in listed), listed
    said = terminal_summary(rows, "cases")
    assert any(line.strip() == f"1 result {diagnosis}" for line in said), said


def test_one_wrong_shape_at_several_shapes_is_one_failure():
    why = "k returned O of shape {}, expected (B, Hq, Nq, dv) = {}"
    rows = [
        _res("BAD-OUTPUT", reasons=(why.format("(1, 16, 2, 64)", "(1, 2, 16, 64)"),)),
        _res("BAD-OUTPUT", reasons=(why.format("(2, 17, 1, 8)", "(2, 1, 17, 8)"),)),
    ]
    listed = failures(SimpleNamespace(results=rows), ["k"], ["fp16"])
    assert listed == [
        "- **k fp16**: BAD-OUTPUT: k returned O of shape (...), expected (B, Hq, Nq, dv) = (...) "
        "— in 2 of 2 results (randn ×2)"
    ]


def test_structural_checks_that_raised_count_as_failed_and_not_as_unjudged_forward_cases():
    rows = [
        _res("PASS", class_util={"flash": 0.5, "naive": 0.4}),
        _res("PASS", part="structural"),
        _res("FAIL", part="structural"),
        _res("ERROR", part="structural", reasons=("TypeError: bwd() got 'causal'",)),
        _res("BAD-OUTPUT", part="structural", reasons=("backward must return (dQ, dK, dV)",)),
        _res("SKIP", part="structural", reasons=("conformance: no reference kernel",)),
    ]
    head = terminal_summary(rows, "cases")[0]
    assert "structural: 4 checks, 3 failed (1 BAD-OUTPUT, 1 ERROR, 1 FAIL), 1 skipped" in head, head
    assert not any("no output to judge" in line for line in terminal_summary(rows, "cases"))
