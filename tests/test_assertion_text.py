"""The one-line texts a failing property raises (properties/assertions.py)."""

import numpy as np
import pytest

from flashcheck.harness.cases.case import Case
from flashcheck.properties.assertions import AttentionMismatch, fail


def test_a_message_that_opens_on_its_own_line_follows_the_colon_directly(tmp_path):
    x = np.ones((1, 1, 1, 1), np.float32)
    case = Case.from_arrays(x, x, x)
    body = "\nkernel k on cpu (gradients): ...\nverdict FAIL-HARD"
    with pytest.raises(AttentionMismatch) as raised:
        fail(case, "k", "cpu", "gradients", body, directory=tmp_path)
    assert str(raised.value).startswith("gradients failed for k:\nkernel k on cpu"), raised.value
    with pytest.raises(AttentionMismatch) as raised:
        fail(case, "k", "cpu", "integrity", "the kernel modified q", directory=tmp_path)
    assert str(raised.value).startswith("integrity failed for k: the kernel modified q")


def test_a_fail_hard_case_is_summed_up_by_a_fail_hard_reason(tmp_path):
    # pytest's summary line showed a FAIL-HARD case's first reason, an O FAIL line, while its
    # LSE broke its deterministic bound.
    import torch

    import flashcheck

    def lse_off(q, k, v, *, causal=False, scale=None):
        s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
        o = torch.softmax(s, -1) @ v.double()
        return o.float(), torch.logsumexp(s, -1).float() + 0.5

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 1, 16, 16)).astype(np.float32) for _ in range(3))
    res = flashcheck.check(lse_off, q, k, v, save="never")
    # (O's FAIL, between the empirical rule and the deterministic bound, planted: that window
    # is narrow for fp32 at 16 keys)
    res.verdict["o"].reasons.insert(0, "FAIL: 3 O elements above max(2·naive + 1 ulp, ...)")
    assert res.verdict.reasons[0].startswith("FAIL: ") and res.verdict.verdict == "FAIL-HARD"
    with pytest.raises(AttentionMismatch) as raised:
        fail(res.case, "k", "cpu", "accuracy", str(res), directory=tmp_path, result=res)
    assert raised.value.summary.startswith("accuracy: FAIL-HARD: LSE exceeds"), raised.value.summary
