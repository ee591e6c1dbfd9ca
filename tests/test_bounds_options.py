"""The forward bounds with soft-capping and sinks dominate the error of the exactly emulated
kernels (the flash recurrence, FA1 and FA2, and the naive baseline) on adversarial cases: scores
around and far beyond the cap, caps small enough to flatten rows, sinks far above and below the
row's scores, rows that keep no key but have a sink; and they are not vacuous (a kernel that
ignores an option is far outside them)."""

import numpy as np
import pytest

from flashcheck.harness.cases.case import DTYPES
from flashcheck.harness.judging.bounds import error_bounds
from flashcheck.harness.oracle.evaluate import oracle
from flashcheck.kernels.naive import naive_numpy
from flashcheck.kernels.recurrence import PrecisionPolicy, online_attention

# name: (score size, softcap, sink offset from the row's scores, causal with Nq > Nk)
FAMILIES = {
    "beyond_cap": (20.0, 5.0, None, False),
    "around_cap": (3.0, 3.0, None, False),
    "flattening_cap": (10.0, 0.25, None, False),
    "sink_above": (1.0, None, 25.0, False),
    "sink_below": (1.0, None, -30.0, False),
    "sink_among": (2.0, None, 0.0, False),
    "masked_rows_sink_cap": (8.0, 2.0, 1.0, True),
}


def _case(family, dtype, seed=0):
    size, cap, sink_off, masked = FAMILIES[family]
    rng = np.random.default_rng(seed)
    dt = DTYPES[dtype]
    d = 8
    # q·k/√d has standard deviation about `size`
    q = (rng.standard_normal((1, 2, 8, d)) * np.sqrt(size)).astype(np.float32).astype(dt)
    k = (rng.standard_normal((1, 2, 5 if masked else 12, d)) * np.sqrt(size)).astype(np.float32)
    k = k.astype(dt)
    v = rng.standard_normal((1, 2, k.shape[2], 4)).astype(np.float32).astype(dt)
    sinks = None
    if sink_off is not None:
        sinks = (np.array([0.3, -0.6]) * size + sink_off).astype(np.float32)
    return q, k, v, {"softcap": cap, "sinks": sinks, "causal": masked}


def _run(kind, q, k, v, dtype, block, opts):
    if kind == "naive":
        return naive_numpy(q, k, v, **opts)
    variant = "fa1" if kind == "flash-fa1" else "fa2"
    pol = PrecisionPolicy.flash(dtype)
    return online_attention(q, k, v, policy=pol, variant=variant, block_k=block, **opts)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_bounds_dominate_the_emulated_kernels(family, dtype):
    q, k, v, opts = _case(family, dtype)
    ref = oracle(q, k, v, **opts)
    live = np.isfinite(ref.lse.hi)
    for kind, block in (("flash", 1), ("flash", 4), ("flash-fa1", 4), ("naive", None)):
        o, lse = _run(kind, q, k, v, dtype, block, opts)
        b = error_bounds(q, k, v, arithmetic=kind, key_block=block, **opts)
        err = np.abs((o.astype(np.float64) - ref.o.hi) - ref.o.lo)
        assert np.all(err <= b.o.det), (kind, block, float(np.max(err / b.o.det)))
        lerr = np.abs(lse.astype(np.float64)[live] - ref.lse.hi[live])
        assert np.all(lerr <= b.lse.det[live]), (kind, block)
        assert np.all(b.o.prob <= b.o.det * (1 + 1e-12))
        unknown = error_bounds(q, k, v, arithmetic="unknown", **opts)
        assert np.all(err <= unknown.o.det)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_a_kernel_that_drops_an_option_is_far_outside_the_bounds(dtype):
    for family, drop in (("around_cap", "softcap"), ("sink_among", "sinks")):
        q, k, v, opts = _case(family, dtype, seed=5)
        ref = oracle(q, k, v, **opts)
        o, _ = _run("flash", q, k, v, dtype, 4, {**opts, drop: None})
        b = error_bounds(q, k, v, arithmetic="unknown", **opts)
        err = np.abs((o.astype(np.float64) - ref.o.hi) - ref.o.lo)
        assert np.max(err / b.o.det) > 10, family


def test_a_row_that_keeps_no_key_has_the_sink_as_lse_within_its_bound():
    q, k, v, opts = _case("masked_rows_sink_cap", "fp32")
    b = error_bounds(q, k, v, arithmetic="flash", key_block=4, **opts)
    o, lse = _run("flash", q, k, v, "fp32", 4, opts)
    empty = slice(0, 3)  # causal, Nq = 8 > Nk = 5: the first three rows keep no key
    assert (o[:, :, empty] == 0).all()
    sink = opts["sinks"].astype(np.float64)[None, :, None]
    assert np.all(np.abs(lse[:, :, empty] - sink) <= b.lse.det[:, :, empty])
    assert np.all(b.lse.det[:, :, empty] > 0)
