"""The Triton backward under TRITON_INTERPRET=1 (tox sets it), fp16 and fp32, or on a CUDA GPU:
against the numpy emulation of the same arithmetic, the gradient oracle and its flash-class
bounds."""

import hashlib
import os

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
pytest.importorskip("triton", reason="triton is a tox dependency; bare envs may lack it")
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (tox sets it)", allow_module_level=True)

# E402 below: the Triton kernels import triton as they load, so they follow the skips above.
from flashcheck.harness.checks.array_checks import check_gradients  # noqa: E402
from flashcheck.harness.judging.gradient_bounds import gradient_bounds  # noqa: E402
from flashcheck.kernels import triton_flash  # noqa: E402
from flashcheck.kernels.recurrence import (  # noqa: E402
    PrecisionPolicy,
    online_attention_backward,
)
from flashcheck.kernels.triton_flash import flash_attention, tma_descriptor  # noqa: E402
from flashcheck.kernels.triton_flash_bwd import (  # noqa: E402
    BackwardConfig,
    flash_attention_backward,
    flash_attention_differentiable,
    launch_backward,
)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
SMALL = BackwardConfig(16, 16, 4, 1)

GRID = [
    # (B, Hq, Hk, Nq, Nk, d, dv, causal, window)
    (2, 4, 2, 33, 47, 40, 40, True, None),  # GQA, ragged lengths, odd head dim
    (1, 2, 1, 40, 17, 72, 24, True, None),  # Nq > Nk causal: 23 rows keep no key; dv != d
    (1, 2, 2, 17, 65, 59, 59, False, (5, 3)),  # sliding window
    (1, 3, 1, 20, 20, 111, 111, False, None),  # MQA, d = 111
]


def _inputs(dtype, shape, seed):
    b, hq, hk, nq, nk, d, dv, causal, window = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, nq, d, generator=g).to(dtype).to(DEV)
    k = torch.randn(b, hk, nk, d, generator=g).to(dtype).to(DEV)
    v = torch.randn(b, hk, nk, dv, generator=g).to(dtype).to(DEV)
    do = torch.randn(b, hq, nq, dv, generator=g).to(dtype).to(DEV)
    return q, k, v, do, causal, window


def _sid(s):
    return "x".join(map(str, s[:7])) + f"-c{int(s[7])}" + ("-w" if s[8] else "")


@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", GRID, ids=_sid)
def test_same_arithmetic_as_the_numpy_emulation(fmt, shape):
    """Both perform FA2's backward roundings; they differ only in the order of fp32 sums (tl.dot
    vs sequential) and, through that, in P or dS elements that round apart in the input format.

    Measured on this grid (16-wide tiles on both sides): fp16 bitwise identical on 98.6-100 % of
    elements (the rest up to 6 fp16 ulps of a small dQ), fp32 on 9-73 % (the rest differing by
    at most 1e-6 of the largest gradient). Asserted, rigorously: every element within the sum of
    the two flash-class deterministic bounds, which each implementation meets (measured: at most
    1.2 % of that sum); and, as a regression guard for fp16 under the interpreter only, at least
    95 % bitwise (on a GPU, tensor-core sums and contracted multiply-adds round differently)."""
    q, k, v, do, causal, window = _inputs(DTYPES[fmt], shape, seed=sum(shape[:7]))
    opts = {"causal": causal, "window": window}
    o, lse = flash_attention(q, k, v, **opts)
    got = launch_backward(
        q,
        k,
        v,
        o,
        lse,
        do,
        scale=shape[5] ** -0.5,
        allow_tf32=False,
        config=SMALL,
        causal=causal,
        window=None if window is None else tuple(window),
        deterministic=True,
    )
    arr = [x.cpu().numpy() for x in (q, k, v, o)]
    want = online_attention_backward(
        *arr,
        lse.cpu().numpy(),
        do.cpu().numpy(),
        block_q=16,
        block_k=16,
        policy=PrecisionPolicy.flash(fmt),
        **opts,
    )
    bnd = gradient_bounds(*arr[:3], do.cpu().numpy(), arithmetic="flash", **opts)
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        g64, w64 = g.double().cpu().numpy(), w.astype(np.float64)
        assert not np.isnan(g64).any()
        same = np.mean(g64 == w64)
        if fmt == "fp16" and DEV == "cpu":
            assert same >= 0.95, (name, same)
        assert np.all(np.abs(g64 - w64) <= 2 * bnd[name].det), name


@pytest.mark.parametrize("kernel", ["triton", "triton-atomic"])
@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
@pytest.mark.parametrize("shape", [*GRID, (1, 2, 1, 9, 24, 256, 256, True, None)], ids=_sid)
def test_gradients_pass_the_oracle_within_flash_bounds(fmt, shape, kernel):
    # The project's own judgement (SPEC 3.7): deterministic and probabilistic flash-class bounds,
    # 2 × the naive same-precision backward + 1 floored ulp, no NaN where the exact value is finite.
    # triton runs the two-kernel backward, triton-atomic the fused one (dQ by atomic adds; past
    # d = 128 it takes the dQ kernel too).
    q, k, v, do, causal, window = _inputs(DTYPES[fmt], shape, seed=1 + sum(shape[:7]))
    res = check_gradients(
        kernel, q, k, v, do=do, causal=causal, window=window, save="never", device=DEV
    )
    assert res.passed, str(res)


def test_rows_that_keep_no_key_get_zero_gradients_not_nan():
    # causal with Nq > Nk (bottom-right): rows 0..Nq-Nk-1 keep no key, LSE = −inf
    q, k, v, do, _, _ = _inputs(torch.float16, (1, 2, 1, 37, 5, 16, 16, True, None), 7)
    o, lse = flash_attention(q, k, v, causal=True)
    assert torch.isneginf(lse[:, :, :32]).all()
    kw = {"causal": True, "window": None, "scale": 0.25, "allow_tf32": False}
    for cfg, det in ((SMALL, False), (None, False), (SMALL, True)):  # atomic dQ adds only zeros
        dq, dk, dv = launch_backward(q, k, v, o, lse, do, config=cfg, deterministic=det, **kw)
        assert torch.equal(dq[:, :, :32], torch.zeros_like(dq[:, :, :32]))
        assert not any(torch.isnan(x).any() for x in (dq, dk, dv))
        # a window that keeps nothing for any row: every gradient is exactly zero
    o, lse = flash_attention(q, k, v, window=(0, 0))
    dq, dk, dv = flash_attention_backward(
        q[:, :, :3], k, v, o[:, :, :3], lse[:, :, :3], do[:, :, :3], window=(0, 0)
    )
    assert all(torch.count_nonzero(x) == 0 for x in (dq, dk, dv))


SPLIT_GRID = [
    # row and key blocks mixing mask-free and masked tiles on both sides (16-wide tiles)
    (1, 2, 1, 70, 70, 32, 32, True, None),
    (1, 1, 1, 50, 90, 16, 24, True, None),
    (1, 1, 1, 90, 50, 16, 16, True, None),
    (1, 1, 1, 64, 100, 32, 32, False, (37, 5)),
    (1, 1, 1, 81, 81, 16, 16, True, (30, None)),
    (1, 1, 1, 48, 63, 16, 16, True, None),
    (1, 1, 1, 64, 64, 16, 16, False, (16, 15)),
]


@pytest.mark.parametrize("shape", SPLIT_GRID, ids=_sid)
def test_mask_free_blocks_change_no_bit(shape):
    """Skipping the mask in blocks every row keeps is an optimisation: a block wrongly taken as
    mask-free, skipped or visited twice changes bits against the all-masked path."""
    q, k, v, do, causal, window = _inputs(torch.float16, shape, seed=sum(shape[:7]))
    win = None if window is None else tuple(-1 if w is None else w for w in window)
    o, lse = flash_attention(q, k, v, causal=causal, window=window)
    kw = {"causal": causal, "window": win, "scale": shape[5] ** -0.5, "allow_tf32": False}
    kw["deterministic"] = True
    split = launch_backward(q, k, v, o, lse, do, config=SMALL, **kw)
    masked = launch_backward(q, k, v, o, lse, do, config=SMALL._replace(split=False), **kw)
    for a, b in zip(split, masked, strict=True):
        assert torch.equal(a, b)


def test_strided_views_in_nan_buffers_give_the_same_bits():
    # A load past Nq, Nk or a head dim, or a wrong stride, would turn gradients into NaN.
    q, k, v, do, _, _ = _inputs(torch.float16, (1, 2, 1, 21, 37, 40, 24, True, None), 3)
    o, lse = flash_attention(q, k, v, causal=True)
    ref = flash_attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)

    def pad(x):
        big = torch.full(
            (x.shape[0], x.shape[1], x.shape[2] + 19, x.shape[3] + 7), float("nan"), device=x.device
        )
        big = big.to(x.dtype)
        big[:, :, 5 : 5 + x.shape[2], 3 : 3 + x.shape[3]] = x
        return big[:, :, 5 : 5 + x.shape[2], 3 : 3 + x.shape[3]]

    lse_big = torch.full((1, 2, 40), float("nan"), device=DEV)
    lse_big[:, :, 2:23] = lse
    got = flash_attention_backward(
        pad(q),
        pad(k),
        pad(v),
        pad(o),
        lse_big[:, :, 2:23],
        pad(do),
        causal=True,
        deterministic=True,
    )
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)
    again = flash_attention_backward(q, k, v, o, lse, do, causal=True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(again, ref, strict=True))  # deterministic


def test_expanded_and_strided_do_give_the_bits_of_do_contiguous():
    # On an H200 the compiled kernels gave a dQ differing in 22-81 elements for an expanded or
    # offset dO from the one of the same values contiguous (at this shape, measured by
    # benchmarks/gpu_do_layouts.py): Triton compiles a variant per stride alignment. The
    # interpreter cannot show it; the backward's copy of a non-contiguous dO prevents it.
    q, k, v, do, _, _ = _inputs(torch.float16, (2, 4, 2, 64, 64, 40, 40, True, None), 40)
    do = do[:1, :1, :1].expand(do.shape)
    o, lse = flash_attention(q, k, v, causal=True)
    ref = flash_attention_backward(q, k, v, o, lse, do.contiguous(), causal=True)
    big = torch.full((*do.shape[:3], 64), float("nan"), dtype=do.dtype, device=DEV)
    big[..., 8:48] = do
    for laid in (do, big[..., 8:48]):
        got = flash_attention_backward(q, k, v, o, lse, laid, causal=True)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b)


def test_autograd_function_matches_the_direct_call():
    q, k, v, do, _, _ = _inputs(torch.float32, (1, 4, 2, 19, 23, 24, 16, False, None), 5)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    kw = {"window": (4, None), "scale": 0.3, "deterministic": True}
    out = flash_attention_differentiable(*leaves, **kw)
    o, lse = flash_attention(q, k, v, window=(4, None), scale=0.3)
    assert torch.equal(out.detach(), o)
    out.backward(do)
    direct = flash_attention_backward(q, k, v, o, lse, do, **kw)
    for leaf, g in zip(leaves, direct, strict=True):
        assert torch.equal(leaf.grad, g)
    # an upstream gradient with zero strides (from a sum) goes through the strided loads.
    # Bitwise under the interpreter; on a GPU Triton compiles a stride of 0 and one of 1 to
    # different load layouts, so D's fp32 sum may be ordered differently (measured on an H200:
    # not bitwise): there the two must agree to a few fp32 ulps.
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    flash_attention_differentiable(*leaves, **kw).sum().backward()
    ones = torch.ones_like(o)
    direct = flash_attention_backward(q, k, v, o, lse, ones, **kw)
    for x, g in zip(leaves, direct, strict=True):
        if DEV == "cpu":
            assert torch.equal(x.grad, g)
        else:
            torch.testing.assert_close(x.grad, g, rtol=1e-5, atol=1e-5 * float(g.abs().max()))


def test_bf16_is_refused_clearly_or_correct_under_the_interpreter():
    if DEV == "cuda":
        pytest.skip("the canary only runs under the CPU interpreter")
    q, k, v, do, _, _ = _inputs(torch.bfloat16, (1, 1, 1, 16, 16, 16, 16, False, None), 4)
    o = torch.zeros_like(do)
    lse = torch.zeros(1, 1, 16, device=DEV)
    try:
        flash_attention_backward(q, k, v, o, lse, do)
    except NotImplementedError as err:
        assert "11584" in str(err)
    else:  # upstream fixed: then the gradients must pass the oracle
        assert check_gradients("triton", q, k, v, do=do, save="never", device="cpu").passed


def test_bad_inputs_raise_value_errors_that_say_what_to_pass():
    q, k, v, do, _, _ = _inputs(torch.float32, (1, 2, 1, 9, 12, 16, 16, True, None), 6)
    o, lse = flash_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="lse must be float32"):
        flash_attention_backward(q, k, v, o, lse.double(), do)
    with pytest.raises(ValueError, match=r"lse must be the forward's LSE"):
        flash_attention_backward(q, k, v, o, lse[:, :1], do)
    with pytest.raises(ValueError, match=r"do must have shape"):
        flash_attention_backward(q, k, v, o, lse, do.half())
    with pytest.raises(ValueError, match=r"o must have shape"):
        flash_attention_backward(q, k, v, o[:, :, :4], lse, do)
    with pytest.raises(ValueError, match="multiple"):
        flash_attention_backward(
            q[:, :1].expand(1, 3, 9, 16), k.expand(1, 2, 12, 16), v.expand(1, 2, 12, 16), o, lse, do
        )
    with pytest.raises(ValueError, match="window"):
        flash_attention_backward(q, k, v, o, lse, do, window=(-3, 2))
    with pytest.raises(ValueError, match=r"torch\.Tensor"):
        flash_attention_backward(q, k, v, o.cpu().numpy(), lse, do)


def test_a_two_stage_dq_kernel_with_descriptor_loads_is_refused():
    # That configuration faulted on an H200 (Triton 3.6; benchmarks/RESULTS.md): refused before
    # any launch, on every machine, with what to pass instead. The configs that ran there pass.
    from flashcheck.kernels.triton_flash_bwd import check_config

    q, k, v, do, _, _ = _inputs(torch.float16, (1, 2, 1, 9, 12, 16, 16, False, None), 6)
    o, lse = flash_attention(q, k, v)
    kw = {"causal": False, "window": None, "scale": 0.25, "allow_tf32": False}
    for cfg in (SMALL._replace(tma=True, dq_stages=2), BackwardConfig(16, 16, 4, 2, tma=True)):
        with pytest.raises(ValueError, match="dq_stages=1 or 3, or tma=False"):
            launch_backward(q, k, v, o, lse, do, config=cfg, **kw)
    for cfg in (
        SMALL._replace(tma=True, dq_stages=3),
        SMALL._replace(tma=True, dq_stages=2, split=False),
        SMALL._replace(dq_stages=2),
        BackwardConfig(64, 64, 4, 2, True, 128, 64, 8, 3, tma=True),  # the H200 default
    ):
        check_config(cfg, fused=False)
    check_config(SMALL._replace(tma=True, dq_stages=2), fused=True)  # no dQ kernel


def test_dq_tiles_reach_the_dq_kernel_only():
    # BackwardConfig's dq_* fields tile the dQ kernel alone: dK, dV are bitwise those of the
    # dK/dV tiles, dQ bitwise that of the dQ tiles (each kernel's sums follow its own tiles).
    q, k, v, do, causal, _ = _inputs(torch.float16, (1, 2, 1, 40, 56, 24, 24, True, None), 5)
    o, lse = flash_attention(q, k, v, causal=causal)

    def grads(cfg):
        return launch_backward(
            q,
            k,
            v,
            o,
            lse,
            do,
            causal=causal,
            window=None,
            scale=0.2,
            allow_tf32=False,
            config=cfg,
            deterministic=True,
        )

    mixed = grads(BackwardConfig(16, 32, 4, 1, True, 32, 16, 4, 1))
    kv_only = grads(BackwardConfig(16, 32, 4, 1))
    dq_only = grads(BackwardConfig(32, 16, 4, 1))
    assert torch.equal(mixed[0], dq_only[0])
    assert torch.equal(mixed[1], kv_only[1]) and torch.equal(mixed[2], kv_only[2])
    if DEV == "cpu":
        # The interpreter sums each tile's dot at once, so the tiles change dQ's sums; a GPU's
        # tensor cores step a 32-key dot in 16-key chunks, the order of two 16-key tiles.
        assert not torch.equal(kv_only[0], dq_only[0])


def test_backward_tiles_by_mask_path_and_cap(monkeypatch):
    # The GPU tiles at d = 128, 16-bit inputs (measured on an H200, benchmarks/RESULTS.md):
    # 128-key dK/dV programs only without a mask on the two-kernel path (capped or not);
    # 128 × 64 dQ programs on 8 warps for the cap with the approximate tanh; the interpreter
    # keeps its own small tiles.
    from flashcheck.kernels import triton_flash_bwd as fb

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    plain = fb.backward_config(128, 128, 2)
    assert plain == fb.backward_config(128, 128, 2, causal=True)
    assert plain[:4] == (32, 64, 4, 3) and plain.for_dq() == (128, 32, 4, 3)
    wide = fb.backward_config(128, 128, 2, causal=False)
    assert wide[:4] == (64, 128, 8, 3) and wide.for_dq() == plain.for_dq()
    assert fb.backward_config(128, 128, 2, causal=False, fused=True) == plain
    capped = fb.backward_config(128, 128, 2, causal=False, approx_cap=True)
    assert capped[:4] == wide[:4] and capped.for_dq() == (128, 64, 8, 3)
    capped_causal = fb.backward_config(128, 128, 2, causal=True, approx_cap=True)
    assert capped_causal[:4] == plain[:4] and capped_causal.for_dq() == capped.for_dq()
    assert fb.backward_config(64, 64, 2, causal=False) == fb.backward_config(64, 64, 2)
    assert fb.backward_config(128, 128, 4, causal=False) == fb.backward_config(128, 128, 4)
    # Where the loads may go through TMA: one 64 × 64 dK/dV tile on one warpgroup and the
    # 128 × 64 dQ tile for every mask and cap of the two-kernel path; the fused path, d <= 64
    # and fp32 keep the pointer tiles.
    for causal in (False, True):
        for cap in (False, True):
            tma = fb.backward_config(128, 128, 2, causal=causal, approx_cap=cap, tma=True)
            assert tma[:4] == (64, 64, 4, 2) and tma.for_dq() == (128, 64, 8, 3) and tma.tma
            assert not fb.backward_config(128, 128, 2, causal=causal, approx_cap=cap).tma
    assert fb.backward_config(128, 128, 2, fused=True, tma=True) == plain
    assert fb.backward_config(64, 64, 2, tma=True) == fb.backward_config(64, 64, 2)
    assert fb.backward_config(128, 128, 4, tma=True) == fb.backward_config(128, 128, 4)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fb.backward_config(128, 128, 2, causal=False) == BackwardConfig(32, 32, 4, 1)
    assert fb.backward_config(128, 128, 2, tma=True) == BackwardConfig(32, 32, 4, 1)


@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("shape", [GRID[0], GRID[1], GRID[2]], ids=_sid)
def test_the_descriptor_loads_give_the_bits_of_the_pointer_loads(shape, softcap, monkeypatch):
    # BackwardConfig.tma: the loops' loads through TMA descriptors (an sm_90 GPU, and the
    # interpreter, which reads a descriptor's blocks as the GPU does) give the pointer loads'
    # bits. Grouped heads (each query head reads its key head's block), ragged rows and keys
    # (zeros past the edges, never the next head's rows), d below the block width. The window
    # case's rows (d = 59, 118 bytes) are not 16-byte aligned: it must fall back to pointers.
    # Planted: the dQ kernel's K and V blocks read at the query head (b, h) instead of its key
    # head fail the two grouped-head cases (benchmarks/RESULTS.md).
    from flashcheck.kernels import triton_flash_bwd as fb

    q, k, v, do, causal, window = _inputs(torch.float16, shape, 5)
    o, lse = flash_attention(q, k, v, causal=causal, window=window, softcap=softcap)
    win = None if window is None else (window[0], window[1])
    made = []  # the descriptors the launcher built: proof that the descriptor path ran

    def counted(t, rows, cols):
        made.append((tuple(t.shape), rows, cols))
        return tma_descriptor(t, rows, cols)

    monkeypatch.setattr(fb, "tma_descriptor", counted)

    def grads(cfg):
        return launch_backward(
            q, k, v, o, lse, do, causal=causal, window=win, scale=shape[5] ** -0.5,
            allow_tf32=False, config=cfg, softcap=softcap,
        )  # fmt: skip

    want = grads(SMALL)
    assert not made
    # The register cap (BackwardConfig.maxnreg, dq_maxnreg) is a compile option on a GPU, where
    # the second configuration checks that a capped, spilling compile keeps the bits; the
    # interpreter ignores it.
    for cfg in (SMALL._replace(tma=True), SMALL._replace(tma=True, maxnreg=128, dq_maxnreg=128)):
        made.clear()
        for got, ref in zip(grads(cfg), want, strict=True):
            assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), cfg
        aligned = shape[5] * 2 % 16 == 0 and shape[6] * 2 % 16 == 0
        # Q and dO for dK/dV, K and V for dQ; none where the rows are not aligned.
        assert len(made) == (4 if aligned else 0), made


@pytest.mark.parametrize(
    "shape", [GRID[0], GRID[2], (1, 4, 1, 45, 70, 24, 16, True, None)], ids=_sid
)
def test_dk_and_dv_apart_give_the_bits_of_dk_and_dv_together(shape):
    # BackwardConfig.kv_apart runs the key-block kernel once for dK and once for dV; each
    # evaluates the expressions of the joint kernel in the same order (GQA sums included).
    q, k, v, do, causal, window = _inputs(torch.float16, shape, seed=2 + sum(shape[:7]))
    win = None if window is None else tuple(-1 if w is None else w for w in window)
    o, lse = flash_attention(q, k, v, causal=causal, window=window)
    kw = {"causal": causal, "window": win, "scale": shape[5] ** -0.5, "allow_tf32": False}
    kw["deterministic"] = True
    together = launch_backward(q, k, v, o, lse, do, config=SMALL, **kw)
    apart = launch_backward(q, k, v, o, lse, do, config=SMALL._replace(kv_apart=True), **kw)
    for a, b in zip(together, apart, strict=True):
        assert torch.equal(a, b)


# The deterministic path's bits as the two-kernel backward gave them before the fused path
# existed (sha256 prefixes of dQ, dK, dV under the interpreter, soft-capped causal GQA case).
# fp32's changed with tanh_fp32's polynomials (one exp2, no division; was 49767684052b6d28,
# which the tree before that change still gives), and again when dS took the slope as
# fl(P·(1 − t²))·(dP − D) rather than fl(P·(dP − D))·(1 − t²) (was e921270aa536ed55); fp16's
# did not change either time. The forward that makes O and LSE runs with its cap unfused (the
# fused exponent came later and moves O's last bits; these digests are of the backward).
TWO_KERNEL_DIGESTS = {"fp16": "614c1191a8e36a82", "fp32": "0892c12404600eaf"}


@pytest.mark.parametrize("fmt", ["fp16", "fp32"])
def test_the_deterministic_path_keeps_the_bits_it_had(fmt, monkeypatch):
    if DEV == "cuda":
        pytest.skip("the digests are of the CPU interpreter's arithmetic")
    monkeypatch.setattr(triton_flash, "CAP_FMA_MAX", 0.0)
    q, k, v, do, causal, _ = _inputs(DTYPES[fmt], (1, 4, 2, 33, 47, 40, 24, True, None), 12)
    o, lse = flash_attention(q, k, v, causal=causal, softcap=2.0)
    got = flash_attention_backward(
        q, k, v, o, lse, do, causal=causal, softcap=2.0, deterministic=True
    )
    digest = hashlib.sha256()
    for x in got:
        digest.update(x.numpy().tobytes())
    # The digests are of OpenBLAS's Haswell GEMM kernel (the interpreter's tl.dot is numpy's
    # matmul): tox sets OPENBLAS_CORETYPE=Haswell; other kernels sum in another order.
    assert digest.hexdigest()[:16] == TWO_KERNEL_DIGESTS[fmt], (
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')!r} (the digests hold for Haswell)"
    )


@pytest.mark.parametrize("shape", [GRID[0], GRID[2]], ids=_sid)
def test_fused_path_agrees_with_the_two_kernels(shape):
    """dK, dV come from the same expressions in the same order on both paths (bitwise under the
    interpreter; a GPU compiles the fused program differently). dQ sums the same rounded terms
    in another order, each within the flash-class bound, so the two are within twice it. The
    mask-free split changes no bit of the fused path either, and past d = 128 (kv_apart) it
    takes the dQ kernel: every bit that of the two-kernel path."""
    q, k, v, do, causal, window = _inputs(torch.float16, shape, seed=4 + sum(shape[:7]))
    win = None if window is None else tuple(-1 if w is None else w for w in window)
    o, lse = flash_attention(q, k, v, causal=causal, window=window)
    kw = {"causal": causal, "window": win, "scale": shape[5] ** -0.5, "allow_tf32": False}
    fused = launch_backward(q, k, v, o, lse, do, config=SMALL, **kw)
    two = launch_backward(q, k, v, o, lse, do, config=SMALL, deterministic=True, **kw)
    arr = [x.cpu().numpy() for x in (q, k, v, do)]
    bnd = gradient_bounds(*arr, arithmetic="flash", causal=causal, window=window)
    for name, a, b in zip(("dq", "dk", "dv"), fused, two, strict=True):
        a64, b64 = a.double().cpu().numpy(), b.double().cpu().numpy()
        assert not np.isnan(a64).any(), name
        assert np.all(np.abs(a64 - b64) <= 2 * bnd[name].det), name
        if name != "dq" and DEV == "cpu":
            assert np.array_equal(a64, b64), name
    if DEV == "cpu":  # the interpreter runs programs, hence atomic adds, in a fixed order
        masked = launch_backward(q, k, v, o, lse, do, config=SMALL._replace(split=False), **kw)
        assert all(torch.equal(a, b) for a, b in zip(fused, masked, strict=True))
    apart = launch_backward(q, k, v, o, lse, do, config=SMALL._replace(kv_apart=True), **kw)
    assert all(torch.equal(a, b) for a, b in zip(apart, two, strict=True))


def test_deterministic_must_be_a_bool():
    q, k, v, do, _, _ = _inputs(torch.float32, (1, 2, 1, 9, 12, 16, 16, True, None), 6)
    o, lse = flash_attention(q, k, v, causal=True)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="deterministic must be True"):
            flash_attention_backward(q, k, v, o, lse, do, deterministic=bad)
        with pytest.raises(ValueError, match="deterministic must be True"):
            flash_attention_differentiable(q, k, v, deterministic=bad)


@pytest.mark.parametrize("plant", ["unscaled", "last-row-block-dropped"])
def test_a_planted_fused_dq_bug_fails_the_gradient_check(monkeypatch, plant):
    """Meta-test: the oracle check of triton-atomic sees a broken fused dQ: its sum left
    unscaled, or the adds of the last row block lost. dK, dV and the two-kernel path stay
    correct, so only dQ of triton-atomic fails."""
    from flashcheck.kernels import triton_flash_bwd as bwd

    q, k, v, do, causal, _ = _inputs(torch.float16, GRID[0], seed=8)
    scaled = bwd._scaled_dq

    def planted(acc, sm_scale, dtype):
        if plant == "unscaled":
            return acc.to(dtype)
        acc = acc.clone()
        acc[:, :, -(acc.shape[2] % 32 or 32) :] = 0  # the last 32-row block's adds, lost
        return scaled(acc, sm_scale, dtype)

    monkeypatch.setattr(bwd, "_scaled_dq", planted)
    res = check_gradients("triton-atomic", q, k, v, do=do, causal=causal, save="never", device=DEV)
    assert res.verdicts["dq"].verdict in ("FAIL", "FAIL-HARD"), str(res)
    assert res.verdicts["dk"].verdict == res.verdicts["dv"].verdict == "PASS"
    ok = check_gradients("triton", q, k, v, do=do, causal=causal, save="never", device=DEV)
    assert ok.passed, str(ok)
