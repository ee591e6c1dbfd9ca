"""Strict oracle path: interval arithmetic (mpmath.iv) with Ziv escalation.

See docs/oracle.md §4.
"""

from __future__ import annotations

import contextlib
from typing import Any

import mpmath
import numpy as np
from mpmath import iv

from ..core.formats import round_mpf, round_to_format
from . import exact as ex
from .common import Scale, finite_or_zero, target


def to_ints(x: np.ndarray, shift: int) -> np.ndarray:
    """Exact integers ``x·2^shift`` (object array); every fmt value times 2^shift is an integer."""
    scaled = np.ldexp(x, shift)
    return np.array([int(t) for t in scaled.ravel()], dtype=object).reshape(x.shape)


def mpf_of(x: Any) -> mpmath.mpf:
    return mpmath.mp.make_mpf(x)


@contextlib.contextmanager
def iv_prec(prec: int):
    # mpmath.iv has no workprec(); its precision is a plain attribute.
    old = iv.prec
    iv.prec = prec
    try:
        yield
    finally:
        iv.prec = old


def _strict_row(q_int, k_int, v, v_iv, cols, shift2: int, scale: Scale, prec: int):
    """Interval evaluation of one query row over its kept keys (k_int, v already selected).

    Returns ``{c: (lo, hi, floor)}`` for the requested columns and ``(lo, hi, floor)`` for LSE,
    endpoints as mpmath numbers.
    """
    with iv_prec(prec):
        t_int = k_int.dot(q_int) if len(k_int) else np.array([], dtype=object)
        pow2 = iv.mpf(2) ** (-shift2)
        sc = scale.interval()
        s = [sc * (iv.mpf(int(t)) * pow2) for t in t_int]
        m = max(mpf_of(x._mpi_[1]) for x in s)
        m_iv = iv.mpf(m)
        e = [iv.exp(x - m_iv) for x in s]
        lsum = iv.mpf(0)
        for x in e:
            lsum += x
        # W (a scale, needed to ~1e-12 only) in float64 from the intervals' lower ends, divided
        # by the largest first: for huge scores an interval's width is itself huge and its lower
        # end exp(−width) underflows float64 (0/0 would make W NaN).
        e_lo = [mpf_of(x._mpi_[0]) for x in e]
        top = max(e_lo, default=mpmath.mpf(0)) or mpmath.mpf(1)
        e_mid = np.array([float(x / top) for x in e_lo])
        l_mid = float(mpf_of(lsum._mpi_[0]) / top)
        res = {}
        for c in cols:
            num = iv.mpf(0)
            for x, vv, vi in zip(e, v[:, c], v_iv[:, c], strict=True):
                if vv != 0.0:
                    num += x * vi
            o = num / lsum
            w = float(np.dot(e_mid, np.abs(v[:, c])) / l_mid)
            res[c] = (mpf_of(o._mpi_[0]), mpf_of(o._mpi_[1]), w)
        lse = iv.log(lsum) + iv.mpf(m)
        s_mid = np.array([abs(float(mpf_of(x._mpi_[0]))) for x in s])
        lse_out = (mpf_of(lse._mpi_[0]), mpf_of(lse._mpi_[1]), float(np.dot(e_mid, s_mid) / l_mid))
    return res, lse_out


def interval_to_dd(lo: mpmath.mpf, hi: mpmath.mpf) -> tuple[float, float, float]:
    with mpmath.mp.workprec(max(mpmath.mp.prec, 64 + max(lo._mpf_[3], hi._mpf_[3]))):
        mid = (lo + hi) / 2
        rad = (hi - lo) / 2
        h, lw = ex.dd_from_mpf(mid)
        conv = abs(mid - h - lw)
        err = float((rad + conv) * (1 + mpmath.mpf(2) ** -50)) + 2.0**-1074
    return h, lw, err


def strict_fill(problem, scale, fmt, b, h, rows, todo_o, todo_lse, res, prec, max_prec, stats):
    """Strictly (re)compute the flagged elements of one head with Ziv escalation, in place."""
    kvh = problem.kv_head(h)
    shift = -(problem.fmt.emin - problem.fmt.p + 1)
    kfull = finite_or_zero(problem.k[b, kvh])
    vfull = finite_or_zero(problem.v[b, kvh])
    k_int_all = v_iv_all = None
    for r in np.flatnonzero(todo_o.any(axis=1) | todo_lse):
        i = rows[r]
        keep = problem.keep(b, h, np.array([i]))[0]
        if not keep.any():
            continue
        if k_int_all is None:
            k_int_all = to_ints(kfull, shift)
            # interval copies of V made once per head (exact: doubles convert exactly)
            v_iv_all = np.array([[iv.mpf(x) for x in row] for row in vfull], dtype=object)
            v_iv_all = v_iv_all.reshape(vfull.shape)
        qrow = finite_or_zero(problem.q[b, h, i])
        q_int = to_ints(qrow, shift)
        k_int = k_int_all[keep]
        vk = vfull[keep]
        cols = list(np.flatnonzero(todo_o[r]))
        need_lse = bool(todo_lse[r])
        p = prec
        while True:
            stats["strict_evaluations"] += 1
            stats["max_prec_used"] = max(stats["max_prec_used"], p)
            vals, lse = _strict_row(q_int, k_int, vk, v_iv_all[keep], cols, 2 * shift, scale, p)
            left = []
            for c in cols:
                lo, hi, w = vals[c]
                dh, dl, err = interval_to_dd(lo, hi)
                decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
                ok = err <= target(np.array(w), fmt)
                res["o_hi"][r, c], res["o_lo"][r, c], res["o_err"][r, c] = dh, dl, err
                res["o_floor"][r, c] = w
                res["o_rounded"][r, c] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
                res["o_certified"][r, c] = bool(decided and ok)
                if not (decided and ok):
                    left.append(c)
            lse_left = False
            if need_lse:
                lo, hi, w = lse
                dh, dl, err = interval_to_dd(lo, hi)
                decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
                ok = err <= target(np.array(max(w, abs(dh))), fmt)
                res["lse_hi"][r], res["lse_lo"][r], res["lse_err"][r] = dh, dl, err
                res["lse_floor"][r] = w
                res["lse_rounded"][r] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
                res["lse_certified"][r] = bool(decided and ok)
                lse_left = not (decided and ok)
            if (not left and not lse_left) or p >= max_prec:
                break
            cols, need_lse, p = left, lse_left, min(2 * p, max_prec)
