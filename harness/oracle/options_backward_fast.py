"""Fast gradient path for soft-capping and sinks: dQ, dK, dV and dσ with certified bounds.

The gradient fast path of :mod:`flashcheck.harness.oracle.backward` (docs/oracle.md §7.1) with
the weights of :mod:`flashcheck.harness.oracle.options_fast` and two additions:

- the cap: ``dS`` times the slope ``1 − tanh²(s/c)``, a dd formed in 200-bit mpmath from the
  exact scores (:func:`~flashcheck.harness.oracle.options_fast.slopes`), both bounds carried
  through the product;
- the sink: a last key with zero ``k`` and ``v`` rows and weight ``exp(σ − LSE)``, so that the
  weights of a row still sum to one (what the certified ``dP − D`` step needs) and its score
  gradient ``dS_iσ = P_iσ·(0 − D_i)`` is the row's term of ``dσ``; the rows' terms are summed
  exactly (an expansion) over the head's rows and the batch.

Elements these bounds do not certify are left to the interval path of
:mod:`flashcheck.harness.oracle.options_backward`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.formats import Format
from ..core.semantics import AttentionProblem
from . import exact as ex
from .backward import fast_group
from .common import Scale, decide, target
from .options import FAST_PATH_LIMITS
from .options_fast import options_fast_rows, slopes

__all__ = ["fast_gradients"]


def _group(problem: AttentionProblem, sc: Scale, q, k, v, do, keep, heads: slice):
    """:func:`fast_group` of one group with the problem's cap and sinks."""
    cap = problem.softcap
    sinks = None if problem.sinks is None else problem.sinks[heads]
    slot = sinks is not None
    kk, vv, kp = k, v, keep
    if slot:
        kk = np.concatenate([k, np.zeros((1, k.shape[1]))])
        vv = np.concatenate([v, np.zeros((1, v.shape[1]))])
        kp = np.concatenate([keep, np.ones((*keep.shape[:2], 1), dtype=bool)], axis=2)

    def weights(g: int) -> dict:
        sink = None if sinks is None else float(sinks[g])
        return options_fast_rows(q[g], k, v, keep[g], sc, cap, sink, weights=True)

    def slope(g: int):
        gh, gl, g_err = slopes(q[g], k, keep[g], sc, cap)
        if slot:  # the sink is not capped: slope 1, exactly
            n = gh.shape[0]
            gh = np.concatenate([gh, np.ones((n, 1))], axis=1)
            gl, g_err = (np.concatenate([x, np.zeros((n, 1))], axis=1) for x in (gl, g_err))
        return gh, gl, g_err

    return fast_group(
        q, kk, vv, do, kp, sc, weights=weights, slope=None if cap is None else slope, sink_slot=slot
    )


def _store(res: dict, name: str, idx: tuple, vals: dict, todo: np.ndarray, fmt: Format) -> None:
    """Write one gradient's fast values where ``todo``; clear what they certify from it."""
    hi, lo, err, floor = (vals[f] for f in ("hi", "lo", "err", "floor"))
    rounded, decided = decide(hi, lo, err, fmt)
    ok = decided & (err <= target(floor, fmt))
    for f, val in (("hi", hi), ("lo", lo), ("err", err), ("floor", floor), ("rounded", rounded)):
        view = res[name][f][idx]
        view[todo] = val[todo]
    res[name]["certified"][idx][todo] = ok[todo]
    todo &= ~ok


def fast_gradients(
    problem: AttentionProblem,
    groups: list,
    res: dict,
    sc: Scale,
    fmt: Format,
    rows: np.ndarray,
    keys: np.ndarray,
    stats: dict[str, Any],
) -> bool:
    """The fast path for every group of :func:`.options_backward.options_gradients` (its
    ``groups`` and ``res``, updated in place: values, and the ``todo`` masks cleared where
    certified). Returns whether ``dsinks`` still needs the interval path."""
    hq = problem.shape[1]
    nk = problem.shape[4]
    sink_terms: list[list[np.ndarray]] = [[] for _ in range(hq)]
    sink_err, sink_floor = np.zeros(hq), np.zeros(hq)
    failed = False
    for b, kvh, heads, (q, k, v, dog), keep, todo, _, _ in groups:
        try:
            with np.errstate(divide="raise", invalid="raise", over="raise"):
                out = _group(problem, sc, q, k, v, dog, keep, heads)
        except FAST_PATH_LIMITS:
            failed = True  # the whole group (and dσ) to the interval path
            stats["fallback_elements"] += sum(int(todo[n].sum()) for n in ("dq", "dk", "dv"))
            continue
        sel = {"dq": (slice(None), rows), "dk": (keys,), "dv": (keys,)}
        for name, idx in (("dq", (b, heads)), ("dk", (b, kvh)), ("dv", (b, kvh))):
            # (dK and dV drop the sink's slot, the last key row)
            fields = ("hi", "lo", "err", "floor")
            vals = {
                f: out[f"{name}_{f}"][: None if name == "dq" else nk][sel[name]] for f in fields
            }
            _store(res, name, idx, vals, todo[name], fmt)
            stats["fallback_elements"] += int(todo[name].sum())
        if problem.sinks is not None:
            for g, h in enumerate(range(hq)[heads]):
                sink_terms[h] += [out["ds_sink_hi"][g], out["ds_sink_lo"][g]]
                sink_err[h] += float(out["ds_sink_err"][g].sum())
                sink_floor[h] += float(np.sum(out["p_sink"][g] * out["pdp"][g]))
    if problem.sinks is None:
        return False
    if failed:
        return True
    # dσ_h = −Σ_{b,i} P_iσ·D_i = Σ_{b,i} dS_iσ: the rows' dd terms summed as an expansion
    pending = False
    for h in range(hq):
        terms = [np.array([x]) for t in sink_terms[h] for x in t] or [np.zeros(1)]
        hi, lo, err = ex.expansion_to_dd(terms)
        vals = {"hi": hi, "lo": lo, "err": err + sink_err[h] * (1 + 2.0**-40)}
        vals["floor"] = np.array([sink_floor[h]])
        todo = np.ones(1, dtype=bool)
        view = {f: a[h : h + 1] for f, a in res["dsinks"].items()}
        _store({"x": view}, "x", (), vals, todo, fmt)
        pending |= bool(todo.any())
    return pending
