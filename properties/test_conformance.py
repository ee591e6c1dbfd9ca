"""The Triton kernel computes the arithmetic it declares (class "flash", SPEC 3.5).

Within one key block the kernel and the exactly emulated recurrence (kernels/recurrence.py with
the flash policy, output kept in fp32) perform the same roundings of P and of the output; they
differ only by fp32-level errors. So per element

    |O_kernel − O_emulated| ≤ 2·B32 + ulp_F(O_kernel) + Σ_{j: p̃_j near a rounding boundary of F}
                              ulp_F(p̃_j)·|v_jc| / l

where B32 is the fp32-only part of the flash bound (harness.bounds, ``fp32_only=True``), the
ulp covers the final store, and the sum covers keys whose P could round the other way. A kernel
that skips the rounding of P (or rounds it twice, or into another format) fails this on inputs
whose output cancels, which the accuracy bounds alone cannot see: it is *more* accurate.
"""

import math

import numpy as np
import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

from harness.assertions import fail
from harness.bounds import RHO_EXP, U32, error_bounds, gamma
from harness.formats import FORMATS, round_to_format, ulp
from kernels.recurrence import PrecisionPolicy, online_attention
from properties.strategies import FAMILIES
from properties.support import adapter_or_skip, case_strategy, fewer

FINITE = tuple(f for f in FAMILIES if f != "nonfinite")
ONE_BLOCK = 16  # every configuration of the kernel has BLOCK_N >= 16


def _near_boundary_term(case, fmt):
    """Σ over keys whose p̃ may round differently in two fp32-accurate computations."""
    _, hq, hk, _, _, d, _ = case.shape
    q, k, v = (getattr(case, n).astype(np.float64) for n in ("q", "k", "v"))
    tau = case.scale if case.scale is not None else 1 / math.sqrt(d)
    rep = hq // hk
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = tau * q @ np.swapaxes(k, -1, -2)
    a = abs(tau) * np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    m = s.max(axis=-1, keepdims=True)
    pt = np.exp(s - m)
    # fp32-level relative error of p̃ (dot, scale, shift, exp2), doubled for two computations
    eps = 2 * (gamma(d + 1, 2 * U32) * a + U32 * (np.abs(s) + 2 * np.abs(s - m)) + RHO_EXP)
    lo, hi = round_to_format(pt * np.exp(-eps), fmt), round_to_format(pt * np.exp(eps), fmt)
    amb = lo != hi
    w = np.where(amb, ulp(pt, fmt) * 1.01, 0.0) / pt.sum(axis=-1, keepdims=True)
    return w @ np.abs(v)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@fewer(20)
@given(data=st.data())
def test_triton_matches_its_declared_arithmetic(dtype, data):
    adapter, dev = adapter_or_skip("triton", dtype)
    case = data.draw(case_strategy(adapter, dtype, families=FINITE, max_len=ONE_BLOCK),
                     label="case")  # fmt: skip
    assume(adapter.supports(case) is None)
    out = adapter.run(case, dev)
    policy = PrecisionPolicy(input=dtype, score="fp32", accum="fp32", p=dtype, output="fp32")
    emu, _ = online_attention(case.q, case.k, case.v, policy=policy, block_k=ONE_BLOCK,
                              causal=case.causal, window=case.window, scale=case.scale)  # fmt: skip
    emu = emu.astype(np.float64)
    fmt = FORMATS[dtype]
    b32 = error_bounds(case.q, case.k, case.v, arithmetic="flash", key_block=ONE_BLOCK,
                       fp32_only=True, **case.options()).o_det  # fmt: skip
    tol = 2 * b32 + ulp(out.o, fmt) + _near_boundary_term(case, fmt)
    diff = np.abs(out.o - emu)
    note(f"max diff/tol {np.max(diff / tol):.3g}")
    if np.any(diff > tol):
        i = np.unravel_index(np.argmax(diff / tol), diff.shape)
        fail(case, "triton", dev, "conformance",
             f"O{tuple(int(x) for x in i)} = {out.o[i]!r} but the emulated flash arithmetic gives "
             f"{emu[i]!r} (tolerance {tol[i]:.3g})")  # fmt: skip
