"""The time budget of a campaign: durations, the order that finds bugs first, coverage."""

import re
import time
from dataclasses import replace

import pytest

from flashcheck.harness.campaign.budget import (
    TAIL_MAX,
    Budget,
    groups_not_run,
    missing_by_part,
    parse_duration,
    priority_order,
    process_age,
)
from flashcheck.harness.campaign.logrecords import CoverageRecord
from flashcheck.harness.campaign.plan import PRESETS, plan_items, structural_items

# serial: wall-clock budgets (tox runs them alone, conftest.py).
pytestmark = pytest.mark.serial

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


def test_priority_order_takes_the_dtypes_in_turn():
    items = [it for dt in ("fp16", "bf16") for it in structural_items(CPU, dt, 0)]
    ordered = priority_order([(it, ["k"]) for it in items])
    groups = {(it.check, it.recipe.dtype) for it in items}
    head = [it for it, _ in ordered[: len(groups)]]
    assert {(it.check, it.recipe.dtype) for it in head} == groups
    # within each batch class the dtypes alternate: neither waits behind the other's cases
    for batched in (True, False):
        dts = [it.recipe.dtype for it in head if (it.recipe.b > 1) == batched]
        n = min(dts.count("fp16"), dts.count("bf16"))
        assert set(zip(dts[: 2 * n : 2], dts[1 : 2 * n : 2], strict=True)) <= {("fp16", "bf16")}


def test_budget_and_coverage():
    assert not Budget(None).spent and Budget(None).left() == float("inf")
    assert Budget(0.0).spent
    items = structural_items(CPU, "fp16", 0)[:3]
    work = [(it, ["a", "b"]) for it in items]
    assert missing_by_part(work, {items[0].key("a")}) == {"structural": 5}
    rec = CoverageRecord(budget=180, planned=6, ran=1, missing={"structural": 5}, search=False)
    assert CoverageRecord.from_json(rec.to_json()) == rec
    assert rec.text().startswith("1 of 6 planned results ran within the time budget of 3:00")
    assert "Every input family and structural property ran first" in rec.text()
    # A group of the first pass of which nothing ran is named, not claimed.
    unrun = groups_not_run(work, {items[0].key("a")})
    checks = dict.fromkeys(it.check for it in items if it.check != items[0].check)
    assert unrun == [f"structural {c} fp16" for c in checks] and unrun
    assert groups_not_run(work, {it.key("b") for it in items}) == []
    rec = replace(rec, unrun=tuple(unrun))
    assert CoverageRecord.from_json(rec.to_json()) == rec
    assert "1 input family or structural property did not run once (structural " in rec.text()
    assert "ran first" not in rec.text()


def test_the_cases_leave_a_tail_of_the_budget_for_the_case_files():
    now = time.monotonic()
    b = Budget(100.0, started=now - 90.0)  # 15 s tail: the cases' share ended at 85 s
    assert b.spent and not b.over and b.left() == 0.0
    assert Budget(100.0, started=now - 80.0).left() == pytest.approx(5.0, abs=0.5)
    assert Budget(100.0, started=now - 101.0).over
    assert Budget(3600.0).tail == TAIL_MAX and Budget(None).tail == 0.0
    assert Budget(40.0, started=now - 27.2).used() == "0:27 of 0:40"
    # a case started just before the share ends may still compile: that is kept back too
    assert Budget(100.0, started=now - 70.0, in_flight=20.0).spent


def test_the_process_age_counts_this_interpreter_since_it_started():
    # A budget given on the command line counts the interpreter's start and the imports.
    age = process_age()
    assert 0.0 < age < 7 * 24 * 3600


@pytest.mark.parametrize("what", ["compile", "case"])
def test_work_that_cannot_finish_in_the_budget_is_not_started(tmp_path, monkeypatch, what):
    from flashcheck.harness.adapters.registry import resolve
    from flashcheck.harness.campaign import runner

    kern = resolve("naive-numpy")
    if what == "compile":
        # Every shape of this kernel compiles for longer than the budget left to the cases
        # (600 s less 30 s of tail and 500 s kept for a compile in flight).
        kern = replace(kern, compile_keys=("nq", "nk"), compile_seconds=500.0)
    else:
        # A started case runs to its end, so one that takes longer than the budget left overran
        # it (a gradient oracle of 18 s past a 45 s budget's cases' share). At an assumed
        # 1000 s per unit of cost every case would outlast the 570 s left to the cases.
        monkeypatch.setattr(runner, "SECONDS_PER_COST", 1000.0)
    camp = _budgeted_campaign(kern, tmp_path)
    covered = camp.coverage()
    # No case starts, and the run says so instead of overrunning.
    assert not camp.results() and covered is not None
    assert covered.ran == 0 and covered.planned > 0


def _smoke_report(tmp_path, name, budget):
    """The smoke campaign of naive-numpy in fp16, in this process, under ``budget`` seconds."""
    from flashcheck.harness.campaign.report import ReportOptions

    return ReportOptions(
        name=name,
        preset="smoke",
        kernels=("naive-numpy",),
        dtypes=("fp16",),
        out=str(tmp_path),
        isolate=False,
        workers=1,
        kernel_workers=1,
        budget=budget,
        fail_on="never",
    )


def test_a_budgeted_campaign_stops_cleanly_reports_its_coverage_and_resumes(tmp_path):
    from flashcheck.harness.campaign.logrecords import load
    from flashcheck.harness.campaign.report import run_report

    opts = _smoke_report(tmp_path, "b", 1e-3)
    lines = []
    # A budget the campaign does not need: it says how much of it the run took.
    assert run_report(replace(opts, name="roomy", budget=600.0), echo=lines.append) == 0
    assert any(re.fullmatch(r"finished within the budget: 0:\d\d of 10:00", x) for x in lines)
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


def test_a_cut_run_does_not_search_and_its_resume_ends_as_an_uncut_run(tmp_path, monkeypatch):
    from flashcheck.harness.campaign.logrecords import load
    from flashcheck.harness.campaign.report import run_report
    from flashcheck.harness.core.progress import Progress

    # At 325 s per unit of cost (the 600 s budget leaves 570 s to the cases), the cases of
    # cost above 1.75, gradient cases among them, would not finish: they are left for a resume
    # while there is time for the rest. The search draws its parents from every earlier
    # result, so it must not run then: it would draw other children than an uncut run, and
    # the resume would add its own on top (a user's trial saw 28 search results against 18).
    opts = _smoke_report(tmp_path, "cut", 600.0)
    lines = []
    with monkeypatch.context() as m:
        m.setattr(Progress, "seconds_per_cost", lambda self: 325.0)
        assert run_report(opts, echo=lines.append) == 0
    cut = load(tmp_path / "cut" / "results.jsonl")
    assert cut.coverage is not None and 0 < cut.coverage.ran < cut.coverage.planned
    assert not cut.coverage.search
    assert not [r for r in cut.every_result if r.part == "search"]
    assert run_report(replace(opts, budget=None), echo=lines.append) == 0
    assert run_report(replace(opts, name="uncut", budget=None), echo=lines.append) == 0

    def outcome(name):
        data = load(tmp_path / name / "results.jsonl")
        return sorted((r.key, str(r.status)) for r in data.every_result)

    assert outcome("cut") == outcome("uncut")


def test_the_suite_says_how_much_of_its_budget_it_took():
    from flashcheck.properties.suite_budget import SuiteBudget

    class Terminal:
        def __init__(self):
            self.lines = []

        def section(self, title):
            self.lines.append(f"== {title}")

        def line(self, text):
            self.lines.append(text)

    tr = Terminal()
    SuiteBudget(90.0, started=time.monotonic() - 7.2).pytest_terminal_summary(tr)
    assert tr.lines == [
        "== flashcheck time budget",
        "every property ran within the budget: 0:07 of 1:30",
    ]


def test_a_negative_budget_on_the_command_line_gets_the_durations_message(capsys):
    # argparse read "-5s" as an option of its own: "expected one argument".
    from flashcheck.harness.cli import main

    for argv in (["report", "--budget", "-5s"], ["test", "k:f", "--budget", "-1m"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
        err = capsys.readouterr().err
        assert "a duration must be positive, got '-" in err and "expected one" not in err, err
    assert parse_duration("1m") == 60
    with pytest.raises(ValueError, match="must be positive"):
        parse_duration("-5m")


def test_a_run_whose_kernels_all_stopped_is_not_said_to_be_cut_by_its_budget(tmp_path, monkeypatch):
    # Every kernel and dtype stopped after identical failures: the cases left had nothing to
    # run, yet under a budget whose rate said they would not fit they were "left for a
    # resume", and the report said "Stopped at its time budget: 0 of 0 planned results ran".
    import flashcheck
    from flashcheck.harness.core.progress import Progress

    def broken(q, k, v, *, causal=False, window=None, scale=None):
        raise RuntimeError("not built for this machine")

    contract = {"dtypes": ("fp16",), "head_dims": (16, 32, 64, 128), "masks": ("causal",)}
    contract.update(gqa=True, unequal_lengths=True, distinct_dv=True, batched=True)
    kern = flashcheck.kernel(broken, api="numpy", seq_multiple=1, compile_keys=(), **contract)
    monkeypatch.setattr(Progress, "seconds_per_cost", lambda self: 325.0)
    camp = _budgeted_campaign(kern, tmp_path)
    assert camp.results() and all(r.status == "ERROR" for r in camp.results())
    assert camp.coverage() is None


def _budgeted_campaign(kern, tmp_path):
    """The smoke campaign of ``kern`` in fp16, in this process, run under a 600 s budget."""
    from flashcheck.harness.campaign import runner
    from flashcheck.harness.campaign.executor import LocalExecutor
    from flashcheck.harness.campaign.logrecords import CampaignConfig, Header
    from flashcheck.harness.core.resultlog import ResultLog

    config = CampaignConfig("c", "smoke", 0, ("k",), ("fp16",), "cpu")
    header = Header(config, "flashcheck report ...")
    with (
        LocalExecutor(workers=1, kernel_workers=1, isolate=False) as ex,
        ResultLog.open(tmp_path / "r.jsonl", header.to_json()) as log,
    ):
        camp = runner.Campaign(
            log,
            PRESETS["smoke"],
            0,
            {"k": kern},
            {"k": "cpu"},
            ("fp16",),
            ex,
            tmp_path / "cases",
            echo=lambda _: None,
            budget=Budget(600.0),
        )
        camp.run()
    return camp
