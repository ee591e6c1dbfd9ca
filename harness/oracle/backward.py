"""Gradient oracle, fast path: dQ, dK, dV of one (batch, kv head) group with certified bounds.

For the query heads ``g`` of one kv head, given the upstream gradient ``dO``:

    P = softmax(s),  dP = dO·Vᵀ,  D_i = Σ_c dO_ic·O_ic,  dS = P ∘ (dP − D)
    dQ = τ·dS·K,     dK = τ·Σ_g dS_gᵀ·Q_g,              dV = Σ_g P_gᵀ·dO_g

``P`` comes from the forward's fast path (a dd per weight, with its bound), ``dP`` is exact
(slice products), ``D`` is formed from the forward's dd ``O``, and the three products are slice
products of dd matrices, every step with a certified absolute bound. The floor scales (the
natural size of each element's rounding errors, SPEC 3.7) are

    dV_jc: Σ_i P_ij |dO_ic|      dQ_ic: |τ| Σ_j F_ij |K_jc|      dK_jc: |τ| Σ_i F_ij |Q_ic|

with ``F_ij = P_ij (|dP_ij| + |D_i|)``, the size of ``dS_ij``'s terms before they cancel. The
derivation is in docs/oracle.md §7; elements the bounds do not certify are recomputed by
:mod:`flashcheck.harness.oracle.backward_strict`.
"""

from __future__ import annotations

import math

import numpy as np

from flashcheck.harness.oracle import exact as ex
from flashcheck.harness.oracle.common import SLACK, Scale
from flashcheck.harness.oracle.fast import fast_rows

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
    """``P = e·(1/l)`` as a dd with an absolute bound (docs/oracle.md §7.1)."""
    eh, el, eps, alpha = res["e_hi"], res["e_lo"], res["e_rel"], res["e_abs"]
    inv_h, inv_l, rel_l = res["inv_hi"][:, None], res["inv_lo"][:, None], res["rel_l"][:, None]
    ph, pl, mul_err = ex.dd_mul_err(eh, el, inv_h, inv_l)
    inv = inv_h * (1 + 2.0**-50)
    e_err = eps * eh + alpha
    l_part = (eh + e_err) * inv * rel_l * (1 + 2 * rel_l)
    p_err = (e_err * inv + l_part + mul_err + 1.01 * ex.U2 * np.abs(ph)) * SLACK
    return ph, pl, p_err


def _row_delta(do, res):
    """``D_i = Σ_c dO_ic·O_ic`` as a dd from the forward's dd ``O``, with its bound."""
    oh, ol, o_err = res["o_hi"], res["o_lo"], res["o_err"]
    p, e = ex.two_prod(do, oh)
    x = do * ol
    terms = [t for c in range(do.shape[1]) for t in (p[:, c], e[:, c], x[:, c])]
    if not terms:
        zero = np.zeros(do.shape[0])
        return zero, zero, zero
    dh, dl, derr = ex.expansion_to_dd(terms)
    rounding = ex.U * np.sum(np.abs(x), axis=1) * (1 + 2.0**-40)
    carried = np.sum(np.abs(do) * o_err, axis=1) * (1 + (do.shape[1] + 2) * ex.U)
    d_err = derr + rounding + carried
    return dh, dl, d_err * SLACK


def _row_delta_from_weights(ph, pl, p_err, dp_h, dp_l, dp_err, keep):
    """``D_i = Σ_j P_ij·dP_ij`` (equal to ``Σ_c dO_ic·O_ic`` since ``O = P·V``) as a dd from
    the dd weights and the dd ``dP``, with its bound. When ``dO·O`` cancels across the head dim,
    ``O``'s bound (relative to ``|O|``) makes the other form's bound large relative to ``|D|``;
    this form's bound is relative to ``Σ_j P_ij·|dP_ij|`` instead."""
    ph, pl, p_err = (np.where(keep, x, 0.0) for x in (ph, pl, p_err))
    p, e = ex.two_prod(ph, dp_h)
    x1, x2 = ph * dp_l, pl * dp_h
    terms = [t for j in range(ph.shape[1]) for t in (p[:, j], e[:, j], x1[:, j], x2[:, j])]
    dh, dl, derr = ex.expansion_to_dd(terms)
    rounding = ex.U * (np.abs(x1) + np.abs(x2)) + np.abs(pl * dp_l)
    carried = p_err * (np.abs(dp_h) + np.abs(dp_l) + dp_err) + (np.abs(ph) + np.abs(pl)) * dp_err
    n = ph.shape[1] + 2
    d_err = derr + np.sum(rounding + carried, axis=1) * (1 + n * ex.U) * (1 + 2.0**-40)
    return dh, dl, d_err * SLACK


def fast_group(q, k, v, do, keep, scale: Scale):
    """The gradients of one group: ``q`` ``(G, Nq, d)``, ``k`` ``(Nk, d)``, ``v`` ``(Nk, dv)``,
    ``do`` ``(G, Nq, dv)``, ``keep`` ``(G, Nq, Nk)`` (finite float64 values, taken as exact).

    Returns ``{name: array}`` for ``dq_{hi,lo,err,floor}`` ``(G, Nq, d)``, ``dk_*`` ``(Nk, d)``
    and ``dv_*`` ``(Nk, dv)``: the dd value, a certified bound on its distance to the exact
    gradient, and the floor scale.
    """
    g_n, nq, d = q.shape
    nk, dv = v.shape
    out = {f"dq_{f}": np.zeros((g_n, nq, d)) for f in ("hi", "lo", "err", "floor")}
    out.update({f"dk_{f}": np.zeros((nk, d)) for f in ("hi", "lo", "err", "floor")})
    out.update({f"dv_{f}": np.zeros((nk, dv)) for f in ("hi", "lo", "err", "floor")})
    if nq == 0 or nk == 0 or not keep.any():
        return out
    v_s, _ = ex.slice_rows(v, None, ex.beta_for(dv))
    ps, ds, fs = [], [], []
    for g in range(g_n):
        res = fast_rows(q[g], k, v, keep[g], scale, weights=True)
        ph, pl, p_err = _weights(res)
        do_s, _ = ex.slice_rows(do[g], None, ex.beta_for(dv))
        dp_h, dp_l, dp_err = ex.expansion_to_dd(ex.sliced_matmul(do_s, v_s) or [np.zeros((nq, nk))])
        d_h, d_l, d_err = _row_delta(do[g], res)
        # Two certified forms of D: keep the tighter one per row.
        w_h, w_l, w_err = _row_delta_from_weights(ph, pl, p_err, dp_h, dp_l, dp_err, keep[g])
        tighter = w_err < d_err
        d_h, d_l, d_err = (np.where(tighter, a, b) for a, b in ((w_h, d_h), (w_l, d_l),
                                                                 (w_err, d_err)))  # fmt: skip
        # dS = P ∘ (dP − D): the difference as a dd, then the product, bounds carried.
        diff_h, diff_l, add_err = ex.dd_add_err(dp_h, dp_l, -d_h[:, None], -d_l[:, None])
        diff_err = dp_err + d_err[:, None] + add_err
        sh, sl, mul_err = ex.dd_mul_err(ph, pl, diff_h, diff_l)
        s_err = np.abs(ph) * (1 + 2.0**-50) * diff_err
        s_err = s_err + p_err * (np.abs(diff_h) + np.abs(diff_l) + diff_err) + mul_err
        s_err = np.where(keep[g], s_err * SLACK, 0.0)
        sh, sl = np.where(keep[g], sh, 0.0), np.where(keep[g], sl, 0.0)
        floor = np.abs(ph) * (np.abs(dp_h) + np.abs(d_h)[:, None])
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
