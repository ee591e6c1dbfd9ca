"""Soft-capping and sinks in the oracle: O, LSE, dQ, dK, dV and dσ against an independent
mpmath computation (the forward from its definition at 300 bits, the gradients by central
differences of that forward), on tiny cases that reach past the cap and put the sink far above
and below the row's scores."""

import threading

import mpmath
import numpy as np
import pytest

from flashcheck.harness.core.formats import FP16, FP32, round_mpf
from flashcheck.harness.oracle.evaluate import oracle

DTYPES = {"fp16": (np.float16, FP16), "fp32": (np.float32, FP32)}


def _reference(q, k, v, *, scale, cap, sinks, causal):
    """O ``(B, H, Nq, dv)`` and LSE ``(B, H, Nq)`` as mpmath numbers, from the definition."""
    b_n, h_n, nq, d = q.shape
    nk, dv = k.shape[2], v.shape[3]
    off = nk - nq
    o = np.empty((b_n, h_n, nq, dv), dtype=object)
    lse = np.empty((b_n, h_n, nq), dtype=object)
    for b in range(b_n):
        for h in range(h_n):
            for i in range(nq):
                keys = [j for j in range(nk) if not causal or j <= i + off]
                ys = []
                for j in keys:
                    s = scale * mpmath.fsum(q[b, h, i, t] * k[b, h, j, t] for t in range(d))
                    ys.append(s if cap is None else cap * mpmath.tanh(s / cap))
                terms = [mpmath.exp(y) for y in ys]
                sink = mpmath.exp(sinks[h]) if sinks is not None else 0
                total = mpmath.fsum(terms) + sink
                lse[b, h, i] = mpmath.log(total) if total else mpmath.mpf("-inf")
                for c in range(dv):
                    num = mpmath.fsum(t * v[b, h, j, c] for t, j in zip(terms, keys, strict=True))
                    o[b, h, i, c] = num / total if total else mpmath.mpf(0)
    return o, lse


def _mp(x):
    return np.vectorize(mpmath.mpf, otypes=[object])(np.asarray(x, dtype=np.float64))


def _case(dtype, seed, *, cap, sink_shift):
    rng = np.random.default_rng(seed)
    np_t, _ = DTYPES[dtype]
    # Scores reach several times the cap: q scaled as FlashAttention's tests do, and more.
    q = (rng.standard_normal((1, 2, 3, 4)) * 3).astype(np_t)
    k = (rng.standard_normal((1, 2, 4, 4)) * 2).astype(np_t)
    v = rng.standard_normal((1, 2, 4, 3)).astype(np_t)
    sinks = None
    if sink_shift is not None:
        sinks = (np.array([1.0, -1.0]) * sink_shift + rng.standard_normal(2)).astype(np.float32)
    return q, k, v, cap, sinks


CASES = [
    ("fp16", 0, 2.5, None),  # scores far beyond a small cap: flattened rows
    ("fp32", 1, 30.0, None),  # a cap that the scores do not reach
    ("fp16", 2, None, 0.0),  # sinks among the scores
    ("fp32", 3, None, 12.0),  # a sink far above one head's scores and far below the other's
    ("fp32", 4, 1.5, 4.0),  # both options at once
]


@pytest.mark.parametrize("dtype,seed,cap,sink_shift", CASES)
@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_forward_matches_the_definition(dtype, seed, cap, sink_shift, mode):
    q, k, v, cap, sinks = _case(dtype, seed, cap=cap, sink_shift=sink_shift)
    _, fmt = DTYPES[dtype]
    res = oracle(q, k, v, causal=True, softcap=cap, sinks=sinks, mode=mode)
    with mpmath.workprec(300):
        scale = 1 / mpmath.sqrt(4)
        o, lse = _reference(_mp(q), _mp(k), _mp(v), scale=scale, cap=cap, sinks=sinks, causal=True)
        for ref, got in ((o, res.o), (lse, res.lse)):
            assert got.certified.all()
            for idx in np.ndindex(ref.shape):
                exact = ref[idx]
                assert abs(exact - got.hi[idx] - got.lo[idx]) <= got.err[idx] * (1 + 1e-9)
                assert got.rounded[idx] == round_mpf(exact, fmt)


def test_masked_row_with_a_sink_gives_zero_and_the_sink():
    q = np.ones((1, 2, 2, 2), np.float32)
    k = np.ones((1, 2, 3, 2), np.float32)
    v = np.ones((1, 2, 3, 2), np.float32)
    mask = np.zeros((1, 2, 2, 3), bool)
    mask[..., 1, :] = True  # row 0 keeps nothing, row 1 everything
    sinks = np.array([3.5, -700.25], np.float32)
    res = oracle(q, k, v, mask=mask, sinks=sinks, softcap=5.0)
    assert (res.o.hi[:, :, 0] == 0).all() and (res.o.rounded[:, :, 0] == 0).all()
    np.testing.assert_array_equal(res.lse.hi[0, :, 0], sinks.astype(np.float64))
    assert res.lse.certified.all() and res.o.certified.all()
    # Row 1: all values are 1, so O = 1 − P_σ; with σ = −700 the sink is invisible.
    assert res.o.rounded[0, 1, 1, 0] == 1.0
    assert res.o.hi[0, 0, 1, 0] < 1.0


def _loss(q, k, v, do, *, scale, cap, sinks, causal):
    o, _ = _reference(q, k, v, scale=scale, cap=cap, sinks=sinks, causal=causal)
    return mpmath.fsum(o[idx] * do[idx] for idx in np.ndindex(o.shape))


@pytest.mark.parametrize("dtype,seed,cap,sink_shift", [CASES[0], CASES[3], CASES[4]])
def test_gradients_match_central_differences(dtype, seed, cap, sink_shift):
    q, k, v, cap, sinks = _case(dtype, seed, cap=cap, sink_shift=sink_shift)
    q, k, v = q[:, :, :2, :2], k[:, :, :3, :2], v[:, :, :3, :2]  # keep the mp work small
    rng = np.random.default_rng(seed + 10)
    np_t, fmt = DTYPES[dtype]
    do = rng.standard_normal((1, 2, 2, 2)).astype(np_t)
    res = oracle(q, k, v, causal=True, softcap=cap, sinks=sinks, do=do)
    with mpmath.workprec(260):
        scale = 1 / mpmath.sqrt(2)
        arrs = {"q": _mp(q), "k": _mp(k), "v": _mp(v)}
        dom = _mp(do)
        snk = None if sinks is None else [mpmath.mpf(float(x)) for x in sinks]
        step = mpmath.mpf(2) ** -100

        def loss(**over):
            a = {**arrs, **{n: x for n, x in over.items() if n != "sinks"}}
            opts = {"scale": scale, "cap": cap, "causal": True, "sinks": over.get("sinks", snk)}
            return _loss(a["q"], a["k"], a["v"], dom, **opts)

        for name in ("q", "k", "v"):
            got = res["d" + name]
            assert got.certified.all()
            for idx in np.ndindex(arrs[name].shape):
                up, dn = arrs[name].copy(), arrs[name].copy()
                up[idx] += step
                dn[idx] -= step
                fd = (loss(**{name: up}) - loss(**{name: dn})) / (2 * step)
                tol = got.err[idx] + 2.0**-150 * (1 + abs(fd))  # the difference's own error
                assert abs(fd - got.hi[idx] - got.lo[idx]) <= tol, (name, idx)
                assert got.rounded[idx] == round_mpf(fd, fmt), (name, idx)
        if sinks is None:
            assert res.dsinks is None
            return
        got = res.dsinks
        assert got.shape == (2,) and got.certified.all()
        for h in range(2):
            up, dn = list(snk), list(snk)
            up[h] += step
            dn[h] -= step
            fd = (loss(sinks=up) - loss(sinks=dn)) / (2 * step)
            assert abs(fd - got.hi[h] - got.lo[h]) <= got.err[h] + 2.0**-150 * (1 + abs(fd))
            assert got.rounded[h] == round_mpf(fd, fmt)
            assert fd != 0


def test_defaults_leave_the_oracle_unchanged():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((1, 1, 3, 4)).astype(np.float16) for _ in range(3))
    a = oracle(q, k, v)
    b = oracle(q, k, v, softcap=0.0, sinks=None)
    for f in ("hi", "lo", "err", "floor", "rounded"):
        np.testing.assert_array_equal(getattr(a.o, f), getattr(b.o, f))
    assert a.stats["strict_evaluations"] == b.stats["strict_evaluations"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"softcap": -1.0}, "softcap must be a finite float > 0"),
        ({"softcap": float("inf")}, "softcap must be a finite float > 0"),
        ({"sinks": np.zeros(3, np.float32)}, r"one logit per query head, shape \(2,\)"),
        ({"sinks": np.array([0.1, 0.2])}, "finite float32 values"),
        ({"sinks": np.array([np.nan, 0], np.float32)}, "finite float32 values"),
    ],
)
def test_bad_options_say_how_to_fix_them(kw, match):
    x = np.ones((1, 2, 2, 2), np.float32)
    with pytest.raises(ValueError, match=match):
        oracle(x, x, x, **kw)


def test_row_samples_and_the_nan_rule_with_both_options():
    q, k, v, cap, sinks = _case("fp32", 4, cap=1.5, sink_shift=4.0)
    rng = np.random.default_rng(9)
    do = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    full = oracle(q, k, v, softcap=cap, sinks=sinks, do=do)
    part = oracle(q, k, v, softcap=cap, sinks=sinks, do=do, rows=[2, 0], keys=[3])
    for name, sel in (("o", (slice(None), slice(None), [2, 0])), ("dk", (..., [3], slice(None)))):
        np.testing.assert_array_equal(part[name].hi, full[name].hi[sel])
    np.testing.assert_array_equal(part.dsinks.hi, full.dsinks.hi)  # dσ needs every row
    q = q.copy()
    q[0, 1, 1, 0] = np.nan  # row 1 of head 1
    res = oracle(q, k, v, softcap=cap, sinks=sinks, do=do)
    assert np.isnan(res.o.hi[0, 1, 1]).all() and np.isnan(res.lse.hi[0, 1, 1])
    assert np.isfinite(res.o.hi[0, 0]).all() and np.isfinite(res.o.hi[0, 1, [0, 2]]).all()
    assert np.isnan(res.dsinks.hi[1]) and np.isfinite(res.dsinks.hi[0])
    assert np.isnan(res.dq.hi[0, 1, 1]).all() and np.isfinite(res.dq.hi[0, 0]).all()


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_fast_and_strict_agree_within_their_bounds(dtype):
    from test_bounds_options import FAMILIES, _case

    for family in sorted(FAMILIES):
        q, k, v, opts = _case(family, dtype, seed=11)
        f = oracle(q, k, v, **opts)
        s = oracle(q, k, v, mode="strict", **opts)
        for name in ("o", "lse"):
            a, b = f[name], s[name]
            assert a.certified.all() and b.certified.all(), (family, name)
            np.testing.assert_array_equal(a.rounded, b.rounded)
            fin = np.isfinite(b.hi)
            np.testing.assert_array_equal(a.hi[~fin], b.hi[~fin])
            gap = np.abs((a.hi[fin] - b.hi[fin]) + (a.lo[fin] - b.lo[fin]))
            assert np.all(gap <= (a.err + b.err)[fin]), (family, name)
            scale = a.floor if name == "o" else np.maximum(a.floor, np.abs(a.hi))
            assert np.all(a.err[fin] <= np.ldexp(scale[fin], -100)), (family, name)
        assert f.stats["fallback_elements"] == 0, family


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_fast_and_strict_gradients_agree_within_their_bounds(dtype):
    from test_bounds_options import FAMILIES, _case

    for family in sorted(FAMILIES):
        q, k, v, opts = _case(family, dtype, seed=12)
        do = np.random.default_rng(3).standard_normal((*q.shape[:3], v.shape[3]))
        do = do.astype(np.float32).astype(q.dtype)
        f = oracle(q, k, v, do=do, **opts)
        s = oracle(q, k, v, do=do, mode="strict", **opts)
        names = ("dq", "dk", "dv") + (("dsinks",) if opts["sinks"] is not None else ())
        for name in names:
            a, b = f[name], s[name]
            assert a.certified.all() and b.certified.all(), (family, name)
            np.testing.assert_array_equal(a.rounded, b.rounded)
            np.testing.assert_array_equal(a.floor == 0, b.floor == 0)
            gap = np.abs((a.hi - b.hi) + (a.lo - b.lo))
            assert np.all(gap <= a.err + b.err), (family, name)
            assert np.all(a.err <= np.maximum(np.ldexp(a.floor, -100), 1e-300)), (family, name)


@pytest.mark.parametrize("nq,nk", [(0, 3), (3, 0), (2, 4)])
@pytest.mark.parametrize("mode", ["fast", "strict"])
def test_empty_shapes_and_rows_without_keys_have_the_sink_as_lse(nq, nk, mode):
    q, do = np.ones((1, 2, nq, 4), np.float32), np.ones((1, 2, nq, 3), np.float32)
    k, v = np.ones((1, 1, nk, 4), np.float32), np.ones((1, 1, nk, 3), np.float32)
    sinks = np.array([1.0, 2.0], np.float32)
    mask = np.zeros((1, 2, nq, nk), bool)  # every row keeps nothing
    r = oracle(q, k, v, do=do, softcap=2.0, sinks=sinks, mask=mask, mode=mode)
    assert (r.o.hi == 0).all() and (r.dq.hi == 0).all() and (r.dk.hi == 0).all()
    np.testing.assert_array_equal(r.lse.hi, np.broadcast_to(sinks[None, :, None], (1, 2, nq)))
    np.testing.assert_array_equal(r.dsinks.hi, [0.0, 0.0])
    for name in ("o", "lse", "dq", "dk", "dv", "dsinks"):
        assert r[name].certified.all(), name


@pytest.mark.parametrize("cap", [6.8e27, 1.25e28])
def test_caps_near_the_float64_range_leave_the_fast_path_for_the_interval_path(cap):
    # fp32 logits near 1e30 with a cap of 1e28: the fast path's double-double arithmetic has
    # no room (it raised, or divided by an underflowed sum); the result must still be the
    # certified one the interval path gives.
    from flashcheck.harness.cases.families import Recipe, make_case

    case = make_case(Recipe("fp32", "huge_logits", 1, 1, 1, 8, 8, 16, 16, seed=0, magnitude=1e30))
    q, k, v = case.q, case.k, case.v
    do = np.random.default_rng(0).standard_normal((1, 1, 8, 16)).astype(np.float32)
    opts = {"softcap": cap, "sinks": np.zeros(1, np.float32), "do": do}
    fast, strict = oracle(q, k, v, **opts), oracle(q, k, v, mode="strict", **opts)
    for name in ("o", "lse", "dq", "dk", "dv", "dsinks"):
        assert np.all(fast[name].certified)
        assert np.array_equal(fast[name].rounded, strict[name].rounded, equal_nan=True)


def test_the_gradients_reuse_the_forwards_logits_and_give_the_same_bits(monkeypatch):
    # The per-element 200-bit logits are the options oracle's largest cost; the gradient pass
    # asks for the ones its forward formed. Kept by content: each distinct input is formed
    # once, a repeat gives the same bits, and what is kept cannot be written to.
    from flashcheck.harness.oracle import options_fast

    rng = np.random.default_rng(5)
    q, k, v, do = (rng.standard_normal((1, 2, n, 8)).astype(np.float32) for n in (6, 9, 9, 6))
    formed = []
    real = options_fast._form_shifted_logits

    def counted(*args):
        formed.append(args[4:])
        return real(*args)

    monkeypatch.setattr(options_fast, "_MEMO", options_fast.OrderedDict())
    monkeypatch.setattr(options_fast, "_form_shifted_logits", counted)
    first = oracle(q, k, v, do=do, softcap=1.5, sinks=np.array([0.5, -2.0]))
    assert len(formed) == 2  # one per head: the forward's; the gradients' were hits
    again = oracle(q, k, v, do=do, softcap=1.5, sinks=np.array([0.5, -2.0]))
    assert len(formed) == 2
    monkeypatch.setattr(options_fast, "_MEMO", options_fast.OrderedDict())
    fresh = oracle(q, k, v, do=do, softcap=1.5, sinks=np.array([0.5, -2.0]))
    for name in ("o", "lse", "dq", "dk", "dv", "dsinks"):
        for f in ("hi", "lo", "err", "rounded"):
            for other in (again, fresh):
                np.testing.assert_array_equal(getattr(first[name], f), getattr(other[name], f))
    oracle(q, k, v, do=do, softcap=2.5)  # another cap: formed anew
    assert len(formed) == 6 and formed[-1] == (2.5, None)
    kept = next(iter(options_fast._MEMO.values()))
    with pytest.raises(ValueError, match="read-only"):
        kept[0][0, 0] = 1.0
    monkeypatch.setattr(options_fast, "_MEMO_BYTES", 1)  # the newest is always kept
    oracle(q, k, v, softcap=3.5)
    assert len(options_fast._MEMO) == 1 and len(formed) == 8


def test_the_logits_memo_takes_one_thread_at_a_time(monkeypatch):
    # The campaign computes references in several threads. Here a second thread inserts its
    # logits exactly while the first scans the memo's sizes to evict (the first read of a kept
    # array's size starts it): without the lock that scan raised "OrderedDict mutated during
    # iteration" (seen in CI); with it the second waits its turn and both results are kept.
    from types import SimpleNamespace

    from flashcheck.harness.oracle import options_fast

    started, errors = [], []

    class Kept:
        flags = None

        def __init__(self):
            self.flags = SimpleNamespace(writeable=True)

        @property
        def nbytes(self):
            if not started:
                started.append(threading.Thread(target=call, args=(2.0,)))
                started[0].start()
                started[0].join(timeout=0.5)  # holds the lock: the second thread waits
            return 8

    def call(cap):
        try:
            options_fast._shifted_logits(q, q, keep, scale, cap, None)
        except RuntimeError as exc:
            errors.append(exc)

    q, keep = np.ones((2, 4)), np.ones((2, 2), dtype=bool)
    scale = options_fast.Scale(mpmath.mpf(0.5), 0.5, 0.0, 0.0, 0.5, 4)
    # One kept result already, so that the next insertion scans the sizes.
    monkeypatch.setattr(options_fast, "_MEMO", options_fast.OrderedDict(x=(Kept(),)))
    monkeypatch.setattr(options_fast, "_form_shifted_logits", lambda *a: (Kept(), Kept()))
    call(1.0)
    assert started, "the first call did not scan the memo"
    started[0].join(timeout=5)
    assert not errors and not started[0].is_alive()
    assert len(options_fast._MEMO) == 3
