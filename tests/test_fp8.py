"""FP8 inputs: the formats, their rounding, descales, and the oracle's exact answer for them."""

import ml_dtypes
import mpmath
import numpy as np
import pytest
import torch

import flashcheck
from flashcheck.harness.core.formats import (
    BF16,
    E4M3,
    E5M2,
    format_of,
    ordered_int,
    round_mpf,
    round_to_format,
)
from flashcheck.harness.core.fp8 import quantize


def test_fp8_formats_match_ml_dtypes():
    for fmt, dt in ((E4M3, ml_dtypes.float8_e4m3fn), (E5M2, ml_dtypes.float8_e5m2)):
        info = ml_dtypes.finfo(dt)
        assert fmt.max_finite == float(info.max)
        assert fmt.min_normal == float(info.smallest_normal)
        assert fmt.min_subnormal == float(info.smallest_subnormal)
        assert format_of(dt) is fmt and format_of(np.zeros(2, dt)) is fmt
        # every finite code point round-trips, and the ordered integers count the steps
        codes = np.arange(256, dtype=np.uint8).view(dt).astype(np.float64)
        codes = codes[np.isfinite(codes)]
        assert np.array_equal(round_to_format(codes, fmt), codes)
        pos = np.unique(codes[codes >= 0])
        assert np.array_equal(ordered_int(pos, fmt), np.arange(pos.size))
    assert format_of(torch.float8_e4m3fn) is E4M3 and format_of("float8_e5m2") is E5M2


def test_fp8_rounding_is_nearest_even_and_e4m3_saturates():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4000) * 2.0 ** rng.integers(-12, 9, 4000)).astype(np.float32)
    x = x[np.abs(x) < 440].astype(np.float64)  # ml_dtypes gives NaN beyond e4m3's range
    for fmt in (E4M3, E5M2):
        ref = x.astype(np.float32).astype(fmt.numpy_dtype).astype(np.float64)
        assert np.array_equal(round_to_format(x, fmt), ref)
    big = np.array([464.0, 470.0, 1e9, np.inf, -np.inf, np.nan])
    out = round_to_format(big, E4M3)
    assert np.array_equal(out[:5], [448.0, 448.0, 448.0, 448.0, -448.0]) and np.isnan(out[5])
    # torch's cast saturates the same way
    t = torch.tensor(big[:5]).to(torch.float8_e4m3fn).float().numpy()
    assert np.array_equal(t, out[:5])
    # e5m2 is IEEE-like: beyond 57344 (after rounding) it overflows to inf
    assert np.array_equal(round_to_format(np.array([57344.0, 61440.0]), E5M2), [57344.0, np.inf])


def test_quantize_gives_one_descale_per_head_within_range():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 8, 16)) * np.array([1e-6, 1.0, 1e3, 1e6])[None, :, None, None]
    for heads in (4, 2):
        x8, desc = quantize(x, "e4m3", heads=heads)
        assert x8.dtype == ml_dtypes.float8_e4m3fn and desc.dtype == np.float32
        assert desc.shape == (2, heads)
        assert np.abs(x8.astype(np.float64)).max() == 448.0  # the largest value of a group
        per_head = np.repeat(desc.astype(np.float64), 4 // heads, axis=1)[:, :, None, None]
        back = x8.astype(np.float64) * per_head
        # relative 2^-4 for normal values, half e4m3's subnormal spacing (2^-10) absolute
        err = np.abs(back - x)
        assert np.all(err <= 2.0**-4 * np.abs(x) * 1.0001 + 2.0**-10 * per_head)


def _mp_attention(q, k, v):
    """Independent reference: every step in mpmath at 200 bits, no interval certificate."""
    with mpmath.workprec(200):
        scale = 1 / mpmath.sqrt(q.shape[1])
        nq, nk = q.shape[0], k.shape[0]
        out = np.zeros((nq, v.shape[1]), dtype=object)
        lse = []
        for i in range(nq):
            s = [
                scale
                * mpmath.fsum(
                    mpmath.mpf(a) * mpmath.mpf(b) for a, b in zip(q[i], k[j], strict=True)
                )
                for j in range(nk)
            ]
            m = max(s)
            e = [mpmath.exp(x - m) for x in s]
            z = mpmath.fsum(e)
            lse.append(m + mpmath.log(z))
            for c in range(v.shape[1]):
                out[i, c] = mpmath.fsum(ej * mpmath.mpf(v[j, c]) for j, ej in enumerate(e)) / z
        return out, lse


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_oracle_fp8_equals_an_independent_mpmath_computation(fmt):
    rng = np.random.default_rng(3)
    b, hq, hk, n, d = 1, 2, 1, 5, 8
    q8, dq = quantize(rng.standard_normal((b, hq, n, d)) * 3, fmt, heads=hk)
    k8, dk = quantize(rng.standard_normal((b, hk, n, d)) * 1e-3, fmt)
    v8, dv = quantize(rng.standard_normal((b, hk, n, d)) * 1e4, fmt)
    res = flashcheck.oracle(q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv, causal=True)
    assert res.fmt is BF16 and res.o.certified.all() and res.lse.certified.all()
    for h in range(hq):
        qe = q8[0, h].astype(np.float64) * float(dq[0, 0])
        ke = k8[0, 0].astype(np.float64) * float(dk[0, 0])
        ve = v8[0, 0].astype(np.float64) * float(dv[0, 0])
        for i in range(n):
            o, lse = _mp_attention(qe[i : i + 1], ke[: i + 1], ve[: i + 1])
            for c in range(d):
                exact = o[0, c]
                hi, lo, err = res.o.hi[0, h, i, c], res.o.lo[0, h, i, c], res.o.err[0, h, i, c]
                with mpmath.workprec(200):
                    gap = abs(mpmath.mpf(hi) + mpmath.mpf(lo) - exact)
                assert gap <= err + abs(exact) * 1e-40
                assert res.o.rounded[0, h, i, c] == round_mpf(exact, BF16)
            assert abs(res.lse.hi[0, h, i] - float(lse[0])) <= 1e-12 * max(1, abs(float(lse[0])))
    # torch float8 tensors give the same answer; strict mode agrees
    tq, tk, tv = (
        torch.from_numpy(x.view(np.uint8)).view(
            E4M3.torch_dtype if fmt == "e4m3" else E5M2.torch_dtype
        )
        for x in (q8, k8, v8)
    )
    again = flashcheck.oracle(
        tq,
        tk,
        tv,
        descale_q=torch.from_numpy(dq),
        descale_k=dk,
        descale_v=dv,
        causal=True,
        mode="strict",
    )
    assert np.array_equal(again.o.rounded, res.o.rounded)
    assert np.array_equal(again.lse.rounded, res.lse.rounded)


def test_fp8_oracle_refuses_misuse_with_a_fix():
    x8 = np.zeros((1, 1, 2, 4), ml_dtypes.float8_e4m3fn)
    x16 = np.zeros((1, 1, 2, 4), np.float16)
    with pytest.raises(ValueError, match="FP8 inputs only"):
        flashcheck.oracle(x16, x16, x16, descale_q=np.ones((1, 1), np.float32))
    with pytest.raises(TypeError, match="float32"):
        flashcheck.oracle(x8, x8, x8, descale_k=np.ones((1, 1)))
    with pytest.raises(ValueError, match="positive"):
        flashcheck.oracle(x8, x8, x8, descale_v=np.zeros((1, 1), np.float32))
    with pytest.raises(ValueError, match="shape"):
        flashcheck.oracle(x8, x8, x8, descale_v=np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match="without do"):
        flashcheck.oracle(x8, x8, x8, do=x16)
    with pytest.raises(TypeError, match="share one format"):
        flashcheck.oracle(x8, x8, x8.astype(ml_dtypes.float8_e5m2))


def test_fp8_case_files_store_bits_and_descales_and_replay_bit_for_bit(tmp_path):
    from flashcheck.harness.cases.case import Case
    from flashcheck.harness.cases.store import load_case, save_case

    rng = np.random.default_rng(4)
    q8, dq = quantize(rng.standard_normal((2, 2, 3, 8)) * 500, "e4m3", heads=1)
    k8, dk = quantize(rng.standard_normal((2, 1, 4, 8)) * 1e-30, "e4m3")
    v8, dv = quantize(rng.standard_normal((2, 1, 4, 8)), "e4m3")
    tq = torch.from_numpy(q8.view(np.uint8)).view(torch.float8_e4m3fn)  # torch in, numpy kept
    case = Case.from_arrays(tq, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv)
    assert case.dtype == "e4m3" and case.q.dtype == ml_dtypes.float8_e4m3fn
    assert " d=8 dv=8 " in case.describe() and "descale_v=[" in case.describe()
    assert np.array_equal(case.bits("q"), q8.view(np.uint8))
    cid = save_case(case, kernel="k", device="cpu", directory=tmp_path)
    back, record = load_case(cid, tmp_path)
    assert record["dtype"] == "e4m3"
    for name in ("q", "k", "v"):
        assert np.array_equal(back.bits(name), case.bits(name))
    for name, d in case.descales.items():
        assert np.array_equal(back.descales[name], d) and back.descales[name].dtype == np.float32
    assert np.array_equal(back.problem.q, case.problem.q)
    assert np.array_equal(back.problem.v, case.problem.v)
    a = flashcheck.oracle(*back.to_torch(), **back.descales)
    b = flashcheck.oracle(q8, k8, v8, descale_q=dq, descale_k=dk, descale_v=dv)
    assert np.array_equal(a.o.rounded, b.o.rounded) and back.to_torch()[0].dtype == tq.dtype
    one = case.slice(1, 1)
    assert one.descale_q.shape == (1, 1) and one.descale_q[0, 0] == dq[1, 0]
    with pytest.raises(ValueError, match="FP8 cases only"):
        Case(*(np.zeros((1, 1, 2, 4), np.float16),) * 3, descale_q=np.ones((1, 1), np.float32))
