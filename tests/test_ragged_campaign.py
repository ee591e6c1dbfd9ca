"""Campaigns on kernels of ragged layouts: the families, the properties (each with a planted
kernel that breaks it), the records, the report, and `flashcheck report --kernel` run as a
user runs it on the kernels of tests/user/user_layouts.py: each bug class exits 1 with its
bug named, the correct kernels exit 0."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_flashcheck

from flashcheck.harness.adapters.probe import resolved
from flashcheck.harness.adapters.registry import as_kernel
from flashcheck.harness.campaign.logrecords import load
from flashcheck.harness.campaign.ragged_records import RaggedResult, load_ragged
from flashcheck.harness.campaign.ragged_report import run_ragged_report
from flashcheck.harness.campaign.render import render_report
from flashcheck.harness.campaign.report import ReportOptions
from flashcheck.harness.cases.ragged_families import FAMILIES, family_cases
from flashcheck.harness.cases.ragged_variants import (
    others_redrawn,
    owned_slots,
    pool_permuted,
    sequence_alone,
    unowned_filled,
)
from flashcheck.harness.checks.batch_invariance import NOT_BATCH_INVARIANT
from flashcheck.harness.checks.ragged_properties import RAGGED_PROPERTIES
from flashcheck.harness.checks.replay import replay
from flashcheck.harness.cli import main
from flashcheck.harness.core.status import Status

USER = Path(__file__).parent / "user"


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


def _bits(case):
    return [case.bits(n).tobytes() for n in case.tensors] + [
        x.tobytes() for x in case.index.values()
    ]


def test_families_are_deterministic_and_hold_what_they_promise():
    for layout in FAMILIES:
        a = family_cases(layout, "bf16", seed=3, preset="cpu")
        b = family_cases(layout, "bf16", seed=3, preset="cpu")
        c = family_cases(layout, "bf16", seed=4, preset="cpu")
        assert [_bits(x) for x in a] == [_bits(x) for x in b]
        assert [_bits(x) for x in a] != [_bits(x) for x in c]
        assert {x.family for x in a} == set(FAMILIES[layout])
    varlen = family_cases("varlen", "fp16", seed=0, preset="cpu")
    lengths = [x.lengths(b) for x in varlen for b in range(x.sequences)]
    assert any(nq == 0 for nq, _ in lengths) and any(nk == 0 for _, nk in lengths)
    assert {15, 16, 17, 33} <= {nq for nq, _ in lengths}
    paged = family_cases("paged", "fp16", seed=0, preset="cpu")
    assert {x.tensors["k_cache"].shape[1] for x in paged} >= {1, 16, 256, 7}
    shared = next(x for x in paged if x.family == "shared-prefix")
    table = shared.index["block_table"]
    assert (table[0, :2] == table[2, :2]).all()
    decode = [x for x in paged if x.family == "decode"]
    assert {x.tensors["q"].shape[1] for x in decode} == {1, 5, 8}
    assert all(x.tensors["q"].shape[2] == 2 * x.tensors["k_cache"].shape[2] for x in decode)
    assert max(x.lengths(b)[1] for x in decode for b in range(x.sequences)) > 4 * 64
    merge = family_cases("combine", "fp32", seed=0, preset="cpu")
    lse = [x.tensors["lse_partial"] for x in merge]
    assert any(np.isneginf(x).all(axis=0).any() for x in lse)
    assert max(np.ptp(x[np.isfinite(x)]) for x in lse) > 100
    big = family_cases("paged", "fp16", seed=0, preset="gpu")
    assert max(x.lengths(b)[1] for x in big for b in range(x.sequences)) > 4000


def test_families_fit_a_kernel_without_gqa_or_with_other_head_dims(user):
    from flashcheck.harness.adapters.ragged_call import head_dim_for

    for layout in ("varlen", "paged"):
        for case in family_cases(layout, "fp16", seed=0, preset="cpu", d=64, gqa=False):
            t = case.tensors
            q, k = t["q"], t["k" if layout == "varlen" else "k_cache"]
            assert q.shape[-2] == k.shape[-2] and q.shape[-1] == k.shape[-1] == 64
    kern = resolved(user.varlen_ok, "cpu")
    assert head_dim_for(kern, 16) == 16
    assert head_dim_for(replace(kern, head_dims=(64, 128)), 16) == 64
    assert head_dim_for(replace(kern, head_dims=(8,)), 16) == 8


def _dense(case, b):
    s = case.sequence(b)
    return [np.asarray(x).tobytes() for x in (s.q, s.k, s.v)]


def test_variants_change_only_what_they_say():
    case = family_cases("paged", "fp16", seed=0, preset="cpu")[4]  # shared-prefix
    moved, filled = pool_permuted(case, seed=1), unowned_filled(case, 0.0)
    for b in range(case.sequences):
        assert _dense(moved, b) == _dense(case, b) == _dense(filled, b)
        redrawn = others_redrawn(case, b, seed=2)
        assert _dense(redrawn, b) == _dense(case, b)
        assert _dense(sequence_alone(case, b), 0) == _dense(case, b)
        others = [o for o in range(case.sequences) if o != b and case.lengths(o)[1]]
        assert all(_dense(redrawn, o) != _dense(case, o) for o in others)
    free = ~owned_slots(case).any(axis=0)
    assert np.isnan(case.tensors["k_cache"][free].astype(np.float32)).all()
    assert not np.isnan(filled.tensors["k_cache"].astype(np.float32)).any()
    varlen = family_cases("varlen", "fp16", seed=0, preset="cpu")[2]  # empty sequences
    for b in range(varlen.sequences):
        assert _dense(others_redrawn(varlen, b, seed=5), b) == _dense(varlen, b)
        assert _dense(sequence_alone(varlen, b), 0) == _dense(varlen, b)


def _statuses(kernel, layout, prop):
    adapter = resolved(as_kernel(kernel), "cpu")
    found = []
    for case in family_cases(layout, "fp16", seed=0, preset="cpu"):
        if case.causal and "causal" not in adapter.masks:
            continue
        found.append(RAGGED_PROPERTIES[prop](adapter, case, "cpu"))
    return found


@pytest.mark.parametrize("prop", list(RAGGED_PROPERTIES))
def test_correct_kernels_hold_every_property(user, prop):
    for kernel, layout in (
        (user.varlen_ok, "varlen"),
        (user.paged_ok, "paged"),
        ("recurrence-varlen", "varlen"),
        ("split-kv-paged", "paged"),
    ):
        for res in _statuses(kernel, layout, prop):
            assert res.status in (Status.PASS, Status.NOT_APPLICABLE), (kernel, res)
            assert NOT_BATCH_INVARIANT not in res.message


@pytest.mark.parametrize(
    ("name", "layout", "prop", "named"),
    [
        # Exact in real arithmetic: only the bits show that the row maximum saw a neighbour.
        (
            "varlen_max_over_neighbour",
            "varlen",
            "sequence-independence",
            "its output changes when the inputs of the other",
        ),
        ("varlen_one_past", "varlen", "sequence-independence", "outside its own rows"),
        ("paged_pool_order", "paged", "page-independence", "depends on where its pages lie"),
        ("paged_whole_page", "paged", "page-independence", "reads slots past cache_seqlens"),
        ("paged_splits_by_batch", "paged", "batch-invariance", "declared batch-invariant, but"),
    ],
)
def test_planted_kernels_break_their_property(user, name, layout, prop, named):
    found = _statuses(getattr(user, name), layout, prop)
    failed = [r for r in found if r.status == Status.FAIL]
    assert failed, found
    assert named in failed[0].message and "sequence " in failed[0].message


def test_batch_invariance_is_measured_for_undeclared_kernels_and_gated_when_declared(user):
    probed = resolved(user.paged_splits_by_batch, "cpu")
    undeclared = replace(probed, name="undeclared", batch_invariant=False)
    found = _statuses(undeclared, "paged", "batch-invariance")
    assert all(r.status == Status.PASS for r in found), found
    assert any(r.message.startswith(NOT_BATCH_INVARIANT) for r in found)


def test_failures_name_the_bug_class_their_pattern_points_at(user):
    import flashcheck
    from flashcheck.harness.cases.ragged_inputs import varlen_case
    from flashcheck.harness.checks.ragged import check_ragged_case
    from flashcheck.harness.checks.ragged_diagnosis import diagnose_ragged

    def diagnoses(kernel, layout, family):
        adapter = resolved(as_kernel(kernel), "cpu")
        cases = family_cases(layout, "fp16", seed=0, preset="cpu")
        return [
            d
            for case in cases
            if case.family == family and not case.causal
            for d in diagnose_ragged(check_ragged_case(adapter, case), adapter)
        ]

    empty = diagnoses(user.varlen_empty_writes, "varlen", "empty-sequences")
    assert empty and "sequence 1 (Nq=0, Nk=6) has no query rows and sits at row 3" in empty[0]
    heads = diagnoses(user.paged_lse_heads_by_modulo, "paged", "decode")
    assert heads and "LSE head holds exact head: 1→2, 2→1" in heads[0]
    merge = diagnoses(user.combine_nan_when_empty, "combine", "all-empty-rows")
    assert merge == [
        "3 of the 3 rows whose every split is empty (lse = −inf) give NaN, and only those: "
        "consistent with a merge that computes exp(lse_s − LSE) with LSE = −inf (−inf − (−inf) "
        "is NaN) instead of O = 0, LSE = −inf"
    ]
    assert diagnoses(user.combine_ok, "combine", "all-empty-rows") == []
    past = diagnoses(user.varlen_one_past, "varlen", "block-edges")
    assert past and "consistent with a key range one past the sequence's end" in past[0]
    # Keys read at the query offsets: named as such, not as the empty sequence's write that
    # the same pattern suggests (a user's kernel was told that); flashcheck.check says it too.
    by_q = diagnoses(user.varlen_keys_by_q, "varlen", "empty-sequences")
    assert by_q and all("taken from cu_seqlens_q instead of cu_seqlens_k" in d for d in by_q)
    assert not any("zero-length" in d for d in by_q), by_q
    cases = family_cases("varlen", "fp16", seed=0, preset="cpu")
    case = next(c for c in cases if c.family == "empty-sequences" and not c.causal)
    res = flashcheck.check(user.varlen_keys_by_q, case, save="never")
    assert res.diagnosis and res.diagnosis[0] in by_q
    # (printed under the sequence's heading, its lengths not said again)
    assert res.diagnosis[0].split(") ", 1)[1] in str(res)
    # Query offsets past the packed keys give no keys to recompute against: the check still
    # gives its verdict (it raised inside the diagnosis on a case a re-check drew).
    for lq, lk in (([15, 1], [1, 1]), ([4, 3], [2, 2])):
        short = varlen_case(lq, lk)
        assert flashcheck.check(user.varlen_keys_by_q, short, save="never").verdict.counted
    for kernel, layout, family in (
        (user.varlen_ok, "varlen", "empty-sequences"),
        (user.varlen_max_over_neighbour, "varlen", "block-edges"),
        (user.paged_ok, "paged", "decode"),
        (user.paged_whole_page, "paged", "decode"),
    ):
        assert diagnoses(kernel, layout, family) == [], kernel


def test_a_ragged_campaign_records_resumes_and_renders(user, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(USER / "user_layouts.py", tmp_path / "user_layouts.py")
    opts = ReportOptions(
        name="r",
        kernels=(
            "user_layouts:varlen_empty_writes",
            "split-kv-combine",
            "user_layouts:paged_splits_by_batch",
        ),
        dtypes=("fp16",),
        out=str(tmp_path),
    )
    lines = []
    assert run_ragged_report(opts, echo=lines.append) == 1
    path = tmp_path / "r" / "results.jsonl"
    data = load_ragged(path)
    assert data.complete and data.header.config.parts == ("ragged",)
    keys = [r.key for r in data.results]
    assert len(keys) == len(set(keys)) == 5 * 3 + 3 + 9 * 4
    for line in path.read_text().splitlines():
        d = json.loads(line)
        if d.get("type") == RaggedResult.TYPE:
            assert RaggedResult.from_json(d).to_json() == d
    failed = [r for r in data.results if r.status == Status.FAIL_HARD]
    assert failed and all(r.case_id for r in failed)
    assert (tmp_path / "r" / "cases" / f"{failed[0].case_id}.npz").exists()
    assert any("the first row of sequence 2, which is wrong there" in x for x in lines)
    # A property's failure replays: the accuracy check, then the property, same verdicts.
    varies = next(r for r in data.results if r.check == "batch-invariance" and r.case_id)
    out = []
    _, verdict, _ = replay(varies.case_id, directory=tmp_path / "r" / "cases", echo=out.append)
    text = "\n".join(out)
    assert verdict == "FAIL" and "recorded verdict: PASS; replayed: PASS (same verdict)" in text
    assert "property batch-invariance: FAIL: declared batch-invariant, but" in text
    assert "recorded verdict: FAIL; replayed: FAIL (same verdict)" in text
    # The dense reader skips the ragged records; render dispatches on the header.
    assert load(path).every_result == []
    report = render_report(path).read_text()
    assert "## Ragged batches" in report and "varlen_empty_writes" in report
    assert "- user_layouts:paged_splits_by_batch fp16: differs in 7 of 7 cases (declared" in report
    # Resuming recomputes nothing.
    assert run_ragged_report(opts, echo=lines.append) == 1
    assert [r.key for r in load_ragged(path).results] == keys


ERRANT = """
import flashcheck
import torch


def _flaky(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False):
    if max_seqlen_k > 100:
        raise RuntimeError("too long for my shared memory")
    return torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)


def _never(q, k_cache, v_cache, *, cache_seqlens, block_table):
    raise RuntimeError("not built")


flaky = flashcheck.kernel(_flaky, name="errant:flaky", layout="varlen")
never = flashcheck.kernel(_never, name="errant:never", layout="paged")
gpu_only = flashcheck.kernel(_never, name="errant:gpu_only", layout="paged", devices=["cuda"])
"""


def test_kernels_that_raise_or_never_run_are_gated_and_cuda_only_ones_refused(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "errant.py").write_text(ERRANT)
    opts = ReportOptions(kernels=("errant:flaky", "errant:never"), dtypes=("fp16",), out="r")
    lines = []
    assert run_ragged_report(opts, echo=lines.append) == 1
    gate = "\n".join(lines[lines.index("exit status 1 (gate --fail-on fail-hard):") :])
    assert "errant:never fp16: could not run at all (RuntimeError: not built" in gate
    assert (
        "accuracy ERROR: errant:flaky fp16 (1 case), e.g. one-long: RuntimeError: too long" in gate
    )
    data = load_ragged(Path("r/errant-flaky+errant-never/results.jsonl"))
    errors = [r for r in data.results if r.status == Status.ERROR]
    props = [r for r in data.results if r.family == "one-long" and r.check != "accuracy"]
    assert len(errors) == 1 and all(r.status == Status.NOT_APPLICABLE for r in props)
    if not _has_cuda():
        with pytest.raises(ValueError, match="errant:gpu_only cannot run here"):
            run_ragged_report(replace(opts, kernels=("errant:gpu_only",)), echo=lines.append)


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def test_report_refuses_mixed_reports_and_dense_only_options(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--kernel", "naive-numpy", "--kernel", "split-kv-paged"]) == 2
    assert "not both: run two reports" in capsys.readouterr().err
    assert main(["report", "--kernel", "split-kv-paged", "--budget", "1m"]) == 2
    assert "--budget" in capsys.readouterr().err
    assert not (tmp_path / "reports").exists()


@pytest.mark.slow
def test_correct_ragged_kernels_exit_0_from_the_command_line(tmp_path):
    shutil.copy(USER / "user_layouts.py", tmp_path / "user_layouts.py")
    specs = ["user_layouts:varlen_ok", "user_layouts:paged_ok", "user_layouts:combine_ok"]
    args = ["report", "--dtype", "fp16", "--name", "ok"]
    out = run_flashcheck([*args, *(x for s in specs for x in ("--kernel", s))], tmp_path, 300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    for spec in specs:
        assert f"{spec} fp16: accuracy" in text and "FAIL" not in text
    assert (tmp_path / "reports/ok/error-report.md").exists()


# Each bug class of the issue, and what the report's output must say about it.
BUG_CLASSES = {
    "varlen_one_past": "consistent with a key range one past the sequence's end",
    "paged_whole_page": "reads slots past cache_seqlens",
    "combine_nan_when_empty": "rows whose every split is empty (lse = −inf) give NaN",
    "paged_lse_heads_by_modulo": "with the wrong head mapping for grouped-query heads",
    "varlen_empty_writes": "consistent with a zero-length sequence writing into its neighbour",
    "paged_splits_by_batch": "declared batch-invariant, but sequence",
    # a hang on long sequences: stopped by --timeout, recorded, and the campaign goes on
    "varlen_hangs_on_long": "accuracy TIMEOUT: user_layouts:varlen_hangs_on_long fp16 (1 case)",
}


@pytest.mark.slow
def test_each_ragged_bug_class_exits_1_from_the_command_line_with_its_bug_named(tmp_path):
    shutil.copy(USER / "user_layouts.py", tmp_path / "user_layouts.py")
    args = ["report", "--dtype", "fp16", "--name", "bugs", "--timeout", "5"]
    for name in BUG_CLASSES:
        args += ["--kernel", f"user_layouts:{name}"]
    out = run_flashcheck(args, tmp_path, 300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    gate = text[text.index("exit status 1") :]
    for name, named in BUG_CLASSES.items():
        lines = [x for x in gate.splitlines() if f"user_layouts:{name} fp16" in x]
        assert any(named in x for x in lines), (name, gate)
    replay = [x for x in text.splitlines() if x.strip().startswith("replay: flashcheck replay")]
    assert len(replay) == len(BUG_CLASSES)
    rep = run_flashcheck(replay[0].strip().removeprefix("replay: ").split()[1:], tmp_path, 120)
    assert rep.returncode == 1 and "(same verdict)" in rep.stdout, rep.stdout + rep.stderr
    assert "DIFFERENT" not in rep.stdout


def test_the_summary_groups_one_failure_across_families_and_signs():
    from types import SimpleNamespace

    from flashcheck.harness.campaign.ragged_records import RaggedResult
    from flashcheck.harness.campaign.ragged_report import ragged_findings, ragged_summary

    def row(i, family, first):
        why = f"sequence 0 (Nq={i}, Nk={i + 1}): O differs, first O[0, 0, 0] = {first} vs 0.5"
        return RaggedResult(
            f"k{i}", "u:k", "fp16", "varlen", family, "sequence-independence", Status.FAIL, (why,)
        )

    rows = [row(3, "block-edges", 0.25), row(4, "block-edges", -2.5), row(5, "one-long", 1.0)]
    lines = ragged_summary(SimpleNamespace(results=rows, limitations=()), "cases")
    kinds = [x for x in lines if "x sequence-independence FAIL" in x]
    assert (
        len(kinds) == 1 and "3 x sequence-independence FAIL (block-edges x2, one-long)" in kinds[0]
    )
    # The example quoted is the first, as the gate's line quotes (they named different cases).
    assert "(Nq=3, Nk=4)" in kinds[0]
    data = SimpleNamespace(results=rows, limitations=())
    (gate,) = ragged_findings(data, "fail")
    assert "(Nq=3, Nk=4)" in gate
