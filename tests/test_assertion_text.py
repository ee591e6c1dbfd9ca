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
