"""Soft-capping and attention sinks in the Triton forward and backward, under TRITON_INTERPRET=1
(tox sets it), fp16 and fp32, or on a CUDA GPU: the tanh's accuracy, the checks of the oracle and
the flash-class bounds (dσ included), rows that keep no key, the sink gradient through autograd,
and the mask-free and prefetching paths changing no bit with the options on; on a GPU, the
soft-cap with the approximate tanh (approx_tanh=True) within the bounds its declaration sets."""

import os

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
triton = pytest.importorskip("triton", reason="triton is a tox dependency; bare envs may lack it")
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (tox sets it)", allow_module_level=True)

# E402 below: the Triton kernels import triton as they load, so they follow the skips above.
import flashcheck  # noqa: E402
from flashcheck.kernels import triton_flash as tf  # noqa: E402
from flashcheck.kernels.triton_flash import (  # noqa: E402
    flash_attention,
    launch,
    launch_config,
    portable_config,
)
from flashcheck.kernels.triton_flash_bwd import (  # noqa: E402
    flash_attention_backward,
    flash_attention_differentiable,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
SINKS = [2.0, -1.5, 30.0, -30.0]  # among the scores, and far above and below them


def _inputs(dtype, seed, *, hq=4, hk=2, nq=40, nk=37, d=24):
    g = torch.Generator().manual_seed(seed)
    # Scores of several times the cap, so that it flattens them.
    q = (torch.randn(2, hq, nq, d, generator=g) * 3).to(dtype).to(DEV)
    k = (torch.randn(2, hk, nk, d, generator=g) * 3).to(dtype).to(DEV)
    v = torch.randn(2, hk, nk, d, generator=g).to(dtype).to(DEV)
    return q, k, v


OPTIONS = {
    "softcap": {"softcap": 1.5},
    "sinks": {"sinks": SINKS},
    "both": {"softcap": 0.75, "sinks": SINKS},
}


def _opts(opts):
    out = dict(opts)
    if "sinks" in out:
        out["sinks"] = np.asarray(out["sinks"], np.float32)
    return out


@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
@pytest.mark.parametrize("which", list(OPTIONS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_passes_the_oracle_within_flash_bounds(fmt, which, causal):
    """Causal with Nq > Nk: the first rows keep no key (O = 0, LSE = σ with sinks)."""
    q, k, v = _inputs(DTYPES[fmt], seed=len(which) + causal)
    res = flashcheck.check("triton", q, k, v, causal=causal, save="never", **_opts(OPTIONS[which]))
    assert res.passed, res.verdict.reasons


def test_rows_that_keep_no_key_have_o_zero_and_lse_sigma():
    q, k, v = _inputs(torch.float32, seed=3, nq=20, nk=8)
    sinks = torch.tensor(SINKS, device=DEV)
    o, lse = flash_attention(q, k, v, causal=True, sinks=sinks, softcap=2.0)
    empty = slice(0, 12)  # row i keeps key j <= i - 12
    assert torch.equal(o[:, :, empty], torch.zeros_like(o[:, :, empty]))
    want = sinks.reshape(1, -1, 1).expand_as(lse[:, :, empty])
    # σ·log2 e, then ·ln 2, in fp32: within a few ulps of σ
    assert torch.allclose(lse[:, :, empty], want, rtol=4 * 2**-24, atol=0)
    assert torch.isfinite(lse).all()


@pytest.mark.parametrize("kernel", ["triton", "triton-atomic"])
@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
@pytest.mark.parametrize("which", list(OPTIONS))
def test_gradients_pass_the_oracle_within_flash_bounds(fmt, which, kernel):
    # triton: the two-kernel backward; triton-atomic: the fused one (dQ by atomic adds).
    q, k, v = _inputs(DTYPES[fmt], seed=7 + len(which), nq=24, nk=33)
    res = flashcheck.check_gradients(
        kernel, q, k, v, causal=True, save="never", **_opts(OPTIONS[which])
    )
    assert res.passed, res.reasons
    assert ("dsinks" in res.verdicts) == ("sinks" in OPTIONS[which])


def test_autograd_differentiates_the_sinks():
    q, k, v = (x.requires_grad_(True) for x in _inputs(torch.float32, seed=11, nq=17, nk=21))
    sinks = torch.tensor(SINKS, device=DEV, requires_grad=True)
    # The two-kernel path on both sides: bitwise comparable on a GPU too.
    kw = {"causal": True, "softcap": 2.5, "deterministic": True}
    o = flash_attention_differentiable(q, k, v, sinks=sinks, **kw)
    do = torch.randn_like(o)
    o.backward(do)
    with torch.no_grad():
        o2, lse = flash_attention(q, k, v, causal=True, softcap=2.5, sinks=sinks)
        want = flash_attention_backward(q, k, v, o2, lse, do, sinks=sinks.detach(), **kw)
    for got, w in zip((q.grad, k.grad, v.grad, sinks.grad), want, strict=True):
        assert torch.equal(got, w)
    # dσ_h = −Σ_i exp(σ_h − LSE_i)·D_i, from the tensors
    d = (do * o2).sum(-1)
    ref = -(torch.exp(sinks.detach().reshape(1, -1, 1) - lse) * d).sum(dim=(0, 2))
    assert torch.allclose(sinks.grad, ref, rtol=1e-4, atol=1e-6)


def test_without_the_options_the_kernel_is_the_one_it_was():
    """softcap=None / 0 and sinks=None take the default path: the same bits as no argument."""
    q, k, v = _inputs(torch.float16, seed=5)
    o, lse = flash_attention(q, k, v, causal=True)
    for opts in ({"softcap": None, "sinks": None}, {"softcap": 0.0}):
        o2, lse2 = flash_attention(q, k, v, causal=True, **opts)
        assert torch.equal(o, o2) and torch.equal(lse, lse2)


@pytest.mark.parametrize("variant", ["masked", "prefetch"])
def test_mask_free_and_prefetching_paths_change_no_bit_with_the_options(variant):
    q, k, v = _inputs(torch.float16, seed=9, nq=70, nk=96, d=16)
    sinks = torch.tensor(SINKS, device=DEV)
    cfg = portable_config(16, 16, 2)
    other = cfg._replace(split=False) if variant == "masked" else cfg._replace(prefetch=True)
    kw = {"causal": True, "window": None, "scale": 0.25, "allow_tf32": False}
    kw.update(softcap=1.5, sinks=sinks)
    a = launch(q, k, v, config=cfg, **kw)
    b = launch(q, k, v, config=other, **kw)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)


@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
def test_the_fused_cap_exponent_moves_o_only_by_its_roundings(fmt, monkeypatch):
    """Caps up to CAP_FMA_MAX fuse the product by cap·log2 e into the exponent: each weight's
    exponent (|x| ≤ 2·cap·log2 e ≈ 4.3 here) moves by an fp32 rounding, so each weight by
    about 3 u32 relative and O by at most 6·u32·max|v| (both forms' roundings), then its own
    store's ulp; LSE by a few fp32 ulps. Larger caps keep the exact form (bit-identical to the
    forward with the fusion turned off)."""
    assert tf.cap_fma(1.5) and tf.cap_fma(tf.CAP_FMA_MAX) and not tf.cap_fma(tf.CAP_FMA_MAX * 2)
    q, k, v = _inputs(DTYPES[fmt], seed=11, nq=70, nk=96)
    sinks = torch.tensor(SINKS, device=DEV)
    kw = {"causal": True, "sinks": sinks}
    fused = flash_attention(q, k, v, softcap=1.5, **kw)
    big = flash_attention(q * 4096, k, v, softcap=20000.0, **kw)
    monkeypatch.setattr(tf, "CAP_FMA_MAX", 0.0)
    exact = flash_attention(q, k, v, softcap=1.5, **kw)
    assert torch.equal(big[0], flash_attention(q * 4096, k, v, softcap=20000.0, **kw)[0])
    o, e = fused[0].float(), exact[0].float()
    u32 = torch.finfo(torch.float32).eps / 2
    vmax = v.float().abs().amax(dim=(2, 3)).repeat_interleave(2, dim=1)[..., None, None]
    tol = 8 * u32 * vmax + torch.finfo(DTYPES[fmt]).eps * torch.maximum(o.abs(), e.abs())
    assert ((o - e).abs() <= tol).all()
    lse_ulp = torch.finfo(torch.float32).eps * exact[1].abs().clamp_min(1.0)
    assert ((fused[1] - exact[1]).abs() <= 8 * lse_ulp).all()
    if fmt == "fp32" and DEV == "cpu":
        # The interpreter's tl.fma rounds once (numpy-side fma): the two forms differ somewhere.
        assert not torch.equal(fused[0], exact[0])


def test_bad_options_raise_value_errors_that_say_what_to_pass():
    q, k, v = _inputs(torch.float32, seed=1, nq=4, nk=4)
    with pytest.raises(ValueError, match="finite float > 0"):
        flash_attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        flash_attention(q, k, v, sinks=torch.zeros(3, device=DEV))
    with pytest.raises(ValueError, match="float32"):
        flash_attention(q, k, v, sinks=torch.zeros(4, dtype=torch.float64, device=DEV))


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="tanh.approx.f32 is an NVIDIA GPU instruction: under the interpreter approx_tanh=True "
    "keeps the accurate tanh",
)


@needs_gpu
@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
@pytest.mark.parametrize("which", ["softcap", "both"])
def test_the_approximate_tanh_passes_the_oracle_within_its_bounds(fmt, which):
    q, k, v = _inputs(DTYPES[fmt], seed=21 + len(which), nq=24, nk=33)
    opts = {"causal": True, "save": "never", **_opts(OPTIONS[which])}
    res = flashcheck.check("triton-approx-tanh", q, k, v, **opts)
    assert res.passed, res.verdict.reasons
    grads = flashcheck.check_gradients("triton-approx-tanh", q, k, v, **opts)
    assert grads.passed, grads.reasons


@needs_gpu
@pytest.mark.parametrize("layout", ["contiguous", "rows-unaligned"])
def test_the_approximate_tanh_at_long_keys_passes_the_oracle(layout):
    # Past 2048 keys at d = 128 the capped forward takes its own tiles on Hopper: 64 x 64
    # through TMA, or, where the rows rule TMA out, the short-key tiles. 2100 keys end in a
    # partial block; 129-element rows (258 bytes) are not 16-byte aligned.
    g = torch.Generator().manual_seed(5)
    width = 128 if layout == "contiguous" else 129
    q, k, v = (
        (torch.randn(1, 2, n, width, generator=g) * 3).to(torch.bfloat16).to(DEV)[..., :128]
        for n in (16, 2100, 2100)
    )
    if torch.cuda.get_device_capability()[0] == 9:
        cfg = launch_config(q, k, v, causal=False, approx_cap=True)
        assert cfg.tma == (layout == "contiguous"), cfg
    res = flashcheck.check("triton-approx-tanh", q, k, v, softcap=2.0, save="never")
    assert res.passed, res.verdict.reasons


@needs_gpu
def test_the_approximate_tanh_is_the_gpu_instruction_and_fails_declared_accurate():
    # One nonzero product per score (its error one rounding) and 8 keys (the sums' few): every
    # tanh argument s/c lies in [0.589, 0.591], at the instruction's largest measured error
    # (2^-16.46 at 0.5899). The capped logits, ~10.6, then share an error of ~1e-4 nats, which
    # moves LSE about 5x beyond the accurate tanh's fp32 bound (an emulated relative error of
    # 2e-6 already fails it). On the campaign's random cases both declarations pass: the dot
    # products' and sums' terms of the bound dwarf the tanh's there.
    cap, n, d = 20.0, 8, 4
    q = torch.zeros(1, 1, n, d, device=DEV)
    k = torch.zeros(1, 1, n, d, device=DEV)
    q[..., 0] = 1.0
    k[..., 0] = torch.linspace(0.589, 0.591, n, device=DEV) * cap * d**0.5
    v = torch.randn(1, 1, n, d, generator=torch.Generator().manual_seed(3)).to(DEV)
    lse1 = flash_attention(q, k, v, softcap=cap)[1]
    lse2 = flash_attention(q, k, v, softcap=cap, approx_tanh=True)[1]
    assert not torch.equal(lse1, lse2)

    def approx(q, k, v, *, causal=False, scale=None, softcap=None):
        opts = {"causal": causal, "scale": scale, "softcap": softcap}
        return flash_attention(q, k, v, approx_tanh=True, **opts)

    kern = flashcheck.kernel(approx, name="approx declared accurate", arithmetic="flash")
    res = flashcheck.check(kern, q, k, v, softcap=cap, save="never")
    assert not res.passed
    assert any('tanh="approx"' in r for r in res.verdict.reasons), res.verdict.reasons
    declared = flashcheck.kernel(approx, name="approx", arithmetic="flash", tanh="approx")
    assert flashcheck.check(declared, q, k, v, softcap=cap, save="never").passed
