"""The time budget of a campaign: durations, the order that finds bugs first, coverage."""

from dataclasses import replace

import pytest

from flashcheck.harness.campaign.budget import (
    Budget,
    missing_by_part,
    parse_duration,
    priority_order,
)
from flashcheck.harness.campaign.logrecords import CoverageRecord
from flashcheck.harness.campaign.plan import PRESETS, plan_items, structural_items

CPU = PRESETS["cpu"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("3m", 180), ("1.5h", 5400), ("2m30s", 150), ("2:30", 150)],
)
def test_durations_read_as_a_user_writes_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "3 weeks", "0", "-5m", "3m and"])
def test_unreadable_durations_say_what_is_accepted(text):
    with pytest.raises(ValueError, match=r"use e\.g\. 90s, 3m"):
        parse_duration(text)


def test_priority_order_runs_every_group_once_batches_first_then_breadth():
    items = plan_items(CPU, ("fp16",), 0) + structural_items(CPU, "fp16", 0)
    work = [(it, ["k"]) for it in items]
    ordered = priority_order(work)
    assert sorted(id(e) for e in ordered) == sorted(id(e) for e in work)  # a permutation
    groups = {(it.part, it.check or it.recipe.family) for it in items}
    head = ordered[: len(groups)]
    assert {(it.part, it.check or it.recipe.family) for it, _ in head} == groups
    batch = [it.recipe.b > 1 for it, _ in head]
    assert batch == sorted(batch, reverse=True)  # every batch > 1 pick before any batch of one
    assert priority_order(work) == ordered  # a function of the plan alone


def test_budget_and_coverage():
    assert not Budget(None).spent and Budget(None).left() == float("inf")
    assert Budget(0.0).spent
    items = structural_items(CPU, "fp16", 0)[:3]
    work = [(it, ["a", "b"]) for it in items]
    assert missing_by_part(work, {items[0].key("a")}) == {"structural": 5}
    rec = CoverageRecord(budget=180, planned=6, ran=1, missing={"structural": 5}, search=False)
    assert CoverageRecord.from_json(rec.to_json()) == rec
    assert rec.text().startswith("1 of 6 planned results ran within the time budget of 3:00")


def test_a_budgeted_campaign_stops_cleanly_reports_its_coverage_and_resumes(tmp_path):
    from flashcheck.harness.campaign.logrecords import load
    from flashcheck.harness.campaign.report import ReportOptions, run_report

    opts = ReportOptions(
        name="b",
        preset="smoke",
        kernels=("naive-numpy",),
        dtypes=("fp16",),
        out=str(tmp_path),
        isolate=False,
        workers=1,
        kernel_workers=1,
        budget=1e-3,
        fail_on="never",
    )
    lines = []
    assert run_report(opts, echo=lines.append) == 0
    data = load(tmp_path / "b" / "results.jsonl")
    assert data.coverage is not None and not data.complete
    assert data.coverage.ran < data.coverage.planned and not data.coverage.search
    assert any(line.startswith("stopped at the budget: ") for line in lines), lines
    md = (tmp_path / "b" / "error-report.md").read_text()
    assert "> **Stopped at its time budget**: " in md and "Incomplete campaign" not in md
    first = {r.key for r in data.every_result}
    # the same command without a budget completes it, recomputing nothing
    assert run_report(replace(opts, budget=None), echo=lines.append) == 0
    done = load(tmp_path / "b" / "results.jsonl")
    assert done.complete and done.coverage is None
    keys = [r.key for r in done.every_result]
    assert len(keys) == len(set(keys)) and first <= set(keys)
