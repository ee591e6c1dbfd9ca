"""Structural properties of a kernel's backward: determinism and, for the flash backward
class, conformance to the declared arithmetic.

- ``gradient-determinism``: two backward calls on one case are bitwise equal for a kernel
  declared deterministic, else within twice the gradient bound of each other;
- ``gradient-conformance``: within one block (``Nq, Nk ≤ 16``) a kernel of the flash backward
  class performs the roundings of FlashAttention-2's backward (docs/error-bounds.md §11): D from
  its own rounded O, P recomputed in fp32 from its LSE, P and dS rounded to the input format
  before their products, fp32 accumulation. Its gradients then match an independent emulation
  of that arithmetic up to fp32-level differences, one final ulp, and the P or dS elements
  whose fp32 value lies so close to a rounding boundary of the input format that the two may
  round apart. A kernel that is *more* accurate than declared (dS kept in fp32, D from an
  unrounded O) is caught here, where no accuracy bound can see it.
"""

from __future__ import annotations

import math

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..checks.accuracy import kernel_gradient_bounds
from ..core.formats import FORMATS, round_to_format, ulp
from ..core.semantics import make_problem
from .bounds import U32, gamma
from .verdict import GRADIENT_LABELS

__all__ = ["GRADIENT_CHECKS", "ONE_BLOCK", "gradient_conformance", "gradient_determinism"]

ONE_BLOCK = 16
LOG2E = 1.4426950408889634
F32 = np.float32


def gradient_determinism(adapter: Kernel, case: Case, device: str) -> tuple[bool, str]:
    """Two backward calls on the same case: bitwise equal for a kernel declared deterministic;
    otherwise within twice the gradient bound of each other (never a NaN in one run only)."""
    a = adapter.run_backward(case, device)
    b = adapter.run_backward(case, device)
    bounds = None if adapter.deterministic else kernel_gradient_bounds(adapter, case)
    for name in ("dq", "dk", "dv"):
        x, y = getattr(a, name), getattr(b, name)
        label = GRADIENT_LABELS[name]
        if (np.isnan(x) != np.isnan(y)).any():
            return False, f"{label} is NaN in one run and not in the other"
        if adapter.deterministic:
            if not np.array_equal(x, y, equal_nan=True):
                n = int((~((x == y) | (np.isnan(x) & np.isnan(y)))).sum())
                return False, (
                    f"{label} differs between two runs in {n} elements (declared deterministic)"
                )
            continue
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y), 0.0)
        over = diff > 2 * bounds[name].det
        if over.any():
            return False, (
                f"{label} of two runs differ by more than twice the bound in "
                f"{int(over.sum())} elements (max {diff.max():.3g})"
            )
    how = "bitwise" if adapter.deterministic else "within twice the bound"
    return True, f"two backward runs agree {how}"


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


def gradient_conformance(adapter: Kernel, case: Case, device: str) -> tuple[bool, str]:
    """The kernel's gradients against the emulated flash backward within one block (see the
    module docstring); needs the kernel's LSE (from its forward)."""
    *_, nq, nk, _, _ = case.shape
    if adapter.backward_arithmetic != "flash" or max(nq, nk) > ONE_BLOCK:
        return True, "not applicable (flash backward class, Nq and Nk <= 16)"
    fwd = adapter.run(case, device)
    if fwd.lse is None:
        return True, "not applicable (the kernel returns no LSE)"
    if not all(np.isfinite(getattr(case, n).astype(np.float64)).all() for n in "qkv"):
        return True, "not applicable (non-finite inputs)"
    g = adapter.run_backward(case, device)
    emu, tol, fmt = _emulate(case, fwd.o.astype(case.q.dtype), fwd.lse)
    if not all(np.isfinite(x).all() for x in (*emu.values(), *tol.values())):
        # Scores near fp32's range (|s| ~ 1e30): the emulation's own fp32 products overflow
        # where the kernel's sequence of operations need not; accuracy is judged elsewhere.
        return True, "not applicable (the emulation overflows fp32 on this case)"
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
            return False, (
                f"{GRADIENT_LABELS[name]}{tuple(int(x) for x in i)} = {got[i]!r} but the emulated "
                f"flash backward gives {float(want[i])!r} (tolerance {t[i]:.3g})"
            )
        worst = max(worst, float(ratio.max()) if ratio.size else 0.0)
    return True, f"matches the emulated flash backward (max diff/tol {worst:.3g})"


GRADIENT_CHECKS = {
    "gradient-determinism": gradient_determinism,
    "gradient-conformance": gradient_conformance,
}
