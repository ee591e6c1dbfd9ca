"""Each structural check can fail: a planted kernel per check (a small numpy function with one
bug) is FAIL, a correct kernel is PASS, and a case that gives the check nothing to test is
NOT-APPLICABLE with the reason, never a pass."""

import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_flashcheck
from structural_helpers import naive_fn, nan_to_zero, planted, small_case

from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.checks.batch_invariance import (
    BATCH_INVARIANT,
    DECLARED_BUT,
    NOT_BATCH_INVARIANT,
)
from flashcheck.harness.checks.do_layouts import LAYOUT_BITS
from flashcheck.harness.checks.registry import CHECKS, GRADIENT_CHECKS, check_target
from flashcheck.harness.checks.structural import StructuralResult
from flashcheck.harness.core.status import Status
from flashcheck.kernels.naive import naive_numpy_backward
from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention

PASS, FAIL, NA = Status.PASS, Status.FAIL, Status.NOT_APPLICABLE


# -- the planted bugs ------------------------------------------------------------------------
def batch_zero_keys(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Every batch attends to batch 0's keys and values."""
    k0 = np.broadcast_to(k[:1], k.shape).copy()
    v0 = np.broadcast_to(v[:1], v.shape).copy()
    return naive_fn(q, k0, v0, causal=causal, window=window, scale=scale, mask=mask)


def ignores_strides(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Reads its inputs as if they were contiguous from their first element."""

    def dense(x):
        return np.lib.stride_tricks.as_strided(
            x, x.shape, np.zeros(x.shape, x.dtype).strides, writeable=False
        ).copy()

    return naive_fn(dense(q), dense(k), dense(v), causal=causal, window=window, scale=scale)


def noisy(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """One output element moves by one ulp, at random, on every call."""
    o, lse = naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)
    o = o.copy()
    i = np.random.default_rng().integers(o.size)
    o.flat[i] = np.nextafter(o.flat[i], np.inf, dtype=o.dtype)
    return o, lse


def drops_first_key(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """The first key never joins the softmax."""
    return naive_fn(q, k[:, :, 1:], v[:, :, 1:], causal=causal, window=window, scale=scale)


def ignores_causal(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Accepts ``causal`` and drops it."""
    return naive_fn(q, k, v, window=window, scale=scale, mask=mask)


def unrounded_p(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """The flash recurrence with P kept in fp32 (more accurate than the flash class)."""
    dt = {np.float16: "fp16", np.float32: "fp32"}[q.dtype.type]
    policy = PrecisionPolicy(input=dt, score="fp32", accum="fp32", p="fp32", output=dt)
    return online_attention(
        q, k, v, policy=policy, block_k=16, causal=causal, window=window, scale=scale
    )


def noisy_backward(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
    """dQ moves by one ulp in one element, at random, on every call."""
    dq, dk, dv = naive_numpy_backward(q, k, v, do, causal=causal, window=window, scale=scale)
    dq = np.array(dq, copy=True)
    i = np.random.default_rng().integers(dq.size)
    dq.flat[i] = np.nextafter(dq.flat[i], np.inf, dtype=dq.dtype)
    return dq, dk, dv


def exact_backward(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
    """Gradients in float64 throughout: P and dS never rounded to the input format."""
    f64 = [x.astype(np.float64) for x in (q, k, v, do)]
    grads = naive_numpy_backward(*f64, causal=causal, window=window, scale=scale, precision="fp64")
    return tuple(g.astype(np.float32) for g in grads)


def scales_q_in_place(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Applies the scale to the caller's q in place (``q *= scale``)."""
    tau = q.shape[-1] ** -0.5 if scale is None else scale
    q *= q.dtype.type(tau)
    return naive_fn(q, k, v, causal=causal, window=window, scale=1.0, mask=mask)


_BUFFERS = {}


def reuses_its_buffer(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Writes every result into one persistent buffer per shape and returns that buffer."""
    o, lse = naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)
    buf = _BUFFERS.setdefault(("numpy", o.shape, o.dtype), np.empty_like(o))
    buf[...] = o
    return buf, lse


def torch_scales_q_in_place(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    import torch

    q.mul_(q.shape[-1] ** -0.5 if scale is None else scale)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)


def torch_reuses_lse(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    import torch

    tau = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * tau
    o = (torch.softmax(s, -1) @ v.float()).to(q.dtype)
    buf = _BUFFERS.setdefault(("torch", s.shape[:-1]), torch.empty(s.shape[:-1]))
    buf.copy_(torch.logsumexp(s, -1))
    return o, buf


def torch_good(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    import torch

    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


def scales_do_in_place(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
    """A backward that doubles the caller's dO before using it."""
    do *= do.dtype.type(2)
    dq, dk, dv = naive_numpy_backward(q, k, v, do, causal=causal, window=window, scale=scale)
    return dq / 2, dk / 2, dv / 2


def reuses_its_dq(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
    """A backward that writes dQ into one persistent buffer per shape."""
    dq, dk, dv = naive_numpy_backward(q, k, v, do, causal=causal, window=window, scale=scale)
    buf = _BUFFERS.setdefault(("dq", dq.shape), np.empty_like(dq))
    buf[...] = dq
    return buf, dk, dv


def reads_do_as_contiguous(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
    """A backward that reads dO's memory with the strides of a contiguous array."""
    strides = tuple(int(np.prod(do.shape[i + 1 :])) * do.itemsize for i in range(do.ndim))
    flat = np.lib.stride_tricks.as_strided(do, do.shape, strides, writeable=False)
    return naive_numpy_backward(q, k, v, flat, causal=causal, window=window, scale=scale)


def rounds_differently_when_do_is_strided(
    q, k, v, do, *, causal=False, window=None, scale=None, mask=None
):
    """Right values, but dQ one ulp up when dO is not contiguous (as a compiled variant per
    stride alignment can give)."""
    dq, dk, dv = naive_numpy_backward(q, k, v, do, causal=causal, window=window, scale=scale)
    if not do.flags.c_contiguous:
        dq = np.nextafter(dq, np.inf).astype(dq.dtype)
    return dq, dk, dv


def reverses_keys_when_alone(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """Correct, but a batch of one sums its keys in reverse order: other roundings."""
    if q.shape[0] == 1:
        k, v = k[:, :, ::-1], v[:, :, ::-1]
    return naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)


# -- one planted kernel per check: FAIL on it, PASS on a correct kernel -----------------------
NAIVE = resolve("naive-numpy")
FLASH = resolve("recurrence-fa2")
HUGE = {"family": "huge_logits", "magnitude": 1e4}
PLANTED = {
    "batch-head-independence": (planted(batch_zero_keys), NAIVE, {}),
    "padded-buffers": (planted(ignores_strides), NAIVE, {}),
    "determinism": (planted(noisy), NAIVE, {}),
    "key-permutation": (planted(drops_first_key), NAIVE, {}),
    "nan-rule": (planted(nan_to_zero), NAIVE, {"family": "nonfinite", "seed": 0}),
    "options-applied": (planted(ignores_causal), NAIVE, {"causal": True}),
    "conformance": (planted(unrounded_p, arithmetic="flash", key_block=16), FLASH, {}),
    "integrity": (planted(scales_q_in_place), NAIVE, {}),
    "batch-invariance": (planted(reverses_keys_when_alone), NAIVE, {}),
}


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_each_forward_check_fails_on_its_planted_bug_and_passes_a_correct_kernel(name):
    bad, good, kw = PLANTED[name]
    case = small_case(**kw)
    found = CHECKS[name](bad, case, "cpu")
    assert found.status is FAIL, found
    assert CHECKS[name](good, case, "cpu").status is PASS


def test_every_check_has_a_planted_bug_here():
    gradient = {
        "gradient-determinism",
        "gradient-conformance",
        "gradient-integrity",
        "gradient-do-layouts",
    }
    assert set(PLANTED) | gradient == {
        *CHECKS,
        *GRADIENT_CHECKS,
    }


def test_gradient_determinism_fails_on_a_noisy_backward():
    bad = replace(NAIVE, name="noisy-backward", backward=noisy_backward)
    case = small_case()
    assert GRADIENT_CHECKS["gradient-determinism"](bad, case, "cpu").status is FAIL
    assert GRADIENT_CHECKS["gradient-determinism"](NAIVE, case, "cpu").status is PASS


def test_gradient_conformance_fails_on_a_backward_more_accurate_than_flash():
    bad = replace(FLASH, name="exact-backward", backward=exact_backward)
    case = small_case(b=1, hq=1, hk=1, d=32, seed=3)
    found = GRADIENT_CHECKS["gradient-conformance"](bad, case, "cpu")
    assert found.status is FAIL, found
    assert GRADIENT_CHECKS["gradient-conformance"](FLASH, case, "cpu").status is PASS


def test_gradient_do_layouts_fails_on_a_backward_that_assumes_a_contiguous_do():
    bad = replace(NAIVE, name="contiguous-do", backward=reads_do_as_contiguous)
    case = small_case()
    found = GRADIENT_CHECKS["gradient-do-layouts"](bad, case, "cpu")
    assert found.status is FAIL, found
    assert found.message.startswith("with dO as a strided view into a larger buffer, dQ is NaN")
    good = GRADIENT_CHECKS["gradient-do-layouts"](NAIVE, case, "cpu")
    assert good.status is PASS and "dO strided and expanded" in good.message, good


def test_gradient_do_layouts_reports_layout_dependent_bits_without_failing_them():
    # Right values, one ulp other for a non-contiguous dO: reported for every kernel, gated for
    # none (`deterministic` promises the same bits for the same call, not across layouts).
    bits = replace(NAIVE, name="layout-bits", backward=rounds_differently_when_do_is_strided)
    case = small_case()
    for adapter in (bits, replace(bits, deterministic=False)):
        found = GRADIENT_CHECKS["gradient-do-layouts"](adapter, case, "cpu")
        assert found.status is PASS, found
        assert found.message.startswith(LAYOUT_BITS) and "dQ in " in found.message, found
    wrong = replace(NAIVE, name="contiguous-do", backward=reads_do_as_contiguous)
    found = GRADIENT_CHECKS["gradient-do-layouts"](wrong, case, "cpu")
    assert found.status is FAIL and "reads the wrong elements" in found.message


def test_gradient_do_layouts_names_a_backward_wrong_whatever_the_layout():
    # No causal mask in the backward, and other roundings for a non-contiguous dO: the rows'
    # exact gradients are 0 with a bound of 0, so the rounding difference is beyond it; the
    # hint must not send the author to dO's strides alone.
    def unmasked(q, k, v, do, *, causal=False, window=None, scale=None, mask=None):
        return rounds_differently_when_do_is_strided(q, k, v, do, window=window, scale=scale)

    bad = replace(NAIVE, name="unmasked-backward", backward=unmasked)
    found = GRADIENT_CHECKS["gradient-do-layouts"](bad, small_case(n=16, nk=17, causal=True), "cpu")
    assert found.status is FAIL, found
    assert "wrong whatever dO's layout" in found.message and "mask" in found.message, found


def test_batch_invariance_is_measured_undeclared_and_gated_declared():
    case = small_case()
    declared = CHECKS["batch-invariance"](planted(reverses_keys_when_alone), case, "cpu")
    assert declared.status is FAIL
    assert declared.message.startswith(DECLARED_BUT + "LSE differs in "), declared
    assert "at position 1 of a batch of 2" in declared.message
    loose = planted(reverses_keys_when_alone, batch_invariant=False)
    measured = CHECKS["batch-invariance"](loose, case, "cpu")
    assert measured.status is PASS
    assert measured.message.startswith(NOT_BATCH_INVARIANT + "LSE differs in "), measured
    same = CHECKS["batch-invariance"](replace(NAIVE, batch_invariant=False), case, "cpu")
    assert same.status is PASS and same.message.startswith(BATCH_INVARIANT), same
    one = CHECKS["batch-invariance"](replace(NAIVE, batched=False), case, "cpu")
    assert one.status is Status.NOT_APPLICABLE


TORCH = dict(api="torch", arithmetic="unknown", batch_invariant=False, deterministic=False)


@pytest.mark.parametrize(
    ("kern", "kw", "named"),
    [
        (planted(scales_q_in_place), {}, "modified its input q: 2048 elements changed"),
        (planted(reuses_its_buffer), {}, "the next call overwrote: O changed in 2048 elements"),
        (planted(torch_scales_q_in_place, **TORCH), {}, "modified its input q: 2048 elements"),
        (planted(torch_reuses_lse, **TORCH), {}, "the next call overwrote: LSE changed in 128 "),
    ],
    ids=["numpy-q", "numpy-buffer", "torch-q", "torch-lse"],
)
def test_integrity_names_the_tensor_that_changed(kern, kw, named):
    case = small_case(
        hq=4, hk=4, n=16, d=16, **kw
    )  # q and O: 2 * 4 * 16 * 16 = 2048 elements; LSE 128
    found = CHECKS["integrity"](kern, case, "cpu")
    assert found.status is FAIL and named in found.message, found
    # where, in bits and values: what a user needs to see the overwrite for themselves
    assert re.search(r"\(first \[[\d, ]+\]: 0x[0-9a-f]+ \(\S+\) became 0x[0-9a-f]+ ", found.message)
    good = NAIVE if kern.api == "numpy" else planted(torch_good, **TORCH)
    assert CHECKS["integrity"](good, case, "cpu").status is PASS


def test_integrity_compares_raw_bits_of_nan_inputs_and_the_mask():
    case = small_case(mask_density=0.5)
    q = case.q.copy()
    q[0, 0, 0, :3] = np.nan
    case = replace(case, q=q)
    found = CHECKS["integrity"](NAIVE, case, "cpu")
    assert found.status is PASS, found

    def flips_nan_signs(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        q[np.isnan(q)] = -q[np.isnan(q)]  # still NaN: only the bits show the change
        return naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)

    def clears_the_mask(q, k, v, *, causal=False, window=None, scale=None, mask=None):
        out = naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)
        mask[...] = True
        return out

    found = CHECKS["integrity"](planted(flips_nan_signs), case, "cpu")
    assert found.status is FAIL and "modified its input q" in found.message, found
    found = CHECKS["integrity"](planted(clears_the_mask), case, "cpu")
    assert found.status is FAIL and "modified its input mask" in found.message, found


@pytest.mark.parametrize(
    ("backward", "named"),
    [
        (scales_do_in_place, "the backward modified its input dO"),
        (reuses_its_dq, "the backward returned storage that the next call overwrote: dQ"),
    ],
)
def test_gradient_integrity_names_the_tensor_that_changed(backward, named):
    case = small_case()
    found = GRADIENT_CHECKS["gradient-integrity"](replace(NAIVE, backward=backward), case, "cpu")
    assert found.status is FAIL and named in found.message, found
    assert GRADIENT_CHECKS["gradient-integrity"](NAIVE, case, "cpu").status is PASS


# -- not applicable: never a pass ------------------------------------------------------------
def _o_only(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    return naive_fn(q, k, v, causal=causal, window=window, scale=scale, mask=mask)[0]


@pytest.mark.parametrize(
    ("name", "kern", "kw", "why"),
    [
        ("batch-head-independence", NAIVE, {"b": 1, "hq": 1, "hk": 1}, "one (batch, head)"),
        ("key-permutation", NAIVE, {"causal": True}, "sets a mask"),
        ("key-permutation", NAIVE, {"n": 1}, "one key"),
        ("options-applied", NAIVE, {}, "sets no option"),
        ("conformance", NAIVE, {}, "flash class only"),
        ("conformance", FLASH, {"n": 17}, "Nk <= 16"),
    ],
)
def test_a_check_with_nothing_to_test_says_why(name, kern, kw, why):
    found = CHECKS[name](kern, small_case(**kw), "cpu")
    assert found.status is NA and why in found.message, found


def test_backward_conformance_of_a_kernel_without_lse_is_not_a_pass():
    # The flash backward recomputes P from LSE: a forward that returns O only gives it nothing
    # to compare, on every case.
    kern = replace(FLASH, name="o-only", fn=_o_only)
    found = GRADIENT_CHECKS["gradient-conformance"](kern, small_case(b=1, hq=1, hk=1), "cpu")
    assert found.status is NA and "no LSE" in found.message


def test_options_applied_where_no_option_moves_the_answer_is_not_a_pass():
    # One query, one key: causal (bottom-right aligned) keeps the key, so it changes nothing.
    found = CHECKS["options-applied"](NAIVE, small_case(n=1, causal=True), "cpu")
    assert found.status is NA and "changes the exact answer" in found.message


def all_nan(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """NaN for every output, with the option or without."""
    return np.full(q.shape[:3] + v.shape[3:], np.nan, q.dtype)


def test_options_applied_names_nan_outputs_instead_of_blaming_the_option():
    found = CHECKS["options-applied"](planted(all_nan), small_case(n=16, nk=17, causal=True), "cpu")
    assert found.status is FAIL and "NaN/Inf" in found.message and "ignores" not in found.message


def zeros_out(q, k, v, *, causal=False, window=None, scale=None, mask=None):
    """O = 0 everywhere, with the option or without: wrong, but not for the option's sake."""
    return np.zeros(q.shape[:3] + v.shape[3:], q.dtype)


def test_options_applied_does_not_blame_the_option_for_a_kernel_wrong_without_it():
    case = small_case(n=16, nk=17, causal=True)
    found = CHECKS["options-applied"](planted(zeros_out), case, "cpu")
    assert found.status is FAIL, found
    assert "wrong there too" in found.message and "ignores" not in found.message, found
    ignored = CHECKS["options-applied"](planted(ignores_causal), case, "cpu")
    assert "the kernel ignores the option there" in ignored.message, ignored


def test_a_structural_result_is_three_states_only():
    with pytest.raises(ValueError, match="PASS, FAIL or NOT-APPLICABLE"):
        StructuralResult(Status.ERROR, "x")
    assert str(StructuralResult.not_applicable("why")) == "NOT-APPLICABLE: not applicable (why)"


def test_checks_are_named_for_workers_by_module_and_function():
    assert check_target("determinism") == "flashcheck.harness.checks.structural:determinism"
    assert check_target("gradient-conformance").endswith("conformance:gradient_conformance")
    with pytest.raises(ValueError, match="unknown structural check"):
        check_target("nope")


@pytest.mark.slow
def test_the_suite_skips_backward_conformance_of_a_kernel_without_lse(tmp_path):
    # Before, every draw of this property was "not applicable" and counted as a pass.
    shutil.copy(Path(__file__).parent / "user" / "user_backward.py", tmp_path)
    args = ["test", "user_backward:flash_no_lse", "--", "-k", "flash_backward_matches", "-rs"]
    out = run_flashcheck(args, tmp_path, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "1 skipped" in text and " passed" not in text, text
    assert "the kernel returns no LSE" in text, text


@pytest.mark.slow
def test_the_suite_reports_gradient_bits_that_depend_on_the_layout_of_do(tmp_path):
    # Before, `flashcheck test` passed such a kernel without a word; the report said it.
    shutil.copy(Path(__file__).parent / "user" / "user_backward.py", tmp_path)
    args = ["test", "user_backward:layout_bits", "--dtype", "fp32", "--", "-k", "layout_of_do"]
    out = run_flashcheck(args, tmp_path, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "gradient bits the same for every dO layout: no (with dO as a strided view" in text, text
    assert "within twice their bounds" in text, text
    # a backward that raises on a strided dO: the line says so, not "yes, bitwise"
    args[1] = "user_backward:views_do"
    out = run_flashcheck(args, tmp_path, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "gradient bits the same for every dO layout: not known: it failed" in text, text
