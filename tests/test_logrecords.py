"""The typed records of results.jsonl: every committed results file loads, and each of its
records reads and writes back the same JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flashcheck.harness.campaign.logrecords import (
    Header,
    load,
    parse_record,
)
from flashcheck.harness.campaign.resultrecords import (
    AccuracyResult,
    GradientResult,
    ResultRecord,
    StructuralResult,
    decode_number,
)
from flashcheck.harness.core.resultlog import read_records
from flashcheck.harness.core.status import Status

ROOT = Path(__file__).resolve().parents[1]


def _dense(path: Path) -> bool:
    """A dense campaign's results (the ragged and FP8 campaigns write records of their own)."""
    with path.open() as f:
        first = json.loads(f.readline())
    return first.get("type") == "header" and "ragged" not in first["config"].get("parts", ())


SAMPLES = sorted(p for p in (ROOT / "reports" / "samples").glob("*/results.jsonl") if _dense(p))


def test_there_are_samples():
    assert {p.parent.name for p in SAMPLES} >= {"cpu", "h200-triton", "h200-gradients"}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.parent.name)
def test_committed_results_round_trip(path):
    """Each record reads into its type and writes back as the same JSON (older files lack
    ``no_run`` on limitations: it reads as False and is written out)."""
    records = read_records(path)
    for d in records:
        rec = parse_record(d)
        assert rec is not None, d.get("type")
        back = rec.to_json()
        if isinstance(rec, Header):
            back = {"schema": d["schema"], **back}
        if d.get("type") == "limitation" and "no_run" not in d:
            back.pop("no_run")
        assert back == d


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.parent.name)
def test_committed_results_load(path):
    data = load(path)
    n = sum(1 for d in read_records(path) if d.get("type") == "result")
    assert n == len(data.every_result) > 0
    assert data.complete
    assert all(isinstance(r, AccuracyResult) for r in data.results)
    assert all(isinstance(r, StructuralResult) for r in data.structural)
    assert all(isinstance(r, GradientResult) for r in data.gradients)
    assert set(data.case_files) <= {r.key for r in data.every_result}
    for r in data.every_result:
        assert isinstance(r.status, Status)
        if isinstance(r, AccuracyResult) and r.status.judged:
            assert r.metrics is not None and r.ulp_hist is not None


def test_non_finite_numbers_decode_once():
    assert math.isnan(decode_number("nan")) and decode_number("-inf") == -math.inf
    assert decode_number(None) is None  # not applicable, not NaN
    assert decode_number(3) == 3 and isinstance(decode_number(3), int)
    assert decode_number(True) is True


def test_a_result_dispatches_on_its_part():
    base = next(d for d in read_records(SAMPLES[0]) if d.get("type") == "result")
    for part, cls in (("structural", StructuralResult), ("gradients", GradientResult)):
        d = {**base, "part": part, "property": "nan-rule"}
        assert type(ResultRecord.from_json(d)) is cls
    assert type(ResultRecord.from_json({**base, "part": "search"})) is AccuracyResult
    assert parse_record({"type": "from-the-future"}) is None  # newer kinds are ignored
