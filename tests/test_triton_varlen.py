"""The Triton varlen kernel (forward and backward, cu_seqlens) on the CPU interpreter, and the
per-sequence gradient check of varlen kernels: the built-in passes its checks on a packed batch
with empty and block-edge sequences; a planted outside backward that sums dK, dV over a
neighbour's query row fails, names the sequence, replays, and makes the campaign exit 1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.campaign.ragged_report import run_ragged_report
from flashcheck.harness.campaign.report import ReportOptions
from flashcheck.harness.cases.ragged_inputs import varlen_case
from flashcheck.harness.checks.replay import replay

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    # Its inputs are CPU tensors (and replays run on the recorded CPU device): on a GPU machine
    # without the interpreter the Triton kernel refuses them (4 of its tests failed so).
    pytest.skip(
        "runs the Triton varlen kernel on CPU tensors: needs TRITON_INTERPRET=1 (tox sets it)",
        allow_module_level=True,
    )

USER = Path(__file__).parent / "user"


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_varlen_grads

    return user_varlen_grads


# 33 rows and keys cross the interpreter's 32-row block; sequence 1 has no query rows (its keys
# get no gradient), sequence 3 no keys (O = 0, LSE = −inf, dQ = 0); grouped-query heads, causal.
def _batch(dtype: str, **kw):
    opts = {"causal": True, "hq": 4, "hk": 2, "d": 16, **kw}
    return varlen_case([3, 0, 33, 1, 2], [4, 2, 40, 0, 33], dtype=dtype, **opts)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_triton_varlen_forward_and_backward_pass_their_checks(dtype):
    case = _batch(dtype)
    res = flashcheck.check("triton-varlen", case, save="never")
    assert res.passed, res.reasons
    judged = [r for r in res.sequences if r is not None]
    assert len(judged) == 4 and max(r.verdict.det_util for r in judged if r.case.shape[4]) > 0
    empty = slice(int(case.index["cu_seqlens_q"][3]), int(case.index["cu_seqlens_q"][4]))
    assert (res.output.o[empty] == 0).all() and np.isneginf(res.output.lse[:, empty]).all()
    grads = flashcheck.check_gradients("triton-varlen", case, save="never")
    assert isinstance(grads, flashcheck.RaggedGradientResult) and grads.passed, grads.reasons
    assert [r is None for r in grads.sequences] == [False, True, False, True, False]
    utils = [tv.det_util for r in grads.sequences if r is not None for tv in r.verdicts.values()]
    assert 0 < max(utils) < 1
    keys = slice(int(case.index["cu_seqlens_k"][1]), int(case.index["cu_seqlens_k"][2]))
    assert (grads.grads.dk[keys] == 0).all() and (grads.grads.dv[keys] == 0).all()


def test_triton_varlen_takes_windows_and_a_value_head_dim_of_its_own():
    case = _batch("fp32", causal=False, window=(3, 1), dv=24, hq=2, hk=2)
    assert flashcheck.check("triton-varlen", case, save="never").passed
    grads = flashcheck.check_gradients("triton-varlen", case, save="never")
    assert grads.passed, grads.reasons


def test_triton_varlen_argument_errors_say_how_to_fix_the_call():
    import torch

    from flashcheck.kernels.triton_varlen import flash_attn_varlen

    q = torch.zeros(5, 2, 16)
    k = torch.zeros(7, 1, 16)
    cu_q = torch.tensor([0, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 7], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"must be int32 \(cu_seqlens_q.to\(torch.int32\)\)"):
        flash_attn_varlen(q, k, k, cu_q.long(), cu_k, 3, 4)
    with pytest.raises(ValueError, match=r"to the packed length 7 .* \[0\] \+ cumsum"):
        flash_attn_varlen(q, k, k, cu_q, torch.tensor([0, 3, 6], dtype=torch.int32), 3, 4)
    with pytest.raises(ValueError, match=r"max_seqlen_k must be an int >= the longest .*\(4\)"):
        flash_attn_varlen(q, k, k, cu_q, cu_k, 3, 3)
    with pytest.raises(ValueError, match=r"q heads \(2\) must be a multiple of k/v heads \(3\)"):
        flash_attn_varlen(q, torch.zeros(7, 3, 16), torch.zeros(7, 3, 16), cu_q, cu_k, 3, 4)


def test_a_backward_summing_over_a_neighbours_row_fails_names_it_and_replays(user, tmp_path):
    case = _batch("fp16")
    assert flashcheck.check_gradients(user.varlen_autograd, case, save="never").passed
    res = flashcheck.check_gradients(user.varlen_bwd_neighbour_row, case, case_dir=tmp_path)
    assert res.verdict == "FAIL-HARD"
    text = "\n".join(res.reasons)
    assert "sequence 0 (Nq=3, Nk=4), worst element dK[" in text
    # Sequence 1 has no query rows: its keys took sequence 2's first row.
    assert "sequence 1 (Nq=0, Nk=2): dK[4, " in text and "no query attends to its keys" in text
    assert all(not r.startswith("sequence 0") or "dQ" not in r for r in res.reasons)
    lines = []
    _, verdict, record = replay(res.case_id, directory=tmp_path, echo=lines.append)
    assert verdict == "FAIL-HARD" and record["context"]["property"] == "gradients"
    out = "\n".join(lines)
    # The check the case was saved for comes first, compared with its record; the forward
    # (which passes) is one line after it. The replay printed the forward's "verdict PASS"
    # and its table first, and no recorded-vs-replayed line.
    assert f"inputs: flashcheck.load_case('{tmp_path / res.case_id}.json')" in out
    assert out.index("gradients FAIL-HARD") < out.index("recorded verdict: FAIL-HARD; replayed")
    assert "(same verdict)" in out and out.rstrip().endswith("the forward on the same case: PASS")
    assert "verdict PASS" not in out
    _, verdict, _ = replay(res.case_id, directory=tmp_path, kernel="triton-varlen", echo=print)
    assert verdict == "PASS"


def test_a_backward_that_skips_a_sequence_without_keys_fails_on_its_rows(user):
    res = flashcheck.check_gradients(user.varlen_bwd_skips_keyless, _batch("fp32"), save="never")
    assert res.verdict == "FAIL-HARD"
    assert res.reasons == [
        "sequence 3 (Nq=1, Nk=0): dQ[36, 0, 0] = 7.0 where the exact gradient is 0 (64 such "
        "elements): the sequence has no keys"
    ]


def test_the_ragged_campaign_runs_the_gradient_check_and_gates_on_it(user, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(USER / "user_varlen_grads.py", tmp_path / "user_varlen_grads.py")
    opts = ReportOptions(
        name="g",
        kernels=("user_varlen_grads:varlen_bwd_neighbour_row",),
        dtypes=("fp32",),
        out=str(tmp_path),
        preset="smoke",
    )
    lines = []
    assert run_ragged_report(opts, echo=lines.append) == 1
    out = "\n".join(lines)
    assert "gradients FAIL-HARD" in out and "accuracy 5 PASS" in out, out
    report = (tmp_path / "g" / "error-report.md").read_text()
    assert "| accuracy | gradients |" in report


def test_the_triton_varlen_campaign_passes_with_its_gradients(tmp_path):
    opts = ReportOptions(
        name="t", kernels=("triton-varlen",), dtypes=("fp32",), out=str(tmp_path), preset="smoke"
    )
    lines = []
    assert run_ragged_report(opts, echo=lines.append) == 0, lines
    assert "triton-varlen fp32: accuracy 5 PASS; gradients 5 PASS" in "\n".join(lines)
