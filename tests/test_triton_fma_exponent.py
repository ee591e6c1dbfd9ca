"""The forward's fused multiply-add exponent (``LaunchConfig.fma_exponent``) under
TRITON_INTERPRET=1 or on a GPU: within the flash class's bounds where key blocks take the fast
form, the exact form, or change form from one block to the next; and, on cases built so that the
answer is known in closed form, rescaled from the reference its p's were computed against."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a tox dependency; bare envs may lack it")
pytest.importorskip("triton", reason="triton is a tox dependency; bare envs may lack it")
if os.environ.get("TRITON_INTERPRET", "0") in ("", "0") and not torch.cuda.is_available():
    pytest.skip("needs CUDA or TRITON_INTERPRET=1 (tox sets it)", allow_module_level=True)

from flashcheck.harness.judging.bounds import error_bounds  # noqa: E402
from flashcheck.harness.oracle.evaluate import oracle  # noqa: E402
from flashcheck.kernels.triton_flash import LaunchConfig, launch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
C32 = np.float32(1.4426950408889634)  # the kernel's c at scale 1: fl32(log2 e)
# Mask-free loop, the same with the next QKᵀ issued early, and every block through the mask.
CONFIGS = {
    "split": LaunchConfig(16, 16, 4, 1, fma_exponent=True),
    "prefetch": LaunchConfig(16, 16, 4, 1, prefetch=True, fma_exponent=True),
    "masked": LaunchConfig(16, 16, 4, 1, split=False, fma_exponent=True),
}


def _launch(q, k, v, cfg, *, causal=False, window=None, scale):
    win = None if window is None else tuple(-1 if w is None else w for w in window)
    o, lse = launch(
        q.to(DEV), k.to(DEV), v.to(DEV), causal=causal, window=win, scale=scale,
        allow_tf32=False, config=cfg,
    )  # fmt: skip
    return o.cpu().double().numpy(), lse.cpu().double().numpy()


def _offset_case(dtype, offsets, *, nq=20, row_big=None, seed=0):
    """Random q, k, v (d = 32) plus one column that adds ``offsets[b]`` (exp2 units) times
    ``row_big(row)`` (1 by default) to every score of key block b (16 keys), so that the row
    maxima·c of each block sit where the case needs them."""
    g = torch.Generator().manual_seed(seed)
    d, nk = 32, 16 * len(offsets)
    sc = d**-0.5
    q = torch.randn(1, 1, nq, d, generator=g)
    k = torch.randn(1, 1, nk, d, generator=g)
    v = torch.randn(1, 1, nk, d, generator=g)
    q[..., 0] = 1.0 if row_big is None else row_big(torch.arange(nq))
    k[..., 0] = torch.tensor(offsets, dtype=torch.float32).repeat_interleave(16) / float(C32) / sc
    return q.to(dtype), k.to(dtype), v.to(dtype), sc


def _block_maxima(q, k, sc):
    """Every row's largest ``s·c`` (exp2 units) per key block of 16, from the rounded inputs."""
    s = sc * float(C32) * (q[0, 0].double() @ k[0, 0].double().T)
    return s.reshape(s.shape[0], -1, 16).amax(-1)


def _assert_within_bounds(q, k, v, o, lse, *, causal=False, window=None, scale):
    """O and LSE inside the flash class's deterministic bounds (key blocks of 16), finite
    wherever the exact result is."""
    qn, kn, vn = (x.numpy() for x in (q, k, v))
    ref = oracle(q, k, v, causal=causal, window=window, scale=scale)
    b = error_bounds(
        qn, kn, vn, arithmetic="flash", causal=causal, window=window, scale=scale, key_block=16
    )
    err = np.abs((o - ref.o.hi) - ref.o.lo)
    assert np.all(err <= b.o.det), f"O: max utilization {np.max(err / b.o.det):.3g}"
    live = np.isfinite(ref.lse.hi)
    np.testing.assert_array_equal(np.isneginf(lse), ~live)
    lerr = np.abs(lse[live] - ref.lse.hi[live])
    assert np.all(lerr <= b.lse.det[live]), f"LSE: {np.max(lerr / b.lse.det[live]):.3g}"


def _ordinary(dtype):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 33, 40, generator=g).to(dtype)
    k = torch.randn(2, 2, 47, 40, generator=g).to(dtype)
    v = torch.randn(2, 2, 47, 40, generator=g).to(dtype)
    return q, k, v, 40**-0.5, True


def _huge(dtype):
    # The inputs of the exact form's guard in test_triton_flash.py (scores ~1e12; ~1e8 within
    # fp16's range): every block exact, and the fast form's leftover would reach 2^4 to 2^14.
    g = torch.Generator().manual_seed(11)
    big = 1e6 if dtype == torch.float32 else 1e4
    q = (torch.randn(1, 2, 65, 40, generator=g) * big).to(dtype)
    k = (torch.randn(1, 1, 70, 40, generator=g) * big).to(dtype)
    v = torch.randn(1, 1, 70, 40, generator=g).to(dtype)
    return q, k, v, 40**-0.5, False


CASES = {
    "ordinary": _ordinary,
    "huge-logits": _huge,
    # Rows 0-7 ordinary, rows 8-19 at ~2^14.3: every block exact, small rows included.
    "mixed-rows": lambda dt: (*_offset_case(dt, [1e4, 1e4], row_big=lambda i: 2.0 * (i >= 8)), 0),
    # Block 0's maxima below 2^14 (fast), block 1's above (exact), then fast → exact → exact.
    "fast-then-exact": lambda dt: (*_offset_case(dt, [16372.0, 16392.0, 16380.0]), 0),
    # Below −2^14 (exact) then above (fast): for c > 0 the only way back to the fast form.
    "exact-then-fast": lambda dt: (*_offset_case(dt, [-16396.0, -16376.0, -16380.0]), 0),
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("case", list(CASES))
def test_fma_exponent_stays_within_the_flash_bounds(dtype, case):
    """Each case with the fast path on, through the mask-free, prefetched and masked loops;
    the offset cases first check that their blocks fall on the intended sides of 2^14."""
    q, k, v, sc, causal = CASES[case](dtype)
    if case in ("fast-then-exact", "exact-then-fast"):
        # The form follows the running maximum: the largest |m·c| over the block's rows.
        top = _block_maxima(q, k, sc).cummax(1).values.abs().amax(0)
        want = [True, False, False] if case == "fast-then-exact" else [False, True, True]
        assert (top < 2**14).tolist() == want, top
    for cfg in CONFIGS.values():
        o, lse = _launch(q, k, v, cfg, causal=bool(causal), scale=sc)
        _assert_within_bounds(q, k, v, o, lse, causal=bool(causal), scale=sc)


def _residual(m):
    """``m·c − fl(m·c)``, exact (24 × 24 bits fit float64)."""
    return m * float(C32) - float(np.float32(np.float32(m) * C32))


def _f32(*xs):
    return tuple(float(np.float32(x)) for x in xs)


def _score(target, sign):
    """The first fp32 score s ≥ target/c whose product s·c rounds by at least 0.9 of half an
    ulp of fl(s·c), in the direction ``sign`` (+1: fl(s·c) < s·c)."""
    s = np.float32(target / float(C32))
    for _ in range(4096):
        mc = np.float32(s * C32)
        r = float(s) * float(C32) - float(mc)  # exact: 24 × 24 bits fit float64
        if r * sign > 0 and abs(r) >= 0.45 * float(np.spacing(abs(mc))):
            return float(s)
        s = np.nextafter(s, np.float32(np.inf))
    raise AssertionError(f"no score near {target} rounds that way")


# Per row, the score of key block 0 and of key block 1 (v = +1 and −1), in unscaled units
# (scale = 1): residuals of opposite signs, both near their largest, 2^-11.
SHARP = {
    "fast-fast": [_f32(_score(15000.0, 1), _score(15001.0, -1))],
    "fast-exact": [_f32(_score(16383.2, 1), 16384.4 / float(C32))],
    "exact-fast": [_f32(-16385.0 / float(C32), _score(-16383.4, -1))],
    # Row 0's maximum stays in block 0 (fast), but row 1 makes block 1 exact: row 0's old
    # accumulator moves from fl(m·c) to m·c with its maximum unchanged.
    "switch-same-max": [
        _f32(_score(12000.0, 1), 11999.0 / float(C32)),
        _f32(100.0 / float(C32), 16390.0 / float(C32)),
    ],
}


def _closed_form(rows, residuals):
    """O per row for block scores ``rows`` (16 equal keys a block, v = +1 then −1), in
    float64 with the kernel's c; ``residuals=True`` adds each fast block's exponent residual
    to its weight, as a kernel that rescales from the unrounded reference would."""
    out = []
    for s0, s1 in rows:
        t = np.array([s0, s1]) * float(C32)
        w = np.exp2(t - t.max())
        if residuals:
            ms = (s0, max(s0, s1))  # the running maximum after each block
            rs = [_residual(m) if abs(float(np.float32(m * C32))) < 2**14 else 0.0 for m in ms]
            w[0] *= 2.0 ** (rs[0] - rs[1])
        out.append((w[0] - w[1]) / (w[0] + w[1]))
    return np.array(out)


@pytest.mark.parametrize("case", list(SHARP))
def test_fma_exponent_rescales_from_the_reference_its_ps_used(case):
    """Two key blocks of 16 equal scores each (exact in fp32: q = e0, k = s·e0, scale 1), so
    O = (w0 − w1)/(w0 + w1) in closed form. Every rounding the kernel makes here is relative
    to exponents of size ≤ 2, a few 2^-24; a rescale that ignores a fast block's residual
    (the exponent of its largest score, up to 2^-11) moves w0 by up to 2^-10·ln 2 relative,
    which the case is built to make ≥ 1e-4 in O. fp32 only: with fp16 inputs, P is rounded
    to 2^-11 before P·V, which hides that much."""
    rows = SHARP[case]
    exact = _closed_form(rows, residuals=False)
    if case == "switch-same-max":
        mutant = exact.copy()  # row 0's old weight keeps its residual 2^{r} (alpha = 1)
        r = _residual(rows[0][0])
        w0, w1 = 1.0, 2.0 ** ((rows[0][1] - rows[0][0]) * float(C32))
        mutant[0] = (w0 * 2**r - w1) / (w0 * 2**r + w1)
    else:
        mutant = _closed_form(rows, residuals=True)
    tol = 2e-5
    assert np.max(np.abs(mutant - exact)) > 5 * tol, "the case no longer separates the two"
    q = torch.zeros(1, 1, len(rows), 16)
    k = torch.zeros(1, 1, 32, 16)
    v = torch.ones(1, 1, 32, 16)
    v[:, :, 16:] = -1.0
    for i, (s0, s1) in enumerate(rows):
        q[0, 0, i, i] = 1.0
        k[0, 0, :16, i] = s0
        k[0, 0, 16:, i] = s1
    for cfg in CONFIGS.values():
        o, lse = _launch(q, k, v, cfg, scale=1.0)
        np.testing.assert_allclose(o[0, 0, :, 0], exact, rtol=0, atol=tol)
        _assert_within_bounds(q, k, v, o, lse, scale=1.0)
