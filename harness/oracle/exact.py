"""Error-free transformations, exact matrix products and double-double arithmetic (numpy).

Notation: ``u = 2^−53`` is the float64 unit roundoff; a double-double (dd) is an unevaluated
pair ``hi + lo`` with ``|lo| ≤ ulp(hi)/2``. Every function that rounds also states, or returns,
a rigorous bound on what its rounding can change, so that the oracle can certify its result.

- ``two_sum`` / ``fast_two_sum`` / ``two_prod``: ``a∘b = s + e`` exactly (Knuth, Dekker).
  Dekker's product is exact while ``|a|, |b| < 2^996`` and ``|a·b| ≥ 2^−969``.
- ``sliced_matmul``: exact products of float64 matrices through BLAS. Each row of ``A`` (and of
  ``B``, which enters transposed) is cut into slices whose entries are integer multiples of a
  per-row power-of-two grid ``G`` with ``|entry/G| ≤ 2^β``. With ``2β + ⌈log2 n⌉ ≤ 53`` every
  partial sum of ``n`` slice products is an integer multiple of ``G_A·G_B`` below ``2^53·G_A·G_B``,
  hence exactly representable: BLAS computes each slice product without error, whatever its
  summation order or FMA use (the idea of Ozaki, Ogita, Oishi & Rump, Numer. Algorithms 2012).
- ``expansion_to_dd``: turns a list of float64 arrays (an exact expansion) into a dd plus a
  certified bound, using two cascaded TwoSum passes (Ogita, Rump & Oishi's VecSum);
  ``expansion_to_td`` into a triple-double the same way.
- ``dd_exp``: ``exp`` of a dd to about 106 bits, with a per-element certified relative bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mpmath
import numpy as np

U = 2.0**-53
U2 = U * U

__all__ = [
    "U2",
    "U",
    "dd_add",
    "dd_add_err",
    "dd_exp",
    "dd_from_mpf",
    "dd_mul",
    "dd_mul_d",
    "dd_mul_err",
    "expansion_to_dd",
    "expansion_to_td",
    "fast_two_sum",
    "slice_rows",
    "sliced_matmul",
    "two_prod",
    "two_sum",
]


def two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``s = fl(a+b)`` and ``e`` with ``a + b = s + e`` exactly (Knuth; no ordering needed)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def fast_two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Dekker's FastTwoSum: exact ``a + b = s + e`` provided ``|a| ≥ |b|`` (or ``a = 0``)."""
    s = a + b
    e = b - (s - a)
    return s, e


_SPLITTER = 2.0**27 + 1.0


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = _SPLITTER * a
    hi = c - (c - a)
    return hi, a - hi


def two_prod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``p = fl(a·b)`` and ``e`` with ``a·b = p + e`` exactly (Dekker/Veltkamp, no FMA)."""
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def dd_add(ah, al, bh, bl):
    """Accurate dd + dd (Joldes, Muller & Popescu 2017, Alg. 6): relative error ≤ 3u²/(1−4u)."""
    zh, zl, _ = dd_add_err(ah, al, bh, bl)
    return zh, zl


def dd_add_err(ah, al, bh, bl):
    """dd + dd as in :func:`dd_add`, with TwoSum in place of FastTwoSum so that the only
    roundings are ``c = fl(sl + th)`` and ``w = fl(tl + vl)``: returns ``(zh, zl, err)`` with
    the absolute bound ``err = u·(|c| + |w|)·(1 + 2^−50)``."""
    sh, sl = two_sum(ah, bh)
    th, tl = two_sum(al, bl)
    c = sl + th
    vh, vl = two_sum(sh, c)
    w = tl + vl
    zh, zl = two_sum(vh, w)
    return zh, zl, (np.abs(c) + np.abs(w)) * (U * (1 + 2.0**-50))


def dd_mul(ah, al, bh, bl):
    """dd × dd with relative error ≤ 8u².

    Exact product ``ah·bh + ah·bl + al·bh + al·bl``; ``ah·bh`` is exact through two_prod, the
    dropped ``al·bl`` is ≤ u², each of the two cross products rounds by ≤ u², their sum by
    ≤ 2u², and the final low-part addition by ≤ 3u² (relative to |a·b|). FastTwoSum is exact.
    """
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    return fast_two_sum(p, e)


def dd_mul_err(ah, al, bh, bl):
    """dd × dd as in :func:`dd_mul` with a per-element absolute bound on its error:
    ``|al·bl| + u·(|ah·bl| + |al·bh| + |cross| + |e + cross|)``, times ``1 + 2^−50``."""
    p, e = two_prod(ah, bh)
    x1 = ah * bl
    x2 = al * bh
    cross = x1 + x2
    e2 = e + cross
    zh, zl = two_sum(p, e2)
    err = np.abs(al * bl) + U * (np.abs(x1) + np.abs(x2) + np.abs(cross) + np.abs(e2))
    return zh, zl, err * (1 + 2.0**-50)


def dd_mul_d(ah, al, b):
    """dd × double with relative error ≤ 3u² (one cross product and one addition round)."""
    p, e = two_prod(ah, b)
    e = e + al * b
    return fast_two_sum(p, e)


def dd_from_mpf(x: mpmath.mpf) -> tuple[float, float]:
    """Nearest dd of an mpmath number: ``|x − hi − lo| ≤ u·|lo| ≤ u²|x|`` (normal range)."""
    hi = float(x)
    if not math.isfinite(hi) or hi == 0.0:
        return hi, 0.0
    # x − hi needs at most bc + 2 bits (x's own bits, plus a borrow): exact at this precision.
    with mpmath.mp.workprec(max(mpmath.mp.prec, int(x._mpf_[3]) + 8)):
        lo = float(x - hi)
    return hi, lo


# ---------------------------------------------------------------------------------------------
# Expansions


def expansion_to_dd(terms: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round an exact expansion ``Σ terms`` to a dd ``hi + lo``; return ``(hi, lo, err)``.

    Two VecSum passes leave the exact sum unchanged and push it into the last term; the other
    terms ("rest") are then of the order of u·|sum| and are added recursively. The only
    rounding is in that last recursive sum, whose error is at most ``u·Σ|partial sums|``
    (each partial sum is computed once, so the bound uses the computed partials, times
    ``1 + 2^−40`` to cover the rounding of the bound itself).
    """
    p = [np.asarray(t, dtype=np.float64) for t in terms]
    if len(p) == 1:
        return p[0].copy(), np.zeros_like(p[0]), np.zeros_like(p[0])
    for _ in range(2):
        for i in range(1, len(p)):
            p[i], p[i - 1] = two_sum(p[i - 1], p[i])
    hi = p[-1]
    rest = p[:-1]
    acc = rest[0]
    err = np.zeros_like(acc)
    for r in rest[1:]:
        acc = acc + r
        err = err + np.abs(acc)
    err = err * (U * (1.0 + 2.0**-40))
    hi, lo = two_sum(hi, acc)
    return hi, lo, err


def expansion_to_td(
    terms: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Round an exact expansion ``Σ terms`` to a triple ``hi + mid + lo``; return it with a
    certified bound on ``|Σ terms − hi − mid − lo|``.

    Two VecSum passes push the exact sum into the last term (``hi``); the other terms, each
    the exact rounding error of a partial sum, are rounded to a dd by :func:`expansion_to_dd`,
    whose bound is then of the order of ``u³·|sum|``. Three TwoSums (exact) renormalise the
    triple so that ``|mid| ≤ ulp(hi)/2``.
    """
    p = [np.asarray(t, dtype=np.float64) for t in terms]
    if len(p) == 1:
        zero = np.zeros_like(p[0])
        return p[0].copy(), zero, zero.copy(), zero.copy()
    for _ in range(2):
        for i in range(1, len(p)):
            p[i], p[i - 1] = two_sum(p[i - 1], p[i])
    mid, lo, err = expansion_to_dd(p[:-1])
    hi, mid = two_sum(p[-1], mid)
    mid, lo = two_sum(mid, lo)
    hi, mid2 = two_sum(hi, mid)
    return hi, mid2, lo, err


def _row_exponent(x: np.ndarray) -> np.ndarray:
    """Per row, the smallest e with ``max|x_row| < 2^e`` (0 for an all-zero row)."""
    m = np.max(np.abs(x), axis=-1)
    _, e = np.frexp(m)
    return e.astype(np.int64)


def slice_rows(
    hi: np.ndarray,
    lo: np.ndarray | None,
    beta: int,
    *,
    max_slices: int | None = None,
    rel_tol: float = 0.0,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Cut the rows of ``hi + lo`` (a float64 matrix, or an exact dd matrix) into slices.

    Slice ``s`` holds integer multiples of a per-row grid ``G = 2^(e−β)`` where ``2^e`` bounds
    the row of the current remainder, so ``|slice/G| ≤ 2^β``. The remainder stays exact (as a
    dd). Slicing stops when the remainder is zero, when ``max_slices`` is reached, or when every
    row's remainder is at most ``rel_tol`` times that row's original maximum. Returns the slices
    and a float64 upper bound on ``|remainder|`` elementwise.
    """
    rh = np.array(hi, dtype=np.float64, copy=True)
    rl = np.zeros_like(rh) if lo is None else np.array(lo, dtype=np.float64, copy=True)
    start = np.max(np.abs(rh), axis=-1, keepdims=True)
    slices: list[np.ndarray] = []
    while True:
        if not np.any(rh):
            break
        if max_slices is not None and len(slices) >= max_slices:
            break
        if rel_tol > 0 and np.all(np.max(np.abs(rh), axis=-1, keepdims=True) <= rel_tol * start):
            break
        e = _row_exponent(rh)[..., None]
        # Clamped at the smallest subnormal so tiny rows cannot make the grid underflow to 0
        # (every double is a multiple of 2^-1074, so the slice is still exact).
        grid = np.ldexp(1.0, np.maximum(e - beta, -1074))
        s = np.rint(rh / grid) * grid  # power-of-two scaling: exact; rint: nearest integer
        slices.append(s)
        # rh − s is exact (|rh − s| ≤ G/2 and both are multiples of rh's ulp or of G), and
        # two_sum keeps the remainder an exact dd.
        rh, rl = two_sum(rh - s, rl)
    return slices, np.abs(rh) + np.abs(rl)


def beta_for(n: int) -> int:
    """Bits per slice so that ``n`` products of slices sum exactly: ``2β + ⌈log2 n⌉ ≤ 53``."""
    return (53 - max(1, math.ceil(math.log2(max(n, 2))))) // 2


def sliced_matmul(a_slices: list[np.ndarray], b_slices: list[np.ndarray]) -> list[np.ndarray]:
    """Exact products ``A_s @ B_tᵀ`` of every pair of slices (see the module docstring)."""
    return [a @ b.T for a in a_slices for b in b_slices]


# ---------------------------------------------------------------------------------------------
# exp in double-double

_TABLE_BITS = 10
_N = 1 << _TABLE_BITS


def _exp_constants():
    with mpmath.mp.workprec(300):
        step = mpmath.log(2) / _N
        l1 = float(mpmath.mpf(step))
        l1 = math.ldexp(round(math.ldexp(l1, 42)), -42)  # 32 significant bits: k·L1 exact
        r1 = step - l1
        l2 = math.ldexp(round(float(r1) * 2.0**74), -74)  # 32 more bits
        l3 = float(r1 - l2)
        err_l = abs(r1 - l2 - l3)
        inv = float(_N / mpmath.log(2))
        exact_t = [mpmath.mpf(2) ** (mpmath.mpf(j) / _N) for j in range(_N)]
        table = [dd_from_mpf(t) for t in exact_t]
        # Actual relative error of each dd table entry, rounded up (mpmath at 300 bits).
        t_err = [
            float(abs(t - h - lo) / t) * (1 + 2.0**-40) + 2.0**-280
            for t, (h, lo) in zip(exact_t, table, strict=True)
        ]
        c6 = dd_from_mpf(mpmath.mpf(1) / 6)
        c24 = dd_from_mpf(mpmath.mpf(1) / 24)
    th = np.array([t[0] for t in table])
    tl = np.array([t[1] for t in table])
    return l1, l2, l3, float(err_l), inv, th, tl, np.array(t_err), c6, c24


_L1, _L2, _L3, _ERR_L, _INV_STEP, _TH, _TL, _TERR, _C6, _C24 = _exp_constants()
EXP_UNDERFLOW = -740.0  # exp(x) < 2^−1067 below this; the result is flushed to 0
EXP_FLUSH_ABS = 2.0**-1060  # absolute bound covering the flush and subnormal scaling


def dd_exp(
    xh: np.ndarray, xl: np.ndarray, xll: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``exp(xh + xl (+ xll))`` as a dd, for ``xh ≤ 700``; returns ``(hi, lo, rel_err)``. The
    optional third term (of the order of ``u²|x|``, as a triple-double's) joins the reduction's
    low-order terms, so an argument known to triple-double accuracy keeps it: ``r`` is small,
    and only its own roundings count.

    Method: ``k = rint(x·1024/ln2)``, ``r = x − k·ln2/1024`` with ln2/1024 as a triple of doubles
    (the first two with 32 bits, so ``k·L1`` and ``k·L2`` are exact for ``|k| < 2^21``), so
    ``|r| ≤ 2^−11.4``; ``exp(x) = 2^(k>>10) · T[k & 1023] · (1 + expm1(r))`` with the table
    ``T[j] = 2^(j/1024)`` correctly rounded to dd and ``expm1(r)`` by its Taylor series to degree
    8 (terms of degree ≥ 5 in plain double: they are below 2^−64). The result is
    ``T + T·expm1(r)``.

    Error (relative, per element): reduction ``|δr|`` (computed from the actual low-order
    terms) + table ``u²`` + final dd_add ``3u²/(1−4u)`` + Taylor and rounding of ``expm1``
    ``≤ 2^−112``. Values with ``xh < −740`` are flushed to 0; the caller adds the absolute
    :data:`EXP_FLUSH_ABS`, which also covers the loss of low bits when ``2^(k>>10)`` scales
    into the subnormal range.
    """
    xh = np.asarray(xh, dtype=np.float64)
    xl = np.asarray(xl, dtype=np.float64)
    if np.any(xh > 700):
        raise ValueError("dd_exp: argument above 700 would overflow float64")
    under = xh < EXP_UNDERFLOW
    xh_c = np.where(under, 0.0, xh)
    xl_c = np.where(under, 0.0, xl)
    k = np.rint(xh_c * _INV_STEP)
    a_h, a_l = two_sum(xh_c, -(k * _L1))
    s, e1 = two_sum(a_h, -(k * _L2))
    s, e2 = two_sum(s, xl_c)
    kl3 = k * _L3
    tail_terms = e1 + e2 + a_l
    xll_c = np.zeros_like(xh_c) if xll is None else np.where(under, 0.0, xll)
    if xll is not None:  # one more rounding, at most u·(|tail_terms| + |xll|)
        tail_terms = tail_terms + xll_c
    low = tail_terms - kl3
    rh, rl = two_sum(s, low)
    # |δr|: the L triple's error, the rounding of k·L3, and of the two low-order additions.
    err_r = np.abs(k) * _ERR_L + U * np.abs(kl3) + 2 * U * (np.abs(tail_terms) + np.abs(low))
    err_r = err_r + U * (np.abs(e1) + np.abs(e2) + np.abs(a_l) + np.abs(xll_c))

    r2h, r2l = dd_mul(rh, rl, rh, rl)
    r3h, r3l = dd_mul(r2h, r2l, rh, rl)
    r4h, r4l = dd_mul(r2h, r2l, r2h, r2l)
    tail = rh**5 * (1 / 120 + rh * (1 / 720 + rh * (1 / 5040 + rh * (1 / 40320))))
    c4h, c4l = dd_mul(r4h, r4l, _C24[0], _C24[1])
    c3h, c3l = dd_mul(r3h, r3l, _C6[0], _C6[1])
    mh, ml = dd_add(c4h, c4l, tail, np.zeros_like(tail))
    mh, ml = dd_add(c3h, c3l, mh, ml)
    mh, ml = dd_add(r2h * 0.5, r2l * 0.5, mh, ml)
    mh, ml = dd_add(rh, rl, mh, ml)  # expm1(r)

    j = (k.astype(np.int64)) % _N
    n = (k.astype(np.int64) - j) // _N
    th, tl = _TH[j], _TL[j]
    ph, pl = dd_mul(th, tl, mh, ml)
    zh, zl, add_err = dd_add_err(th, tl, ph, pl)
    # Relative: the table entry's own error, the final addition (computed per element, over
    # |z| ≥ 1 − 2^−11), dd_mul on a term ≤ 2^−11 of the total (8u²·2^−11), expm1's roundings
    # and truncation (≤ 2^−112 relative to 1), and δr·(1 + |r|).
    rel = _TERR[j] + add_err / (np.abs(zh) * (1 - 2.0**-10)) + 8.0 * 2.0**-11 * U2 + 2.0**-112
    rel = (rel + err_r * (1 + 2.0**-10)) * (1.0 + 2.0**-40)
    zh = np.ldexp(zh, n)
    zl = np.ldexp(zl, n)
    zh = np.where(under, 0.0, zh)
    zl = np.where(under, 0.0, zl)
    return zh, zl, np.where(under, 0.0, rel)
