"""Structural properties: independence of batch and heads, out-of-bounds safety, determinism,
invariance under key permutation, and the NaN rule for non-finite inputs."""

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.assertions import fail
from harness.bounds import error_bounds
from harness.cases import Case
from harness.oracle import oracle
from harness.semantics import make_problem, nan_rows_and_cols
from properties.support import (
    adapter_or_skip,
    case_strategy,
    fewer,
    kernel_dtype_params,
    padded_inputs,
    same_bits,
)

PARAMS = kernel_dtype_params()
FINITE = tuple(
    f
    for f in __import__("properties.strategies", fromlist=["FAMILIES"]).FAMILIES
    if f != "nonfinite"
)


def _draw(data, adapter, dtype, **kw):
    case = data.draw(case_strategy(adapter, dtype, **kw), label="case")
    assume(adapter.supports(case) is None)
    return case


@pytest.mark.parametrize(("kernel", "dtype"), PARAMS)
@fewer(10)
@given(data=st.data())
def test_batch_and_head_independence(kernel, dtype, data):
    adapter, dev = adapter_or_skip(kernel, dtype)
    case = _draw(data, adapter, dtype, families=FINITE)
    b_n, hq, *_ = case.shape
    assume(b_n * hq > 1)
    full = adapter.run(case, dev)
    for b in range(b_n):
        for h in range(hq):
            part = adapter.run(case.slice(b, h), dev)
            if adapter.batch_invariant:
                ok = same_bits(full.o[b, h], part.o[0, 0])
                why = "not bitwise equal to the slice computed alone"
            else:
                sl = case.slice(b, h)
                bd = error_bounds(sl.q, sl.k, sl.v, arithmetic=adapter.arithmetic,
                                  key_block=adapter.key_block, **sl.options())  # fmt: skip
                diff = np.abs(full.o[b, h] - part.o[0, 0])
                ok = bool(np.all(diff <= 2 * bd.o_det[0, 0]))
                why = "differs from the slice computed alone by more than twice the bound"
            if not ok:
                fail(case, kernel, dev, "batch-head-independence", f"(b={b}, h={h}) {why}")


@pytest.mark.parametrize(("kernel", "dtype"), PARAMS)
@fewer(10)
@given(data=st.data())
def test_padded_buffers_give_identical_bits(kernel, dtype, data):
    # Inputs placed inside NaN-filled buffers (non-contiguous views): any read outside the
    # logical tensor would change the result.
    adapter, dev = adapter_or_skip(kernel, dtype)
    case = _draw(data, adapter, dtype, families=FINITE)
    plain = adapter.run(case, dev)
    padded = adapter.run(case, dev, inputs=padded_inputs(case, adapter, dev))
    if not (
        same_bits(plain.o, padded.o) and (plain.lse is None or same_bits(plain.lse, padded.lse))
    ):
        fail(case, kernel, dev, "padded-buffers", "outputs differ when inputs sit in NaN padding")


@pytest.mark.parametrize(("kernel", "dtype"), PARAMS)
@fewer(10)
@given(data=st.data())
def test_repeated_runs_are_bitwise_identical(kernel, dtype, data):
    adapter, dev = adapter_or_skip(kernel, dtype)
    if not adapter.deterministic:
        pytest.skip(f"{kernel} does not declare deterministic results")
    case = _draw(data, adapter, dtype)
    a, b = adapter.run(case, dev), adapter.run(case, dev)
    if not (same_bits(a.o, b.o) and (a.lse is None or same_bits(a.lse, b.lse))):
        fail(case, kernel, dev, "determinism", "two runs on the same inputs differ")


@pytest.mark.parametrize(("kernel", "dtype"), PARAMS)
@fewer(10)
@given(data=st.data())
def test_key_permutation_changes_output_only_within_bounds(kernel, dtype, data):
    adapter, dev = adapter_or_skip(kernel, dtype)
    case = _draw(data, adapter, dtype, families=FINITE, masks=())
    nk = case.shape[4]
    perm = np.asarray(data.draw(st.permutations(range(nk)), label="perm"))
    moved = Case(case.q, case.k[:, :, perm], case.v[:, :, perm], scale=case.scale,
                 family=case.family, seed=case.seed, params=case.params)  # fmt: skip
    a, b = adapter.run(case, dev), adapter.run(moved, dev)
    ba = error_bounds(case.q, case.k, case.v, arithmetic=adapter.arithmetic,
                      key_block=adapter.key_block, scale=case.scale)  # fmt: skip
    bb = error_bounds(moved.q, moved.k, moved.v, arithmetic=adapter.arithmetic,
                      key_block=adapter.key_block, scale=case.scale)  # fmt: skip
    diff = np.abs(a.o - b.o)
    if not np.all(diff <= ba.o_det + bb.o_det):
        fail(
            case,
            kernel,
            dev,
            "key-permutation",
            f"permuting keys moved O by {diff.max():.3g}, more than the two bounds allow",
        )


@pytest.mark.parametrize(("kernel", "dtype"), PARAMS)
@fewer(15)
@given(data=st.data())
def test_nan_inputs_propagate_and_stay_contained(kernel, dtype, data):
    # SPEC 3.1: an output whose exact computation involves a NaN input is NaN; outputs that
    # involve only finite inputs stay finite (no leak across rows, heads or batches).
    adapter, dev = adapter_or_skip(kernel, dtype)
    case = _draw(data, adapter, dtype, families=("nonfinite",))
    out = adapter.run(case, dev)
    ref = oracle(case.q, case.k, case.v, **case.options(), rows=None)
    fin = np.isfinite(ref.o_hi)
    if not np.all(np.isfinite(out.o[fin])):
        fail(case, kernel, dev, "nan-rule", "NaN/Inf leaked into outputs of finite inputs")
    # Outputs involving a NaN (not only ±inf, whose IEEE behaviour varies) must be NaN.
    p = make_problem(case.q, case.k, case.v, **case.options())
    _, hq, *_ = p.shape
    for b in range(p.shape[0]):
        for h in range(hq):
            kvh = p.kv_head(h)
            rows = np.arange(p.shape[3])
            keep = p.keep(b, h, rows)
            nan_only = lambda x: np.where(np.isinf(x), 0.0, x)  # noqa: E731
            inf_only = lambda x: np.where(np.isnan(x), 0.0, x)  # noqa: E731
            _, elem = nan_rows_and_cols(
                nan_only(p.q[b, h]), nan_only(p.k[b, kvh]), nan_only(p.v[b, kvh]), keep
            )
            # Where an ±inf input is involved too, IEEE gives no single answer (an inf score can
            # drop a key: exp(−inf) = 0); only outputs free of inf must show the NaN.
            _, elem_inf = nan_rows_and_cols(
                inf_only(p.q[b, h]), inf_only(p.k[b, kvh]), inf_only(p.v[b, kvh]), keep
            )
            elem = elem & ~elem_inf
            if not np.all(np.isnan(out.o[b, h][elem])):
                fail(case, kernel, dev, "nan-rule", f"a NaN input did not reach O (b={b}, h={h})")
