"""Oracle for attention with soft-capping and sinks: O and LSE, the interval path.

With ``softcap = c`` every kept score ``s_j = τ·q·k_j`` becomes ``y_j = c·tanh(s_j/c)``; with a
sink ``σ`` (one per query head) the row's denominator gains ``exp(σ)``, which has no value row:

    l = exp(σ) + Σ_j exp(y_j),   O_c = Σ_j exp(y_j)·v_jc / l,   LSE = log l

(without a sink the ``exp(σ)`` term is absent; without a cap ``y = s``). A row that keeps no key
gives ``O = 0`` and ``LSE = σ`` (``−inf`` without a sink).

Every step is an mpmath interval (``mpmath.iv``) at working precision ``prec``: the scores are
exact integers first, ``tanh(x) = 1 − 2/(exp(2x) + 1)`` is monotone in its one occurrence of
``x``, so its interval encloses the exact value, and the interval of each result is its
certificate. Elements that miss the accuracy target or straddle a rounding boundary of the
target format are recomputed at doubled precision (Ziv), as the strict path does without these
options. This is ``mode="strict"``; the fast mode (:mod:`.options_fast`) sends here only the
elements its bounds do not certify (docs/oracle.md §10).
"""

from __future__ import annotations

from typing import Any

import mpmath
import numpy as np
from mpmath import iv

from ..core.formats import Format, round_mpf, round_to_format
from ..core.semantics import AttentionProblem, nan_rows_and_cols
from .common import MIN_PREC, Scale, decide, finite_or_zero, target
from .options_fast import options_fast_rows
from .strict import interval_to_dd, iv_prec, mpf_of, to_ints
from .tensor import CertifiedTensor

__all__ = ["capped", "logits", "options_forward", "sech2", "shift_of", "store_interval"]


def capped(x: Any, cap: float) -> Any:
    """``c·tanh(x/c)`` of an interval ``x`` (an enclosure: every step is monotone)."""
    c = iv.mpf(cap)
    return c * (1 - 2 / (iv.exp(2 * x / c) + 1))


def sech2(x: Any, cap: float) -> Any:
    """``1 − tanh²(x/c) = (2/(e^{x/c} + e^{−x/c}))²`` of an interval ``x``: the derivative of
    :func:`capped`, with a relative (not absolute) accuracy far beyond the cap."""
    z = x / iv.mpf(cap)
    return (2 / (iv.exp(z) + iv.exp(-z))) ** 2


def shift_of(problem: AttentionProblem) -> int:
    """Every value of the input format times ``2^shift`` is an integer."""
    return -(problem.fmt.emin - problem.fmt.p + 1)


def logits(q_int, k_int, shift2: int, scale: Scale, cap: float | None) -> list:
    """The row's (capped) scores as intervals, from exact integer dot products."""
    t_int = k_int.dot(q_int) if len(k_int) else np.array([], dtype=object)
    pow2 = iv.mpf(2) ** (-shift2)
    sc = scale.interval()
    s = [sc * (iv.mpf(int(t)) * pow2) for t in t_int]
    return s if cap is None else [capped(x, cap) for x in s]


def _row(q_int, k_int, v, v_iv, shift2, scale, cap, sink, *, cols, prec):
    """One row: ``{c: (lo, hi, floor)}`` for the columns and ``(lo, hi, floor)`` for LSE.
    Floors: ``W_c = Σ_j p_j|v_jc|`` and ``Σ_j p_j|y_j| + p_σ|σ|`` (p over the full
    denominator, the sink's term included)."""
    with iv_prec(prec):
        y = logits(q_int, k_int, shift2, scale, cap)
        tops = [mpf_of(x._mpi_[1]) for x in y] + ([mpmath.mpf(sink)] if sink is not None else [])
        m = iv.mpf(max(tops))
        e = [iv.exp(x - m) for x in y]
        lsum = iv.mpf(0)
        for x in e:
            lsum += x
        e_sink = iv.exp(iv.mpf(sink) - m) if sink is not None else None
        if e_sink is not None:
            lsum += e_sink
        # Floor scales to ~1e-12 only: float64 from lower ends, relative to the largest term.
        e_lo = [mpf_of(x._mpi_[0]) for x in e]
        s_lo = mpf_of(e_sink._mpi_[0]) if e_sink is not None else mpmath.mpf(0)
        top = max([*e_lo, s_lo]) or mpmath.mpf(1)
        e_mid = np.array([float(x / top) for x in e_lo])
        l_mid = float(mpf_of(lsum._mpi_[0]) / top)
        res = {}
        for c in cols:
            num = iv.mpf(0)
            for x, vv, vi in zip(e, v[:, c], v_iv[:, c], strict=True):
                if vv != 0.0:
                    num += x * vi
            o = num / lsum
            res[c] = (
                mpf_of(o._mpi_[0]),
                mpf_of(o._mpi_[1]),
                float(e_mid @ np.abs(v[:, c]) / l_mid),
            )
        lse = iv.log(lsum) + m
        y_mid = np.array([abs(float(mpf_of(x._mpi_[0]))) for x in y])
        w = float(e_mid @ y_mid / l_mid)
        if sink is not None:
            w += float(s_lo / top) * abs(sink) / l_mid
        return res, (mpf_of(lse._mpi_[0]), mpf_of(lse._mpi_[1]), w)


def store_interval(view: dict, name: str, idx: Any, lo, hi, floor: float, fmt: Format) -> bool:
    """Write one interval's dd, bound, floor and rounding; True when it is certified."""
    dh, dl, err = interval_to_dd(lo, hi)
    decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
    ok = bool(decided and err <= target(np.array(floor), fmt))
    view[f"{name}_hi"][idx], view[f"{name}_lo"][idx], view[f"{name}_err"][idx] = dh, dl, err
    view[f"{name}_floor"][idx] = floor
    view[f"{name}_rounded"][idx] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
    view[f"{name}_certified"][idx] = ok
    return ok


def _fill_row(args, view, r, fmt, prec, max_prec, stats, cols, need_lse) -> None:
    """Ziv loop of one row: recompute the uncertified columns (and LSE) at doubled precision."""
    p = prec
    while True:
        stats["strict_evaluations"] += 1
        stats["max_prec_used"] = max(stats["max_prec_used"], p)
        vals, lse = _row(*args, cols=cols, prec=p)
        cols = [c for c in cols if not store_interval(view, "o", (r, c), *vals[c], fmt)]
        if need_lse:
            lo, hi, w = lse
            scale_l = max(w, abs(float(lo)))  # LSE's scale is max(W, |LSE|)
            need_lse = not store_interval(view, "lse", r, lo, hi, scale_l, fmt)
            view["lse_floor"][r] = w
        if (not cols and not need_lse) or p >= max_prec:
            return
        p = min(2 * p, max_prec)


# What the fast path's float64 and double-double arithmetic raises where a cap or a sink
# puts the values past its range (an exponent over 700, a sum that underflows to 0).
FAST_PATH_LIMITS = (ValueError, ZeroDivisionError, OverflowError, FloatingPointError)


def _fast(view, args, fmt: Format, row_nan, elem_nan):
    """The fast path's O and LSE of one head (:mod:`.options_fast`) into ``view``; returns the
    elements it does not certify (``(R, dv)`` and ``(R,)``), for the interval path."""
    has = args[3].any(axis=1)
    try:
        with np.errstate(divide="raise", invalid="raise", over="raise"):
            res = options_fast_rows(*args)
    except FAST_PATH_LIMITS:
        # The interval path, which has no such limit, takes every row of the head.
        return ~elem_nan & has[:, None], ~row_nan & has
    for name in ("o", "lse"):
        for f in ("hi", "lo", "err", "floor"):
            key = f"{name}_{f}"
            view[key][has] = res[key][has]
    o_round, dec_o = decide(res["o_hi"], res["o_lo"], res["o_err"], fmt)
    l_round, dec_l = decide(res["lse_hi"], res["lse_lo"], res["lse_err"], fmt)
    ok_o = dec_o & (res["o_err"] <= target(res["o_floor"], fmt))
    lse_scale = np.maximum(res["lse_floor"], np.abs(res["lse_hi"]))
    ok_l = dec_l & (res["lse_err"] <= target(lse_scale, fmt))
    view["o_rounded"][has] = o_round[has]
    view["lse_rounded"][has] = l_round[has]
    view["o_certified"][has] = ok_o[has]
    view["lse_certified"][has] = ok_l[has]
    return ~ok_o & ~elem_nan & has[:, None], ~ok_l & ~row_nan & has


def options_forward(
    problem: AttentionProblem,
    sc: Scale,
    fmt: Format,
    rows: np.ndarray,
    mode: str,
    prec: int,
    max_prec: int,
    stats: dict[str, Any],
) -> dict[str, CertifiedTensor]:
    """O and LSE of the requested rows with the problem's soft-cap and sinks, certified: the
    fast path (:mod:`.options_fast`) with the interval path for what it does not certify, or
    the interval path throughout (``mode="strict"``). NaN inputs follow the rule of
    :func:`~flashcheck.harness.core.semantics.nan_rows_and_cols` (a sink is finite and
    poisons nothing). Longer than 80 lines: one loop over heads whose two paths share every
    array view."""
    bsz, hq, _, _, _, _, dv = problem.shape
    r_n = rows.size
    arrays = {f"o_{f}": np.zeros((bsz, hq, r_n, dv)) for f in ("hi", "lo", "err", "floor")}
    arrays.update({f"lse_{f}": np.zeros((bsz, hq, r_n)) for f in ("hi", "lo", "err", "floor")})
    arrays["o_rounded"] = np.zeros((bsz, hq, r_n, dv))
    arrays["lse_rounded"] = np.zeros((bsz, hq, r_n))
    arrays["o_certified"] = np.ones((bsz, hq, r_n, dv), dtype=bool)
    arrays["lse_certified"] = np.ones((bsz, hq, r_n), dtype=bool)
    shift = shift_of(problem)
    for b in range(bsz):
        for h in range(hq):
            kvh = problem.kv_head(h)
            keep = problem.keep(b, h, rows)
            kk, vv = finite_or_zero(problem.k[b, kvh]), finite_or_zero(problem.v[b, kvh])
            row_nan, elem_nan = nan_rows_and_cols(
                problem.q[b, h][rows], problem.k[b, kvh], problem.v[b, kvh], keep
            )
            view = {name: arr[b, h] for name, arr in arrays.items()}
            sink = None if problem.sinks is None else float(problem.sinks[h])
            empty = -np.inf if sink is None else sink
            view["lse_hi"][...] = empty
            view["lse_rounded"][...] = round_to_format(np.array(empty), fmt)
            has = keep.any(axis=1)
            todo_o, todo_l = ~elem_nan & has[:, None], ~row_nan & has
            start = prec
            if mode == "fast" and has.any():
                fast_args = (
                    finite_or_zero(problem.q[b, h][rows]),
                    kk,
                    vv,
                    keep,
                    sc,
                    problem.softcap,
                    sink,
                )
                todo_o, todo_l = _fast(view, fast_args, fmt, row_nan, elem_nan)
                stats["fallback_elements"] += int(todo_o.sum() + todo_l.sum())
                start = max(prec, 2 * MIN_PREC)
            pending = np.flatnonzero(todo_o.any(axis=1) | (todo_l & has))
            if pending.size:
                k_int = to_ints(kk, shift)
                v_iv = np.array([[iv.mpf(x) for x in row] for row in vv], dtype=object)
                v_iv = v_iv.reshape(vv.shape)
            for r in pending:
                sel = keep[r]
                cols = list(np.flatnonzero(todo_o[r]))
                q_int = to_ints(finite_or_zero(problem.q[b, h, rows[r]]), shift)
                args = (q_int, k_int[sel], vv[sel], v_iv[sel], 2 * shift, sc, problem.softcap, sink)
                _fill_row(args, view, r, fmt, start, max_prec, stats, cols, bool(todo_l[r]))
            for name in ("o_hi", "o_rounded"):
                view[name][elem_nan] = np.nan
            for name in ("o_lo", "o_err", "o_floor"):
                view[name][elem_nan] = 0.0
            view["o_certified"][elem_nan] = True
            for name in ("lse_hi", "lse_rounded"):
                view[name][row_nan] = np.nan
            for name in ("lse_lo", "lse_err", "lse_floor"):
                view[name][row_nan] = 0.0
            view["lse_certified"][row_nan] = True
    return {name: CertifiedTensor.from_fields(arrays, f"{name}_") for name in ("o", "lse")}
