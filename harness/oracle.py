"""The mpmath oracle: attention outputs to ≥ 100 bits, with certified error bounds.

``oracle(q, k, v, ...)`` evaluates the attention of :mod:`harness.semantics` and returns, for
every requested output element ``O[b, h, i, c]`` and ``LSE[b, h, i]``:

- the value as a double-double ``hi + lo``;
- ``err``: a certified bound on ``|hi + lo − exact|``;
- the floor scale ``W_c = Σ_j p_j |v_jc|`` (for LSE: ``Σ_j p_j |s_j|``), to ~1e-12 relative;
- ``rounded``: the exact value correctly rounded (nearest-even) into the target format;
- ``certified``: the bound is within ``2^−100 · W`` (or far below the format's smallest
  subnormal) and decides the rounding.

Two modes that must agree (tests check that they do):

``strict``
    Every operation in mpmath interval arithmetic (``mpmath.iv``) at working precision
    ``prec``: the interval is the certificate. Score dot products are formed as exact Python
    integers first. Elements that miss the accuracy target, or whose interval straddles a
    rounding boundary of the target format, are recomputed at doubled precision up to
    ``max_prec`` (Ziv's strategy). A value exactly on a rounding boundary (e.g. the mean of two
    neighbouring fp16 values) is decided only when its interval is a single point (an exact
    evaluation); otherwise it keeps ``certified = False`` and ``rounded`` applies ties-to-even to
    the best estimate.

``fast``
    Exact scores from exact float64 slice products (see :mod:`harness.exact`: products of two
    fp16/bf16/fp32 values have ≤ 48 significant bits and fit a double), a double-double
    softmax with per-element certified bounds, ``P·V`` and the row sums by slice products again,
    mpmath for ``1/l`` and ``log l`` per row. Every element that is not certified is recomputed
    by the strict path (the Ziv-style fallback), so both modes certify the same contract.

``docs/oracle.md`` gives the derivation of every bound used here.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import mpmath
import numpy as np
from mpmath import iv

from harness import exact as ex
from harness.formats import Format, format_of, round_mpf, round_to_format, ulp
from harness.semantics import AttentionProblem, make_problem, nan_rows_and_cols

__all__ = ["ACCURACY_BITS", "OracleResult", "oracle"]

ACCURACY_BITS = 100
MIN_PREC = 110  # below this, a working precision cannot deliver ACCURACY_BITS
_SLACK = 1.0 + 2.0**-30  # absorbs second-order terms and the rounding of bound arithmetic


@dataclass
class OracleResult:
    """Oracle values for the requested rows; arrays are ``(B, Hq, R, dv)`` or ``(B, Hq, R)``."""

    fmt: Format
    rows: np.ndarray
    mode: str
    o_hi: np.ndarray
    o_lo: np.ndarray
    o_err: np.ndarray
    o_floor: np.ndarray
    o_rounded: np.ndarray
    o_certified: np.ndarray
    lse_hi: np.ndarray
    lse_lo: np.ndarray
    lse_err: np.ndarray
    lse_floor: np.ndarray
    lse_rounded: np.ndarray
    lse_certified: np.ndarray
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def o(self) -> np.ndarray:
        """The output rounded to float64 (``hi`` is the nearest double of ``hi + lo``)."""
        return self.o_hi

    @property
    def lse(self) -> np.ndarray:
        return self.lse_hi


# ---------------------------------------------------------------------------------------------
# Scale


@dataclass(frozen=True)
class _Scale:
    mp: mpmath.mpf  # the scale to 300 bits (exact when the scale is a double)
    hi: float
    lo: float
    err: float  # bound on |scale − hi − lo|
    given: float | None
    d: int

    def interval(self) -> Any:
        if self.given is not None:
            return iv.mpf(self.given)
        return 1 / iv.sqrt(iv.mpf(self.d))


def _scale_of(problem: AttentionProblem) -> _Scale:
    d = problem.q.shape[-1]
    with mpmath.mp.workprec(300):
        if problem.scale is not None:
            val = mpmath.mpf(problem.scale)
            return _Scale(val, problem.scale, 0.0, 0.0, problem.scale, d)
        val = 1 / mpmath.sqrt(d)
        hi, lo = ex.dd_from_mpf(val)
        # The dd's actual distance to the 300-bit value, plus that value's own error.
        err = float(
            abs(val - hi - lo) * (1 + mpmath.mpf(2) ** -40) + abs(val) * mpmath.mpf(2) ** -290
        )
    return _Scale(val, hi, lo, err, None, d)


# ---------------------------------------------------------------------------------------------
# Rounding decisions


def _decide(hi: np.ndarray, lo: np.ndarray, err: np.ndarray, fmt: Format):
    """Correctly rounded value of ``hi + lo ± err`` in ``fmt`` and whether it is decided."""
    b = err + np.abs(lo)
    with np.errstate(invalid="ignore", over="ignore"):
        lo_end = np.nextafter(hi - b, -np.inf)
        hi_end = np.nextafter(hi + b, np.inf)
    r_lo = round_to_format(lo_end, fmt)
    r_hi = round_to_format(hi_end, fmt)
    decided = (r_lo == r_hi) | ~np.isfinite(hi)  # ±inf (LSE of a masked row) and NaN are exact
    best = round_to_format(hi, fmt)
    # hi exactly on a midpoint of fmt: the sign of lo decides (|lo| < half a double ulp of hi,
    # so no other rounding boundary lies between hi and hi + lo).
    with np.errstate(invalid="ignore"):
        half = ulp(hi, fmt) / 2
        tie = np.isfinite(hi) & (np.abs(hi - best) == half) & (lo != 0)
    if np.any(tie):
        toward = round_to_format(hi + np.sign(lo) * half, fmt)
        best = np.where(tie, toward, best)
    return np.where(np.isfinite(hi), np.where(decided, r_lo, best), hi), decided


def _target(floor: np.ndarray, fmt: Format) -> np.ndarray:
    return np.maximum(
        np.ldexp(floor, -ACCURACY_BITS) * (1 - 2.0**-30), fmt.min_subnormal * 2.0**-ACCURACY_BITS
    )


# ---------------------------------------------------------------------------------------------
# Fast path: one (batch, head), all requested rows at once


def _prepare_keys(k, v):
    """Per-head work shared by all row blocks: exact slices of K and of ``[V | 1]``."""
    nk, d = k.shape
    bd = ex.beta_for(d)
    bn = ex.beta_for(nk)
    ks, _ = ex.slice_rows(k, None, bd)
    v_aug = np.concatenate([v, np.ones((nk, 1))], axis=1)
    vs, _ = ex.slice_rows(v_aug.T, None, bn)
    return {"ks": ks, "vs": vs, "abs_v": np.abs(v_aug), "bd": bd, "bn": bn, "shape": v.shape}


def _fast_head(q, keep, prep, scale: _Scale):
    """Double-double evaluation with certified bounds; see docs/oracle.md §3."""
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
        dh, dl, derr = ex.expansion_to_dd([*expansion, np.broadcast_to(-m2[:, None], s0.shape)])
    else:
        m2 = np.zeros_like(m2)
    xh, xl, xerr = ex.dd_mul_err(dh, dl, scale.hi, scale.lo)
    xerr = (xerr + abs(scale.hi) * derr + scale.err * np.abs(dh)) * _SLACK + 2.0**-1000
    xh = np.where(keep, xh, -1e4)
    xl = np.where(keep, xl, 0.0)

    # 3. e = exp(x): relative error eps (exp's own and x's), absolute EXP_FLUSH_ABS.
    eh, el, rel = ex.dd_exp(xh, xl)
    eps = (rel + xerr * (1 + xerr)) * _SLACK
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
    o_err = (o_err * (1 + 2 * rel_l[:, None]) + mul_err + 1.01 * ex.U2 * np.abs(oh)) * _SLACK
    lse_err = (rel_l * (1 + rel_l) + lse_round) * _SLACK + ex.U2 * np.abs(lse_h)
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
    return out


_BLOCK_ELEMENTS = 1 << 16  # rows × keys per block: keeps the elementwise work in cache


def _fast_rows(q, k, v, keep, scale: _Scale):
    """:func:`_fast_head` over blocks of rows (rows are independent), results stacked."""
    step = max(32, _BLOCK_ELEMENTS // max(k.shape[0], 1))
    prep = _prepare_keys(k, v)
    parts = [
        _fast_head(q[i : i + step], keep[i : i + step], prep, scale)
        for i in range(0, q.shape[0], step)
    ]
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


# ---------------------------------------------------------------------------------------------
# Strict path: one row, interval arithmetic


def _to_ints(x: np.ndarray, shift: int) -> np.ndarray:
    """Exact integers ``x·2^shift`` (object array); every fmt value times 2^shift is an integer."""
    scaled = np.ldexp(x, shift)
    return np.array([int(t) for t in scaled.ravel()], dtype=object).reshape(x.shape)


def _mpf(x: Any) -> mpmath.mpf:
    return mpmath.mp.make_mpf(x)


@contextlib.contextmanager
def _iv_prec(prec: int):
    # mpmath.iv has no workprec(); its precision is a plain attribute.
    old = iv.prec
    iv.prec = prec
    try:
        yield
    finally:
        iv.prec = old


def _strict_row(q_int, k_int, v, v_iv, cols, shift2: int, scale: _Scale, prec: int):
    """Interval evaluation of one query row over its kept keys (k_int, v already selected).

    Returns ``{c: (lo, hi, floor)}`` for the requested columns and ``(lo, hi, floor)`` for LSE,
    endpoints as mpmath numbers.
    """
    with _iv_prec(prec):
        t_int = k_int.dot(q_int) if len(k_int) else np.array([], dtype=object)
        pow2 = iv.mpf(2) ** (-shift2)
        sc = scale.interval()
        s = [sc * (iv.mpf(int(t)) * pow2) for t in t_int]
        m = max(_mpf(x._mpi_[1]) for x in s)
        m_iv = iv.mpf(m)
        e = [iv.exp(x - m_iv) for x in s]
        lsum = iv.mpf(0)
        for x in e:
            lsum += x
        # W (a scale, needed to ~1e-12 only) in float64 from the interval midpoints.
        e_mid = np.array([float(_mpf(x._mpi_[0])) for x in e])
        l_mid = float(_mpf(lsum._mpi_[0]))
        res = {}
        for c in cols:
            num = iv.mpf(0)
            for x, vv, vi in zip(e, v[:, c], v_iv[:, c], strict=True):
                if vv != 0.0:
                    num += x * vi
            o = num / lsum
            w = float(np.dot(e_mid, np.abs(v[:, c])) / l_mid)
            res[c] = (_mpf(o._mpi_[0]), _mpf(o._mpi_[1]), w)
        lse = iv.log(lsum) + iv.mpf(m)
        s_mid = np.array([abs(float(_mpf(x._mpi_[0]))) for x in s])
        lse_out = (_mpf(lse._mpi_[0]), _mpf(lse._mpi_[1]), float(np.dot(e_mid, s_mid) / l_mid))
    return res, lse_out


def _interval_to_dd(lo: mpmath.mpf, hi: mpmath.mpf) -> tuple[float, float, float]:
    with mpmath.mp.workprec(max(mpmath.mp.prec, 64 + max(lo._mpf_[3], hi._mpf_[3]))):
        mid = (lo + hi) / 2
        rad = (hi - lo) / 2
        h, lw = ex.dd_from_mpf(mid)
        conv = abs(mid - h - lw)
        err = float((rad + conv) * (1 + mpmath.mpf(2) ** -50)) + 2.0**-1074
    return h, lw, err


def _strict_fill(problem, scale, fmt, b, h, rows, todo_o, todo_lse, res, prec, max_prec, stats):
    """Strictly (re)compute the flagged elements of one head with Ziv escalation, in place."""
    kvh = problem.kv_head(h)
    shift = -(problem.fmt.emin - problem.fmt.p + 1)
    kfull = np.nan_to_num(problem.k[b, kvh], nan=0.0, posinf=0.0, neginf=0.0)
    vfull = np.nan_to_num(problem.v[b, kvh], nan=0.0, posinf=0.0, neginf=0.0)
    k_int_all = v_iv_all = None
    for r in np.flatnonzero(todo_o.any(axis=1) | todo_lse):
        i = rows[r]
        keep = problem.keep(b, h, np.array([i]))[0]
        if not keep.any():
            continue
        if k_int_all is None:
            k_int_all = _to_ints(kfull, shift)
            # interval copies of V made once per head (exact: doubles convert exactly)
            v_iv_all = np.array([[iv.mpf(x) for x in row] for row in vfull], dtype=object)
            v_iv_all = v_iv_all.reshape(vfull.shape)
        qrow = np.nan_to_num(problem.q[b, h, i], nan=0.0, posinf=0.0, neginf=0.0)
        q_int = _to_ints(qrow, shift)
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
                dh, dl, err = _interval_to_dd(lo, hi)
                decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
                ok = err <= _target(np.array(w), fmt)
                res["o_hi"][r, c], res["o_lo"][r, c], res["o_err"][r, c] = dh, dl, err
                res["o_floor"][r, c] = w
                res["o_rounded"][r, c] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
                res["o_certified"][r, c] = bool(decided and ok)
                if not (decided and ok):
                    left.append(c)
            lse_left = False
            if need_lse:
                lo, hi, w = lse
                dh, dl, err = _interval_to_dd(lo, hi)
                decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
                ok = err <= _target(np.array(max(w, abs(dh))), fmt)
                res["lse_hi"][r], res["lse_lo"][r], res["lse_err"][r] = dh, dl, err
                res["lse_floor"][r] = w
                res["lse_rounded"][r] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
                res["lse_certified"][r] = bool(decided and ok)
                lse_left = not (decided and ok)
            if (not left and not lse_left) or p >= max_prec:
                break
            cols, need_lse, p = left, lse_left, min(2 * p, max_prec)


# ---------------------------------------------------------------------------------------------
# Public entry point


def oracle(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: Any = None,
    mask: Any = None,
    scale: float | None = None,
    fmt: Any = None,
    rows: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
) -> OracleResult:
    """Attention ``O = softmax(scale·QKᵀ + mask)·V`` and ``LSE`` to ≥ 100 bits, certified.

    Args:
        q, k, v: ``(B, Hq, Nq, d)``, ``(B, Hk, Nk, d)``, ``(B, Hk, Nk, dv)`` numpy arrays or torch
            tensors (any device) of one format: float16, bfloat16 or float32. Their values are
            taken as exact.
        causal, window, mask: masking as in :mod:`harness.semantics` (bottom-right aligned).
        scale: the float the kernel is given; ``None`` means the exact real ``1/sqrt(d)``.
        fmt: format of the correctly rounded results (default: the input format).
        rows: query rows to evaluate (rows are independent); default all ``Nq`` rows.
        mode: ``"fast"`` or ``"strict"`` (see the module docstring).
        prec: starting working precision of the strict path, in bits (≥ 110).
        max_prec: the precision at which Ziv escalation stops.

    Returns:
        :class:`OracleResult` with arrays of shape ``(B, Hq, R, dv)`` (O) and ``(B, Hq, R)`` (LSE).
    """
    problem = make_problem(q, k, v, causal=causal, window=window, mask=mask, scale=scale)
    if mode not in ("fast", "strict"):
        raise ValueError(f"mode must be 'fast' or 'strict', got {mode!r}")
    if not isinstance(prec, int) or prec < MIN_PREC:
        raise ValueError(
            f"prec={prec!r} bits cannot deliver the oracle's {ACCURACY_BITS}-bit accuracy; "
            f"use prec >= {MIN_PREC} (default 128)"
        )
    if not isinstance(max_prec, int) or max_prec < prec:
        raise ValueError(f"max_prec ({max_prec!r}) must be an int >= prec ({prec})")
    target_fmt = problem.fmt if fmt is None else format_of(fmt)
    if not target_fmt.storage:
        raise ValueError(f"{target_fmt.name} has no storage format to round results into")
    bsz, hq, _, nq, _, _, dv = problem.shape
    if rows is None:
        row_idx = np.arange(nq)
    else:
        row_idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if row_idx.size and (row_idx.min() < 0 or row_idx.max() >= nq):
            raise ValueError(f"rows must lie in [0, {nq}), got {rows!r}")
    r_n = row_idx.size
    sc = _scale_of(problem)
    t0 = time.perf_counter()
    stats = {"strict_evaluations": 0, "max_prec_used": 0, "fallback_elements": 0}

    arrays = {
        name: np.zeros((bsz, hq, r_n, dv))
        for name in ("o_hi", "o_lo", "o_err", "o_floor", "o_rounded")
    }
    arrays.update({name: np.zeros((bsz, hq, r_n)) for name in ("lse_lo", "lse_err", "lse_floor")})
    arrays["lse_hi"] = np.full((bsz, hq, r_n), -np.inf)
    arrays["lse_rounded"] = np.full((bsz, hq, r_n), -np.inf)
    o_cert = np.ones((bsz, hq, r_n, dv), dtype=bool)
    lse_cert = np.ones((bsz, hq, r_n), dtype=bool)

    for b in range(bsz):
        for h in range(hq):
            kvh = problem.kv_head(h)
            keep = problem.keep(b, h, row_idx)
            qr = problem.q[b, h][row_idx]
            kk, vv = problem.k[b, kvh], problem.v[b, kvh]
            row_nan, elem_nan = nan_rows_and_cols(qr, kk, vv, keep)
            view = {name: arr[b, h] for name, arr in arrays.items()}
            view["o_certified"] = o_cert[b, h]
            view["lse_certified"] = lse_cert[b, h]
            has = keep.any(axis=1)
            if mode == "fast":
                fin = lambda a: np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)  # noqa: E731
                res = _fast_rows(fin(qr), fin(kk), fin(vv), keep, sc)
                for name, val in res.items():
                    view[name][...] = val
                view["o_rounded"][...], dec_o = _decide(
                    res["o_hi"], res["o_lo"], res["o_err"], target_fmt
                )
                view["lse_rounded"][...], dec_l = _decide(
                    res["lse_hi"], res["lse_lo"], res["lse_err"], target_fmt
                )
                ok_o = dec_o & (res["o_err"] <= _target(res["o_floor"], target_fmt))
                # LSE's scale is max(W, |LSE|): W = Σ p|s| is 0 for all-zero scores, LSE = log n.
                lse_scale = np.maximum(res["lse_floor"], np.abs(res["lse_hi"]))
                ok_l = dec_l & (res["lse_err"] <= _target(lse_scale, target_fmt))
                ok_l |= ~has
                todo_o = ~ok_o & ~elem_nan & has[:, None]
                todo_l = ~ok_l & ~row_nan
                start = max(prec, 2 * MIN_PREC)
            else:
                todo_o = ~elem_nan & has[:, None]
                todo_l = ~row_nan & has
                start = prec
            stats["fallback_elements"] += int(todo_o.sum() + todo_l.sum()) if mode == "fast" else 0
            if todo_o.any() or todo_l.any():
                _strict_fill(
                    problem,
                    sc,
                    target_fmt,
                    b,
                    h,
                    row_idx,
                    todo_o,
                    todo_l,
                    view,
                    start,
                    max_prec,
                    stats,
                )
            # NaN rule last: it overrides whatever was computed from sanitized inputs.
            for name in ("o_hi", "o_rounded"):
                view[name][elem_nan] = np.nan
            for name in ("o_lo", "o_err", "o_floor"):
                view[name][elem_nan] = 0.0
            for name in ("lse_hi", "lse_rounded"):
                view[name][row_nan] = np.nan
            for name in ("lse_lo", "lse_err", "lse_floor"):
                view[name][row_nan] = 0.0
            view["o_certified"][elem_nan] = True
            view["lse_certified"][row_nan | ~has] = True
            view["lse_rounded"][~has & ~row_nan] = -np.inf

    stats["seconds"] = time.perf_counter() - t0
    return OracleResult(
        fmt=target_fmt,
        rows=row_idx,
        mode=mode,
        o_certified=o_cert,
        lse_certified=lse_cert,
        stats=stats,
        **arrays,
    )
