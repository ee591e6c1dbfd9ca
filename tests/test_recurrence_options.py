"""Soft-capping and sinks in the reference kernels: the recurrence (forward and backward) and the
naive baselines (numpy and torch), in float64 against the oracle (their algorithm, free of
rounding), and the same-precision numpy emulation against torch."""

import numpy as np
import pytest

from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_numpy, naive_numpy_backward, naive_torch
from flashcheck.kernels.recurrence import (
    PrecisionPolicy,
    online_attention,
    online_attention_backward,
)

OPTIONS = [
    {"softcap": 2.0},
    {"sinks": np.array([6.0, -3.5], np.float32)},
    {"softcap": 1.5, "sinks": np.array([-40.0, 0.75], np.float32)},
]


def _inputs(seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((2, 2, 5, 4)) * 4).astype(dtype)  # scores well past the caps
    k = rng.standard_normal((2, 1, 6, 4)).astype(dtype)
    v = rng.standard_normal((2, 1, 6, 3)).astype(dtype)
    mask = rng.random((2, 2, 5, 6)) < 0.7
    mask[0, 0, 2] = False  # a row that keeps no key
    do = rng.standard_normal((2, 2, 5, 3)).astype(dtype)
    return q, k, v, mask, do


def _close(got, ref, tol=1e-12):
    got = np.asarray(got, np.float64)
    inf = np.isinf(ref.hi)  # LSE of a row that keeps no key, without a sink
    np.testing.assert_array_equal(got[inf], ref.hi[inf])
    exact = np.where(inf, 0.0, ref.hi + ref.lo)
    scale = np.maximum(ref.floor, np.abs(exact)) + 1e-300
    assert np.all(np.abs(np.where(inf, 0.0, got) - exact) <= tol * scale + 1e-300)


@pytest.mark.parametrize("opts", OPTIONS)
@pytest.mark.parametrize("variant", ["fa1", "fa2"])
def test_recurrence_in_float64_is_the_oracle(opts, variant):
    q, k, v, mask, do = _inputs(1)
    ref = oracle(q, k, v, mask=mask, do=do, **opts)
    pol = PrecisionPolicy.fp64("fp32")
    o, lse = online_attention(q, k, v, policy=pol, variant=variant, block_k=2, mask=mask, **opts)
    _close(o, ref.o)
    _close(lse, ref.lse)
    if variant == "fa1":
        return
    blocks = {"block_q": 2, "block_k": 4, "mask": mask}
    grads = online_attention_backward(
        q, k, v, o, lse, do.astype(np.float64), policy=pol, **blocks, **opts
    )
    names = ("dq", "dk", "dv") + (("dsinks",) if "sinks" in opts else ())
    assert len(grads) == len(names)
    for name, g in zip(names, grads, strict=True):
        _close(g, ref[name], 1e-10)


@pytest.mark.parametrize("opts", OPTIONS)
def test_naive_in_float64_is_the_oracle(opts):
    q, k, v, mask, do = _inputs(2)
    ref = oracle(q, k, v, mask=mask, do=do, **opts)
    o, lse = naive_numpy(q, k, v, mask=mask, precision="fp64", **opts)
    _close(o, ref.o)
    _close(lse, ref.lse)
    grads = naive_numpy_backward(q, k, v, do, mask=mask, precision="fp64", **opts)
    names = ("dq", "dk", "dv") + (("dsinks",) if "sinks" in opts else ())
    for name, g in zip(names, grads, strict=True):
        _close(g, ref[name], 1e-10)


def test_a_masked_row_with_a_sink_gives_zero_and_the_sink():
    q, k, v, mask, _ = _inputs(3)
    sinks = np.array([2.5, -1.25], np.float32)
    flash = PrecisionPolicy.flash("fp32")
    for o, lse in (
        online_attention(q, k, v, policy=flash, mask=mask, sinks=sinks),
        naive_numpy(q, k, v, mask=mask, sinks=sinks),
    ):
        assert (o[0, 0, 2] == 0).all()
        assert abs(float(lse[0, 0, 2]) - 2.5) <= 4e-7


@pytest.mark.parametrize("opts", OPTIONS)
def test_naive_numpy_emulates_torch(opts):
    torch = pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    q, k, v, mask, do = _inputs(4, np.float16)
    o_np, lse_np = naive_numpy(q, k, v, mask=mask, **opts)
    tq, tk, tv = (torch.from_numpy(x.copy()).requires_grad_() for x in (q, k, v))
    sinks = opts.get("sinks")
    ts = None if sinks is None else torch.from_numpy(sinks.copy()).requires_grad_()
    o_t, lse_t = naive_torch(
        tq, tk, tv, mask=torch.from_numpy(mask), softcap=opts.get("softcap"), sinks=ts
    )
    ulp16 = 2.0**-10
    np.testing.assert_allclose(o_t.detach().numpy(), o_np, atol=4 * ulp16, rtol=4 * ulp16)
    np.testing.assert_allclose(lse_t.detach().numpy(), lse_np, atol=1e-5, rtol=1e-5)
    (o_t.float() * torch.from_numpy(do).float()).sum().backward()
    grads = naive_numpy_backward(q, k, v, do, mask=mask, **opts)
    got = [tq.grad, tk.grad, tv.grad] + ([ts.grad] if ts is not None else [])
    for g_t, g_np in zip(got, grads, strict=True):
        ref = np.abs(np.asarray(g_np, np.float64)).max() + 1e-3
        assert np.abs(g_t.numpy().astype(np.float64) - g_np).max() <= 0.02 * ref
