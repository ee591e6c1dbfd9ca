"""The ragged campaign's references on a process pool: the same records as computed inline, in
the same order, and an interrupted campaign resumes without computing finished cases'
references again."""

from __future__ import annotations

import concurrent.futures as cf
import json
import shutil
import threading
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from pathlib import Path

import pytest

from flashcheck.harness.adapters.probe import resolved
from flashcheck.harness.adapters.registry import as_kernel
from flashcheck.harness.campaign.executor import Executor, LocalExecutor
from flashcheck.harness.campaign.ragged_pool import RaggedReferences
from flashcheck.harness.campaign.ragged_records import RaggedResult
from flashcheck.harness.campaign.ragged_report import run_ragged_report
from flashcheck.harness.campaign.report import ReportOptions
from flashcheck.harness.cases.ragged_families import family_cases
from flashcheck.harness.checks.ragged import check_ragged_case
from flashcheck.harness.core.resultlog import ResultLog

USER = Path(__file__).parent / "user"


def _results(path: Path) -> list[dict]:
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    return [d for d in lines if d.get("type") == RaggedResult.TYPE]


def _tasks(lines: list[str]) -> int:
    """The number of reference tasks the campaign said it submitted."""
    line = next(x for x in lines if x.startswith("  references: "))
    return int(line.split()[1])


def test_pooled_references_give_the_inline_records_and_an_interrupted_run_resumes(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("user_layouts.py", "user_varlen_grads.py"):
        shutil.copy(USER / name, tmp_path / name)
    # A varlen kernel with a backward that fails its gradient check, a paged kernel that fails
    # its accuracy check: the records hold reasons and utilizations computed from references.
    kernels = ("user_varlen_grads:varlen_bwd_neighbour_row", "user_layouts:paged_whole_page")
    opts = ReportOptions(
        name="inline",
        kernels=kernels,
        dtypes=("fp32",),
        preset="smoke",
        out=str(tmp_path),
        render=False,
        isolate=False,  # every reference computed in this process, in turn
    )
    inline_lines: list[str] = []
    assert run_ragged_report(opts, echo=inline_lines.append) == 1
    assert not any(x.startswith("  references: ") for x in inline_lines)
    inline = _results(tmp_path / "inline" / "results.jsonl")
    assert any(r["check"] == "gradients" and r["status"] == "FAIL-HARD" for r in inline)

    # The same campaign with its references on two processes, interrupted (Ctrl-C) after
    # its ninth result is written.
    written = []
    append = ResultLog.append

    def stop_after_nine(self, record):
        append(self, record)
        if record.get("type") == RaggedResult.TYPE:
            written.append(record)
            if len(written) == 9:
                raise KeyboardInterrupt

    pooled = replace(opts, name="pooled", isolate=True, workers=2)
    first: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(ResultLog, "append", stop_after_nine)
        assert run_ragged_report(pooled, echo=first.append) == 130
    path = tmp_path / "pooled" / "results.jsonl"
    assert _results(path) == inline[:9]

    # Resumed: the cases on file get no references; the records are the inline run's, in
    # its order.
    again: list[str] = []
    assert run_ragged_report(pooled, echo=again.append) == 1
    assert 0 < _tasks(again) < _tasks(first)
    assert any("waited" in x and "on references" in x for x in again)
    assert _results(path) == inline
    assert [x for x in again if x.startswith("user_")] == [
        x for x in inline_lines if x.startswith("user_")
    ]


def test_the_reference_pool_refuses_kernel_calls():
    with LocalExecutor(workers=1, kernels=False, isolate=False) as pool:
        assert pool.kernel_workers == 0
        assert pool.submit(divmod, 7, 2).result() == (3, 1)
        with pytest.raises(ValueError, match="kernels=False"):
            pool.run(None, None, "cpu")


class _Late(Executor):
    """An executor whose first reference comes late and whose others fail (a lost worker)."""

    workers = 1

    def __init__(self):
        self.futures = []

    def submit(self, fn, *args, **kwargs):
        fut = cf.Future()
        self.futures.append(fut)
        if len(self.futures) == 1:
            value = fn(*args, **kwargs)
            threading.Timer(1.2, fut.set_result, (value,)).start()
        else:
            fut.set_exception(BrokenProcessPool("a worker died"))
        return fut


def test_a_late_reference_shows_on_the_progress_line_and_a_lost_one_is_computed_here():
    adapter = resolved(as_kernel("recurrence-varlen"), "cpu")
    case = family_cases("varlen", "fp16", seed=0, preset="smoke")[0]
    said = []
    refs = RaggedReferences(_Late(), said.append)
    refs.submit("k", adapter, case)
    got = check_ragged_case(adapter, case, references=refs.forward("k", "note"))
    assert said and all(s == "note: waiting on the oracle, seq 0" for s in said)
    assert refs.waited > 1.0 and refs.tasks == case.sequences
    want = check_ragged_case(adapter, case)
    assert got.as_dict() == want.as_dict()
