"""The split-KV merge oracle against a 600-bit evaluation of the same formula: correctly
rounded, certified, with empty (−inf) splits, all-empty rows, huge LSE spreads and the NaN rule."""

from __future__ import annotations

import re

import ml_dtypes
import mpmath
import numpy as np
import pytest

import flashcheck
from flashcheck.harness.core.formats import BF16, FP16, FP32, round_mpf
from flashcheck.harness.oracle.combine import combine_oracle

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)


TOL = mpmath.mpf(2) ** -590  # the reference's own relative error at 600 bits


def _reference(o: np.ndarray, lse: np.ndarray):
    """``(O, LSE)`` per row at 600 bits (mpmath, the formula shifted by the largest lse)."""
    n_split, dv = o.shape[0], o.shape[-1]
    o2, l2 = o.reshape(n_split, -1, dv), lse.reshape(n_split, -1)
    out_o, out_l = [], []
    with mpmath.mp.workprec(600):
        for r in range(l2.shape[1]):
            live = [s for s in range(n_split) if l2[s, r] != -np.inf]
            if not live:
                out_o.append([mpmath.mpf(0)] * dv)
                out_l.append(mpmath.mpf("-inf"))
                continue
            m = max(mpmath.mpf(float(l2[s, r])) for s in live)
            z = mpmath.fsum(mpmath.exp(mpmath.mpf(float(l2[s, r])) - m) for s in live)
            out_l.append(m + mpmath.log(z))
            out_o.append(
                [
                    mpmath.fsum(
                        mpmath.exp(mpmath.mpf(float(l2[s, r])) - out_l[-1])
                        * mpmath.mpf(float(o2[s, r, c]))
                        for s in live
                    )
                    for c in range(dv)
                ]
            )
    return out_o, out_l


def _agree(res, o, lse, fmt=FP32):
    want_o, want_l = _reference(o, lse)
    got_o = res.o
    flat = {f: getattr(got_o, f).reshape(len(want_o), -1) for f in ("hi", "lo", "err", "rounded")}
    lse_flat = {f: getattr(res.lse, f).reshape(-1) for f in ("hi", "lo", "err", "rounded")}
    with mpmath.mp.workprec(600):
        for r, (row, lrow) in enumerate(zip(want_o, want_l, strict=True)):
            for c, y in enumerate(row):
                assert flat["rounded"][r, c] == round_mpf(y, fmt)
                dist = abs(mpmath.mpf(flat["hi"][r, c]) + mpmath.mpf(flat["lo"][r, c]) - y)
                assert dist <= flat["err"][r, c] + abs(y) * TOL
            if lrow == -mpmath.inf:
                assert lse_flat["rounded"][r] == -np.inf
                continue
            assert lse_flat["rounded"][r] == round_mpf(lrow, fmt)
            dist = abs(mpmath.mpf(lse_flat["hi"][r]) + mpmath.mpf(lse_flat["lo"][r]) - lrow)
            assert dist <= lse_flat["err"][r] + abs(lrow) * TOL
    assert res.o.certified.all() and res.lse.certified.all()


@pytest.mark.parametrize("seed", range(3))
def test_the_merge_is_correctly_rounded_and_certified(seed):
    rng = np.random.default_rng(seed)
    o = rng.standard_normal((4, 2, 3, 5)).astype(np.float32)
    lse = (rng.standard_normal((4, 2, 3)) * 4).astype(np.float32)
    res = flashcheck.oracle(o, lse, op="combine")
    assert res.o.shape == (2, 3, 5) and res.lse.shape == (2, 3) and res.fmt == FP32
    _agree(res, o, lse)


def test_empty_splits_contribute_nothing_and_empty_rows_give_zero_and_minus_inf():
    rng = np.random.default_rng(4)
    o = rng.standard_normal((3, 4, 2)).astype(np.float32)
    lse = rng.standard_normal((3, 4)).astype(np.float32)
    lse[0, 0] = -np.inf  # one empty split
    lse[:, 1] = -np.inf  # every split empty
    lse[1:, 2] = -np.inf  # only split 0 holds keys: O is its o exactly
    o[0, 0] = np.nan  # an empty split's output is never read
    o[:, 1] = np.nan
    res = flashcheck.oracle(o, lse, op="combine")
    assert np.all(res.o.rounded[1] == 0) and res.lse.rounded[1] == -np.inf
    np.testing.assert_array_equal(res.o.rounded[2], o[0, 2])
    assert res.lse.rounded[2] == lse[0, 2]
    assert not np.isnan(res.o.rounded).any()
    _agree(res, np.where(np.isneginf(lse)[..., None], 0, o), lse)


def test_huge_lse_spreads_are_exact():
    o = np.array([[[1.0, -2.0]], [[3.0, 0.5]], [[-1.0, 7.0]]], dtype=np.float32)
    lse = np.array([[3e38], [-3e38], [3e38 - 2e31]], dtype=np.float32)
    res = flashcheck.oracle(o, lse, op="combine")
    _agree(res, o, lse)
    spread = np.array([[80.0], [-80.0], [0.0]], dtype=np.float32)
    _agree(flashcheck.oracle(o, spread, op="combine"), o, spread)


def test_non_finite_partials_follow_the_nan_rule():
    o = np.ones((2, 3, 2), dtype=np.float32)
    lse = np.zeros((2, 3), dtype=np.float32)
    lse[0, 0] = np.nan  # the row's O and LSE
    lse[1, 1] = np.inf
    o[1, 2, 1] = np.inf  # one element of a contributing split: that O element only
    res = combine_oracle(o, lse)
    assert np.isnan(res.o.rounded[0]).all() and np.isnan(res.lse.rounded[0])
    assert np.isnan(res.o.rounded[1]).all() and np.isnan(res.lse.rounded[1])
    assert res.o.rounded[2, 0] == 1.0 and np.isnan(res.o.rounded[2, 1])
    assert res.lse.rounded[2] == np.float32(np.log(2.0))
    assert res.o.certified.all() and res.lse.certified.all()


def test_torch_partials_and_a_target_format():
    rng = np.random.default_rng(9)
    o = rng.standard_normal((2, 6, 4)).astype(np.float32)
    lse = rng.standard_normal((2, 6)).astype(np.float32)
    res = flashcheck.oracle(torch.from_numpy(o), torch.from_numpy(lse), op="combine", fmt="fp16")
    assert res.fmt == FP16
    _agree(res, o, lse, fmt=FP16)


def test_bad_merge_calls_say_how_to_fix_them():
    o = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=re.escape("lse_partial must be (S, ...) = (2, 3)")):
        combine_oracle(o, np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=re.escape("out_partial must be (S, ..., dv)")):
        combine_oracle(np.zeros(3, np.float32), np.zeros((), np.float32))
    with pytest.raises(TypeError, match="takes two tensors"):
        flashcheck.oracle(o, o, o, op="combine")
    with pytest.raises(
        ValueError, match=re.escape("op='combine' takes no causal: the merge takes only fmt, mode")
    ):
        flashcheck.oracle(o, np.zeros((2, 3), np.float32), op="combine", causal=True)
    with pytest.raises(TypeError, match="lse_partial has dtype int32"):
        combine_oracle(o, np.zeros((2, 3), np.int32))


def test_fast_and_strict_modes_agree():
    rng = np.random.default_rng(10)
    o = rng.standard_normal((5, 3, 4)).astype(np.float32)
    lse = (rng.standard_normal((5, 3)) * 30).astype(np.float32)
    lse[2, 1] = -np.inf
    fast = flashcheck.oracle(o, lse, op="combine")
    strict = flashcheck.oracle(o, lse, op="combine", mode="strict")
    assert strict.mode == "strict" and strict.stats["strict_evaluations"] > 0
    for name in ("o", "lse"):
        np.testing.assert_array_equal(fast[name].rounded, strict[name].rounded)
        assert strict[name].certified.all()
    _agree(strict, o, lse)


def test_bf16_partials_with_fp32_lse_and_no_row_axes():
    o = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=ml_dtypes.bfloat16)
    lse = np.array([0.0, np.log(3.0)], dtype=np.float32)
    res = flashcheck.oracle(o, lse, op="combine")
    assert res.fmt.name == "bf16" and res.o.shape == (2,) and res.lse.shape == ()
    _agree(res, o.astype(np.float32), lse, fmt=BF16)
