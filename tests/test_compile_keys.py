"""Compile keys: probing times a kernel's first and repeated calls and finds the dimensions
whose new values cost a compile. The planted kernels advance a fake clock by a "compile" on
every new key of their own (and a little per call), so the tests take no real time."""

from dataclasses import replace

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.adapters.compilekeys import CallTimes, compile_cost, infer_keys
from flashcheck.harness.adapters.probe import probe

COMPILE, CALL = 10.0, 0.01


class FakeJit:
    """A numpy kernel that "compiles" (advances the clock by COMPILE) on every new value of
    ``key(q, k, v, causal)``, and counts its compiles."""

    def __init__(self, key, compile_s=COMPILE):
        self.key, self.compile_s = key, compile_s
        self.now, self.seen = 0.0, set()

    def clock(self):
        return self.now

    def __call__(self, q, k, v, *, causal=False, window=None, mask=None, scale=None):
        key = self.key(q, k, v, causal)
        if key not in self.seen:
            self.seen.add(key)
            self.now += self.compile_s
        self.now += CALL
        return np.zeros((*q.shape[:3], v.shape[3]), dtype=q.dtype)


def _probe(jit, **declared):
    # A distinct name per test: probe() caches its answers by kernel.
    kern = flashcheck.kernel(jit, api="numpy", devices=("cpu",), name=f"jit-{id(jit)}", **declared)
    return probe(kern, clock=jit.clock)


def _triton_like(q, k, v, causal):
    return (q.shape[2], k.shape[2], q.shape[3], causal, q.dtype)


def test_a_kernel_keyed_on_lengths_head_dim_causal_and_dtype_is_found_in_seven_compiles():
    jit = FakeJit(_triton_like)
    kern = _probe(jit)
    assert kern.compile_keys == ("dtype", "nq", "nk", "d", "causal")
    assert kern.compile_seconds == pytest.approx(COMPILE)
    # the base shape, two dtypes, ragged Nq != Nk both ways, head dim 128, causal
    assert len(jit.seen) == 7
    assert "compile keys dtype, nq, nk, d, causal (about 10 s each)" in kern.contract_lines()
    # the contract is still probed in full
    assert kern.dtypes == ("fp16", "bf16", "fp32") and kern.seq_multiple == 1
    assert kern.unequal_lengths and kern.distinct_dv and kern.gqa and kern.batched
    assert kern.masks == frozenset({"causal", "window", "mask"})


@pytest.mark.parametrize(
    ("key", "want"),
    [
        (lambda q, k, v, causal: q.shape[3], ("d",)),
        (lambda q, k, v, causal: v.shape[3], ("dv",)),
        (lambda q, k, v, causal: (q.shape[2], k.shape[2]), ("nq", "nk")),
        (lambda q, k, v, causal: k.shape[2], ("nk",)),
        (lambda q, k, v, causal: causal, ("causal",)),
        (lambda q, k, v, causal: q.dtype, ("dtype",)),
    ],
    ids=["d", "dv", "lengths", "nk", "causal", "dtype"],
)
def test_each_key_dimension_is_told_apart(key, want):
    assert _probe(FakeJit(key)).compile_keys == want


def test_a_kernel_that_needs_equal_lengths_gets_both_lengths_as_keys():
    class Square(FakeJit):
        def __call__(self, q, k, v, *, causal=False, scale=None):
            if q.shape[2] != k.shape[2]:
                raise ValueError("Nq must equal Nk")
            return super().__call__(q, k, v, causal=causal)

    kern = _probe(Square(lambda q, k, v, causal: q.shape[2]))
    assert not kern.unequal_lengths
    assert kern.compile_keys == ("nq", "nk")


def test_a_kernel_without_compile_cost_has_no_keys_and_its_usual_contract():
    jit = FakeJit(_triton_like, compile_s=0.0)
    kern = _probe(jit)
    assert kern.compile_keys == () and kern.compile_seconds == 0.0
    assert not any("compile" in line for line in kern.contract_lines())
    # probed as before: every head dim of the families, both ragged lengths
    assert len(jit.seen) > 15


def test_a_warm_up_longer_than_the_compiles_does_not_hide_them():
    class WarmUp(FakeJit):
        def __call__(self, q, k, v, **opts):
            if not self.seen:
                self.now += 5 * COMPILE  # imports, a CUDA context: once per process
            return super().__call__(q, k, v, **opts)

    kern = _probe(WarmUp(_triton_like))
    assert kern.compile_keys == ("dtype", "nq", "nk", "d", "causal")
    assert kern.compile_seconds == pytest.approx(COMPILE)


def test_a_slow_first_call_alone_is_no_compile_key():
    """A warm-up on the very first call (a CUDA context, lazy imports), not repeated for new
    shapes, finds the kernel compiling but no dimension a key."""

    class WarmUp(FakeJit):
        def __call__(self, q, k, v, **opts):
            if not self.seen:
                self.now += COMPILE
            self.seen.add(1)
            self.now += CALL
            return np.zeros((*q.shape[:3], v.shape[3]), dtype=q.dtype)

    kern = _probe(WarmUp(None))
    assert kern.compile_keys == () and kern.compile_seconds == 0.0
    # and it is probed as if it had declared no compile keys: the same contract
    declared = _probe(FakeJit(lambda *a: 0, compile_s=0.0), compile_keys=())
    assert replace(kern, fn=declared.fn, name=declared.name) == declared


def test_declared_compile_keys_are_trusted_and_not_timed():
    jit = FakeJit(_triton_like)
    kern = flashcheck.kernel(jit, api="numpy", devices=("cpu",), compile_keys=("nq", "d"))
    assert "compile_keys" not in kern.pending and kern.compile_keys == ("nq", "d")
    assert probe(kern, clock=jit.clock).compile_keys == ("nq", "d")
    with pytest.raises(ValueError, match="unknown compile key"):
        flashcheck.kernel(jit, compile_keys=("batch",))


def test_call_times_and_inference():
    t = CallTimes(first=10.5, repeat=0.5)
    assert t.compiles and t.overhead == 10.0
    assert not CallTimes(first=0.4, repeat=0.01).compiles  # under COMPILE_MIN_S
    assert not CallTimes(first=3.0, repeat=1.0).compiles  # not 4x a repeat
    base = ("fp16", 16, 16, 64, 64, False)
    calls = [
        (base, 10.5),
        (base, 0.5),
        (("bf16", 16, 16, 64, 64, False), 0.6),  # fast: dtype is no key
        (("fp16", 17, 17, 64, 64, False), 10.0),  # both lengths at once, slow
        (("fp16", 16, 16, 64, 64, True), 9.0),  # causal alone, slow
    ]
    assert infer_keys(calls, t) == ("nq", "nk", "causal")
    assert compile_cost(calls, t) == 9.5  # the slowest later first call, less a repeat
    # a slow first call and no later one: no keys
    assert infer_keys([*calls[:3], (("fp16", 16, 16, 64, 64, True), 0.6)], t) == ()
    assert infer_keys(calls, CallTimes(1.0, 1.0)) == ()
    with pytest.raises(ValueError, match="one value per"):
        infer_keys([(("fp16", 16), 1.0)], t)


def test_compile_costs_that_differ_fourfold_between_keys_still_show_every_key():
    # The call times an autotuned Triton kernel showed on an H100 (16 configurations keyed on
    # Nq, Nk, d, dv; benchmarks/probe_autotuned_times.py): fp32 compiled 4x longer than a
    # new length, which half the slowest first call would have taken for a repeat.
    base = ("fp16", 16, 16, 64, 64, False)
    calls = [
        (base, 14.384),
        (("bf16", 16, 16, 64, 64, False), 11.821),
        (("fp32", 16, 16, 64, 64, False), 46.308),
        (("fp16", 16, 17, 64, 64, False), 12.870),
        (("fp16", 17, 16, 64, 64, False), 13.492),
        (("fp16", 16, 16, 64, 128, False), 15.544),
        (("fp16", 16, 16, 128, 128, False), 16.081),
    ]
    times = CallTimes(14.384, 0.0004)
    assert infer_keys(calls, times) == ("dtype", "nq", "nk", "d", "dv")
