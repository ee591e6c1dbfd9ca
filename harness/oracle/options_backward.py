"""Gradient oracle with soft-capping and sinks: dQ, dK, dV and the sink gradient dσ.

Per row ``i`` of query head ``h`` (weights over the full denominator, the sink's included):

    P_ij = exp(y_ij − LSE_i),   P_iσ = exp(σ_h − LSE_i),   dP_ij = dO_i·v_j
    D_i = Σ_j P_ij dP_ij (= dO_i·O_i: the sink has no value row)
    dS_ij = P_ij (dP_ij − D_i) · (1 − tanh²(s_ij/c))       (the last factor only with a cap)
    dQ = τ·dS·K,   dK = τ·Σ_g dS_gᵀ·Q_g,   dV = Σ_g P_gᵀ·dO_g
    dσ_h = −Σ_{b, i} P_iσ·D_i                               (every row of head h, every batch)

Every quantity is an mpmath interval at working precision ``prec`` (scores and ``dP`` exact
integers first); elements whose interval misses the accuracy target or straddles a rounding
boundary are recomputed at doubled precision up to ``max_prec``. Floors (docs/oracle.md):
``F_ij = P_ij(|dP_ij| + |D_i|)·(1 − tanh²)`` for dQ and dK as without options, ``Σ_i P_ij|dO_ic|``
for dV, and ``Σ_{b,i} P_iσ·Σ_j P_ij|dP_ij|`` for dσ. This interval path is ``mode="strict"``;
the fast mode (:mod:`.options_backward_fast`) leaves it only what its bounds do not certify.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpmath import iv

from ..core.formats import Format
from ..core.semantics import AttentionProblem
from .common import MIN_PREC, Scale, finite_or_zero
from .options import capped, sech2, shift_of, store_interval
from .options_backward_fast import fast_gradients
from .strict import iv_prec, mpf_of, to_ints
from .tensor import FIELDS, CertifiedTensor

__all__ = ["gradient_nan", "options_gradients"]

_ZERO = iv.mpf(0)


def gradient_nan(q, k, v, do, keep):
    """Which gradients a NaN or ±inf input poisons, for one group (``(G, Nq)`` rows of dQ,
    ``(Nk,)`` rows of dK and dV). A row that keeps a key involves all of ``q_i``, ``dO_i``
    (through ``D_i``, which every ``dS_ij`` uses) and every kept ``k_j``, ``v_j``: any
    non-finite value among them poisons the whole row, its dQ and the dK, dV of every key it
    keeps. Rows that keep no key contribute nothing."""
    has = keep.any(axis=2)
    bad_k = ~np.isfinite(k).all(axis=1) | ~np.isfinite(v).all(axis=1)
    bad_row = ~np.isfinite(q).all(axis=2) | ~np.isfinite(do).all(axis=2)
    bad_row = has & (bad_row | (keep & bad_k[None, None, :]).any(axis=2))
    bad_key = (keep & bad_row[:, :, None]).any(axis=(0, 1))
    return bad_row, bad_key


def _approx(x: Any) -> float:
    with np.errstate(invalid="ignore", over="ignore"):
        return float(mpf_of(x._mpi_[0]))


def _row_level(s, dpr, cap, sink):
    """One row's weights, ``dS`` and sink term from its raw score intervals ``s`` and exact
    ``dP`` intervals: ``(P, dS, F, sink_val, sink_floor)``."""
    y = s if cap is None else [capped(x, cap) for x in s]
    tops = [x._mpi_[1] for x in y] + ([iv.mpf(sink)._mpi_[1]] if sink is not None else [])
    m = iv.mpf(max(mpf_of(t) for t in tops))
    e = [iv.exp(x - m) for x in y]
    total = _ZERO
    for x in e:
        total += x
    e_sink = iv.exp(iv.mpf(sink) - m) if sink is not None else _ZERO
    total += e_sink
    p = [x / total for x in e]
    d_i = _ZERO
    for a, b in zip(p, dpr, strict=True):
        d_i += a * b
    deriv = [iv.mpf(1)] * len(s) if cap is None else [sech2(x, cap) for x in s]
    ds = [a * (b - d_i) * g for a, b, g in zip(p, dpr, deriv, strict=True)]
    pa = np.abs([_approx(x) for x in p])
    dpa = np.abs([_approx(x) for x in dpr])
    da = np.array([abs(_approx(g)) for g in deriv])
    floor = pa * (dpa + abs(_approx(d_i))) * da
    p_sink = e_sink / total
    return p, ds, floor, -p_sink * d_i, abs(_approx(p_sink)) * float(pa @ dpa)


def _level(q, k, v, do, keep, scale: Scale, cap, sinks, shift: int, prec: int):
    """``P``, ``dS`` (interval arrays ``(G, Nq, Nk)``), the floor ``F`` and, per row, the sink
    gradient's term and floor, for one group."""
    g_n, nq, _ = q.shape
    nk = k.shape[0]
    with iv_prec(prec):
        pow2 = iv.mpf(2) ** (-2 * shift)
        sc = scale.interval()
        k_int, v_int = to_ints(k, shift), to_ints(v, shift)
        p = np.full((g_n, nq, nk), _ZERO, dtype=object)
        ds = np.full((g_n, nq, nk), _ZERO, dtype=object)
        floor = np.zeros((g_n, nq, nk))
        sink_val = np.full((g_n, nq), _ZERO, dtype=object)
        sink_floor = np.zeros((g_n, nq))
        for g in range(g_n):
            t_int = to_ints(q[g], shift).dot(k_int.T)
            dp_int = to_ints(do[g], shift).dot(v_int.T)
            sink = None if sinks is None else sinks[g]
            for i in range(nq):
                cols = np.flatnonzero(keep[g, i])
                if not len(cols):
                    continue
                s = [sc * (iv.mpf(int(t)) * pow2) for t in t_int[i, cols]]
                dpr = [iv.mpf(int(t)) * pow2 for t in dp_int[i, cols]]
                row = _row_level(s, dpr, cap, sink)
                p[g, i, cols], ds[g, i, cols], floor[g, i, cols] = row[0], row[1], row[2]
                sink_val[g, i], sink_floor[g, i] = row[3], row[4]
    return p, ds, floor, sink_val, sink_floor


def _dot(coeffs, values) -> Any:
    total = _ZERO
    for a, b in zip(coeffs, values, strict=True):
        if b != 0:
            total += a * iv.mpf(float(b))
    return total


def _empty(shape) -> dict[str, np.ndarray]:
    out = {f: np.zeros(shape) for f in FIELDS[:-1]}
    out["certified"] = np.ones(shape, dtype=bool)
    return out


def options_gradients(
    problem: AttentionProblem,
    do: np.ndarray,
    sc: Scale,
    fmt: Format,
    rows: np.ndarray,
    keys: np.ndarray,
    mode: str,
    prec: int,
    max_prec: int,
    stats: dict[str, Any],
) -> dict[str, CertifiedTensor]:
    """dQ (the requested rows), dK and dV (the requested keys) and, with sinks, ``dsinks``
    ``(Hq,)`` of the problem with its soft-cap and sinks, certified: the fast path
    (:mod:`.options_backward_fast`) and the interval path for what it leaves, or the interval
    path throughout (``mode="strict"``). Longer than 80 lines: one Ziv loop whose precision
    steps share every group's pending elements."""
    bsz, hq, hk, nq, _, d, dv = problem.shape
    group = hq // hk
    shift = shift_of(problem)
    res = {
        "dq": _empty((bsz, hq, rows.size, d)),
        "dk": _empty((bsz, hk, keys.size, d)),
        "dv": _empty((bsz, hk, keys.size, dv)),
        "dsinks": _empty((hq,)),
    }
    groups, bad_head = [], np.zeros(hq, dtype=bool)
    for b in range(bsz):
        for kvh in range(hk):
            heads = slice(kvh * group, (kvh + 1) * group)
            keep = np.stack([problem.keep(b, h, np.arange(nq)) for h in range(hq)[heads]])
            raw = (problem.q[b, heads], problem.k[b, kvh], problem.v[b, kvh], do[b, heads])
            bad_row, bad_key = gradient_nan(*raw, keep)
            bad_head[heads] |= bad_row.any(axis=1)
            todo = {
                "dq": np.zeros((group, rows.size, d), dtype=bool),
                "dk": np.repeat(~bad_key[keys, None], d, axis=1),
                "dv": np.repeat(~bad_key[keys, None], dv, axis=1),
            }
            todo["dq"][...] = ~bad_row[:, rows, None]
            groups.append(
                (b, kvh, heads, tuple(finite_or_zero(a) for a in raw), keep, todo, bad_row, bad_key)
            )
    sink_todo = problem.sinks is not None
    p_ = prec
    if mode == "fast":
        sink_todo = fast_gradients(problem, groups, res, sc, fmt, rows, keys, stats)
        p_ = max(prec, 2 * MIN_PREC)
    pending = sink_todo or any(t.any() for grp in groups for t in grp[5].values())
    while pending:
        stats["strict_evaluations"] += 1
        stats["max_prec_used"] = max(stats["max_prec_used"], p_)
        sink_sum = [_ZERO] * hq
        sink_fl = np.zeros(hq)
        for b, kvh, heads, (q, k, v, dog), keep, todo, _, _ in groups:
            if not (sink_todo or any(t.any() for t in todo.values())):
                continue
            sinks = None if problem.sinks is None else problem.sinks[heads]
            lvl = _level(q, k, v, dog, keep, sc, problem.softcap, sinks, shift, p_)
            p, ds, floor, s_val, s_fl = lvl
            pos = (b, kvh, heads, rows, keys)
            _group_elements(res, todo, pos, q, k, dog, p, ds, floor, sc, fmt, p_)
            with iv_prec(p_):
                for g, h in enumerate(range(hq)[heads]):
                    for i in range(nq):
                        sink_sum[h] += s_val[g, i]
                    sink_fl[h] += float(s_fl[g].sum())
        if sink_todo:
            sink_todo = False
            for h in range(hq):
                lo, hi = mpf_of(sink_sum[h]._mpi_[0]), mpf_of(sink_sum[h]._mpi_[1])
                ok = store_interval(_flat(res["dsinks"]), "x", h, lo, hi, sink_fl[h], fmt)
                sink_todo |= not ok and not bad_head[h]
        pending = sink_todo or any(t.any() for grp in groups for t in grp[5].values())
        if p_ >= max_prec:
            break
        p_ = min(2 * p_, max_prec)
    for b, kvh, heads, _, _, _, bad_row, bad_key in groups:
        for name, idx, bad in (
            ("dq", (b, heads), bad_row[:, rows]),
            ("dk", (b, kvh), bad_key[keys]),
            ("dv", (b, kvh), bad_key[keys]),
        ):
            _poison(res[name], idx, bad)
    if problem.sinks is not None:
        _poison(res["dsinks"], (), bad_head)
    names = ("dq", "dk", "dv", "dsinks") if problem.sinks is not None else ("dq", "dk", "dv")
    return {n: CertifiedTensor(**res[n]) for n in names}


def _flat(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"x_{f}": a for f, a in arrays.items()}


def _poison(arrays: dict[str, np.ndarray], idx: tuple, bad: np.ndarray) -> None:
    """The NaN rule, applied last: it overrides what was computed from sanitised inputs."""
    for f in FIELDS:
        view = arrays[f][idx]
        fill = np.nan if f in ("hi", "rounded") else (True if f == "certified" else 0.0)
        view[bad] = fill


def _group_elements(res, todo, pos, q, k, do, p, ds, floor, sc, fmt, prec):
    """Store the pending dQ, dK, dV elements of one group at this precision; clear the
    certified ones from ``todo``."""
    b, kvh, heads, rows, keys = pos
    g_n, nq, d = q.shape
    q_all, do_all = q.reshape(g_n * nq, d), do.reshape(g_n * nq, do.shape[2])
    n_k = p.shape[-1]
    p_all, ds_all = p.reshape(g_n * nq, n_k), ds.reshape(g_n * nq, n_k)
    f_all = floor.reshape(g_n * nq, n_k)
    tau = abs(sc.hi)
    dq = _flat({f: a[b, heads] for f, a in res["dq"].items()})
    dk = _flat({f: a[b, kvh] for f, a in res["dk"].items()})
    dvv = _flat({f: a[b, kvh] for f, a in res["dv"].items()})
    with iv_prec(prec):
        scale = sc.interval()
        for g, r, c in zip(*np.nonzero(todo["dq"]), strict=True):
            i = rows[r]
            val = scale * _dot(ds[g, i], k[:, c])
            fl = tau * float(floor[g, i] @ np.abs(k[:, c]))
            lo, hi = mpf_of(val._mpi_[0]), mpf_of(val._mpi_[1])
            todo["dq"][g, r, c] = not store_interval(dq, "x", (g, r, c), lo, hi, fl, fmt)
        for r, c in zip(*np.nonzero(todo["dk"]), strict=True):
            j = keys[r]
            val = scale * _dot(ds_all[:, j], q_all[:, c])
            fl = tau * float(f_all[:, j] @ np.abs(q_all[:, c]))
            lo, hi = mpf_of(val._mpi_[0]), mpf_of(val._mpi_[1])
            todo["dk"][r, c] = not store_interval(dk, "x", (r, c), lo, hi, fl, fmt)
        for r, c in zip(*np.nonzero(todo["dv"]), strict=True):
            j = keys[r]
            val = _dot(p_all[:, j], do_all[:, c])
            fl = float(np.abs([_approx(x) for x in p_all[:, j]]) @ np.abs(do_all[:, c]))
            lo, hi = mpf_of(val._mpi_[0]), mpf_of(val._mpi_[1])
            todo["dv"][r, c] = not store_interval(dvv, "x", (r, c), lo, hi, fl, fmt)
