"""Gradient oracle, strict path: interval arithmetic (mpmath.iv) with Ziv escalation.

For one (batch, kv head) group, every kept weight ``P_ij``, ``D_i = Σ_j P_ij dP_ij`` and
``dS_ij = P_ij (dP_ij − D_i)`` is an interval at working precision ``prec``; the scores and
``dP_ij = dO_i·V_j`` are exact integers first. The requested elements of ``dQ = τ·dS·K``,
``dK = τ·Σ_g dS_gᵀ·Q_g`` and ``dV = Σ_g P_gᵀ·dO_g`` are interval sums; the interval is the
certificate. Elements whose interval misses the accuracy target or straddles a rounding
boundary of the target format are recomputed at doubled precision up to ``max_prec``.
See docs/oracle.md §7.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpmath import iv

from ..core.formats import Format, round_mpf, round_to_format
from .common import Scale, target
from .strict import interval_to_dd, iv_prec, mpf_of, to_ints

__all__ = ["strict_group"]

_iv_exp = np.frompyfunc(iv.exp, 1, 1)


def _approx(x: np.ndarray) -> np.ndarray:
    """A float64 value inside each interval (for floor scales, needed to ~1e-12 only)."""
    return np.array([float(mpf_of(t._mpi_[0])) for t in x.ravel()]).reshape(x.shape)


def _level(q, k, v, do, keep, scale: Scale, shift: int, prec: int):
    """``P``, ``dP`` and ``dS`` of the group as interval arrays ``(G, Nq, Nk)``, and the floor
    scale ``F = |P|(|dP| + |D|)`` in float64."""
    g_n, nq, _ = q.shape
    nk = k.shape[0]
    zero = iv.mpf(0)
    with iv_prec(prec):
        pow2 = iv.mpf(2) ** (-2 * shift)
        sc = scale.interval()
        k_int = to_ints(k, shift)
        v_int = to_ints(v, shift)
        p = np.full((g_n, nq, nk), zero, dtype=object)
        dp = np.full((g_n, nq, nk), zero, dtype=object)
        ds = np.full((g_n, nq, nk), zero, dtype=object)
        floor = np.zeros((g_n, nq, nk))
        for g in range(g_n):
            t_int = to_ints(q[g], shift).dot(k_int.T)
            dp_int = to_ints(do[g], shift).dot(v_int.T)
            for i in range(nq):
                cols = np.flatnonzero(keep[g, i])
                if not len(cols):
                    continue
                s = [sc * (iv.mpf(int(t)) * pow2) for t in t_int[i, cols]]
                m = iv.mpf(max(mpf_of(x._mpi_[1]) for x in s))
                e = _iv_exp(np.array([x - m for x in s], dtype=object))
                total = zero
                for x in e:
                    total += x
                row = e / total
                dpr = np.array([iv.mpf(int(t)) * pow2 for t in dp_int[i, cols]], dtype=object)
                d_i = zero
                for a, b in zip(row, dpr, strict=True):
                    d_i += a * b
                p[g, i, cols] = row
                dp[g, i, cols] = dpr
                ds[g, i, cols] = row * (dpr - d_i)
                # At a low precision an interval of a huge score can be wider than its value:
                # its float end is then 0 or ±inf and the floor NaN, which certifies nothing
                # (err <= NaN is false), so the element is simply tried at a higher precision.
                with np.errstate(invalid="ignore", over="ignore"):
                    floor[g, i, cols] = np.abs(_approx(row)) * (
                        np.abs(_approx(dpr)) + abs(float(mpf_of(d_i._mpi_[0])))
                    )
    return p, ds, floor


def _dot(coeffs: np.ndarray, values: np.ndarray) -> Any:
    total = iv.mpf(0)
    for a, b in zip(coeffs, values, strict=True):
        if b != 0:
            total += a * iv.mpf(float(b))
    return total


def _store(out: dict, name: str, idx: tuple, val: Any, floor: float, fmt: Format) -> bool:
    lo, hi = mpf_of(val._mpi_[0]), mpf_of(val._mpi_[1])
    dh, dl, err = interval_to_dd(lo, hi)
    decided = round_mpf(lo, fmt) == round_mpf(hi, fmt)
    ok = bool(decided and err <= target(np.array(floor), fmt))
    out[f"{name}_hi"][idx], out[f"{name}_lo"][idx], out[f"{name}_err"][idx] = dh, dl, err
    out[f"{name}_floor"][idx] = floor
    out[f"{name}_rounded"][idx] = round_mpf(lo, fmt) if decided else round_to_format(dh, fmt)
    out[f"{name}_certified"][idx] = ok
    return ok


def strict_group(
    q,
    k,
    v,
    do,
    keep,
    scale: Scale,
    fmt: Format,
    in_fmt: Format,
    todo: dict,
    out: dict,
    prec: int,
    max_prec: int,
    stats: dict,
) -> None:
    """Recompute the flagged gradient elements of one group (arrays as for
    :func:`flashcheck.harness.oracle.backward.fast_group`) strictly, in place in ``out``
    (``{grad}_{hi,lo,err,floor,rounded,certified}``); ``todo`` maps ``dq``/``dk``/``dv`` to
    boolean arrays of the elements to compute."""
    shift = -(in_fmt.emin - in_fmt.p + 1)  # every value of the input format times 2^shift is an int
    g_n, nq, d = q.shape
    q_all = q.reshape(g_n * nq, d)
    do_all = do.reshape(g_n * nq, do.shape[2])
    todo = {name: mask.copy() for name, mask in todo.items()}
    p_ = prec
    while any(m.any() for m in todo.values()):
        stats["strict_evaluations"] += 1
        stats["max_prec_used"] = max(stats["max_prec_used"], p_)
        p, ds, floor = _level(q, k, v, do, keep, scale, shift, p_)
        p_all = p.reshape(g_n * nq, -1)
        ds_all = ds.reshape(g_n * nq, -1)
        f_all = floor.reshape(g_n * nq, -1)
        tau = abs(scale.hi)
        with iv_prec(p_):
            sc = scale.interval()
            for g, i, c in zip(*np.nonzero(todo["dq"]), strict=True):
                val = sc * _dot(ds[g, i], k[:, c])
                fl = tau * float(floor[g, i] @ np.abs(k[:, c]))
                todo["dq"][g, i, c] = not _store(out, "dq", (g, i, c), val, fl, fmt)
            for j, c in zip(*np.nonzero(todo["dk"]), strict=True):
                val = sc * _dot(ds_all[:, j], q_all[:, c])
                fl = tau * float(f_all[:, j] @ np.abs(q_all[:, c]))
                todo["dk"][j, c] = not _store(out, "dk", (j, c), val, fl, fmt)
            for j, c in zip(*np.nonzero(todo["dv"]), strict=True):
                val = _dot(p_all[:, j], do_all[:, c])
                fl = float(np.abs(_approx(p_all[:, j])) @ np.abs(do_all[:, c]))
                todo["dv"][j, c] = not _store(out, "dv", (j, c), val, fl, fmt)
        if p_ >= max_prec:
            break
        p_ = min(2 * p_, max_prec)
