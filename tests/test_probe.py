"""Probing finds the contract of a plain function: each planted function below rejects one input
class (by raising, as real kernels do), and the probe must find exactly that limit; a kernel
that hangs or raises on everything is reported with the reason."""

from dataclasses import replace

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.adapters.outcome import Outcome, call_kernel
from flashcheck.harness.adapters.probe import probe, resolved
from flashcheck.harness.core.status import Status


def _zeros(q, v):
    """An output of the right shape and dtype (the probe looks at shapes, not values)."""
    return np.zeros((*q.shape[:3], v.shape[3]), dtype=q.dtype)


def _numpy(fn, **kw):
    return flashcheck.kernel(fn, api="numpy", devices=("cpu",), **kw)


def fp32_only(q, k, v, *, causal=False, window=None, mask=None, scale=None):
    if q.dtype != np.float32:
        raise TypeError(f"only float32, got {q.dtype}")
    return _zeros(q, v)


def pow2_dims(q, k, v, *, causal=False, scale=None):
    bad = {q.shape[3], v.shape[3]} - {16, 32, 64, 128}
    if bad:
        raise ValueError(f"head dims {sorted(bad)} unsupported")
    return _zeros(q, v)


def causal_only(q, k, v, *, causal=False, window=None):
    if window is not None:
        raise NotImplementedError("no sliding window")
    return _zeros(q, v)


def no_gqa(q, k, v, *, causal=False, scale=None):
    if q.shape[1] != k.shape[1]:
        raise ValueError("Hq must equal Hk")
    return _zeros(q, v)


def broadcast_heads(q, k, v, *, causal=False, scale=None):
    # Heads left to broadcasting, as `q @ k.transpose(-1, -2)` does: one key head works,
    # two key heads for four query heads do not.
    np.broadcast_shapes(q.shape[:2], k.shape[:2])
    return _zeros(q, v)


def square_only(q, k, v, *, causal=False, scale=None):
    if q.shape[2] != k.shape[2]:
        raise ValueError("Nq must equal Nk")
    return _zeros(q, v)


def one_slice(q, k, v, *, causal=False, scale=None):
    if q.shape[0] * q.shape[1] > 1:
        raise ValueError("one (batch, head) per call")
    return _zeros(q, v)


def blocks_of_32(q, k, v, *, causal=False, scale=None):
    if q.shape[2] % 32 or k.shape[2] % 32:
        raise ValueError("lengths must be multiples of 32")
    return _zeros(q, v)


def everything(q, k, v, *, causal=False, window=None, mask=None, scale=None):
    return _zeros(q, v)


def always_raises(q, k, v, *, causal=False, scale=None):
    raise RuntimeError("no GPU here")


def wrong_shape(q, k, v, *, causal=False, scale=None):
    return np.zeros((1, 1, 1, 1), dtype=q.dtype)


def test_a_function_that_takes_everything_gets_the_whole_contract():
    kern = probe(_numpy(everything))
    assert kern.dtypes == ("fp16", "bf16", "fp32")
    assert kern.head_dims is None and kern.seq_multiple == 1
    assert kern.masks == frozenset({"causal", "window", "mask"})
    assert kern.options == frozenset({"causal", "window", "mask", "scale"})
    assert kern.gqa and kern.unequal_lengths and kern.batched and kern.distinct_dv
    assert not kern.pending and not kern.unsupported


@pytest.mark.parametrize(
    ("fn", "field", "want", "note"),
    [
        (fp32_only, "dtypes", ("fp32",), "only float32"),
        (pow2_dims, "head_dims", (16, 32, 64, 128), "unsupported"),
        (pow2_dims, "distinct_dv", True, None),
        (causal_only, "masks", frozenset({"causal"}), "no sliding window"),
        (no_gqa, "gqa", False, "Hq must equal Hk"),
        (broadcast_heads, "gqa", False, "cannot be broadcast"),
        (square_only, "unequal_lengths", False, "Nq must equal Nk"),
        (one_slice, "batched", False, "one (batch, head) per call"),
        (blocks_of_32, "seq_multiple", 32, "multiples of 32"),
    ],
)
def test_the_probe_finds_each_limit_and_keeps_the_kernels_reason(fn, field, want, note):
    kern = probe(_numpy(fn))
    assert getattr(kern, field) == want, kern.contract_lines()
    if note is not None:
        assert any(note in why for _, why in kern.unsupported), kern.unsupported
    assert not kern.pending


def test_a_masks_limit_comes_from_the_signature_too():
    # pow2_dims names no window or mask keyword: those are never passed, nor probed.
    kern = probe(_numpy(pow2_dims))
    assert kern.masks == frozenset({"causal"}) and kern.options == frozenset({"causal", "scale"})


def test_declared_fields_are_trusted_not_probed():
    kern = _numpy(fp32_only, dtypes=("fp16", "fp32"))
    assert "dtypes" not in kern.pending
    # fp16 is declared: the probe does not remove it (the campaign will show the errors).
    assert probe(kern).dtypes == ("fp16", "fp32")


def test_a_kernel_that_raises_on_every_input_is_reported_with_its_exception():
    kern = probe(_numpy(always_raises))
    assert kern.dtypes == ()
    ((what, why),) = kern.unsupported
    assert what == "every probe input" and "RuntimeError: no GPU here" in why
    assert "ran on none of the probe inputs" in kern.contract_lines()[0]


def test_an_error_re_raised_in_our_words_is_placed_where_the_user_raised_it(tmp_path):
    # A user's module that failed to import in worker processes was reported "at
    # .../flashcheck/harness/adapters/registry.py", its location cut at 160 characters.
    from flashcheck.harness.adapters.outcome import describe
    from flashcheck.harness.adapters.registry import as_kernel

    (tmp_path / "breaks_on_import.py").write_text("x = 1\nraise ImportError('needs a GPU')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(tmp_path))
        with pytest.raises(ValueError) as info:
            as_kernel("breaks_on_import:fn")
    text = describe(info.value)
    assert text.startswith("ValueError: cannot import 'breaks_on_import' for kernel")
    assert text.endswith(f"(at {tmp_path / 'breaks_on_import.py'}:2)")

    def raises_long(q, k, v):
        raise RuntimeError("x" * 200 + " the end")

    kern = probe(flashcheck.kernel(raises_long, api="numpy"))
    assert "x the end (at " in kern.unsupported[0][1], kern.unsupported


def test_a_wrong_output_counts_as_running():
    # It is judged later, as BAD-OUTPUT, where it happens: not a limit of the contract.
    kern = probe(_numpy(wrong_shape))
    assert kern.dtypes == ("fp16", "bf16", "fp32") and kern.gqa and kern.batched


def test_a_kernel_that_hangs_on_the_base_shape_cannot_run():
    def hangs(case):
        return Outcome.failed(Status.TIMEOUT, "no result within 120 s")

    kern = probe(_numpy(everything, name="hangs-always"), runner=hangs)
    assert kern.dtypes == ()
    assert kern.unsupported == (("every probe input", "it hung: no result within 120 s"),)


def test_a_hang_past_the_base_shape_stays_in_the_contract():
    # Where the kernel hangs is recorded by the campaign, as TIMEOUT: the probe does not hide
    # it by narrowing the contract.
    base = _numpy(everything, name="hangs-on-gqa")

    def run(case):
        if case.shape[1] != case.shape[2]:
            return Outcome.failed(Status.TIMEOUT, "no result within 1 s")
        return call_kernel(base.run, case, "cpu")

    assert probe(base, runner=run).gqa


def test_a_declined_input_marks_the_class_unsupported_a_crash_does_not():
    # A kernel that killed its process on odd lengths had its contract narrowed to multiples
    # of 16 and passed, exit 0: a crash is a failure for the campaign to record where it
    # happens, as a hang is, not a refusal.
    base = _numpy(everything, name="crashes-on-batches")
    calls = []

    def run(case):
        calls.append(case.shape)
        if case.shape[0] > 1:
            return Outcome.failed(Status.ERROR, "the kernel process died (exit code -11)")
        if case.dtype == "bf16":
            return Outcome.failed(Status.SKIP, "the backend takes no bf16")
        return call_kernel(base.run, case, "cpu")

    kern = probe(base, runner=run)
    assert kern.batched and kern.dtypes == ("fp16", "fp32")
    assert dict(kern.unsupported) == {"bf16": "the backend takes no bf16"}
    # The call after the crash ran in a fresh process, after the base shape there.
    at = next(i for i, shape in enumerate(calls) if shape[0] > 1)
    assert calls[at + 1] == calls[0] and len(calls) > at + 2

    def crashes(case):
        return Outcome.failed(Status.ERROR, "the kernel process died (exit code 3)")

    kern = probe(_numpy(everything, name="crashes-always"), runner=crashes)
    assert kern.dtypes == ()
    assert kern.unsupported == (
        ("every probe input", "it killed its process: the kernel process died (exit code 3)"),
    )


def test_a_runner_must_answer_an_outcome():
    with pytest.raises(TypeError, match="returns an Outcome"):
        probe(_numpy(everything, name="bad-runner"), runner=lambda case: None)


def test_resolved_probes_only_what_is_pending():
    kern = probe(_numpy(blocks_of_32))
    assert resolved(kern) is kern
    again = replace(kern, pending=frozenset({"gqa"}))
    assert resolved(again).seq_multiple == 32 and resolved(again).gqa


def test_a_users_triton_kernel_is_not_judged_in_bf16_by_a_broken_interpreter(monkeypatch):
    # A user's correct Triton kernel got 14 FAIL-HARD in bf16 under TRITON_INTERPRET=1 (the
    # interpreter's bf16 tl.dot is wrong), and the report said "Limitations: None detected".
    pytest.importorskip(
        "triton", reason="Triton is not a flashcheck dependency; this user kernel needs it"
    )
    from pathlib import Path

    from flashcheck.harness.adapters.availability import triton_available

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "user"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    import user_triton_guard

    kern = flashcheck.kernel(user_triton_guard.flash)
    broken = "11584" in (triton_available("bf16", "cpu") or "")
    why = kern.unavailable("bf16", "cpu")
    assert (why is not None) == broken, why
    if broken:
        assert why.startswith("bf16 tl.dot is broken in the Triton interpreter")
    assert kern.unavailable("fp16", "cpu") is None and kern.unavailable("bf16", "cuda") is None
    # A kernel not written with Triton is judged in bf16 under the interpreter as anywhere.
    assert flashcheck.kernel(everything, api="numpy").unavailable("bf16", "cpu") is None
