import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from flashcheck.harness.core.formats import BF16, FP16, FP32
from flashcheck.harness.judging.metrics import floored_ulp_error
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_numpy, naive_torch
from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention

DT = {"fp16": (np.float16, FP16), "bf16": (ml_dtypes.bfloat16, BF16), "fp32": (np.float32, FP32)}


def _inputs(seed, b, hq, hk, nq, nk, d, dv, dt, scale=1.0):
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * scale).astype(np.float32).astype(dt)  # noqa: E731
    return f(b, hq, nq, d), f(b, hk, nk, d), f(b, hk, nk, dv)


@st.composite
def cases(draw):
    name = draw(st.sampled_from(sorted(DT)))
    nq, nk = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    shape = dict(
        b=draw(st.integers(1, 2)),
        hk=draw(st.sampled_from([1, 2])),
        nq=nq,
        nk=nk,
        d=draw(st.integers(1, 9)),
        dv=draw(st.integers(1, 4)),
    )
    shape["hq"] = shape["hk"] * draw(st.sampled_from([1, 2]))
    opts = {"causal": draw(st.booleans())}
    if draw(st.booleans()):
        opts["window"] = (draw(st.integers(0, 4)), draw(st.sampled_from([0, 2, None])))
    seed = draw(st.integers(0, 2**31))
    blocks = (draw(st.sampled_from([1, 2, 3, 16])), draw(st.sampled_from([1, 2, 5, 16])))
    note(f"{name} {shape} {opts} seed={seed} blocks={blocks}")
    return name, shape, opts, seed, blocks


@given(case=cases(), variant=st.sampled_from(["fa1", "fa2"]))
def test_fp64_recurrence_matches_the_oracle(case, variant):
    # With every intermediate in float64 the only error left is the algorithm's own rounding
    # (~1e-15 of W): masks, rescaling, GQA and block edges must be exactly right to pass.
    name, shape, opts, seed, (bq, bk) = case
    dt, _ = DT[name]
    q, k, v = _inputs(seed, dt=dt, **shape)
    o, lse = online_attention(
        q, k, v, policy=PrecisionPolicy.fp64(name), variant=variant, block_q=bq, block_k=bk, **opts
    )
    ref = oracle(q, k, v, **opts)
    err = np.abs((o - ref.o.hi) - ref.o.lo)
    assert np.all(err <= 1e-13 * np.maximum(ref.o.floor, 1e-300) + 1e-300)
    masked = np.isneginf(ref.lse.hi)
    np.testing.assert_array_equal(np.isneginf(lse), masked)
    assert np.all(o[masked] == 0)
    live = ~masked
    assert np.all(np.abs(lse[live] - ref.lse.hi[live]) <= 1e-13 * (1 + np.abs(ref.lse.hi[live])))


@given(case=cases())
def test_naive_fp64_matches_the_oracle(case):
    name, shape, opts, seed, _ = case
    dt, _ = DT[name]
    q, k, v = _inputs(seed, dt=dt, **shape)
    o, lse = naive_numpy(q, k, v, precision="fp64", **opts)
    ref = oracle(q, k, v, **opts)
    assert np.all(np.abs(o - ref.o.hi) <= 1e-13 * ref.o.floor + 1e-300)
    live = np.isfinite(ref.lse.hi)
    np.testing.assert_array_equal(np.isneginf(lse), ~live)
    assert np.all(np.abs(lse[live] - ref.lse.hi[live]) <= 1e-13 * (1 + np.abs(ref.lse.hi[live])))


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_flash_policy_within_twice_the_naive_error(name):
    # SPEC 3.4's empirical policy on random inputs: flash error <= 2 x same-precision naive
    # error + a floor of 1 ulp(W) (an error the naive reference may not happen to show).
    dt, fmt = DT[name]
    worst = []
    for seed in range(6):
        q, k, v = _inputs(seed, 1, 2, 1, 24, 40, 16, 8, dt, scale=2.0)
        ref = oracle(q, k, v, causal=seed % 2 == 0)
        o, _ = online_attention(
            q, k, v, policy=PrecisionPolicy.flash(name), block_k=8, causal=seed % 2 == 0
        )
        n, _ = naive_numpy(q, k, v, causal=seed % 2 == 0)
        e_flash = floored_ulp_error(o.astype(np.float64), ref.o.hi, ref.o.lo, ref.o.floor, fmt)
        e_naive = floored_ulp_error(n.astype(np.float64), ref.o.hi, ref.o.lo, ref.o.floor, fmt)
        assert e_flash.max() <= 2 * e_naive.max() + 1.0
        worst.append(e_flash.max())
    assert max(worst) > 0  # the check compared real rounding errors, not identical values


def test_recurrence_variants_and_blocks_agree_in_fp32():
    q, k, v = _inputs(3, 1, 1, 1, 13, 29, 7, 5, np.float32)
    ref = oracle(q, k, v)
    outs = [
        online_attention(q, k, v, policy=PrecisionPolicy.fp32(), variant=var, block_k=bk)[0]
        for var in ("fa1", "fa2")
        for bk in (1, 4, 29)
    ]
    for o in outs:
        e = floored_ulp_error(o.astype(np.float64), ref.o.hi, ref.o.lo, ref.o.floor, FP32)
        assert e.max() < 16  # tens of ulps are legitimate for fp32 (error-bounds.md §6c)


def test_fully_masked_rows_and_determinism():
    q, k, v = _inputs(4, 1, 1, 1, 6, 3, 4, 2, np.float16)
    o, lse = online_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), causal=True)
    assert np.all(o[0, 0, :3] == 0) and np.all(np.isneginf(lse[0, 0, :3]))
    assert not np.isnan(o).any()
    o2, lse2 = online_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), causal=True)
    assert o.tobytes() == o2.tobytes() and lse.tobytes() == lse2.tobytes()
    n, nl = naive_numpy(q, k, v, causal=True)
    assert np.all(n[0, 0, :3] == 0) and np.all(np.isneginf(nl[0, 0, :3]))


def test_naive_torch_matches_the_numpy_emulation_closely():
    torch = pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    q, k, v = _inputs(5, 1, 2, 1, 9, 12, 8, 4, np.float32)
    ot, lt = naive_torch(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    on, ln = naive_numpy(q, k, v, causal=True)
    np.testing.assert_allclose(ot.numpy(), on, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lt.numpy(), ln, rtol=1e-5)


def test_bad_arguments():
    q, k, v = _inputs(6, 1, 1, 1, 2, 2, 2, 2, np.float16)
    with pytest.raises(ValueError, match="dtype"):
        online_attention(q.astype(np.float32), k, v, policy=PrecisionPolicy.flash("fp16"))
    with pytest.raises(ValueError, match="variant"):
        online_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), variant="fa3")
    with pytest.raises(ValueError, match="block"):
        online_attention(q, k, v, policy=PrecisionPolicy.flash("fp16"), block_k=0)
