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
