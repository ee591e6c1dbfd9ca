"""A deliberately wrong kernel, defined outside the package, fails a property; the case file is
written before the failure propagates; `flashcheck replay` reproduces the verdict."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import flashcheck
from flashcheck import AttentionMismatch, assert_attention
from flashcheck.harness.cases.store import load_case
from flashcheck.properties.strategies import Recipe, make_case

PLANTED = textwrap.dedent(
    """
    import flashcheck
    from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention

    @flashcheck.kernel(arithmetic="flash", api="numpy", dtypes=("fp16",), devices=("cpu",),
                       key_block=16)
    def wrong_scale(q, k, v, *, causal, window, scale, mask=None):
        # planted bug: the softmax scale is 1.25x too large
        d = q.shape[-1]
        s = (scale if scale is not None else d ** -0.5) * 1.25
        return online_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), causal=causal,
                                window=window, mask=mask, scale=s)
    """
)


def _cli(args, cwd, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "flashcheck.harness.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_planted_bug_is_saved_and_replays_with_the_same_verdict(tmp_path, monkeypatch):
    (tmp_path / "planted_kernel.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(tmp_path))
    cases_dir = tmp_path / "cases"
    monkeypatch.setenv("FLASHCHECK_CASE_DIR", str(cases_dir))
    case = make_case(Recipe("fp16", "randn", 1, 1, 1, 9, 20, 16, 4, seed=5))
    with pytest.raises(AttentionMismatch) as info:
        assert_attention("planted_kernel:wrong_scale", case, device="cpu")
    cid = info.value.case_id
    assert cid and f"flashcheck replay {cid}" in str(info.value)
    _, record = load_case(cid, cases_dir)
    assert record["verdict"]["verdict"] == "FAIL-HARD"
    assert record["kernel"] == "planted_kernel:wrong_scale"
    out = _cli(["replay", cid, "--dir", str(cases_dir)], cwd=tmp_path)
    assert out.returncode == 1, out.stderr
    assert "recorded verdict: FAIL-HARD; replayed: FAIL-HARD (same verdict)" in out.stdout
    assert "| (b, h, i, c) | kernel | bits |" in out.stdout
    # the correct kernel on the same case passes (the replay judged the kernel, not the case)
    ok = _cli(["replay", cid, "--dir", str(cases_dir), "--kernel", "recurrence-fa2"], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_replay_reports_bad_case_files(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "something-else/1"}))
    out = _cli(["replay", "bad", "--dir", str(tmp_path)], cwd=tmp_path)
    assert out.returncode == 2
    assert "not a flashcheck case file" in out.stderr
    out = _cli(["replay", "missing", "--dir", str(tmp_path)], cwd=tmp_path)
    assert out.returncode == 2 and "no case file" in out.stderr


def _nan_to_zero(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Maps every NaN output to 0: breaks the NaN rule, accurate elsewhere."""
    import numpy as np

    from flashcheck.kernels.naive import naive_numpy

    o, lse = naive_numpy(q, k, v, causal=causal, window=window, mask=mask, scale=scale)
    return np.nan_to_num(o, nan=0.0), lse


@pytest.mark.parametrize(
    ("prop", "verdict", "words"),
    [
        ("nan-rule", "FAIL", "property nan-rule: FAIL: the NaN in "),
        ("accuracy", "PASS", "verdict PASS"),
    ],
)
def test_a_replay_gives_the_one_verdict_its_case_was_saved_for(tmp_path, prop, verdict, words):
    import flashcheck
    from flashcheck.harness.cases.store import save_case
    from flashcheck.harness.checks.replay import replay

    kern = flashcheck.kernel(_nan_to_zero, api="numpy", arithmetic="naive")
    case = make_case(Recipe("fp16", "nonfinite", 1, 2, 2, 8, 8, 16, 16, seed=0))
    context = {"property": prop}
    for saved_by in (kern.name, "k"):
        cid = save_case(
            case,
            kernel=saved_by,
            device="cpu",
            directory=tmp_path,
            verdict={"verdict": verdict},
            context=context,
        )
        lines = []
        _, got, _ = replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
        text = "\n".join(lines)
        assert got == verdict and words in text, text
        # one verdict: the other check's is not printed beside it
        other = "\nverdict " if prop == "nan-rule" else "property "
        assert other not in text, text
    # Replayed on the kernel the file names, the verdicts are compared; on another (a pinned
    # case of the project's old kernel replayed on a user's), each is named with its kernel.
    assert text.endswith(f"\nrecorded for k: {verdict}; {kern.name} replayed: {verdict}"), text
    cid = save_case(
        case,
        kernel=kern.name,
        device="cpu",
        directory=tmp_path,
        verdict={"verdict": verdict},
        context=context,
    )
    lines = []
    replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
    assert lines[-1] == f"\nrecorded verdict: {verdict}; replayed: {verdict} (same verdict)"


def test_a_replay_shows_a_small_case_s_inputs_and_how_to_load_any_case():
    from flashcheck.harness.cases.case import Case
    from flashcheck.harness.checks.replay import SMALL, input_lines

    q = np.array([[[[np.nan, 0.5]]]], np.float16)
    small = input_lines(Case(q, q + 1, q * 0 + 0.25), "reports/cases/abc.json")
    assert small == [
        "inputs: flashcheck.load_case('reports/cases/abc.json') rebuilds them bit for bit",
        "  q (1, 1, 1, 2) = [[[[nan, 0.5]]]]",
        "  k (1, 1, 1, 2) = [[[[nan, 1.5]]]]",
        "  v (1, 1, 1, 2) = [[[[ nan, 0.25]]]]",
    ]
    big = np.zeros((1, 1, SMALL + 1, 1), np.float32)
    assert len(input_lines(Case(big, big, big), "abc")) == 1


def test_a_replayed_output_of_the_wrong_shape_is_the_kernel_s_verdict(tmp_path):
    from flashcheck.harness.cases.store import save_case
    from flashcheck.harness.checks.replay import replay

    def bnhd(q, k, v, *, causal=False, scale=None):
        return np.swapaxes(np.asarray(q, np.float32), 1, 2)

    case = make_case(Recipe("fp32", "randn", 1, 2, 2, 8, 8, 4, 4, seed=0))
    verdict = {"verdict": "BAD-OUTPUT", "reasons": []}
    cid = save_case(case, kernel="bnhd", device="cpu", verdict=verdict, directory=tmp_path)
    lines = []
    kern = flashcheck.kernel(bnhd, name="bnhd", api="numpy")
    _, got, _ = replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
    assert got == "BAD-OUTPUT"
    assert any(x.startswith("BAD-OUTPUT: bnhd returned O of shape (1, 8, 2, 4)") for x in lines)
    assert lines[-1].endswith("replayed: BAD-OUTPUT (same verdict)")


def test_a_replayed_backward_that_raises_is_the_kernel_s_error_with_do_shown(tmp_path):
    from flashcheck.harness.cases.store import save_case
    from flashcheck.harness.checks.replay import replay
    from flashcheck.kernels.naive import naive_numpy

    def fwd(q, k, v, *, causal=False, scale=None):
        return naive_numpy(q, k, v, causal=causal, scale=scale)

    def bwd(q, k, v, do, *, causal=False, scale=None):
        raise ValueError("assignment destination is read-only")  # as numpy says for an expanded dO

    case = make_case(Recipe("fp32", "randn", 1, 2, 2, 2, 2, 2, 2, seed=0))
    verdict = {"verdict": "ERROR", "message": "ValueError: ..."}
    ctx = {"property": "gradient-do-layouts"}
    cid = save_case(
        case, kernel="inplace", device="cpu", verdict=verdict, context=ctx, directory=tmp_path
    )
    kern = flashcheck.kernel(fwd, name="inplace", api="numpy", backward=bwd)
    lines = []
    _, got, _ = replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
    assert got == "ERROR", lines
    assert any("dO: its grad_output(), handed over as a contiguous array" in x for x in lines)
    assert any(x.lstrip().startswith("dO (1, 2, 2, 2) = ") for x in lines), lines
    said = "ERROR: the kernel raised inside gradient-do-layouts: ValueError: assignment"
    assert any(x.startswith(said) for x in lines), lines
    assert lines[-1].endswith("replayed: ERROR (same verdict)")
