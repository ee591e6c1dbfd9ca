"""Conformance checks: a kernel against the exactly emulated arithmetic of its declared class,
within one block, each answering a
:class:`~flashcheck.harness.checks.structural.StructuralResult`.

- ``conformance``: within one key block (``Nk <= 16``) a flash kernel and the emulated
  recurrence share the roundings of P and of the output (docs/error-bounds.md §6);
- ``gradient-conformance``: within one block (``Nq, Nk <= 16``) a kernel of the flash backward
  class performs the roundings of FlashAttention-2's backward (docs/error-bounds.md §11): D from
  its own rounded O, P recomputed in fp32 from its LSE, P and dS rounded to the input format
  before their products, fp32 accumulation. Its gradients then match an independent emulation
  of that arithmetic up to fp32-level differences, one final ulp, and the P or dS elements
  whose fp32 value lies so close to a rounding boundary of the input format that the two may
  round apart.

Both catch a kernel that is *more* accurate than declared (P not rounded, dS kept in fp32, D
from an unrounded O), which no accuracy bound can see. Outside the class, or past one block,
they are NOT-APPLICABLE, with the reason.
"""

from __future__ import annotations

import math

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..checks.accuracy import kernel_bounds
from ..core.formats import FORMATS, round_to_format, ulp
from ..core.semantics import make_problem
from ..judging.bounds import RHO_EXP, U32, gamma
from ..judging.verdict import GRADIENT_LABELS
from .structural import ONE_BLOCK, StructuralResult

__all__ = ["NO_LSE", "conformance", "gradient_conformance"]

LOG2E = 1.4426950408889634
F32 = np.float32
# Why backward conformance cannot judge a kernel that returns O only: P is recomputed from LSE.
NO_LSE = "the kernel returns no LSE, which the flash backward recomputes P from"


def _near_boundary_term(case: Case, fmt) -> np.ndarray:
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
    eps = np.minimum(eps, 50.0)  # beyond e^50 every key is ambiguous anyway; keeps exp finite
    lo, hi = round_to_format(pt * np.exp(-eps), fmt), round_to_format(pt * np.exp(eps), fmt)
    w = np.where(lo != hi, ulp(pt, fmt) * 1.01, 0.0) / pt.sum(axis=-1, keepdims=True)
    return w @ np.abs(v)


def conformance(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Within one key block (``Nk ≤ 16``) a flash kernel and the emulated recurrence share
    the roundings of P and of the output, so ``|O − O_emulated| ≤ 2·B32 + ulp_F(O) +`` (keys
    whose P may round the other way); see docs/error-bounds.md §6."""
    from ...kernels.recurrence import PrecisionPolicy, online_attention

    if adapter.arithmetic != "flash":
        return StructuralResult.not_applicable(
            f"the flash class only; the kernel declares {adapter.arithmetic}"
        )
    if case.shape[4] > ONE_BLOCK or case.mask is not None:
        return StructuralResult.not_applicable(f"needs Nk <= {ONE_BLOCK} keys and no explicit mask")
    out = adapter.run(case, device)
    dtype = case.dtype
    policy = PrecisionPolicy(input=dtype, score="fp32", accum="fp32", p=dtype, output="fp32")
    emu, _ = online_attention(
        case.q,
        case.k,
        case.v,
        policy=policy,
        block_k=ONE_BLOCK,
        causal=case.causal,
        window=case.window,
        scale=case.scale,
    )
    emu = emu.astype(np.float64)
    fmt = FORMATS[dtype]
    b32 = kernel_bounds(adapter, case, fp32_only=True).o.det
    tol = 2 * b32 + ulp(out.o, fmt) + _near_boundary_term(case, fmt)
    diff = np.abs(out.o - emu)
    if np.any(diff > tol):
        i = np.unravel_index(np.argmax(diff / tol), diff.shape)
        return StructuralResult.failed(
            f"O{tuple(int(x) for x in i)} = {float(out.o[i])!r} but the emulated flash "
            f"arithmetic gives {float(emu[i])!r} (tolerance {float(tol[i]):.3g}): the kernel "
            f"does not round as it declares (S in fp32, P rounded to {case.dtype} before P·V, "
            "fp32 accumulation). If it keeps P in fp32 or accumulates otherwise, declare "
            "arithmetic='unknown' (judged against the loosest class) or the class it implements"
        )
    return StructuralResult.passed(
        f"matches the emulation (max diff/tol {float(np.max(diff / tol)):.3g})"
    )


def _straddles(x: np.ndarray, rel: np.ndarray, fmt) -> np.ndarray:
    """Where a value known to relative accuracy ``rel`` may round to two values of ``fmt``."""
    lo = round_to_format(x - np.abs(x) * rel, fmt)
    hi = round_to_format(x + np.abs(x) * rel, fmt)
    return lo != hi


def _emulate(case: Case, o: np.ndarray, lse: np.ndarray):
    """The flash backward's roundings, vectorised in float32 (an emulation independent of
    kernels/recurrence.py), and per-gradient tolerances for a kernel that shares them."""
    p_ = make_problem(case.q, case.k, case.v, **case.options())
    bsz, hq, hk, nq, nk, d, dv = p_.shape
    fmt = FORMATS[case.dtype]
    dt = case.q.dtype
    sc = 1.0 / math.sqrt(d) if case.scale is None else float(case.scale)
    c, sc32 = F32(sc * LOG2E), F32(sc)
    grp = hq // hk
    q, k, v = (x.astype(F32) for x in (case.q, case.k, case.v))
    do = case.grad_output().astype(F32)
    keep = np.stack(
        [np.stack([p_.keep(b, h, np.arange(nq)) for h in range(hq)]) for b in range(bsz)]
    )
    kk, vv = np.repeat(k, grp, axis=1), np.repeat(v, grp, axis=1)
    with np.errstate(all="ignore"):
        dsum = np.sum(do * o.astype(F32), axis=-1, dtype=F32)
        lse2 = (lse.astype(F32) * F32(LOG2E)).astype(F32)
        t = (np.matmul(q, np.swapaxes(kk, -1, -2)) * c).astype(F32)
        live = np.isfinite(lse2)[..., None] & keep
        x = np.where(live, t - np.where(np.isfinite(lse2), lse2, 0)[..., None], -np.inf)
        p = np.exp2(x.astype(np.float64)).astype(F32)
        pf = p.astype(dt).astype(F32)
        dp = np.matmul(do, np.swapaxes(vv, -1, -2))
        diff = (dp - dsum[..., None]).astype(F32)
        ds = (p * diff).astype(F32)
        dsf = ds.astype(dt).astype(F32)
        dq = (np.matmul(dsf, kk) * sc32).astype(F32)
        dk_h = np.matmul(np.swapaxes(dsf, -1, -2), q)
        dv_h = np.matmul(np.swapaxes(pf, -1, -2), do)
        dk = (dk_h.reshape(bsz, hk, grp, nk, d).sum(2, dtype=F32) * sc32).astype(F32)
        dvv = dv_h.reshape(bsz, hk, grp, nk, dv).sum(2, dtype=F32)
        # fp32-level uncertainty: P through t and lse2 (log2 units → relative via ln 2), exp2's
        # 2 ulp on each side, dP and D by their dot products; dS carries P's and dP − D's.
        a_t = np.abs(np.matmul(np.abs(q), np.swapaxes(np.abs(kk), -1, -2)) * c)
        rel_p = gamma(d + 2, 2 * U32) * a_t + 4 * U32 * (np.abs(t) + np.abs(lse2)[..., None])
        rel_p = rel_p * math.log(2) + 8 * U32
        mag_dp = np.matmul(np.abs(do), np.swapaxes(np.abs(vv), -1, -2))
        mag_d = np.sum(np.abs(do * o.astype(F32)), axis=-1)
        err_diff = gamma(dv + 2, 2 * U32) * (mag_dp + mag_d[..., None])
        err_ds = np.abs(p) * err_diff + rel_p * np.abs(ds) + U32 * np.abs(ds)
        # Each implementation is within err of the ideal fp32 value, so the two within 2·err:
        # where that interval straddles a rounding boundary of the input format, the rounded
        # values may differ by up to 2·err + one ulp; elsewhere they are equal.
        err_p = 2 * rel_p * np.abs(p)
        flip_p = np.where(
            live & _straddles(p.astype(np.float64), 2 * rel_p, fmt),
            err_p + ulp(np.abs(p) + err_p, fmt),
            0.0,
        )
        rel_ds = np.where(ds != 0, 2 * err_ds / np.maximum(np.abs(ds), 1e-300), np.inf)
        flip_ds = np.where(
            live & _straddles(ds.astype(np.float64), rel_ds, fmt),
            2 * err_ds + ulp(np.abs(ds) + 2 * err_ds, fmt),
            0.0,
        )
        # What two implementations of these roundings may differ by: a P or dS element that
        # rounds apart (elsewhere both round to the same value), and each product's own fp32
        # accumulation.
        e_s = flip_ds
        dq_tol = abs(sc) * (
            np.matmul(e_s, np.abs(kk)) + gamma(nk + 2, 2 * U32) * np.matmul(np.abs(dsf), np.abs(kk))
        )
        dk_t = np.matmul(np.swapaxes(e_s, -1, -2), np.abs(q)) + gamma(grp * nq + 2, 2 * U32) * (
            np.matmul(np.swapaxes(np.abs(dsf), -1, -2), np.abs(q))
        )
        dk_tol = abs(sc) * dk_t.reshape(bsz, hk, grp, nk, d).sum(2)
        dv_t = np.matmul(np.swapaxes(flip_p, -1, -2), np.abs(do)) + gamma(grp * nq + 2, 2 * U32) * (
            np.matmul(np.swapaxes(np.abs(pf), -1, -2), np.abs(do))
        )
        dv_tol = dv_t.reshape(bsz, hk, grp, nk, dv).sum(2)
    emu = {"dq": dq, "dk": dk, "dv": dvv}
    tol = {"dq": dq_tol, "dk": dk_tol, "dv": dv_tol}
    return emu, tol, fmt


def gradient_conformance(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The kernel's gradients against the emulated flash backward within one block (see the
    module docstring); needs the kernel's LSE (from its forward)."""
    *_, nq, nk, _, _ = case.shape
    if adapter.backward_arithmetic != "flash":
        return StructuralResult.not_applicable(
            f"the flash backward class only; the kernel declares {adapter.backward_arithmetic}"
        )
    if max(nq, nk) > ONE_BLOCK:
        return StructuralResult.not_applicable(f"needs Nq and Nk <= {ONE_BLOCK}")
    if not all(np.isfinite(getattr(case, n).astype(np.float64)).all() for n in "qkv"):
        return StructuralResult.not_applicable("non-finite inputs")
    fwd = adapter.run(case, device)
    if fwd.lse is None:
        return StructuralResult.not_applicable(NO_LSE)
    g = adapter.run_backward(case, device)
    emu, tol, fmt = _emulate(case, fwd.o.astype(case.q.dtype), fwd.lse)
    if not all(np.isfinite(x).all() for x in (*emu.values(), *tol.values())):
        # Scores near fp32's range (|s| ~ 1e30): the emulation's own fp32 products overflow
        # where the kernel's sequence of operations need not; accuracy is judged elsewhere.
        return StructuralResult.not_applicable("the emulation overflows fp32 on this case")
    worst = 0.0
    for name in ("dq", "dk", "dv"):
        got = getattr(g, name)
        want = emu[name].astype(np.float64)
        t = tol[name] + ulp(want, fmt) + ulp(got, fmt)
        with np.errstate(invalid="ignore"):
            ratio = np.abs(got - want) / t
        ratio = np.where(np.isnan(got) & np.isnan(want), 0.0, ratio)
        if np.any(~(ratio <= 1)):
            i = np.unravel_index(np.argmax(np.where(np.isnan(ratio), np.inf, ratio)), got.shape)
            return StructuralResult.failed(
                f"{GRADIENT_LABELS[name]}{tuple(int(x) for x in i)} = {float(got[i])!r} but the "
                f"emulated flash backward gives {float(want[i])!r} (tolerance {float(t[i]):.3g}):"
                " the backward does not round as FlashAttention-2's does (dS and D from the "
                "rounded P and O). If that is by design, declare backward_arithmetic='unknown'"
            )
        worst = max(worst, float(ratio.max()) if ratio.size else 0.0)
    return StructuralResult.passed(
        f"matches the emulated flash backward (max diff/tol {worst:.3g})"
    )
