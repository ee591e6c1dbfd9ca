import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from flashcheck.kernels.naive import naive_numpy_backward, naive_torch
from flashcheck.kernels.recurrence import (
    PrecisionPolicy,
    keep_mask,
    online_attention,
    online_attention_backward,
)

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)

DT = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp32": np.float32, "fp64": np.float64}
U = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}  # unit roundoff u_F


def _inputs(seed, b, hq, hk, nq, nk, d, dv, dt, scale=1.0):
    rng = np.random.default_rng(seed)
    f = lambda *s: (rng.standard_normal(s) * scale).astype(np.float32).astype(dt)  # noqa: E731
    return f(b, hq, nq, d), f(b, hk, nk, d), f(b, hk, nk, dv), f(b, hq, nq, dv)


def _t(x):
    if x.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(x))


def _np(t):
    t = t.detach()
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _reference(q, k, v, do, causal=False, window=None, mask=None, scale=None):
    """Float64 torch autograd of plain attention; also the per-element floor scales (SPEC 3.7)
    ``Σ_j P_ij(|dP_ij| + |D_i|)|K_jc|``-style magnitudes that bound each gradient's rounding."""
    bsz, hq, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    rep = hq // hk
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    tq, tk, tv = (torch.from_numpy(x.astype(np.float64)).requires_grad_() for x in (q, k, v))
    kk, vv = tk.repeat_interleave(rep, 1), tv.repeat_interleave(rep, 1)
    mk = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    keep = torch.from_numpy(
        np.stack(
            [
                np.stack(
                    [
                        keep_mask(
                            nq,
                            nk,
                            np.arange(nq),
                            np.arange(nk),
                            causal,
                            window,
                            None if mk is None else mk[b, h],
                        )
                        for h in range(hq)
                    ]
                )
                for b in range(bsz)
            ]
        )
    )
    s = (sc * tq @ kk.transpose(-1, -2)).masked_fill(~keep, -math.inf)
    has = keep.any(-1, keepdim=True)
    p = torch.softmax(torch.where(has, s, 0.0), -1) * keep
    o = p @ vv
    tdo = torch.from_numpy(do.astype(np.float64))
    o.backward(tdo)
    with torch.no_grad():
        dp = tdo @ vv.transpose(-1, -2)
        w = p * (dp.abs() + (tdo * o).sum(-1, keepdim=True).abs())
        fq = sc * w @ kk.abs()
        fk = (sc * w.transpose(-1, -2) @ tq.abs()).reshape(bsz, hk, rep, nk, d).sum(2)
        fv = (p.transpose(-1, -2) @ tdo.abs()).reshape(bsz, hk, rep, nk, -1).sum(2)
    grads = tuple(x.grad.numpy() for x in (tq, tk, tv))
    return grads, (fq.numpy(), fk.numpy(), fv.numpy())


def _flash(q, k, v, do, policy, block_q=16, block_k=16, **opts):
    o, lse = online_attention(q, k, v, policy=policy, block_q=block_q, block_k=block_k, **opts)
    return online_attention_backward(
        q,
        k,
        v,
        o,
        lse,
        do.astype(o.dtype),
        policy=policy,
        block_q=block_q,
        block_k=block_k,
        **opts,
    )


def _max_rel(got, ref):
    return max(
        np.abs(g.astype(np.float64) - r).max() / max(np.abs(r).max(), 1e-300)
        for g, r in zip(got, ref, strict=True)
    )


# (shape, options, blocks): causal, window, explicit mask, GQA, Nq != Nk, dv != d, ragged block
# edges, block_k = 1.
CASES = [
    (dict(b=1, hq=1, hk=1, nq=17, nk=17, d=8, dv=8), {}, (16, 16)),
    (dict(b=2, hq=4, hk=2, nq=19, nk=23, d=7, dv=5), {"causal": True}, (5, 7)),
    (dict(b=1, hq=4, hk=2, nq=13, nk=9, d=5, dv=3), {"window": (3, 1)}, (4, 1)),
    (dict(b=1, hq=2, hk=1, nq=9, nk=15, d=16, dv=4), {"window": (2, None)}, (16, 3)),
    (dict(b=1, hq=4, hk=1, nq=11, nk=13, d=6, dv=9), {"mask": "random"}, (3, 5)),
    (dict(b=1, hq=2, hk=2, nq=40, nk=33, d=3, dv=2), {"causal": True}, (16, 1)),
]


def _opts(opts, shape, seed):
    if opts.get("mask") == "random":
        rng = np.random.default_rng(seed + 1)
        m = rng.random((shape["b"], shape["hq"], shape["nq"], shape["nk"])) < 0.7
        return {**opts, "mask": m}
    return opts


@pytest.mark.parametrize("case", range(len(CASES)))
def test_fp64_gradients_match_float64_autograd(case):
    shape, opts, (bq, bk) = CASES[case]
    q, k, v, do = _inputs(case, dt=np.float32, **shape)
    opts = _opts(opts, shape, case)
    ref, _ = _reference(q, k, v, do, **opts)
    flash = _flash(q, k, v, do, PrecisionPolicy.fp64("fp32"), bq, bk, **opts)
    naive = naive_numpy_backward(q, k, v, do, precision="fp64", **opts)
    assert all(g.dtype == np.float64 for g in (*flash, *naive))
    assert _max_rel(flash, ref) < 1e-12
    assert _max_rel(naive, ref) < 1e-12


@st.composite
def cases(draw):
    nq, nk = draw(st.integers(1, 9)), draw(st.integers(1, 11))
    shape = dict(
        b=1,
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
    note(f"{shape} {opts} seed={seed} blocks={blocks}")
    return shape, opts, seed, blocks


@given(case=cases())
def test_fp64_backward_matches_autograd_on_drawn_shapes(case):
    # Includes fully masked rows (causal with Nq > Nk, narrow windows): they must give 0.
    shape, opts, seed, (bq, bk) = case
    q, k, v, do = _inputs(seed, dt=np.float16, **shape)
    ref, _ = _reference(q, k, v, do, **opts)
    flash = _flash(q, k, v, do, PrecisionPolicy.fp64("fp16"), bq, bk, **opts)
    naive = naive_numpy_backward(q, k, v, do, precision="fp64", **opts)
    for got in (flash, naive):
        for g, r in zip(got, ref, strict=True):
            assert not np.isnan(g).any()
            assert np.all(np.abs(g - r) <= 1e-12 * max(np.abs(r).max(), 1e-300))


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_fully_masked_rows_and_keys_give_exact_zeros(name):
    # Causal with Nq > Nk leaves rows 0..2 with no key; the explicit mask also empties row 5 and
    # key 1 (for every query head of the group, so dK, dV of key 1 get nothing).
    dt = DT[name]
    q, k, v, do = _inputs(7, 1, 2, 1, 8, 5, 4, 3, dt)
    mask = np.ones((1, 2, 8, 5), dtype=bool)
    mask[:, :, 5] = False
    mask[:, :, :, 1] = False
    opts = {"causal": True, "mask": mask}
    dead_rows = [0, 1, 2, 5]
    pols = [PrecisionPolicy.fp64(name)]
    pols.append(PrecisionPolicy.fp32() if name == "fp32" else PrecisionPolicy.flash(name))
    results = [_flash(q, k, v, do, pol, 3, 2, **opts) for pol in pols]
    results += [naive_numpy_backward(q, k, v, do, precision=p, **opts) for p in ("same", "fp64")]
    tq, tk, tv = (_t(x).requires_grad_() for x in (q, k, v))
    o, lse = naive_torch(tq, tk, tv, **opts)
    (o.float() * _t(do).float()).sum().backward()
    assert torch.isneginf(lse[0, :, dead_rows]).all()
    results.append(tuple(_np(x.grad) for x in (tq, tk, tv)))
    for dq, dk, dv in results:
        for g in (dq, dk, dv):
            assert not np.isnan(g.astype(np.float64)).any()
        assert np.all(dq[:, :, dead_rows].astype(np.float64) == 0)
        assert np.all(dk[:, :, 1].astype(np.float64) == 0)
        assert np.all(dv[:, :, 1].astype(np.float64) == 0)
        assert np.any(dq.astype(np.float64) != 0)


def test_naive_torch_autograd_is_clean_with_the_lse_in_the_graph():
    # SPEC 3.7: LSE has no upstream gradient, but a caller who sums it (finite rows only) must
    # still get finite gradients: torch's logsumexp backward masks the −inf rows.
    q, k, v, _ = _inputs(8, 1, 1, 1, 6, 3, 4, 2, np.float32)
    tq, tk, tv = (_t(x).requires_grad_() for x in (q, k, v))
    o, lse = naive_torch(tq, tk, tv, causal=True)
    (o.sum() + torch.where(torch.isfinite(lse), lse, 0.0).sum()).backward()
    for t in (tq, tk, tv):
        assert torch.isfinite(t.grad).all()
    assert (tq.grad[0, 0, :3] == 0).all()


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_one_key_closed_form(name):
    # One key: P = 1, O = v exactly, so dP − D = 0 bit for bit (the same sequential dot) and
    # dQ = dK = 0 exactly; dV = Σ over the group's rows of dO. dO is a dyadic grid, so every fp32
    # sum is exact: with q = 0 (t = 0, LSE = 0, P = exp2(0) = 1) dV = fl_F(Σ dO) exactly. With a
    # random q the flash P = exp2(t − fl(fl(t·ln 2)·fl(log2 e))) is 1 only up to the LSE round
    # trip (|t − lse'| of an ulp of t): exact after rounding P to fp16/bf16, within a few ulps of
    # |t| in fp32.
    dt = DT[name]
    rng = np.random.default_rng(9)
    q, k, v, _ = _inputs(9, 1, 4, 2, 9, 1, 8, 3, dt)
    do = (rng.integers(-64, 64, (1, 4, 9, 3)) / 8).astype(dt)
    want = do.astype(np.float64).reshape(1, 2, 2, 9, 3).sum(axis=(2, 3))[:, :, None]
    pol = PrecisionPolicy.fp32() if name == "fp32" else PrecisionPolicy.flash(name)
    for qq in (np.zeros_like(q), q):
        dq, dk, dv = _flash(qq, k, v, do, pol, block_q=4)
        assert np.all(dq.astype(np.float64) == 0) and np.all(dk.astype(np.float64) == 0)
        err = np.abs(dv.astype(np.float64) - want.astype(dt).astype(np.float64))
        if name == "fp32" and qq is q:
            abs_sum = np.abs(do.astype(np.float64)).reshape(1, 2, 2, 9, 3).sum(axis=(2, 3))
            assert np.all(err <= 64 * U[name] * abs_sum[:, :, None])
        else:
            assert np.all(err == 0)
        ndq, ndk, ndv = naive_numpy_backward(qq, k, v, do)
        assert np.all(ndq.astype(np.float64) == 0) and np.all(ndk.astype(np.float64) == 0)
        # naive: per head fl_F(Σ_i dO) then the group's fp32 sum rounded once
        per_head = do.astype(np.float64).sum(axis=2).astype(dt).astype(np.float32)
        per_head = per_head.reshape(1, 2, 2, 3)  # repeat_interleave: heads (0, 1) share kv 0
        grouped = (per_head[:, :, 0] + per_head[:, :, 1]).astype(dt)
        np.testing.assert_array_equal(ndv[:, :, 0], grouped)


def test_uniform_scores_closed_form():
    # q = 0: S = 0, P = 1/N, D_i = dO_i·v̄, so dS = (1/N)·dO·(V − v̄)ᵀ, dQ = scale·dS·K,
    # dK = scale·dSᵀ·q = 0 exactly and dV_j = (1/N)·Σ_i dO_i (summed over the group's heads).
    _, k, v, do = _inputs(10, 1, 2, 1, 7, 12, 5, 4, np.float32)
    q = np.zeros((1, 2, 7, 5), dtype=np.float32)
    n, sc = 12, 1 / math.sqrt(5)
    k64, v64, do64 = (x.astype(np.float64) for x in (k[0, 0], v[0, 0], do[0]))
    ds = do64 @ (v64 - v64.mean(axis=0)).T / n
    want_dq = sc * ds @ k64
    want_dv = do64.sum(axis=(0, 1)) / n
    for pol, tol in ((PrecisionPolicy.fp64("fp32"), 1e-13), (PrecisionPolicy.fp32(), 1e-5)):
        dq, dk, dv = _flash(q, k, v, do, pol, block_q=3, block_k=5)
        assert np.all(dk == 0)
        assert np.abs(dq[0] - want_dq).max() <= tol * np.abs(want_dq).max()
        assert np.abs(dv[0, 0] - want_dv).max() <= tol * np.abs(want_dv).max()
    dq, dk, dv = naive_numpy_backward(q, k, v, do, precision="fp64")
    assert np.all(dk == 0) and np.abs(dq[0] - want_dq).max() <= 1e-13 * np.abs(want_dq).max()


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp32"])
def test_flash_and_naive_gradients_within_a_loose_bound_of_float64(name):
    # Per element, |g − g64| ≤ 64·u_F·floor with floor the SPEC 3.7 magnitudes (dS's error
    # enters through P(|dP| + |D|)) plus one rounding of g itself.
    dt = DT[name]
    pol = PrecisionPolicy.fp32() if name == "fp32" else PrecisionPolicy.flash(name)
    worst = 0.0
    for seed in range(3):
        q, k, v, do = _inputs(seed, 1, 4, 2, 21, 34, 16, 8, dt, scale=1.5)
        opts = {"causal": seed == 1, "window": (5, 2) if seed == 2 else None}
        ref, floors = _reference(q, k, v, do, **opts)
        for got in (
            _flash(q, k, v, do, pol, 8, 16, **opts),
            naive_numpy_backward(q, k, v, do, **opts),
        ):
            for g, r, f in zip(got, ref, floors, strict=True):
                err = np.abs(g.astype(np.float64) - r)
                assert np.all(err <= U[name] * (64 * f + np.abs(r)) + 1e-300)
                worst = max(worst, (err / (U[name] * (f + np.abs(r)) + 1e-300)).max())
    assert worst > 0.5  # real rounding errors were compared


def test_block_q_changes_nothing_but_the_grouping_of_dk_dv_sums():
    # dQ of a row depends on that row only: bitwise identical for every block_q. dK, dV sum the
    # rows sequentially inside a query block, then add the block to the accumulator: with one
    # query head per kv head, block_q = 1 and block_q ≥ Nq are the same sequential sum (bitwise);
    # other block_q regroup the fp32 sum (ulps).
    q, k, v, do = _inputs(11, 2, 2, 2, 19, 14, 6, 5, np.float16)
    pol = PrecisionPolicy.flash("fp16")
    runs = {bq: _flash(q, k, v, do, pol, bq, 4, causal=True) for bq in (1, 3, 16, 19, 64)}
    for bq, (dq, dk, dv) in runs.items():
        np.testing.assert_array_equal(dq, runs[1][0])
        u = np.float64(2.0**-10)
        for g, g1 in ((dk, runs[1][1]), (dv, runs[1][2])):
            diff = np.abs(g.astype(np.float64) - g1.astype(np.float64))
            assert np.all(diff <= 2 * u * np.abs(g1.astype(np.float64)) + 1e-7), bq
    for i in (1, 2):
        np.testing.assert_array_equal(runs[19][i], runs[1][i])
        np.testing.assert_array_equal(runs[64][i], runs[1][i])
    # dK, dV are computed once per key block: block_k regroups nothing for them in fp64.
    a = _flash(q, k, v, do, PrecisionPolicy.fp64("fp16"), 5, 1, causal=True)
    b = _flash(q, k, v, do, PrecisionPolicy.fp64("fp16"), 2, 14, causal=True)
    assert _max_rel(a, b) < 1e-14


@pytest.mark.parametrize("name", ["fp32", "fp16", "bf16"])
def test_naive_backward_emulates_torch_autograd(name):
    # Same graph, same roundings; what differs is summation order: torch's CPU GEMMs block (and
    # fuse) their fp32 accumulation, its softmax uses a vectorised exp and multiplies by 1/Σ, and
    # reduces Σ_j P·dP lane-wise. After rounding to fp16/bf16 that rarely shows (an occasional
    # 1-ulp flip); in fp32 it is a few ulps of the gradient's magnitude.
    dt = DT[name]
    q, k, v, do = _inputs(12, 1, 4, 2, 17, 13, 8, 6, dt)
    mask = np.random.default_rng(3).random((1, 1, 17, 13)) < 0.8
    for opts in ({"causal": True}, {"window": (4, 1)}, {"mask": mask}):
        tq, tk, tv = (_t(x).requires_grad_() for x in (q, k, v))
        o, _ = naive_torch(tq, tk, tv, **opts)
        o.backward(_t(do))
        got = naive_numpy_backward(q, k, v, do, **opts)
        for t, g in zip((tq, tk, tv), got, strict=True):
            a, b = _np(t.grad).astype(np.float64), g.astype(np.float64)
            assert np.abs(a - b).max() <= 8 * U[name] * np.abs(a).max()


def test_nan_inputs_propagate_without_warnings():
    # A NaN in one query row: its LSE is NaN (live), so its P, dQ row, and every dK, dV entry of
    # the keys it sees are NaN; other rows' dQ stay finite. No sanitising, no numpy warnings.
    q, k, v, do = _inputs(14, 1, 2, 1, 6, 5, 4, 3, np.float16)
    q[0, 0, 2, 1] = np.nan
    pol = PrecisionPolicy.flash("fp16")
    dq, dk, dv = _flash(q, k, v, do, pol, 4, 2)
    assert np.isnan(dq[0, 0, 2]).all() and np.isfinite(np.delete(dq[0, 0], 2, axis=0)).all()
    assert np.isfinite(dq[0, 1]).all() and np.isnan(dk).all() and np.isnan(dv).all()
    ndq, _, _ = naive_numpy_backward(q, k, v, do)
    assert np.isnan(ndq[0, 0, 2]).all() and np.isfinite(ndq[0, 1]).all()


def test_bad_arguments():
    q, k, v, do = _inputs(13, 1, 2, 1, 4, 3, 2, 2, np.float16)
    pol = PrecisionPolicy.flash("fp16")
    o, lse = online_attention(q, k, v, policy=pol)
    bwd = online_attention_backward
    with pytest.raises(ValueError, match="dtype"):
        bwd(q.astype(np.float32), k, v, o, lse, do, policy=pol)
    with pytest.raises(ValueError, match="do must be"):
        bwd(q, k, v, o, lse, do.astype(np.float32), policy=pol)
    with pytest.raises(ValueError, match=r"o \(1, 2, 3, 2\) and do"):
        bwd(q, k, v, o[:, :, :3], lse, do, policy=pol)
    with pytest.raises(ValueError, match=r"lse must be .* float32"):
        bwd(q, k, v, o, lse.astype(np.float64), do, policy=pol)
    with pytest.raises(ValueError, match="lse must be"):
        bwd(q, k, v, o, lse[:, :1], do, policy=pol)
    with pytest.raises(ValueError, match="block"):
        bwd(q, k, v, o, lse, do, policy=pol, block_q=0)
    with pytest.raises(ValueError, match="Hq a multiple"):
        bwd(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), o, lse, do, policy=pol)
    with pytest.raises(ValueError, match="mask of shape"):
        bwd(q, k, v, o, lse, do, policy=pol, mask=np.ones((4, 4), dtype=bool))
    with pytest.raises(ValueError, match="do must be"):
        naive_numpy_backward(q, k, v, do[..., :1])
    with pytest.raises(ValueError, match="precision"):
        naive_numpy_backward(q, k, v, do, precision="fp32")
    with pytest.raises(ValueError, match="dtypes"):
        naive_numpy_backward(q, k.astype(np.float32), v, do)
