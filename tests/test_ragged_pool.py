"""The ragged campaign's references on a process pool: the same records as computed inline, in
the same order, and an interrupted campaign resumes without computing finished cases'
references again."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from flashcheck.harness.campaign.ragged_records import RaggedResult
from flashcheck.harness.campaign.ragged_report import run_ragged_report
from flashcheck.harness.campaign.report import ReportOptions
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
    from flashcheck.harness.campaign.executor import LocalExecutor

    with LocalExecutor(workers=1, kernels=False, isolate=False) as pool:
        assert pool.kernel_workers == 0
        assert pool.submit(divmod, 7, 2).result() == (3, 1)
        with pytest.raises(ValueError, match="kernels=False"):
            pool.run(None, None, "cpu")
