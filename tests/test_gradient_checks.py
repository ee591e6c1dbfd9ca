"""Gradient checks of kernels with a backward (SPEC 3.7), through the public API and the
installed command, on kernels a user declares outside the package (tests/user/user_backward.py):
a correct one passes, each planted backward bug is named, a failure replays."""

import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_flashcheck

import flashcheck
from flashcheck.harness.cases.case import Case
from flashcheck.harness.cases.store import load_case, save_case
from flashcheck.harness.checks.replay import replay

HERE = Path(__file__).parent / "user"


@pytest.fixture(scope="module")
def ub():
    sys.path.insert(0, str(HERE))
    try:
        import user_backward

        yield user_backward
    finally:
        sys.path.remove(str(HERE))


def _inputs(dtype=np.float16, b=2, hq=4, hk=2, nq=24, nk=16, d=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, nq, d)).astype(dtype)
    k = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    v = rng.standard_normal((b, hk, nk, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("name", ["textbook_autograd", "manual"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_a_correct_backward_passes(ub, name, dtype):
    # causal with Nq > Nk: the first 8 rows keep no key, and their gradients must be 0
    res = flashcheck.check_gradients(getattr(ub, name), *_inputs(dtype), causal=True, save="never")
    assert res.passed, str(res)
    assert set(res.verdicts) == {"dq", "dk", "dv"}
    assert np.all(res.grads.dq[:, :, :8] == 0)


@pytest.mark.parametrize(
    ("name", "gradient", "reason"),
    [
        ("no_dq_scale", "dq", "exceed the deterministic bound"),
        ("gqa_first_head", "dk", "exceed the deterministic bound"),
        ("nan_masked", "dq", "NaN/Inf where the oracle is finite"),
    ],
)
def test_each_planted_backward_bug_is_named(ub, tmp_path, name, gradient, reason):
    res = flashcheck.check_gradients(getattr(ub, name), *_inputs(), causal=True, case_dir=tmp_path)
    assert res.verdict == "FAIL-HARD"
    assert res.verdicts[gradient].verdict == "FAIL-HARD"
    assert any(reason in r for r in res.verdicts[gradient].reasons), res.reasons
    # saved, and the replay recomputes the same verdict from the case file alone
    assert res.replay is not None and res.case_id is not None
    _, verdict, record = replay(
        res.case_id, directory=tmp_path, kernel=getattr(ub, name), echo=lambda *_: None
    )
    assert verdict == "FAIL-HARD"
    assert record["context"]["property"] == "gradients"


def test_a_kernel_without_backward_gets_a_clear_error():
    def fwd(q, k, v, *, causal=False, scale=None):
        return q

    with pytest.raises(ValueError, match="backward='autograd'"):
        flashcheck.check_gradients(fwd, *_inputs(b=1, hq=1, hk=1))
    with pytest.raises(ValueError, match="needs api='torch'"):
        flashcheck.kernel(fwd, api="numpy", backward="autograd")
    with pytest.raises(ValueError, match="backward must be"):
        flashcheck.kernel(fwd, backward="magic")


def test_a_backward_that_cannot_take_the_forward_s_options_is_refused_when_declared():
    def fwd(q, k, v, *, causal=False, scale=None):
        return q

    def no_options(q, k, v, do):
        return q, k, v

    def needs_more(q, k, v, do, mode, *, causal=False, scale=None):
        return q, k, v

    def takes_them(q, k, v, do, **options):
        return q, k, v

    with pytest.raises(ValueError, match=r"takes no causal or scale, which the forward takes"):
        flashcheck.kernel(fwd, backward=no_options)
    with pytest.raises(ValueError, match=r"missing a required argument: 'mode'"):
        flashcheck.kernel(fwd, backward=needs_more)
    assert flashcheck.kernel(fwd, backward=takes_them).backward is takes_them


def test_the_upstream_gradient_is_a_function_of_the_inputs_and_is_saved(tmp_path):
    q, k, v = _inputs(b=1, hq=2, hk=1, nq=5, nk=7, d=8)
    a, b = Case.from_arrays(q, k, v), Case.from_arrays(q, k, v)
    np.testing.assert_array_equal(a.grad_output(), b.grad_output())
    assert a.grad_output().dtype == q.dtype and a.grad_output().shape == (1, 2, 5, 8)
    k2 = k.copy()
    k2[0, 0, 0, 0] += np.float16(1)
    assert not np.array_equal(Case.from_arrays(q, k2, v).grad_output(), a.grad_output())
    # an explicit dO travels with a saved case, bit for bit
    do = np.full((1, 2, 5, 8), 0.25, dtype=np.float16)
    c = Case.from_arrays(q, k, v)
    c.do = do
    cid = save_case(c, kernel="naive-torch", device="cpu", directory=tmp_path)
    back, _ = load_case(cid, tmp_path)
    np.testing.assert_array_equal(back.grad_output(), do)
    with pytest.raises(ValueError, match="O's shape"):
        Case(q, k, v, do=do[:, :1])


def test_explicit_do_changes_the_gradients(ub):
    q, k, v = _inputs(b=1, hq=2, hk=1, nq=6, nk=6, d=8)
    do = np.zeros((1, 2, 6, 8), dtype=np.float16)
    res = flashcheck.check_gradients(ub.manual, q, k, v, do=do, save="never")
    assert res.passed
    for g in (res.grads.dq, res.grads.dk, res.grads.dv):
        assert not g.any()  # dO = 0: every gradient is exactly 0
    with pytest.raises(ValueError, match="inputs' dtype"):
        flashcheck.check_gradients(ub.manual, q, k, v, do=do.astype(np.float32))


def test_do_layouts_hand_the_same_values_in_the_named_layout():
    import torch

    q, k, v = _inputs(b=2, hq=2, hk=1, nq=5, nk=7, d=8)
    case = Case.from_arrays(q, k, v)
    strided = replace(case, do_layout="strided")
    for api in ("numpy", "torch"):
        x = strided.grad_output_as(api)
        y = x.numpy() if api == "torch" else x
        assert not (x.is_contiguous() if api == "torch" else x.flags.c_contiguous)
        np.testing.assert_array_equal(y, case.grad_output())
    expanded = replace(case, do_layout="expanded")
    t = expanded.grad_output_as("torch")
    assert t.stride()[:3] == (0, 0, 0) and isinstance(t, torch.Tensor)
    assert np.broadcast_to(case.grad_output()[:1, :1, :1], t.shape).tolist() == t.tolist()
    assert expanded.grad_output_as("numpy").strides[:3] == (0, 0, 0)
    with pytest.raises(ValueError, match="do_layout must be one of"):
        replace(case, do_layout="transposed")
    with pytest.raises(ValueError, match="rows are all equal"):
        replace(case, do=case.grad_output(), do_layout="expanded")


def test_check_gradients_hands_do_in_the_layout_asked_and_replays_it(ub, tmp_path):
    q, k, v = _inputs()
    for layout in ("strided", "expanded"):
        res = flashcheck.check_gradients(ub.manual, q, k, v, do_layout=layout, save="never")
        assert res.passed, str(res)
    res = flashcheck.check_gradients(
        ub.assumes_contiguous_do, q, k, v, do_layout="strided", case_dir=tmp_path
    )
    assert res.verdict == "FAIL-HARD" and "dO strided" in str(res)
    _, verdict, _ = replay(
        res.case_id, directory=tmp_path, kernel=ub.assumes_contiguous_do, echo=lambda *_: None
    )
    assert verdict == "FAIL-HARD"
    assert flashcheck.check_gradients(ub.assumes_contiguous_do, q, k, v, save="never").passed


@pytest.fixture
def user_dir(tmp_path):
    shutil.copy(HERE / "user_backward.py", tmp_path / "user_backward.py")
    return tmp_path


@pytest.mark.slow
def test_report_on_a_backward_bug_exits_1_and_names_the_gradients(user_dir):
    args = [
        "report",
        "--preset",
        "smoke",
        "--dtype",
        "fp16",
        "--part",
        "gradients",
        "--kernel",
        "user_backward:no_dq_scale",
        "--no-render",
    ]
    out = run_flashcheck(args, user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "gradients FAIL-HARD: user_backward:no_dq_scale fp16" in text, text


@pytest.mark.slow
def test_report_on_a_correct_backward_exits_0_with_a_gradient_section(user_dir):
    args = [
        "report",
        "--preset",
        "smoke",
        "--dtype",
        "fp32",
        "--part",
        "gradients",
        "--kernel",
        "user_backward:manual",
    ]
    out = run_flashcheck(args, user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "gradients: 2 PASS" in text, text
    md = (user_dir / "reports" / "user_backward-manual" / "error-report.md").read_text()
    assert "## Gradients" in md and "| user_backward:manual | fp32 | dQ | 2 | 2 | 0 | 0 |" in md
    assert "**2 results**: gradients 2 (2 PASS)" in md and "Incomplete" not in md


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kernel", "check", "named"),
    [
        ("doubles_do", "gradient-integrity", "the backward modified its input dO:"),
        (
            "reuses_dq",
            "gradient-integrity",
            "the backward returned storage that the next call overwrote: dQ changed",
        ),
        (
            "assumes_contiguous_do",
            "gradient-do-layouts",
            "with dO as a strided view into a larger buffer, dQ is NaN in",
        ),
        ("manual", None, None),
    ],
)
def test_report_on_a_backward_that_breaks_integrity_names_the_tensor(
    user_dir, kernel, check, named
):
    args = ["report", "--preset", "smoke", "--dtype", "fp32", "--part", "structural"]
    out = run_flashcheck([*args, "--kernel", f"user_backward:{kernel}", "--no-render"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == (0 if named is None else 1), text
    if named is not None:
        assert named in text and "flashcheck replay" in text, text
        assert f"structural property {check} failed: user_backward:{kernel}" in text


def test_a_backward_that_raises_in_a_property_gets_a_case_file_that_replays_the_error(user_dir):
    # Before, the re-run for the case file raised as well and nothing was saved: the report
    # named the failure with no way to replay it.
    args = ["report", "--preset", "smoke", "--dtype", "fp32", "--part", "structural"]
    out = run_flashcheck([*args, "--kernel", "user_backward:views_do", "--no-render"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "structural property gradient-do-layouts ERROR: user_backward:views_do" in text, text
    assert "gave no result" not in text, text
    (cid,) = re.findall(r"flashcheck replay (\w+) --dir", text)
    out = run_flashcheck(["replay", cid, "--dir", "reports/user_backward-views_do/cases"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "ERROR" in text and "view" in text, text


def test_case_files_reuse_the_campaigns_gradient_references(tmp_path, monkeypatch):
    """Saving the worst gradient case judges it with the reference the campaign computed: a
    second oracle call in the main process (minutes for a case that needs the strict path)
    would run after the campaign, serially, once per kernel."""
    from flashcheck.harness.campaign import executor as ex
    from flashcheck.harness.campaign.render import load
    from flashcheck.harness.campaign.report import ReportOptions, run_report
    from flashcheck.harness.checks import accuracy as gradient_check

    computed = []
    real = ex.compute_gradient_reference
    monkeypatch.setattr(
        ex, "compute_gradient_reference", lambda recipe: computed.append(recipe) or real(recipe)
    )

    def no_second_oracle(case):
        raise AssertionError("the gradient oracle ran again for a case file")

    monkeypatch.setattr(gradient_check, "gradient_oracle", no_second_oracle)
    opts = ReportOptions(
        name="g",
        preset="smoke",
        kernels=("naive-numpy",),
        dtypes=("fp32",),
        out=str(tmp_path),
        isolate=False,
        render=False,
        parts=("gradients",),
    )
    assert run_report(opts, echo=lambda *a: None) == 0
    data = load(tmp_path / "g" / "results.jsonl")
    assert data.complete and data.gradients
    assert len(computed) == len(set(computed))  # one reference per recipe
    saved = {r.key for r in data.case_files.values()}
    assert saved & {r.key for r in data.gradients}  # the worst gradient case has a file


def test_flashcheck_test_refuses_a_dtype_outside_the_declared_ones(user_dir):
    # It used to skip every test and exit 0 ("runs on no dtype here"); report exits 2.
    out = run_flashcheck(["test", "user_backward:flash_no_lse", "--dtype", "fp32"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert "runs none of --dtype fp32: its dtypes are fp16" in text, text
    assert "probing" not in text, text  # declared: refused before the probe


def test_check_and_check_gradients_refuse_an_input_outside_the_declared_contract(ub):
    # They used to judge it: an fp32 input of a kernel declared fp16 passed without a word, and
    # a causal input of one declaring no mask failed FAIL-HARD as if the kernel were wrong.
    half = replace(ub.textbook_autograd, dtypes=("fp16",), masks=frozenset(), pending=frozenset())
    q, k, v = _inputs(np.float32, b=1, hq=1, hk=1)
    with pytest.raises(ValueError, match=r"outside textbook_autograd's declared contract: fp32 "):
        flashcheck.check(half, q, k, v, save="never")
    with pytest.raises(ValueError, match=r"not among its dtypes \(fp16\)"):
        flashcheck.check_gradients(half, q, k, v, save="never")
    q, k, v = (x.astype(np.float16) for x in (q, k, v))
    with pytest.raises(ValueError, match="causal masks unsupported"):
        flashcheck.check(half, q, k, v, causal=True, save="never")
    with pytest.raises(ValueError, match="causal masks unsupported"):
        flashcheck.check_gradients(half, q, k, v, causal=True, save="never")
    assert flashcheck.check(half, q, k, v, save="never").passed
    assert flashcheck.check_gradients(half, q, k, v, save="never").passed


def test_a_declaration_is_named_by_its_own_name_and_a_plain_record_says_how_to_replay(
    tmp_path, monkeypatch
):
    # check() named a module-level declaration `good = flashcheck.kernel(good_fn, ...)` after
    # its function (good_fn) where `flashcheck test mod:good` said good; and a gradient case
    # saved from a declaration no module binds named the plain function, whose replay failed
    # with "declares no backward" and nothing on how to replay it.
    (tmp_path / "plainmod.py").write_text(
        "import flashcheck, torch\n"
        "def good_fn(q, k, v, *, causal=False, scale=None):\n"
        "    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)\n"
        "    if causal:\n"
        "        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float('-inf'))\n"
        "    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)\n"
        "def no_causal(q, k, v, *, causal=False, scale=None):\n"
        "    return good_fn(q, k, v, scale=scale)\n"
        "good = flashcheck.kernel(good_fn, backward='autograd')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import plainmod

    q, k, v = _inputs(np.float32, b=1, hq=1, hk=1, nq=8, nk=8)
    assert flashcheck.check(plainmod.good, q, k, v, save="never").kernel == "plainmod:good"
    inline = flashcheck.kernel(plainmod.no_causal, backward="autograd")
    res = flashcheck.check_gradients(inline, q, k, v, causal=True, case_dir=tmp_path)
    assert not res.passed
    with pytest.raises(RuntimeError, match=r"plainmod:no_causal, which declares none.*--kernel"):
        replay(res.case_id, directory=tmp_path, echo=lambda *_: None)


def test_an_exception_of_the_kernel_says_which_function_raised_it_and_on_what(tmp_path):
    # A backward's bare torch size error came out of check_gradients with nothing to say it
    # came from the user's backward, or on what input; and, unlike a failing verdict, the
    # input that made the kernel raise was not saved.
    def forward(q, k, v, *, causal=False, scale=None):
        return q.new_zeros(q.shape[:-1] + v.shape[-1:])

    def backward(q, k, v, do, *, causal=False, scale=None):
        raise RuntimeError("Expected size for first two dimensions of batch2 tensor")

    kern = flashcheck.kernel(forward, name="mine", backward=backward, dtypes=("fp16",))
    q, k, v = _inputs(nq=24, nk=16)
    with pytest.raises(RuntimeError, match="batch2") as info:
        flashcheck.check_gradients(kern, q, k, v, save="never")
    (note,) = info.value.__notes__
    assert note.startswith("flashcheck: raised by the backward of mine on ") and "Nq=24" in note

    with pytest.raises(RuntimeError, match="batch2") as info:
        flashcheck.check_gradients(kern, q, k, v, case_dir=tmp_path)
    raised, saved = info.value.__notes__
    assert raised.startswith("flashcheck: raised by the backward of mine")
    cid = re.fullmatch(
        r"flashcheck: saved case (\S+); replay with: flashcheck replay \1 --dir .*", saved
    )[1]
    case, record = load_case(cid, tmp_path)
    assert record["verdict"] == {
        "verdict": "ERROR",
        "message": "RuntimeError: Expected size for first two dimensions of batch2 tensor",
    }
    assert record["context"]["property"] == "gradients" and case.q.shape == (2, 4, 24, 16)
    lines = []
    _, verdict, _ = replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
    assert verdict == "ERROR" and "replayed: ERROR (same verdict)" in lines[-1]

    def broken(q, k, v, *, causal=False, scale=None):
        raise ValueError("no")

    with pytest.raises(ValueError, match="no") as info:
        fwd = flashcheck.kernel(broken, name="fwd", dtypes=("fp16",))
        flashcheck.check(fwd, q, k, v, case_dir=tmp_path)
    assert info.value.__notes__[0].startswith("flashcheck: raised by fwd on ")
    assert info.value.__notes__[1].startswith("flashcheck: saved case ")
    # An output of the wrong shape is saved as the suite saves it: BAD-OUTPUT.
    wrong = flashcheck.kernel(lambda q, k, v: q[..., :1], name="wrong", dtypes=("fp16",))
    with pytest.raises(ValueError, match="shape") as info:
        flashcheck.check(wrong, q, k, v, case_dir=tmp_path)
    cid = info.value.__notes__[-1].split()[3].rstrip(";")
    assert load_case(cid, tmp_path)[1]["verdict"]["verdict"] == "BAD-OUTPUT"
