"""The precision floor: an undeclared kernel (class ``unknown``) is held to the arithmetic
classes at or above its input format's precision; tf32 products (fp32 inputs) pass only when
declared, and errors that fit them are FAIL-HARD with a reason naming the declaration."""

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_helpers import run_flashcheck

import flashcheck
from flashcheck.harness.campaign.sections import fit_text
from flashcheck.harness.core.formats import FP32
from flashcheck.harness.core.resultlog import read_records
from flashcheck.harness.core.status import Status
from flashcheck.harness.judging.bounds import error_bounds
from flashcheck.harness.judging.classes import (
    applicable_classes,
    floor_classes,
    precision_reason,
    reduced_classes,
)
from flashcheck.harness.judging.gradient_bounds import gradient_bounds
from flashcheck.harness.judging.roundoff import TensorBounds
from flashcheck.harness.judging.verdict import judge_gradients, judge_tensor
from flashcheck.harness.oracle.tensor import CertifiedTensor

HERE = Path(__file__).parent / "user"
REASON = (
    'precision below fp32: the errors fit the bounds of tf32 matmuls (declare arithmetic="tf32"'
)


def _user_module():
    spec = importlib.util.spec_from_file_location("user_precision", HERE / "user_precision.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unknown_envelope_per_input_format():
    assert applicable_classes("fp32") == ("naive", "flash", "flash-fa1", "tf32")
    assert floor_classes("fp32") == ("naive", "flash", "flash-fa1")
    assert reduced_classes("fp32") == ("tf32",)
    for fmt in ("fp16", "bf16"):
        assert applicable_classes(fmt) == floor_classes(fmt) == ("naive", "flash", "flash-fa1")
        assert reduced_classes(fmt) == ()


def test_unknown_bounds_keep_tf32_as_a_part_outside_the_envelope():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 1, 8, 16)).astype(np.float32) for _ in range(3))
    b = error_bounds(q, k, v, arithmetic="unknown")
    assert set(b.parts) == {"naive", "flash", "flash-fa1", "tf32"}
    envelope = np.maximum.reduce([b.parts[c].o.det for c in floor_classes("fp32")])
    assert np.array_equal(b.o.det, envelope)
    assert (b.parts["tf32"].o.det > b.o.det).all()  # tf32's bound is looser everywhere here


def test_precision_reason_names_the_declaration():
    why = precision_reason("fp32", "tf32")
    assert why.startswith(REASON) and "--arithmetic tf32" in why
    with pytest.raises(ValueError, match="not a reduced-precision class"):
        precision_reason("fp16", "tf32")
    with pytest.raises(ValueError, match="not a reduced-precision class"):
        precision_reason("fp32", "flash")


def _judge(error, lower_det, y_bad=False):
    """O of two elements judged with det bound 1 and a lower class's det bound ``lower_det``."""
    hi = np.array([[[[0.5, 0.25]]]])
    zero = np.zeros_like(hi)
    ref = CertifiedTensor(hi, zero, zero, zero + 1.0, hi.copy(), np.ones(hi.shape, bool))
    y = hi + np.array([error, 0.0])
    if y_bad:
        y[..., 1] = np.nan
    env = TensorBounds(np.ones(hi.shape), np.ones(hi.shape))
    lower = {"tf32": TensorBounds(np.full(hi.shape, lower_det), np.full(hi.shape, lower_det))}
    return judge_tensor("o", y, ref, env, fmt=FP32, naive=None, lower=lower)


def test_errors_within_a_lower_class_give_the_precision_reason():
    v = _judge(error=2.0, lower_det=4.0)
    assert v.verdict == Status.FAIL_HARD
    assert v.reasons[0].startswith(f"FAIL-HARD: {REASON}")
    assert "exceed the deterministic bound" in v.reasons[1]


def test_a_case_states_the_precision_reason_once_for_o_and_lse():
    # O's judgement and LSE's both find the kernel below fp32; a user saw the line twice.
    from flashcheck.harness.judging.tensor_verdict import Verdict

    o = _judge(error=2.0, lower_det=4.0)
    lse = replace(o, name="lse")
    both = Verdict({"o": o, "lse": lse}).reasons
    assert both == o.reasons and sum("precision below" in r for r in both) == 1


def test_no_precision_reason_beyond_the_lower_class_or_for_nan():
    above = _judge(error=8.0, lower_det=4.0)
    assert above.verdict == Status.FAIL_HARD
    assert not any("precision below" in r for r in above.reasons)
    nan = _judge(error=2.0, lower_det=4.0, y_bad=True)
    assert nan.verdict == Status.FAIL_HARD
    assert not any("precision below" in r for r in nan.reasons)
    within = _judge(error=0.5, lower_det=4.0)
    assert within.verdict == Status.PASS and within.reasons == []


def _bf16_products(q, k, v, *, causal=False, scale=None):
    """An fp32 kernel whose q and k are rounded to bf16 before QKᵀ (8 bits, below tf32's 11)."""
    import torch

    q, k = (x.to(torch.bfloat16).float() for x in (q, k))
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_the_precision_reason_needs_every_failing_tensor_to_fit_the_class():
    # O within tf32's bounds beside an LSE beyond them: the case said "the errors fit the
    # bounds of tf32 matmuls (declare arithmetic="tf32")", and declared, it still failed.
    x = np.float32(1 + 2**-8 + 2**-10)  # bf16 rounds it by 3·2⁻¹⁰, tf32 by at most 2⁻¹¹
    q = np.full((1, 1, 2, 1), x, dtype=np.float32)
    k = (np.array([x, -x], dtype=np.float32) * 4).reshape(1, 1, 2, 1)
    v = np.array([1.0, 0.0], dtype=np.float32).reshape(1, 1, 2, 1)
    undeclared = flashcheck.check(_bf16_products, q, k, v, save="never").verdict
    assert undeclared["o"].det_util > 1 and undeclared["lse"].det_util > 1
    assert not any(REASON in r for r in undeclared.reasons), undeclared.reasons
    declared = flashcheck.kernel(_bf16_products, arithmetic="tf32")
    assert flashcheck.check(declared, q, k, v, save="never").verdict["lse"].det_util > 1


def test_gradient_bounds_of_class_unknown_give_the_precision_reason():
    rng = np.random.default_rng(2)
    q, k, v, do = (rng.standard_normal((1, 1, 6, 8)).astype(np.float32) for _ in range(4))
    gb = gradient_bounds(q, k, v, do, arithmetic="unknown")
    ref = flashcheck.oracle(q, k, v, do=do)
    # every gradient off by half of tf32's bound: above the envelope where tf32's is looser
    grads = {}
    for name in ("dq", "dk", "dv"):
        t, tf = ref[name], gb.parts["tf32"][name].det
        grads[name] = t.hi + t.lo + 0.5 * tf
    verdicts = judge_gradients(grads, ref, gb, naive=None)
    above = [n for n in grads if (0.5 * gb.parts["tf32"][n].det > gb[n].det).any()]
    assert above  # the test means something only where tf32's bound is the looser
    for name in above:
        assert verdicts[name].verdict == Status.FAIL_HARD, name
        assert verdicts[name].reasons[0].startswith(f"FAIL-HARD: {REASON}"), name


def test_tf32_products_fail_hard_unless_declared():
    user = _user_module()
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 64, 32)).astype(np.float32) for _ in range(3))
    undeclared = flashcheck.check(user.tf32_products, q, k, v, save="never")
    assert undeclared.verdict.verdict == Status.FAIL_HARD
    assert undeclared.verdict.reasons[0].startswith(f"FAIL-HARD: {REASON}")
    declared = flashcheck.kernel(user.tf32_products, arithmetic="tf32")
    assert flashcheck.check(declared, q, k, v, save="never").verdict.verdict == Status.PASS
    exact = flashcheck.check(user.fp32_products, q, k, v, save="never")
    assert exact.verdict.verdict == Status.PASS


@pytest.fixture
def user_dir(tmp_path):
    shutil.copy(HERE / "user_precision.py", tmp_path / "user_precision.py")
    return tmp_path


def _report(user_dir, kernel, *extra):
    args = ["report", "--preset", "smoke", "--dtype", "fp32", "--kernel", kernel, *extra]
    out = run_flashcheck([*args, "--timeout", "5", "--no-render"], user_dir)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.slow
def test_cli_tf32_kernel_exits_1_with_the_precision_reason(user_dir):
    rc, text = _report(user_dir, "user_precision:tf32_products")
    assert rc == 1, text
    assert REASON in text, text
    assert "errors fit: tf32; not flash, flash-fa1, naive" in text, text
    records = read_records(user_dir / "reports/user_precision-tf32_products/results.jsonl")
    hard = [r for r in records if r.get("type") == "result" and r["status"] == "FAIL-HARD"]
    assert hard and all(REASON in r["reasons"][0] for r in hard)


@pytest.mark.slow
def test_cli_tf32_kernel_declared_tf32_exits_0(user_dir):
    rc, text = _report(user_dir, "user_precision:tf32_products", "--arithmetic", "tf32")
    assert rc == 0, text
    assert "precision below" not in text


@pytest.mark.slow
def test_cli_fp32_kernel_exits_0(user_dir):
    rc, text = _report(user_dir, "user_precision:fp32_products")
    assert rc == 0, text
    assert "precision below" not in text


def test_fit_text_names_the_classes_the_errors_fit():
    def rec(**util):
        return SimpleNamespace(status=Status.PASS, class_util=util)

    rows = [
        rec(naive=40.0, flash=35.0, **{"flash-fa1": 25.0}, tf32=0.1),
        rec(naive=0.5, flash=0.5, **{"flash-fa1": 0.5}, tf32=0.01),
    ]
    assert fit_text(rows) == "errors fit: tf32; not flash, flash-fa1, naive"
    fp16 = [rec(naive=0.9, flash=1.5, **{"flash-fa1": 0.7})]
    assert fit_text(fp16) == "errors fit: flash-fa1, naive; not flash"
    nan = rec(naive=None, flash=None, **{"flash-fa1": None})
    assert fit_text([*fp16, nan]) == (
        "errors fit: flash-fa1, naive; not flash (1 case with NaN/Inf outputs left out)"
    )
    assert fit_text([SimpleNamespace(status=Status.ERROR, class_util=None)]) is None
    bad = SimpleNamespace(status=Status.BAD_OUTPUT, class_util=None)
    assert fit_text([*fp16, nan, bad, bad]) == (
        "errors fit: flash-fa1, naive; not flash (1 case with NaN/Inf outputs and 2 cases with "
        "no output to judge left out)"
    )


def test_fit_text_says_when_the_class_a_reason_names_does_not_fit_the_other_cases():
    # A case that fits only tf32 says "declare tf32"; bf16 products in an fp32 kernel (a
    # user's trial) fit tf32 on some cases and nothing on others, where declaring tf32 would
    # not help: the summary says so. Where tf32 fits every case, it says nothing more.
    why = "FAIL-HARD: " + precision_reason("fp32", "tf32")  # as a verdict records it

    def rec(tf32, reasons=()):
        util = {"naive": 9.0, "flash": 9.0, "flash-fa1": 9.0, "tf32": tf32}
        return SimpleNamespace(status=Status.FAIL_HARD, class_util=util, reasons=reasons)

    mixed = fit_text([rec(0.5, (why,)), rec(40.0, ("O exceeds the bound",))])
    assert mixed.startswith("errors fit: no class; not flash, flash-fa1, naive, tf32; tf32, ")
    assert "declaring tf32 would not make them pass" in mixed
    assert "would not" not in fit_text([rec(0.5, (why,)), rec(0.7, (why,))])
