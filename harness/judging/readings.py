"""The readings of an attention problem that common kernel mistakes compute: the catalog of
mistakes that apply to a problem (:func:`readings_of`) and float64 attention under each one's
departure from the definition (:func:`reading`), for :mod:`.diagnosis` to match a failing
output against."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..core.semantics import AttentionProblem

__all__ = ["Keep", "reading", "readings_of"]

Keep = Callable[[int, int], np.ndarray]


_SAME: object = object()  # a softmax option of reading: the problem's own


def reading(
    p: AttentionProblem,
    *,
    keep: Keep | None = None,
    tau: float | None = None,
    kv: Callable[[int], int] | None = None,
    axis: int = -1,
    inputs: AttentionProblem | None = None,
    cap: object = _SAME,
    cap_before_scale: bool = False,
    cap_after_mask: bool = False,
    sinks: object = _SAME,
    no_max: type | None = None,
    floor: type | None = None,
    guarded: bool = False,
    transposed: bool = False,
    with_lse: bool = False,
    weights: list[np.ndarray] | None = None,
) -> np.ndarray | tuple[np.ndarray, np.ndarray | None]:
    """float64 attention of ``p`` with the given departures: which keys each row keeps, the
    score scale, the key/value head of each query head, and the softmax's axis. A row (or, over
    the queries, a column) that keeps nothing gives 0. ``inputs``: a problem whose q, k, v
    replace ``p``'s (an FP8 descale applied twice or not at all). ``cap`` and ``sinks``: the
    soft-cap and the sink logits (default ``p``'s; ``None``: left out); ``cap_before_scale``:
    the cap taken of the unscaled product ``q·k`` and the scale applied after it;
    ``cap_after_mask``: the cap applied after the mask set dropped scores to −inf, which it
    turns into −c (every key then takes part, a dropped one with the score −c). ``no_max``: a
    numpy float type; the softmax then taken as exp(s) / Σ exp(s), without subtracting the row
    maximum, each exp and the sum rounded to that type, so that they overflow (to inf, and
    inf / inf = NaN) and underflow (0 / 0) where a kernel computing in it would. ``floor``: a
    numpy float type; the rows whose every exp(s) underflows to 0 in it give NaN (0 / 0), or 0
    if ``guarded`` (a kernel writing 0 for a row whose sum is 0), the others the exact
    answer. ``with_lse``: also the reading's LSE, ``m + log Σ`` over the keys (−inf for a row
    that keeps nothing), or ``None`` for a softmax over the queries, which has none.
    ``weights``: a list that receives the reading's ``W = Σ_j p_j·|v_j|`` per output element
    (the scale of its rounding errors, as the bounds' floor). ``transposed``: q, k, v read as
    ``(B, N, H, d)``, FlashAttention's ``flash_attn_func`` layout, though they are ``(B, H, N,
    d)``: the heads taken as the sequence and the sequence as the heads, and O (and the LSE)
    written back in the layout it came in (only the other options apply)."""
    if transposed:
        swapped = replace(p, **{t: getattr(p, t).swapaxes(1, 2) for t in ("q", "k", "v")})
        got_w: list[np.ndarray] = []
        o, lse_t = reading(swapped, with_lse=True, weights=got_w)
        if weights is not None:
            weights.append(got_w[0].swapaxes(1, 2))
        o = o.swapaxes(1, 2)
        return (o, lse_t.swapaxes(1, 2)) if with_lse else o
    x = p if inputs is None else inputs
    b_n, hq, _, nq, _, d, dv = p.shape
    if tau is None:
        tau = p.scale if p.scale is not None else 1 / math.sqrt(d)
    c = p.softcap if cap is _SAME else cap
    sink = p.sinks if sinks is _SAME else sinks
    rows = np.arange(nq)
    out = np.zeros((b_n, hq, nq, dv))
    w = np.zeros((b_n, hq, nq, dv))
    lse = np.zeros((b_n, hq, nq))
    with np.errstate(all="ignore"):
        for b in range(b_n):
            for h in range(hq):
                kh = p.kv_head(h) if kv is None else kv(h)
                kp = p.keep(b, h, rows) if keep is None else keep(b, h)
                dot = x.q[b, h] @ x.k[b, kh].T
                if c is None:
                    s = tau * dot
                elif cap_before_scale:
                    s = tau * (c * np.tanh(dot / c))
                else:
                    s = c * np.tanh(tau * dot / c)
                if cap_after_mask and c is not None:
                    s, kp = np.where(kp, s, -c), np.ones_like(kp)
                else:
                    s = np.where(kp, s, -np.inf)
                m = s.max(axis=axis, keepdims=True)
                # A sink (over the keys only): a logit in the denominator with no value row.
                sig = None if sink is None or axis != -1 else float(np.asarray(sink)[h])
                if sig is not None:
                    m = np.maximum(m, sig)
                m = np.where(np.isfinite(m) & (no_max is None), m, 0.0)
                e = _rounded(np.where(kp, np.exp(s - m), 0.0), no_max)
                den = e.sum(axis=axis, keepdims=True)
                if sig is not None:
                    den = den + _rounded(np.exp(sig - m), no_max)
                den = _rounded(den, no_max)
                if floor is not None:  # (m: the row's largest logit, sinks included)
                    gone = _rounded(np.exp(m), floor) == 0
                    den = np.where(gone, np.inf if guarded else np.nan, den)
                if no_max is None and floor is None:
                    prob = np.divide(e, den, out=np.zeros_like(e), where=den > 0)
                else:  # inf / inf, 0 / 0: NaN, as in the kernel; a row with no key gives 0
                    prob = np.where(kp.any(axis=axis, keepdims=True), e / den, 0.0)
                out[b, h] = prob @ x.v[b, kh]
                w[b, h] = np.abs(prob) @ np.abs(x.v[b, kh])
                if axis == -1:
                    lse[b, h] = (m + np.log(den))[:, 0]
    if weights is not None:
        weights.append(w)
    if not with_lse:
        return out
    return out, (lse if axis == -1 else None)


def _rounded(x: np.ndarray, fmt: type | None) -> np.ndarray:
    """``x`` rounded to the numpy float type ``fmt`` (overflowing to inf), back in float64."""
    return x if fmt is None else np.asarray(x).astype(fmt).astype(np.float64)


def _keeps(p: AttentionProblem, **changes) -> Keep:
    """The keep matrices of ``p`` with option ``changes`` (``causal``, ``window``, ``mask``)."""
    q = replace(p, **changes)
    rows = np.arange(p.shape[3])
    return lambda b, h: q.keep(b, h, rows)


def _shifted_diagonal(p: AttentionProblem, shift: int) -> Keep:
    """Causal with the diagonal moved by ``shift`` (``−(Nk − Nq)``: aligned top-left)."""
    rest = _keeps(p, causal=False)
    _, _, _, nq, nk, _, _ = p.shape
    diag = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + (nk - nq) + shift
    return lambda b, h: rest(b, h) & diag


def readings_of(p: AttentionProblem) -> list[tuple[str, dict]]:
    """Each common mistake that applies to ``p``, as keyword arguments of :func:`reading`."""
    _, hq, hk, nq, nk, d, _ = p.shape
    tau = p.scale if p.scale is not None else 1 / math.sqrt(d)
    alts: list[tuple[str, dict]] = []
    if p.causal:
        if nq != nk:
            alts.append(
                (
                    "a causal mask aligned top-left (query i keeps keys j <= i; flashcheck, as "
                    "FlashAttention, aligns it bottom-right: j <= i + Nk - Nq)",
                    {"keep": _shifted_diagonal(p, -(nk - nq))},
                )
            )
        for shift in (-1, 1):
            alts.append(
                (f"the causal diagonal off by {shift:+d}", {"keep": _shifted_diagonal(p, shift)})
            )
        alts.append(("causal=True ignored", {"keep": _keeps(p, causal=False)}))
    if p.window is not None:
        left, right = p.window
        alts.append(("the window ignored", {"keep": _keeps(p, window=None)}))
        for name, edge in (("left", left), ("right", right)):
            if edge is None:
                continue
            for step in (-1, 1):
                if edge + step < 0:
                    continue
                w = (edge + step, right) if name == "left" else (left, edge + step)
                alts.append(
                    (f"the window's {name} edge off by {step:+d}", {"keep": _keeps(p, window=w)})
                )
    if p.mask is not None:
        alts.append(("the mask read inverted (True taken as masked out)", {"keep": _inverted(p)}))
        alts.append(("the mask ignored", {"keep": _keeps(p, mask=None)}))
    if tau != 1:
        alts.append(("the scale left out (scale 1)", {"tau": 1.0}))
        alts.append((f"the scale applied twice ({tau:.6g}²)", {"tau": tau * tau}))
    if p.scale is not None and p.scale != 1 / math.sqrt(d):
        alts.append(("the explicit scale ignored (1/√d used)", {"tau": 1 / math.sqrt(d)}))
    if hk not in (1, hq):
        alts.append(
            (
                "query heads mapped to key/value heads by modulo (h % Hk; the grouping is h // "
                "(Hq / Hk))",
                {"kv": lambda h: h % hk},
            )
        )
    alts.append(("the softmax taken over the queries instead of the keys", {"axis": -2}))
    if p.mask is None and p.sinks is None and p.fp8 is None and nk > 0 and nq % nk == 0:
        # (a kernel written against flash_attn_func's layout takes the heads for the sequence;
        # it returns O in the shape it was given, so no shape check catches it)
        alts.append(
            (
                "q, k, v read as (B, N, H, d), flash_attn_func's layout, though they are "
                "(B, H, N, d): the heads taken for the sequence and the sequence for the heads",
                {"transposed": True},
            )
        )
    # exp(s) / Σ exp(s) is exact in real arithmetic: it differs from the truth only where a
    # score passes exp's overflow, or every score of a row its underflow, in the format the
    # kernel computes exp in (fp32, or for fp16 inputs possibly fp16). Underflow alone is
    # also what a running maximum started at a finite value (-1e4 for -inf) gives: that
    # reading comes first, so that where the two agree the name covers both.
    for fmt in (np.float32, np.float16) if p.fmt.name == "fp16" else (np.float32,):
        name = {np.float32: "fp32", np.float16: "fp16"}[fmt]
        tiny = math.log(float(np.finfo(fmt).smallest_subnormal))
        alts.append(
            (
                "a row maximum never below a finite value (the maximum not subtracted, or a "
                "running maximum started at -1e4 or the like instead of -inf): every score of "
                f"each failing row lies below {tiny:.2f}, where exp underflows to 0 in {name} "
                "(0 / 0 = NaN)",
                {"floor": fmt},
            )
        )
        alts.append(
            (
                "a row maximum never below a finite value, and a row whose sum is 0 written as "
                "0 (a running maximum started at -1e4 or the like instead of -inf, with a guard "
                f"against 0 / 0): every score of each failing row lies below {tiny:.2f}, where "
                f"exp underflows to 0 in {name}",
                {"floor": fmt, "guarded": True},
            )
        )
        big = math.log(float(np.finfo(fmt).max))
        alts.append(
            (
                "exp(s) taken without subtracting the row maximum (exp(s) / Σ exp(s) is inf / "
                f"inf = NaN once a score passes {big:.2f}, exp's limit in {name})",
                {"no_max": fmt},
            )
        )
    if p.softcap is not None:
        alts.append(("softcap ignored", {"cap": None}))
        alts.append(
            (
                "the soft-cap taken of the unscaled product (c·tanh(q·k/c)·scale; the cap "
                "applies to the scaled score: c·tanh(scale·q·k/c))",
                {"cap_before_scale": True},
            )
        )
        if p.causal or p.window is not None or p.mask is not None:
            alts.append(
                (
                    "the soft-cap applied after the mask (c·tanh(−inf/c) = −c: the dropped keys "
                    "get the score −c and take part in the softmax; cap the scores, then mask)",
                    {"cap_after_mask": True},
                )
            )
    if p.sinks is not None:
        alts.append(("sinks ignored", {"sinks": None}))
        if tau != 1:
            alts.append(
                ("the sinks multiplied by the scale (a sink is a logit, not scaled)",
                 {"sinks": np.asarray(p.sinks) * tau}),
            )  # fmt: skip
    return alts + _descalereadings_of(p)


def _descalereadings_of(p: AttentionProblem) -> list[tuple[str, dict]]:
    """An FP8 problem's descales each applied twice or left out, and left out together (its
    q, k, v hold the FP8 values times their descales once)."""
    if p.fp8 is None:
        return []
    alts: list[tuple[str, dict]] = []
    for name in p.fp8.descales():
        for power, what in ((1, "applied twice"), (-1, "left out")):
            alts.append((f"{name} {what}", _descaled(p, {name[-1]: power})))
    # A kernel that takes the descales but never applies them computes with the FP8 values as
    # they are. Each single reading then fits O or the LSE at best, and not the same one on
    # every family (a user's such kernel read as descale_v left out on one family and applied
    # twice on another): these readings fit both. (After the single ones: where a case sets
    # one descale only, the single reading keeps the name and these are named as the same
    # answer.)
    alts.append(("descale_q and descale_k left out", _descaled(p, {"q": -1, "k": -1})))
    alts.append(
        (
            "all three descales left out (the FP8 values used as they are)",
            _descaled(p, {"q": -1, "k": -1, "v": -1}),
        )
    )
    return alts


def _descaled(p: AttentionProblem, powers: dict[str, int]) -> dict:
    """The :func:`reading` keywords of an FP8 problem whose inputs ``t`` (``"q"``, ``"k"``,
    ``"v"``) carry their descale to the extra power ``powers[t]``."""
    rep = p.shape[1] // p.shape[2]
    changed = {}
    kw: dict = {}
    for t, power in powers.items():
        d = getattr(p.fp8, f"descale_{t}")
        scale = ((np.repeat(d, rep, axis=1) if t == "q" else d) ** power)[:, :, None, None]
        changed[t] = getattr(p, t) * scale
        if t == "v":  # O scales with V: so does the bound of that reading
            kw["tol_scale"] = np.repeat(scale, rep, axis=1)
    kw["inputs"] = replace(p, **changed)
    return kw


def _inverted(p: AttentionProblem) -> Keep:
    rest = _keeps(p, mask=None)
    rows = np.arange(p.shape[3])
    return lambda b, h: rest(b, h) & ~p.mask[b, h][rows]
