"""A diagnosis of a failing output: which common mistake it is consistent with.

Many wrong attention kernels compute exactly the right thing for a slightly different
definition: a causal mask aligned top-left, the scale left out or applied twice, a boolean mask
read the other way round, grouped query heads mapped to key/value heads by modulo, a window
edge off by one, the softmax taken over the queries, exp taken without subtracting the row
maximum (exact until it overflows), an option ignored, the soft-cap taken before the scale,
sinks multiplied by the scale, an FP8 descale applied twice or left out. For a case that failed,
:func:`diagnose` evaluates attention under each such alternative (in float64: its error is
negligible beside any bound of a 16- or 32-bit kernel) and names the alternatives the kernel's
output matches within its own deterministic bound. It only speaks where the alternative's
answer differs from the true one by more than that bound, so a match is evidence, not chance:
in O, or where O cannot tell them apart (one key: O = V whatever the scores), in the LSE the
kernel returns. Readings that fit one output equally are named as alternatives.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..core.formats import FP32, ulp
from ..core.semantics import AttentionProblem
from .classes import PRECISION_BELOW
from .tensor_verdict import Verdict

__all__ = ["CONSISTENT", "diagnose", "diagnose_lse", "explain"]

CONSISTENT = "consistent with "
Keep = Callable[[int, int], np.ndarray]


_SAME: object = object()  # a softmax option of _reference: the problem's own


def _reference(
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
    (the scale of its rounding errors, as the bounds' floor)."""
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


def _alternatives(p: AttentionProblem) -> list[tuple[str, dict]]:
    """Each common mistake that applies to ``p``, as keyword arguments of :func:`_reference`."""
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
    return alts + _descale_alternatives(p)


def _descale_alternatives(p: AttentionProblem) -> list[tuple[str, dict]]:
    """An FP8 problem's descales each applied twice or left out (its q, k, v hold the FP8
    values times their descales once)."""
    if p.fp8 is None:
        return []
    alts: list[tuple[str, dict]] = []
    rep = p.shape[1] // p.shape[2]
    for name, d in p.fp8.descales().items():
        t = name[-1]
        factor = np.repeat(d, rep, axis=1) if t == "q" else d
        for power, what in ((1, "applied twice"), (-1, "left out")):
            scale = (factor**power)[:, :, None, None]
            kw: dict = {"inputs": replace(p, **{t: getattr(p, t) * scale})}
            if t == "v":  # O scales with V: so does the bound of that reading
                kw["tol_scale"] = np.repeat(scale, rep, axis=1)
            alts.append((f"{name} {what}", kw))
    return alts


def _inverted(p: AttentionProblem) -> Keep:
    rest = _keeps(p, mask=None)
    rows = np.arange(p.shape[3])
    return lambda b, h: rest(b, h) & ~p.mask[b, h][rows]


def _aliases(labels: list[str]) -> str:
    """What a reason adds for the readings that give the same answer on this input."""
    if not labels:
        return ""
    verb = "gives" if len(labels) == 1 else "give"
    return f" (on this input {' and '.join(labels)} {verb} the same answer)"


def diagnose(
    p: AttentionProblem,
    o: np.ndarray,
    exact: np.ndarray,
    det: np.ndarray,
    *,
    lse: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> list[str]:
    """The common mistakes (module docstring) that the kernel's output ``o`` matches within its
    deterministic bound ``det`` (elementwise, plus an ulp of the format) while the exact answer
    ``exact`` does not: one reason per match, starting with :data:`CONSISTENT`. ``lse``: the
    kernel's LSE, the exact one and its bound; where a reading's O cannot be told from the
    exact O (one key: O = V under every reading), it is matched by its LSE instead. Empty for
    non-finite inputs (the NaN rule has its own checks)."""
    if not all(np.isfinite(x).all() for x in (p.q, p.k, p.v)):
        return []
    o = np.asarray(o, dtype=np.float64)
    det = np.asarray(det, dtype=np.float64)
    # A reading that keeps other keys than the truth computes each row with the rounding of
    # its own keys, which the truth's bound of that row does not cover (a row the true mask
    # empties has bound 0): such readings take the largest bound of the (batch, head, column)
    # for every row. (An fp32 kernel aligned top-left, Nq > Nk, went unnamed: its rows that
    # keep one key truly but nine top-left missed their tolerance by a fraction of an ulp.)
    widest = np.broadcast_to(det.max(axis=-2, keepdims=True), det.shape)
    found: list[list[str]] = []  # the labels of each reading that fits: its own, then aliases
    by_lse: list[list[str]] = []  # those told from the exact answer by the LSE alone
    lse_fit: list[list[str]] = []  # those whose LSE the kernel's matches too
    seen: list[tuple[np.ndarray, list[str], frozenset, np.ndarray | None]] = []
    weights: list[np.ndarray] = []
    _reference(p, weights=weights)
    true_w = weights[0]
    for label, kw in _alternatives(p):
        tol_scale = kw.pop("tol_scale", 1.0)
        # (a reading that writes 0 for rows that keep keys does not take NaN for that 0)
        nan_as_empty = not kw.get("guarded", False)
        # The kind of mistake a reading stands for: what it changes (with or without the
        # guard against 0 / 0, exp's limits are one mistake in each format).
        kind = frozenset(kw) - {"guarded"}
        alt_w: list[np.ndarray] = []
        alt, alt_lse = _reference(p, **kw, with_lse=True, weights=alt_w)
        same = next(
            (
                s
                for s in seen
                if np.array_equal(alt, s[0], equal_nan=True)
                and (lse is None or _same(alt_lse, s[3]))
            ),
            None,
        )
        if same is not None:
            # The same answer as an earlier reading. Two masks that keep the same keys here (a
            # causal mask aligned top-left and the diagonal off by +1 at Nq = 2, Nk = 1), or
            # two mistakes of other kinds (at Nq = Nk = 1 a softmax over the queries and a
            # sink ignored both give V), are different mistakes this input cannot tell apart:
            # the reason names both. (A repeat of the same kind is one mistake seen twice,
            # e.g. exp's limit in two formats.)
            if "keep" in kw or kind != same[2]:
                same[1].append(label)
            continue
        labels = [label]
        seen.append((alt, labels, kind, alt_lse))
        tol = (widest if "keep" in kw else det) * tol_scale + ulp(alt, p.fmt)
        with np.errstate(invalid="ignore", divide="ignore"):
            differs = np.isfinite(exact) & ~(np.abs(alt - exact) <= tol)
            # A kernel computing the reading rounds at the reading's scale: where its weights
            # W = Σ p·|v| exceed the truth's, the bound grows with them (a user's fp32 kernel
            # that scaled sinks of +45, whose true O is 1e-19 but the reading's 1e-4, matched
            # the reading to 5 ulp, far beyond the truth's bound).
            grow = np.where(true_w > 0, np.maximum(alt_w[0] / true_w, 1.0), 1.0)
            fit = (widest if "keep" in kw else det) * tol_scale * grow + ulp(alt, p.fmt)
            # (a NaN where the reading leaves a row with no key counts as its empty row; a NaN
            # or inf where the reading overflows, as its overflow)
            matches = (
                (np.isfinite(o) & (np.abs(o - alt) <= fit))
                | (np.isnan(o) & (alt == 0) & nan_as_empty)
                | (~np.isfinite(o) & ~np.isfinite(alt))
            )
        if matches.all() and (differs.any() or _nearer(o, alt, exact, det * tol_scale)):
            found.append(labels)
            if _lse_fits(lse, alt_lse):
                lse_fit.append(labels)
        elif matches.all() and _lse_tells(lse, alt_lse):
            by_lse.append(labels)
            found.append(labels)
            lse_fit.append(labels)
    if lse_fit:
        # The readings whose LSE fits the kernel's too outrank those whose O alone does (a
        # user's sink-scaled kernel: O ~ 0 under the scale left out as well, its LSE only
        # under the scaled sink). Without such a reading (an LSE in another base, say), O's
        # matches stand.
        found = [labels for labels in found if labels in lse_fit]
    return [
        f"{CONSISTENT}{labels[0]}: the output matches exact attention under that reading "
        "within the kernel's bound"
        + (" (its LSE tells it: O is the same under both here)" if labels in by_lse else "")
        + _aliases(labels[1:])
        + _rivals(labels, found)
        for labels in found
    ]


def _nearer(o: np.ndarray, alt: np.ndarray, exact: np.ndarray, det: np.ndarray) -> bool:
    """Whether a reading whose answer ``alt`` lies within an ulp of the bound from the exact
    answer still explains the elements where the kernel's output ``o`` breaks its bound
    ``det``: at each of them the reading too departs from the exact answer by more than the
    bound, and lies nearer the kernel's output than the exact answer does. (A user's
    sink-scaled kernel, one key and a sink of -40, missed its fp16 bound by 2 ulp with O within
    0.01 ulp of the scaled-sink reading, which the ulp of slack hid.) The bound is rigorous, so
    a kernel of the class never breaks it; a reading that accounts for each break is the
    explanation, not a coincidence."""
    with np.errstate(invalid="ignore"):
        fails = np.isfinite(exact) & np.isfinite(o) & (np.abs(o - exact) > det)
        if not fails.any():
            return False
        away = np.abs(alt - exact) > det
        nearer = np.abs(o - alt) < np.abs(o - exact)
    return bool((away & nearer)[fails].all())


def _same(a: np.ndarray | None, b: np.ndarray | None) -> bool:
    return (a is None) == (b is None) and (a is None or np.array_equal(a, b, equal_nan=True))


def _lse_fits(
    lse: tuple[np.ndarray, np.ndarray, np.ndarray] | None, alt: np.ndarray | None
) -> bool:
    """Whether the kernel's LSE matches a reading's within the LSE bound plus an fp32 ulp
    everywhere (False without either)."""
    if lse is None or alt is None or lse[0] is None:
        return False
    got, _, det = (np.asarray(x, dtype=np.float64) for x in lse)
    with np.errstate(invalid="ignore"):
        tol = det + ulp(np.where(np.isfinite(alt), alt, 0.0), FP32)
        return bool(((np.abs(got - alt) <= tol) | (got == alt)).all())


def _lse_tells(
    lse: tuple[np.ndarray, np.ndarray, np.ndarray] | None, alt: np.ndarray | None
) -> bool:
    """Whether a reading whose O matches the kernel's but not distinguishably from the exact O
    is told by the LSE: the reading's LSE differs from the exact one by more than its bound
    (plus an fp32 ulp) somewhere and the kernel's matches it everywhere. (A user's kernel
    that capped the unscaled product went unnamed by the property suite, which had shrunk it
    to one key, where O = V whatever the scores.)"""
    if lse is None or alt is None or lse[0] is None:
        return False
    exact, det = (np.asarray(x, dtype=np.float64) for x in lse[1:])
    with np.errstate(invalid="ignore"):
        tol = det + ulp(np.where(np.isfinite(alt), alt, 0.0), FP32)
        differs = np.isfinite(exact) & ~(np.abs(alt - exact) <= tol)
    return bool(differs.any()) and _lse_fits(lse, alt)


def _rivals(labels: list[str], found: list[list[str]]) -> str:
    """What a reason adds when other readings fit this output too, with answers that differ
    but within the bound: they are alternatives, not findings in addition (a user read "the
    scale left out" and "the sinks multiplied by the scale", both fitting one key that a huge
    negative logit left below the sink, as two bugs)."""
    others = [other[0] for other in found if other is not labels]
    if not others:
        return ""
    verb = "fits" if len(others) == 1 else "fit"
    return f"; {' and '.join(others)} {verb} too: this input cannot tell which"


def diagnose_lse(lse: np.ndarray, exact: np.ndarray, det: np.ndarray) -> list[str]:
    """LSE returned in base 2, ``log2 Σ exp(s) = LSE / ln 2`` (what a kernel that computes in
    exp2 holds, the Triton tutorial's among them), matched within the LSE bound (scaled the
    same way) plus an fp32 ulp, where that differs from the true LSE by more than its bound."""
    lse = np.asarray(lse, dtype=np.float64)
    alt = exact / math.log(2)
    fin = np.isfinite(exact)
    with np.errstate(invalid="ignore"):
        differs = fin & (np.abs(alt - exact) > det + ulp(exact, FP32))
        close = np.abs(lse - alt) <= det / math.log(2) + ulp(alt, FP32)
    matches = np.where(fin, close, lse == exact)
    if differs.any() and matches.all():
        return [
            f"{CONSISTENT}LSE in base 2 (log2 Σ exp(s) = LSE / ln 2, as a kernel working in "
            "exp2 keeps it): the LSE matches that within its bound; return LSE · ln 2"
        ]
    return []


def explain(
    verdict: Verdict,
    p: AttentionProblem,
    o: np.ndarray,
    exact: np.ndarray,
    det: np.ndarray,
    *,
    lse: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """Set ``verdict.diagnosis`` to :func:`diagnose`'s findings, and :func:`diagnose_lse`'s
    for ``lse`` (the kernel's LSE, the exact one and its bound) where given. Where the output
    matches a common mistake, a reduced-precision class whose bound also holds its errors
    ("precision below fp32: the errors fit tf32") is a coincidence, not the explanation: that
    reason goes."""
    verdict.diagnosis = diagnose(p, o, exact, det, lse=lse)
    if lse is not None and lse[0] is not None:
        verdict.diagnosis += diagnose_lse(*lse)
    if verdict.diagnosis:
        for t in verdict.tensors.values():
            t.reasons[:] = [r for r in t.reasons if PRECISION_BELOW not in r]
