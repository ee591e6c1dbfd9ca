"""What a kernel gets that raises, or returns something other than an attention output, in
``flashcheck.check`` and ``check_gradients``: the exception goes on to the caller with notes
naming the function, the input and the saved case; an output of the wrong shape or format is
BAD-OUTPUT, saying what was expected."""

import re

import numpy as np
import pytest
import torch
from test_ragged_checks import USER, _varlen

import flashcheck
from flashcheck.harness.cases.ragged_store import load_ragged_case
from flashcheck.harness.checks.replay import replay


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


def test_an_output_in_the_wrong_layout_is_named_with_the_shape_expected():
    from flashcheck.harness.adapters.adapter import KernelOutputError

    def dense_shaped(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        return q.transpose(0, 1)[None]  # (1, H, total_q, d): the dense layout, not varlen's

    kern = flashcheck.kernel(dense_shaped, layout="varlen")
    with pytest.raises(
        KernelOutputError,
        match=re.escape("returned O of shape (1, 4, 27, 16), expected (27, 4, 16) (varlen)"),
    ):
        flashcheck.check(kern, _varlen(), save="never")


def test_a_ragged_kernel_that_raises_has_its_case_saved_and_replayed(user, tmp_path):
    # flashcheck.check saved a failing ragged case but not one the kernel raised on, so the
    # input that broke it (here a sequence without keys) was lost with the traceback.
    def no_empty(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        if bool((cu_seqlens_k.diff() == 0).any()):
            raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
        return user.varlen_ok.fn(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal
        )

    kern = flashcheck.kernel(no_empty, name="no_empty", layout="varlen")
    with pytest.raises(IndexError, match="out of bounds") as info:
        flashcheck.check(kern, _varlen(), case_dir=tmp_path)
    raised, saved = info.value.__notes__
    assert raised.startswith("flashcheck: raised by no_empty on randn varlen fp16 B=5")
    cid = re.fullmatch(r"flashcheck: saved case (\S+); replay with: .*", saved)[1]
    case, record = load_ragged_case(cid, tmp_path)
    assert record["verdict"]["verdict"] == "ERROR" and case.lengths(4) == (2, 0)
    lines = []
    replay(cid, directory=tmp_path, kernel=kern, echo=lines.append)
    assert "replayed: ERROR (same verdict)" in lines[-1]
    with pytest.raises(IndexError) as info:
        flashcheck.check(kern, _varlen(), save="never")
    assert len(info.value.__notes__) == 1 and not list(tmp_path.glob("*.npz"))[1:]


def test_a_varlen_backward_that_raises_has_its_case_saved(user, tmp_path):
    from user_varlen_grads import varlen_autograd

    def bwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, do, *, causal=False, scale=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    kern = flashcheck.kernel(varlen_autograd.fn, name="bwd_raises", layout="varlen", backward=bwd)
    with pytest.raises(RuntimeError, match="illegal memory") as info:
        flashcheck.check_gradients(kern, _varlen(), case_dir=tmp_path)
    assert info.value.__notes__[0].startswith("flashcheck: raised by the backward of bwd_raises")
    cid = info.value.__notes__[1].split()[3].rstrip(";")
    record = load_ragged_case(cid, tmp_path)[1]
    assert record["gradient_verdict"]["verdict"] == "ERROR"
    assert record["context"]["findings"] == [
        "gradients: RuntimeError: CUDA error: an illegal memory access was encountered"
    ]


def test_an_output_in_a_format_other_than_the_inputs_is_a_bad_output(user, tmp_path):
    # A reference kernel returning its fp32 accumulator for fp16 inputs crashed check, test
    # and report alike with "values are not representable in fp16; round them first".
    from flashcheck.harness.adapters.adapter import KernelOutputError

    def wide(q, k, v, *, causal=False, scale=None):
        s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        return torch.softmax(s, -1) @ v.float()

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float16) for _ in range(3))
    said = "returned O in fp32, but O is judged in fp16 (the inputs'): return it in fp16, e.g."
    with pytest.raises(KernelOutputError, match=re.escape(said)) as info:
        flashcheck.check(flashcheck.kernel(wide, name="wide"), q, k, v, case_dir=tmp_path)
    cid = info.value.__notes__[-1].split()[3].rstrip(";")
    assert flashcheck.load_case(cid, tmp_path).dtype == "fp16"

    def varlen_wide(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        o, lse = user.varlen_ok.fn(q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0, causal=causal)
        return o.float(), lse

    with pytest.raises(KernelOutputError, match=re.escape("returned O in fp32, but O is")):
        flashcheck.check(flashcheck.kernel(varlen_wide, layout="varlen"), _varlen(), save="never")
