"""Fast oracle path: exact slice products and a double-double softmax with certified bounds.

See docs/oracle.md §3 for the derivation of every bound used here.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np

from . import exact as ex
from .common import SLACK, Scale


def _prepare_keys(k, v):
    """Per-head work shared by all row blocks: exact slices of K and of ``[V | 1]``."""
    nk, d = k.shape
    bd = ex.beta_for(d)
    bn = ex.beta_for(nk)
    ks, _ = ex.slice_rows(k, None, bd)
    v_aug = np.concatenate([v, np.ones((nk, 1))], axis=1)
    vs, _ = ex.slice_rows(v_aug.T, None, bn)
    return {"ks": ks, "vs": vs, "abs_v": np.abs(v_aug), "bd": bd, "bn": bn, "shape": v.shape}


def _triple_argument(expansion, scale: Scale):
    """``x = τ·Σ expansion`` as a renormalised triple ``(hi, mid, lo)`` with an absolute bound,
    or ``None`` where the products below might not be exact (huge or tiny values or scale).

    ``t − m = D1 + D2 + D3 + δD`` (:func:`.exact.expansion_to_td`, ``|δD|`` bounded, of the
    order of ``u³|t − m|``) and ``τ = τ1 + τ2 + τ3 + δτ`` (doubles from its 300-bit value). The
    products ``D_a·τ_b`` with ``a, b ≤ 2`` are split exactly by TwoProduct (valid while they
    stay inside ``[2^−960, 2^990]``); ``D1·τ3`` and ``D3·τ1`` (about ``u²|x|``) are rounded
    once, by at most ``u`` of their value; ``D2·τ3 + D3·τ2 + D3·τ3`` (about ``u³|x|``) is
    dropped. The kept terms are rounded to a triple by :func:`.exact.expansion_to_td`. The
    bound sums those roundings, the dropped terms, ``|τ|·|δD|`` and ``|δτ|·|t − m|``.
    """
    with mpmath.mp.workprec(300):
        rest = scale.mp - mpmath.mpf(scale.hi) - mpmath.mpf(scale.lo)
        t3 = float(rest)
        t_err = float(abs(rest - t3) * (1 + mpmath.mpf(2) ** -40))
    if scale.given is None:  # the 300-bit value's own error
        t_err += float(abs(scale.mp)) * 2.0**-289
    d1, d2, d3, d_err = ex.expansion_to_td(expansion)
    t1, t2 = scale.hi, scale.lo
    exact_pairs = [(d1, t1), (d2, t1)] + ([(d1, t2), (d2, t2)] if t2 != 0.0 else [])
    for a, b in exact_pairs:  # TwoProduct's split needs |a|, |b| < 2^996 (and no underflow)
        prod = np.abs(a * b)
        big = max(float(np.max(np.abs(a))), abs(b), float(np.max(prod)))
        if t1 == 0.0 or big > 2.0**990 or np.min(prod[a != 0], initial=1.0) < 2.0**-960:
            return None
    terms = [half for a, b in exact_pairs for half in ex.two_prod(a, b)]
    rounded = [d1 * t3, d3 * t1]
    hi, mid, lo, err = ex.expansion_to_td(terms + rounded)
    dropped = np.abs(d2) * abs(t3) + np.abs(d3) * (abs(t2) + abs(t3))
    d_abs = np.abs(d1) + np.abs(d2) + np.abs(d3) + d_err
    tau_abs = abs(t1) + abs(t2) + abs(t3) + t_err
    err = err + ex.U * (np.abs(rounded[0]) + np.abs(rounded[1])) + dropped
    err = (err + tau_abs * d_err + t_err * d_abs) * SLACK + 2.0**-1000
    return hi, mid, lo, err


def _fast_head(q, keep, prep, scale: Scale, weights: bool = False):
    """Double-double evaluation with certified bounds; see docs/oracle.md §3. With
    ``weights``, also the unnormalised weights ``e`` (dd ``e_hi + e_lo`` within
    ``e_rel·e_hi + e_abs`` of the exact ``exp``), ``1/l`` as a dd and ``rel_l`` (the relative
    bound on the computed ``l``): what the gradient oracle needs to form ``P``.

    Longer than 80 lines: the double-double steps and their error bounds follow
    docs/oracle.md §3 in order, each bound built from the previous steps' arrays."""
    r_n, _d = q.shape
    nk, dv = prep["shape"]
    has = keep.any(axis=1)
    out = {
        "o_hi": np.zeros((r_n, dv)),
        "o_lo": np.zeros((r_n, dv)),
        "o_err": np.zeros((r_n, dv)),
        "o_floor": np.zeros((r_n, dv)),
        "lse_hi": np.full(r_n, -np.inf),
        "lse_lo": np.zeros(r_n),
        "lse_err": np.zeros(r_n),
        "lse_floor": np.zeros(r_n),
    }
    if weights:
        zeros = np.zeros((r_n, nk))
        out.update(
            e_hi=zeros,
            e_lo=zeros,
            e_rel=zeros,
            e_abs=zeros,
            inv_hi=np.zeros(r_n),
            inv_lo=np.zeros(r_n),
            rel_l=np.zeros(r_n),
        )
    if r_n == 0 or nk == 0 or not has.any():
        return out

    # 1. exact scores t = q·k as an expansion of exact float64 matrices.
    qs, _ = ex.slice_rows(q, None, prep["bd"])
    terms = ex.sliced_matmul(qs, prep["ks"]) or [np.zeros((r_n, nk))]
    t_approx = terms[0].copy()
    for t in terms[1:]:
        t_approx += t
    sgn = -1.0 if scale.hi < 0 else 1.0
    ranked = np.where(keep, sgn * t_approx, -np.inf)
    m = sgn * np.max(ranked, axis=1)  # any shift works: softmax is shift invariant
    m = np.where(has, m, 0.0)

    # 2. x = scale·(t − m) as a dd with an absolute error bound.
    s0, e0 = ex.two_sum(terms[0], -m[:, None])
    expansion = [s0, e0, *terms[1:]]
    dh, dl, derr = ex.expansion_to_dd(expansion)
    # m came from a rounded sum: for huge scores it can miss the true maximum by u·|t|, far
    # more than exp's range. Re-centre on the max of the accurate t − m, as a second exact
    # shift m2 (LSE uses m + m2).
    m2 = sgn * np.max(np.where(keep, sgn * dh, -np.inf), axis=1)
    m2 = np.where(has, m2, 0.0)
    if np.any(np.abs(m2) * abs(scale.hi) > 2.0**-20):
        expansion.append(np.broadcast_to(-m2[:, None], s0.shape))
        dh, dl, derr = ex.expansion_to_dd(expansion)
    else:
        m2 = np.zeros_like(m2)
    # The gradient path needs the weights' relative error well below 2^−100 (docs/oracle.md
    # §7.1, step 1): there x is carried as a triple-double where its terms allow.
    triple = _triple_argument(expansion, scale) if weights else None
    if triple is None:
        xh, xl, xerr = ex.dd_mul_err(dh, dl, scale.hi, scale.lo)
        xerr = (xerr + abs(scale.hi) * derr + scale.err * np.abs(dh)) * SLACK + 2.0**-1000
        xll = None
    else:
        xh, xl, xll, xerr = triple
        xll = np.where(keep, xll, 0.0)
    xh = np.where(keep, xh, -1e4)
    xl = np.where(keep, xl, 0.0)

    # 3. e = exp(x): relative error eps (exp's own and x's), absolute EXP_FLUSH_ABS.
    eh, el, rel = ex.dd_exp(xh, xl, xll)
    eps = (rel + xerr * (1 + xerr)) * SLACK
    eh = np.where(keep, eh, 0.0)
    el = np.where(keep, el, 0.0)
    eps = np.where(keep, eps, 0.0)
    alpha = np.where(keep, ex.EXP_FLUSH_ABS, 0.0)

    # 4. num = e·V and l = Σ e from slice products of (e, [V | 1]); the e slices stop once the
    #    remainder is below 2^−(110 + log2 Nk) of the row maximum, and the remainder is bounded.
    tol = 2.0 ** -(110 + math.ceil(math.log2(nk + 1)))
    es, e_rem = ex.slice_rows(eh, el, prep["bn"], rel_tol=tol)
    prods = ex.sliced_matmul(es, prep["vs"]) or [np.zeros((r_n, dv + 1))]
    nh, nl, nerr = ex.expansion_to_dd(prods)
    abs_v = prep["abs_v"]
    stacked = np.concatenate([eh, eps * eh + alpha, e_rem], axis=0) @ abs_v
    # All terms are >= 0: float64 matmul is within a factor (1 + (Nk+1)u) of the exact sums.
    stacked *= 1 + (nk + 2) * ex.U
    wsum = stacked[:r_n]
    num_err = stacked[r_n : 2 * r_n] + stacked[2 * r_n :] + nerr
    lh, ll, l_err = nh[:, -1], nl[:, -1], num_err[:, -1]

    # 5. per row in mpmath: 1/l and log l (+ scale·m) at 200 bits.
    inv_h = np.zeros(r_n)
    inv_l = np.zeros(r_n)
    lse_h = np.full(r_n, -np.inf)
    lse_l = np.zeros(r_n)
    lse_round = np.zeros(r_n)
    with mpmath.mp.workprec(200):
        for i in np.flatnonzero(has):
            lv = mpmath.mpf(lh[i]) + mpmath.mpf(ll[i])
            inv_h[i], inv_l[i] = ex.dd_from_mpf(1 / lv)
            sm = scale.mp * (mpmath.mpf(m[i]) + mpmath.mpf(m2[i]))
            lg = mpmath.log(lv)
            lse_h[i], lse_l[i] = ex.dd_from_mpf(sm + lg)
            lse_round[i] = float((abs(sm) + abs(lg)) * mpmath.mpf(2) ** -190)
            lse_round[i] += abs(float(sm)) * (scale.err / abs(scale.hi) if scale.hi else 0.0)
            lse_round[i] += abs(float(sm)) * 2.0**-190  # rounding of m + m2 at 200 bits
    rel_l = np.where(has, l_err / np.where(has, lh, 1.0), 0.0)

    oh, ol, mul_err = ex.dd_mul_err(nh[:, :dv], nl[:, :dv], inv_h[:, None], inv_l[:, None])
    floor = wsum[:, :dv] * inv_h[:, None]
    o_err = (num_err[:, :dv] + floor * (1 + 2.0**-20) * l_err[:, None]) * inv_h[:, None]
    # + the product's rounding, and inv's own error (≤ u²·|inv| for the dd of a 200-bit value).
    o_err = (o_err * (1 + 2 * rel_l[:, None]) + mul_err + 1.01 * ex.U2 * np.abs(oh)) * SLACK
    lse_err = (rel_l * (1 + rel_l) + lse_round) * SLACK + ex.U2 * np.abs(lse_h)
    s_abs = np.abs(t_approx) * abs(scale.hi)
    lse_floor = np.sum(np.where(keep, eh * s_abs, 0.0), axis=1) * inv_h

    sel = has[:, None]
    out.update(
        o_hi=np.where(sel, oh, 0.0),
        o_lo=np.where(sel, ol, 0.0),
        o_err=np.where(sel, o_err, 0.0),
        o_floor=np.where(sel, floor, 0.0),
        lse_hi=np.where(has, lse_h, -np.inf),
        lse_lo=np.where(has, lse_l, 0.0),
        lse_err=np.where(has, lse_err, 0.0),
        lse_floor=np.where(has, lse_floor, 0.0),
    )
    if weights:
        out.update(
            e_hi=eh,
            e_lo=el,
            e_rel=eps,
            e_abs=alpha,
            inv_hi=np.where(has, inv_h, 0.0),
            inv_lo=np.where(has, inv_l, 0.0),
            rel_l=rel_l,
        )
    return out


_BLOCK_ELEMENTS = 1 << 16  # rows × keys per block: keeps the elementwise work in cache


def fast_rows(q, k, v, keep, scale: Scale, *, weights: bool = False):
    """:func:`_fast_head` over blocks of rows (rows are independent), results stacked."""
    step = max(32, _BLOCK_ELEMENTS // max(k.shape[0], 1))
    prep = _prepare_keys(k, v)
    parts = [
        _fast_head(q[i : i + step], keep[i : i + step], prep, scale, weights)
        for i in range(0, q.shape[0], step)
    ]
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
