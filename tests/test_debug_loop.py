"""The debug loop in Python: a saved case loaded by id, the kernel called on it as the checks
call it (only the options its signature names)."""

import numpy as np
import pytest
import torch

import flashcheck


def forward(q, k, v, *, causal=False, scale=None):
    """The README's signature: no window, no mask."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


def test_a_saved_case_loads_and_calls_the_kernel_with_its_own_options(tmp_path):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 8, 16)).astype(np.float32) for _ in range(3))
    res = flashcheck.check(
        forward, q, k, v, causal=True, scale=0.5, save="always", case_dir=tmp_path
    )
    case = flashcheck.load_case(res.case_id, tmp_path)
    assert isinstance(case, flashcheck.Case) and case.causal and case.scale == 0.5
    np.testing.assert_array_equal(case.q, q)
    with pytest.raises(TypeError, match="window"):  # what the plain call would do
        forward(*case.to_torch(), **case.options())
    out = flashcheck.call(forward, case, device="cpu")
    want = forward(*case.to_torch(), causal=True, scale=0.5)
    assert torch.equal(out, want)
    with pytest.raises(TypeError, match="takes a flashcheck Case"):
        flashcheck.call(forward, q)
