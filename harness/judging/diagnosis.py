"""A diagnosis of a failing output: which common mistake it is consistent with.

Many wrong attention kernels compute exactly the right thing for a slightly different
definition: a causal mask aligned top-left, the scale left out or applied twice, a boolean mask
read the other way round, grouped query heads mapped to key/value heads by modulo, a window
edge off by one, the softmax taken over the queries, exp taken without subtracting the row
maximum (exact until it overflows), an option ignored, the soft-cap taken before the scale,
sinks multiplied by the scale, an FP8 descale applied twice or left out (alone, q's and k's
together, or all three). For a case that failed, :func:`diagnose` evaluates attention under
each such alternative (in float64: its error is negligible beside any bound of a 16- or 32-bit
kernel) and names the alternatives the kernel's output matches within its own deterministic
bound. It only speaks where the alternative's answer differs from the true one by more than
that bound, so a match is evidence, not chance: in O, or where O cannot tell them apart (one
key: O = V whatever the scores), in the LSE the kernel returns. Readings that fit one output
equally are named as alternatives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.formats import FP32, ulp
from ..core.semantics import AttentionProblem
from .classes import PRECISION_BELOW
from .readings import reading, readings_of
from .tensor_verdict import Verdict

__all__ = ["CONSISTENT", "diagnose", "diagnose_lse", "explain"]

CONSISTENT = "consistent with "


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
    # Where O is within its bound of the truth everywhere, O fitting a reading is no evidence
    # (a reading's tolerance grows with its weights, and huge logits matched the softmax over
    # the queries to a kernel whose O was right and whose LSE was off for another reason):
    # only a reading the LSE tells is named then.
    with np.errstate(invalid="ignore"):
        o_fails = bool((np.isfinite(exact) & ~(np.abs(o - exact) <= det)).any())
    found: list[list[str]] = []  # the labels of each reading that fits: its own, then aliases
    by_lse: list[list[str]] = []  # those told from the exact answer by the LSE alone
    lse_fit: list[list[str]] = []  # those whose LSE the kernel's matches too
    seen: list[tuple[np.ndarray, list[str], frozenset, np.ndarray | None]] = []
    weights: list[np.ndarray] = []
    reading(p, weights=weights)
    true_w = weights[0]
    for label, kw in readings_of(p):
        tol_scale = kw.pop("tol_scale", 1.0)
        # (a reading that writes 0 for rows that keep keys does not take NaN for that 0)
        nan_as_empty = not kw.get("guarded", False)
        # The kind of mistake a reading stands for: what it changes (with or without the
        # guard against 0 / 0, exp's limits are one mistake in each format).
        kind = frozenset(kw) - {"guarded"}
        if "inputs" in kw:
            # (which descales a reading drops or doubles is its mistake: where a case sets
            # only descale_k, "descale_k left out" and "the descales left out" agree, and the
            # reason names both)
            kind |= {label}
        alt_w: list[np.ndarray] = []
        alt, alt_lse = reading(p, **kw, with_lse=True, weights=alt_w)
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
            # A reading that rescales V (tol_scale) has that factor in its weights already:
            # counted twice, "descale_v left out" at descale_v = 0.007 took 2·10^4 times the
            # bound and fitted a kernel that only dropped descale_q and descale_k.
            base_w = true_w * tol_scale
            grow = np.where(base_w > 0, np.maximum(alt_w[0] / base_w, 1.0), 1.0)
            fit = (widest if "keep" in kw else det) * tol_scale * grow + ulp(alt, p.fmt)
            # (a NaN where the reading leaves a row with no key counts as its empty row; a NaN
            # or inf where the reading overflows, as its overflow)
            matches = (
                (np.isfinite(o) & (np.abs(o - alt) <= fit))
                | (np.isnan(o) & (alt == 0) & nan_as_empty)
                | (~np.isfinite(o) & ~np.isfinite(alt))
            )
        if o_fails and matches.all() and (differs.any() or _nearer(o, alt, exact, det * tol_scale)):
            found.append(labels)
            if _lse_fits(lse, alt_lse):
                lse_fit.append(labels)
        elif matches.all() and _lse_tells(lse, alt_lse):
            by_lse.append(labels)
            found.append(labels)
            lse_fit.append(labels)
    if not found and o_fails:
        own = _own_lse(o, exact, det, lse, p.fmt)
        if own is not None:
            return [own]
    if lse_fit:
        # The readings whose LSE fits the kernel's too outrank those whose O alone does (a
        # user's sink-scaled kernel: O ~ 0 under the scale left out as well, its LSE only
        # under the scaled sink). Without such a reading (an LSE in another base, say), O's
        # matches stand.
        found = [labels for labels in found if labels in lse_fit]
    return [
        f"{CONSISTENT}{labels[0]}: the output matches exact attention under that reading "
        "within the kernel's bound"
        + (
            " (its LSE tells it: O is the same under that reading and the true one here)"
            if labels in by_lse
            else ""
        )
        + _aliases(labels[1:])
        + _rivals(labels, found)
        for labels in found
    ]


def _own_lse(
    o: np.ndarray,
    exact: np.ndarray,
    det: np.ndarray,
    lse: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    fmt: Any,
) -> str | None:
    """O whose rows are each the exact row times one factor exp(ε) within the bound, |ε|
    within a few fp32 ulps of the row's LSE, where the factor 1 does not fit some row: the
    weights formed as exp(s − LSE) with the LSE rounded to fp32. Not a misreading of the
    definition but an arithmetic one: where |LSE| is large its rounding (an fp32 ulp is 0.004
    at 4e4) scales whole rows past any bound of the format. (A user's fp32 kernel forming
    P = exp(S − LSE), as torch references and FlashAttention's backward do, was told its
    errors fit tf32 products, which it never used.) The factors are not computed but searched
    for: each element's bound gives an interval of factors, and a row fits where its
    intervals meet (the kernel's LSE comes from its rounded scores, which a float64 reading
    cannot know)."""
    if lse is None:
        return None
    if lse[0] is not None:
        # The reading's LSE is computed right and only its rounding reaches O: a kernel whose
        # LSE breaks its bound (an fp32 kernel with bf16 products, whose near one-hot rows
        # took a factor each) is not this one.
        got, true, bound = (np.asarray(x, dtype=np.float64) for x in lse)
        with np.errstate(invalid="ignore"):
            off = np.isfinite(true) & ~(np.abs(got - true) <= bound + ulp(true, FP32))
        if off.any():
            return None
    size = np.abs(np.asarray(lse[0] if lse[0] is not None else lse[1], dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        room = 4 * ulp(np.where(np.isfinite(size), size, 0.0), FP32)
        # (past |LSE| ~ 1e6 the rounding is no small factor but weights of 0 or inf: another
        # failure, which this reading would cover with any factor it liked)
        rows = np.isfinite(exact).all(-1) & np.isfinite(o).all(-1) & np.isfinite(size)
        rows &= room <= 2.0**-4
        tol = det * np.exp(room)[..., None] + ulp(exact, fmt)
        live = exact != 0
        x = np.where(live, exact, 1.0)
        a, b = (o - tol) / x, (o + tol) / x
        lo = np.where(live, np.minimum(a, b), -np.inf).max(-1)
        hi = np.where(live, np.maximum(a, b), np.inf).min(-1)
        # the factors each row's elements allow, within exp(±ε) of 1
        lo, hi = np.maximum(lo, np.exp(-room)), np.minimum(hi, np.exp(room))
        ok = (lo <= hi) & (np.where(live, True, np.abs(o) <= tol).all(-1))
        one = (lo <= 1.0) & (1.0 <= hi)
        others = ~rows & (np.abs(o - exact) <= det).all(-1)
    if not (rows.any() and np.where(rows, ok, others).all() and (rows & ~one).any()):
        return None
    big = float(size[rows].max())
    return (
        f"{CONSISTENT}weights formed as exp(s − LSE) with the LSE rounded to fp32: each row is "
        "the exact row times one factor exp(ε), ε within 4 fp32 ulps of the row's LSE "
        f"(|LSE| up to {big:.3g}, where an ulp is {float(ulp(np.array(big), FP32)):.2g}), and "
        "within the kernel's bound after it; normalizing as exp(s − m) / Σ exp(s − m), with m "
        "the row maximum, keeps the LSE's rounding out of O"
    )


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
