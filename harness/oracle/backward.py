"""Gradient oracle, fast path: dQ, dK, dV of one (batch, kv head) group with certified bounds.

For the query heads ``g`` of one kv head, given the upstream gradient ``dO``:

    P = softmax(s),  dP = dO·Vᵀ,  D_i = Σ_c dO_ic·O_ic,  dS = P ∘ (dP − D)
    dQ = τ·dS·K,     dK = τ·Σ_g dS_gᵀ·Q_g,              dV = Σ_g P_gᵀ·dO_g

``P`` comes from the forward's fast path (a dd per weight, with its bound), ``dP`` is exact
(slice products), ``dP − D`` is formed from the weights so that a weight's own error cancels
(:func:`_score_grad_gap`), and the three products are slice
products of dd matrices, every step with a certified absolute bound. The floor scales (the
natural size of each element's rounding errors, docs/oracle.md §7) are

    dV_jc: Σ_i P_ij |dO_ic|      dQ_ic: |τ| Σ_j F_ij |K_jc|      dK_jc: |τ| Σ_i F_ij |Q_ic|

with ``F_ij = P_ij (|dP_ij| + |D_i|)``, the size of ``dS_ij``'s terms before they cancel. The
derivation is in docs/oracle.md §7; elements the bounds do not certify are recomputed by
:mod:`flashcheck.harness.oracle.backward_strict`.
"""

from __future__ import annotations

import math

import numpy as np

from . import exact as ex
from .common import SLACK, Scale
from .fast import fast_rows

__all__ = ["GRADIENTS", "fast_group"]

GRADIENTS = ("dq", "dk", "dv")


def _nonneg_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` of non-negative matrices, rounded up: float64 sums of ``n`` non-negative terms
    are within a factor ``1 + (n + 2)u`` of the exact sum."""
    return (a @ b) * (1 + (a.shape[-1] + 2) * ex.U)


def _tol(n: int) -> float:
    # Slices of a dd matrix stop at 2^-(110 + log2 n) of the row maximum: the rest is bounded.
    return 2.0 ** -(110 + math.ceil(math.log2(n + 1)))


def _product(a_hi, a_lo, a_err, b):
    """``(a_hi + a_lo) @ b`` for a dd matrix ``a`` (within ``a_err`` of the exact ``A``,
    elementwise) and an exact float64 matrix ``b``: returns ``(hi, lo, err)`` with ``err``
    bounding the distance to the exact ``A @ b``."""
    n = a_hi.shape[1]
    beta = ex.beta_for(n)
    a_s, rem = ex.slice_rows(a_hi, a_lo, beta, rel_tol=_tol(n))
    b_s, _ = ex.slice_rows(np.ascontiguousarray(b.T), None, beta)  # exact: b is not truncated
    prods = ex.sliced_matmul(a_s, b_s) or [np.zeros((a_hi.shape[0], b.shape[1]))]
    hi, lo, err = ex.expansion_to_dd(prods)
    err = err + _nonneg_dot(a_err + rem, np.abs(b))
    return hi, lo, err


def _scaled(hi, lo, err, scale: Scale):
    """``τ·(hi + lo)`` as a dd, the bound carried through (``τ`` itself is a dd within
    ``scale.err`` of the exact scale)."""
    zh, zl, mul_err = ex.dd_mul_err(hi, lo, scale.hi, scale.lo)
    out_err = abs(scale.hi) * (1 + 2.0**-50) * err + scale.err * (np.abs(hi) + err) + mul_err
    return zh, zl, (out_err + ex.U2 * np.abs(zh)) * SLACK


def _weights(res):
    """``P = e·(1/l)`` as a dd with an absolute bound (docs/oracle.md §7.1), and that error
    split as ``P̂ = (1 + c_i)(P + η)``: ``c_i`` (bounded by ``c``, per row) from ``l`` and its
    reciprocal, common to the row, and ``η`` (bounded by ``eta``) from ``e`` and the product."""
    eh, el, eps, alpha = res["e_hi"], res["e_lo"], res["e_rel"], res["e_abs"]
    inv_h, inv_l, rel_l = res["inv_hi"][:, None], res["inv_lo"][:, None], res["rel_l"][:, None]
    ph, pl, mul_err = ex.dd_mul_err(eh, el, inv_h, inv_l)
    inv = inv_h * (1 + 2.0**-50)
    e_err = eps * eh + alpha
    l_part = (eh + e_err) * inv * rel_l * (1 + 2 * rel_l)
    p_err = (e_err * inv + l_part + mul_err + 1.01 * ex.U2 * np.abs(ph)) * SLACK
    # 1 + c = (1 + ι)/(1 + ρ): |ι| ≤ 1.01u² (the dd of 1/l̂), |ρ| ≤ rel_l/(1 − rel_l) (l̂ = l(1 + ρ)).
    c = (1.01 * ex.U2 + rel_l * (1 + 2 * rel_l)) * (1 + 2 * rel_l + 2.0**-50) * SLACK
    # η = Δe/l + μ/(1 + c), with 1/l = (1 + ρ)/l̂ and μ the product's rounding.
    eta = (e_err * inv * (1 + 2 * rel_l) + mul_err * (1 + 2 * c)) * SLACK
    return ph, pl, p_err, eta, c[:, 0]


def _exclusive_sums(x: np.ndarray) -> np.ndarray:
    """``Σ_{k≠j} x_ik`` for non-negative ``x``, rounded up: a prefix and a suffix sum, so no
    subtraction can cancel (``Σ_k x_ik − x_ij`` would keep the rounding error of the whole
    row). Float64 sums of ``n`` non-negative terms are within ``1 + (n + 2)u`` of exact."""
    before = np.concatenate([np.zeros_like(x[:, :1]), np.cumsum(x[:, :-1], axis=1)], axis=1)
    after = np.concatenate(
        [np.flip(np.cumsum(np.flip(x[:, 1:], axis=1), axis=1), axis=1), np.zeros_like(x[:, :1])],
        axis=1,
    )
    return (before + after) * (1 + (x.shape[1] + 3) * ex.U)


def _score_grad_gap(ph, pl, p_err, dp_h, dp_l, dp_err, keep, eta, c):
    """``dP_ij − D_i`` (``D_i = Σ_k P_ik·dP_ik``) as a dd with a certified bound, and ``D`` as
    a dd (for the floor).

    Since the exact weights of a row sum to one, ``dP_ij − D_i = Σ_{k≠j} P_ik (dP_ij − dP_ik)``:
    the errors of ``P_ij`` and ``dP_ij`` themselves do not reach the difference. The value is
    computed as ``dP̃_ij·(1 + λ_i) − D̃_i`` with ``λ_i = Σ_k P̃_ik − 1`` and every product
    exact, so it is ``Σ_{k≠j} P̃_ik (dP̃_ij − dP̃_ik)`` up to its own rounding. With the weights'
    error split as ``P̃ = (1 + c_i)(P + η)`` (:func:`_weights`), the row's common factor only
    scales the difference, and the carried bound is

        B = (1 + c)·Σ_{k≠j} η_ik (|dP̃_ij| + |dP̃_ik|) + (|P̃_ik| + p_err_ik)(dp_err_ij + dp_err_ik)

    plus ``c·|dP_ij − D_i|``; with ``R`` the rounding, ``|g̃ − g| ≤ (R + B + c|g̃|)/(1 − c)``.

    For a row whose softmax is one-hot to double precision (huge logit gaps) the difference is
    then certified as (almost) exactly zero; a bound relative to ``|D|`` (≈ 2^−106·|dP|) could
    not decide the rounding of the astronomically small gradients of such rows.
    """
    ph, pl, p_err, eta = (np.where(keep, x, 0.0) for x in (ph, pl, p_err, eta))
    nq, nk = ph.shape
    # D: every product exact (two_prod), only pl·dp_l dropped and bounded.
    terms = []
    for a, b in ((ph, dp_h), (ph, dp_l), (pl, dp_h)):
        hi, lo = ex.two_prod(a, b)
        terms += [hi[:, j] for j in range(nk)] + [lo[:, j] for j in range(nk)]
    d_h, d_l, d_err = ex.expansion_to_dd(terms)
    d_err = d_err + np.sum(np.abs(pl * dp_l), axis=1) * (1 + (nk + 3) * ex.U)
    lam = [ph[:, j] for j in range(nk)] + [pl[:, j] for j in range(nk)] + [-np.ones(nq)]
    lam_h, lam_l, lam_err = ex.expansion_to_dd(lam)
    a_h, a_l, a_err = ex.dd_add_err(dp_h, dp_l, -d_h[:, None], -d_l[:, None])
    b_h, b_l, b_err = ex.dd_mul_err(dp_h, dp_l, lam_h[:, None], lam_l[:, None])
    g_h, g_l, c_err = ex.dd_add_err(a_h, a_l, b_h, b_l)
    abs_dp = np.abs(dp_h) + np.abs(dp_l)
    rounding = d_err[:, None] + a_err + b_err + c_err + abs_dp * lam_err[:, None]
    p_big = np.abs(ph) + np.abs(pl) + p_err
    c = c[:, None]
    carried = (1 + c) * (abs_dp * _exclusive_sums(eta) + _exclusive_sums(eta * abs_dp))
    carried = carried + dp_err * _exclusive_sums(p_big) + _exclusive_sums(p_big * dp_err)
    total = (rounding + carried + c * (np.abs(g_h) + np.abs(g_l))) / (1 - c)
    return g_h, g_l, total * (1 + 2.0**-40) * SLACK, d_h


def fast_group(q, k, v, do, keep, scale: Scale, *, weights=None, slope=None, sink_slot=False):
    """The gradients of one group: ``q`` ``(G, Nq, d)``, ``k`` ``(Nk, d)``, ``v`` ``(Nk, dv)``,
    ``do`` ``(G, Nq, dv)``, ``keep`` ``(G, Nq, Nk)`` (finite float64 values, taken as exact).

    Returns ``{name: array}`` for ``dq_{hi,lo,err,floor}`` ``(G, Nq, d)``, ``dk_*`` ``(Nk, d)``
    and ``dv_*`` ``(Nk, dv)``: the dd value, a certified bound on its distance to the exact
    gradient, and the floor scale.

    For soft-capping and sinks (:mod:`.options_backward`): ``weights(g)`` gives head ``g``'s
    weights in place of :func:`.fast.fast_rows`; ``slope(g)`` a dd ``(g_hi, g_lo, g_err)`` that
    multiplies ``dS`` (the cap's ``1 − tanh²``); with ``sink_slot`` the last key is the sink
    (zero ``k`` and ``v`` rows) and the result also holds, per head and row, its ``dS`` as
    ``ds_sink_{hi,lo,err}``, its weight as ``p_sink`` and ``Σ_j P|dP|`` as ``pdp`` ``(G, Nq)``.
    """
    g_n, nq, d = q.shape
    nk, dv = v.shape
    out = {f"dq_{f}": np.zeros((g_n, nq, d)) for f in ("hi", "lo", "err", "floor")}
    out.update({f"dk_{f}": np.zeros((nk, d)) for f in ("hi", "lo", "err", "floor")})
    out.update({f"dv_{f}": np.zeros((nk, dv)) for f in ("hi", "lo", "err", "floor")})
    if sink_slot:
        out.update({f"ds_sink_{f}": np.zeros((g_n, nq)) for f in ("hi", "lo", "err")})
        out["pdp"], out["p_sink"] = np.zeros((g_n, nq)), np.zeros((g_n, nq))
    if nq == 0 or nk == 0 or not keep.any():
        return out
    v_s, _ = ex.slice_rows(v, None, ex.beta_for(dv))
    ps, ds, fs = [], [], []
    for g in range(g_n):
        if weights is None:
            res = fast_rows(q[g], k, v, keep[g], scale, weights=True)
        else:
            res = weights(g)
        ph, pl, p_err, eta, c_row = _weights(res)
        do_s, _ = ex.slice_rows(do[g], None, ex.beta_for(dv))
        dp_h, dp_l, dp_err = ex.expansion_to_dd(ex.sliced_matmul(do_s, v_s) or [np.zeros((nq, nk))])
        # dS = P ∘ (dP − D): the difference as a dd, then the product, bounds carried.
        diff_h, diff_l, diff_err, d_h = _score_grad_gap(
            ph, pl, p_err, dp_h, dp_l, dp_err, keep[g], eta, c_row
        )
        sh, sl, mul_err = ex.dd_mul_err(ph, pl, diff_h, diff_l)
        s_err = np.abs(ph) * (1 + 2.0**-50) * diff_err
        s_err = s_err + p_err * (np.abs(diff_h) + np.abs(diff_l) + diff_err) + mul_err
        s_err = np.where(keep[g], s_err * SLACK, 0.0)
        sh, sl = np.where(keep[g], sh, 0.0), np.where(keep[g], sl, 0.0)
        floor = np.abs(ph) * (np.abs(dp_h) + np.abs(d_h)[:, None])
        if slope is not None:  # dS·(1 − tanh²): the product's rounding and both bounds
            gh, gl, g_err = slope(g)
            zh, zl, z_err = ex.dd_mul_err(sh, sl, gh, gl)
            s_err = s_err * (np.abs(gh) + g_err) * (1 + 2.0**-50)
            s_err = (s_err + (np.abs(sh) + np.abs(sl)) * g_err + z_err) * SLACK
            sh, sl, floor = zh, zl, floor * np.abs(gh)
        if sink_slot:
            out["ds_sink_hi"][g], out["ds_sink_lo"][g] = sh[:, -1], sl[:, -1]
            out["ds_sink_err"][g] = s_err[:, -1]
            out["pdp"][g] = (np.abs(ph) * np.abs(dp_h)).sum(axis=1)
            out["p_sink"][g] = np.abs(ph[:, -1])
        # dQ of this head: τ·dS·K.
        qh, ql, qerr = _product(sh, sl, s_err, k)
        qh, ql, qerr = _scaled(qh, ql, qerr, scale)
        out["dq_hi"][g], out["dq_lo"][g], out["dq_err"][g] = qh, ql, qerr
        out["dq_floor"][g] = abs(scale.hi) * (floor @ np.abs(k))
        ps.append((ph, pl, p_err))
        ds.append((sh, sl, s_err))
        fs.append(floor)
    # dK and dV sum over every row of every query head of the group.
    q_all = q.reshape(g_n * nq, d)
    do_all = do.reshape(g_n * nq, dv)
    st = [np.concatenate([x[i] for x in ds]).T for i in range(3)]
    kh, kl, kerr = _product(st[0], st[1], st[2], q_all)
    out["dk_hi"], out["dk_lo"], out["dk_err"] = _scaled(kh, kl, kerr, scale)
    out["dk_floor"] = abs(scale.hi) * (np.concatenate(fs).T @ np.abs(q_all))
    pt = [np.concatenate([x[i] for x in ps]).T for i in range(3)]
    out["dv_hi"], out["dv_lo"], out["dv_err"] = _product(pt[0], pt[1], pt[2], do_all)
    out["dv_floor"] = np.abs(pt[0]) @ np.abs(do_all)
    return out
