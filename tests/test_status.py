"""The one status type: on-disk strings, severity, and the families the report counts."""

from __future__ import annotations

import json

import pytest

from flashcheck.harness.core.status import Status


def test_members_are_their_on_disk_strings():
    assert Status.FAIL_HARD == "FAIL-HARD"
    assert Status("BAD-OUTPUT") is Status.BAD_OUTPUT
    assert json.dumps({"status": Status.FAIL_HARD}) == '{"status": "FAIL-HARD"}'
    with pytest.raises(ValueError):
        Status("fail-hard")


def test_families_partition_the_statuses():
    for s in Status:
        assert [s.judged, s.broken, not s.counted].count(True) == 1, s
    failed = {Status.FAIL, Status.FAIL_HARD, Status.BAD_OUTPUT, Status.ERROR, Status.TIMEOUT}
    assert {s for s in Status if s.failed} == failed


def test_worst_orders_by_severity_and_keeps_the_first_among_equals():
    assert Status.worst([]) is Status.PASS
    assert Status.worst(["PASS", "SKIP", "NOT-APPLICABLE"]) is Status.PASS
    assert Status.worst(["PASS", "FAIL", "PASS"]) is Status.FAIL
    assert Status.worst(["FAIL", "FAIL-HARD", "ERROR"]) is Status.FAIL_HARD
    assert Status.worst(["TIMEOUT", "FAIL-HARD"]) is Status.TIMEOUT
