"""The adversarial input families (docs/properties.md, Inputs), as plain numpy generators.

A :class:`Recipe` is a small record (family, shapes, masks, scale, an RNG seed and a few family
parameters); :func:`make_case` turns it into exact arrays with numpy's seeded generator, rounded
into the input format. Both the Hypothesis strategies (:mod:`flashcheck.properties.strategies`) and
the report campaign (:mod:`flashcheck.harness.campaign.runner`) draw recipes and build cases through
this module, so a recipe printed by either rebuilds exactly the values tested.

Families: ``randn``, ``huge_logits`` (scores near and beyond the format's limits and beyond the
exp-overflow thresholds 11.09 / 88.72), ``negative_rows`` (every score of a row negative and
as large: a finite sentinel in place of −inf for the running max is never replaced),
``near_ties`` and ``exact_ties`` of the row max,
``subnormal`` and ``tiny`` inputs, ``spike`` (one dominant key), ``fa3_outliers``
(N(0,1) + N(0,100)·Bernoulli(0.001)), ``sink`` (attention sink at key 0), ``monotone`` (the
running max grows at every key: the most rescales), ``cancel_v`` (V whose weighted sum cancels
to near 0), ``uniform`` scores, ``one_hot`` rows and ``nonfinite`` (NaN/±Inf injected).

A recipe may also set a soft-cap and sinks relative to the case's own scores (``cap_factor``,
``sink_offset``: :func:`~flashcheck.harness.cases.softmax_families.with_softmax_options`, the
cap rounded to fp32); a recipe without them is written and hashed as before they existed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from ..core.formats import FORMATS, round_to_format
from .case import DTYPES, Case
from .softmax_families import with_softmax_options

__all__ = ["EDGES", "EXP_OVERFLOW", "FAMILIES", "HEAD_DIMS", "Recipe", "magnitudes", "make_case"]

FAMILIES = (
    "randn",
    "huge_logits",
    "negative_rows",
    "near_ties",
    "exact_ties",
    "subnormal",
    "tiny",
    "spike",
    "fa3_outliers",
    "sink",
    "monotone",
    "cancel_v",
    "uniform",
    "one_hot",
    "nonfinite",
)
# Block edges of common kernels (16, 32, 64, 128, 256, 1024) and their neighbours.
EDGES = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025)
HEAD_DIMS = (1, 8, 16, 24, 32, 40, 59, 64, 72, 96, 111, 128, 256)
EXP_OVERFLOW = {"fp16": 11.09, "bf16": 88.72, "fp32": 88.72}


@dataclass(frozen=True)
class Recipe:
    """Everything :func:`make_case` needs; small, printable, shrinkable."""

    dtype: str
    family: str
    b: int
    hq: int
    hk: int
    nq: int
    nk: int
    d: int
    dv: int
    seed: int
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    mask_density: float | None = None
    scale: float | None = None
    magnitude: float = 1.0
    score_limit: float | None = None
    # The softmax options, relative to the case's own scores (cases/softmax_families.py): the
    # cap as a fraction of max |s|, each head's sink as an offset from its largest score.
    cap_factor: float | None = None
    sink_offset: float | None = None

    def to_json(self) -> dict:
        """The fields as a dict; the softmax options only where set, so that a recipe without
        them is written (and hashed into campaign keys) as before they existed."""
        out = asdict(self)
        for name in _OPTION_FIELDS:
            if out[name] is None:
                del out[name]
        return out


_OPTION_FIELDS = ("cap_factor", "sink_offset")


def magnitudes(family: str, dtype: str, score_limit: float | None = None) -> list[float]:
    """The ``magnitude`` values worth trying for ``family`` (sorted; ``[1.0]`` if unused).

    ``huge_logits``: score bounds just below and above the exp-overflow threshold of the format,
    then past fp16's 65504 and (for bf16/fp32) far beyond, capped below ``score_limit``;
    peaked families: how far the peak stands out; ``cancel_v``/``tiny``: the size of V.
    """
    if family in ("huge_logits", "negative_rows"):
        fmt_max = FORMATS[dtype].max_finite
        cands = [EXP_OVERFLOW[dtype] * f for f in (0.99, 1.01)] + [1e3, 6e4, 7e4, 1e6]
        if dtype != "fp16":
            cands += [1e12, 1e30]
        limit = score_limit if score_limit is not None else min(fmt_max, 1e36)
        cands = [c for c in cands if c < 0.9 * limit] + [0.9 * min(limit, 1e30)]
        return sorted(set(cands))
    if family in ("spike", "one_hot", "sink", "monotone", "near_ties", "exact_ties"):
        return [2.0, 10.0, 30.0, 100.0]
    if family in ("cancel_v", "tiny"):
        return [1e-2, 1.0, 1e2]
    return [1.0]


def _fit(x: np.ndarray, dtype: str) -> np.ndarray:
    fmt = FORMATS[dtype]
    big = fmt.max_finite
    x = np.where(np.isfinite(x), np.clip(x, -big, big), x)
    return round_to_format(x, fmt).astype(DTYPES[dtype])


def _scores_max(q, k, tau) -> float:
    rep = q.shape[1] // k.shape[1]
    kk = np.repeat(k, rep, axis=1)
    return float(abs(tau) * (np.abs(q) @ np.swapaxes(np.abs(kk), -1, -2)).max(initial=0.0))


def _shape_family(r: Recipe, rng: np.random.Generator, q, k, v, tau: float):
    """Q, K and V of family ``r.family`` from standard normal ones (float64, not yet rounded)."""
    fam = r.family
    ks = (r.b, r.hk, r.nk, r.d)
    fmt = FORMATS[r.dtype]
    mag = r.magnitude
    if fam == "huge_logits":
        q = q * (mag / max(_scores_max(q, k, tau), 1e-300))
    elif fam == "negative_rows":
        # Every score of every row negative and large: k > 0 and q < 0 componentwise (scale
        # sign included), so a running max initialised to a finite sentinel (-1e4, -5e4,
        # -1e6 instead of -inf) is never replaced and exp underflows to 0 / 0.
        k = np.abs(k) + 0.5
        q = -(np.abs(q) + 0.5) * (1.0 if tau > 0 else -1.0)
        q = q * (mag / max(_scores_max(q, k, tau), 1e-300))
    elif fam in ("near_ties", "exact_ties"):
        # Many keys share (or nearly share) the direction that gives the row max.
        base = rng.standard_normal((r.b, r.hk, 1, r.d))
        tied = rng.random((r.b, r.hk, r.nk, 1)) < 0.5
        jitter = 0.0 if fam == "exact_ties" else fmt.eps * rng.standard_normal(ks)
        k = np.where(tied, base * (1 + jitter), k)
        q = q * (mag / max(1.0, math.sqrt(r.d) * abs(tau)))
    elif fam == "subnormal":
        tiny = fmt.min_normal
        q = q * tiny * 4
        k = k * tiny * 4
        v = v * tiny * rng.choice([0.01, 0.3, 2.0])
    elif fam == "tiny":
        q, k, v = q * 1e-3, k * 1e-3, v * mag * 1e-4
    elif fam in ("spike", "one_hot"):
        rep = r.hq // r.hk
        for b in range(r.b):
            for h in range(r.hq):
                cols = rng.integers(0, r.nk, size=r.nq) if fam == "one_hot" else None
                for i in range(r.nq if fam == "one_hot" else 1):
                    j = int(cols[i]) if cols is not None else int(rng.integers(0, r.nk))
                    row = q[b, h, i]
                    k[b, h // rep, j] = row / max(np.linalg.norm(row), 1e-30) * math.sqrt(r.d)
        q = q * (mag / max(1.0, math.sqrt(r.d) * abs(tau)))
    elif fam == "fa3_outliers":
        for name in ("q", "k", "v"):
            x = {"q": q, "k": k, "v": v}[name]
            x += rng.standard_normal(x.shape) * 10.0 * (rng.random(x.shape) < 1e-3)
    elif fam == "sink":
        direction = q.mean(axis=(1, 2), keepdims=True)
        k[:, :, :1] = direction / np.maximum(np.abs(direction).max(), 1e-30) * mag
        v[:, :, :1] *= 0.05
    elif fam == "monotone":
        ramp = np.linspace(0.0, mag, r.nk)[None, None, :, None]
        w = rng.standard_normal((r.b, 1, 1, r.d))
        q = w + 0.01 * q
        unit = w / np.maximum((w * w).sum(-1, keepdims=True), 1e-30)
        k = 0.01 * k + ramp * unit / max(abs(tau), 1e-30)
    elif fam == "cancel_v":
        sign = np.where(np.arange(r.nk) % 2 == 0, 1.0, -1.0)[None, None, :, None]
        v = mag * (sign + 1e-3 * v)
        q = q * 0.1
    elif fam == "uniform":
        k = np.broadcast_to(k[:, :, :1], ks).copy()
    return q, k, v


def _plant_nonfinite(r: Recipe, rng: np.random.Generator, q, k, v):
    """One to three NaN/±Inf values at random places of Q and K (and V, when no mask could hide
    the row that reads it)."""
    q, k, v = q.copy(), k.copy(), v.copy()
    specials = [np.nan, np.inf, -np.inf]
    targets = ["q", "k"] + (["v"] if not (r.causal or r.window or r.mask_density) else [])
    for _ in range(int(rng.integers(1, 4))):
        arr = {"q": q, "k": k, "v": v}[targets[int(rng.integers(len(targets)))]]
        idx = tuple(int(rng.integers(n)) for n in arr.shape)
        arr[idx] = specials[int(rng.integers(3))]
    return q, k, v


def make_case(r: Recipe) -> Case:
    """Build the arrays of recipe ``r`` (deterministic in ``r``)."""
    rng = np.random.default_rng(r.seed)
    fam = r.family
    qs, ks, vs = (r.b, r.hq, r.nq, r.d), (r.b, r.hk, r.nk, r.d), (r.b, r.hk, r.nk, r.dv)
    q, k, v = rng.standard_normal(qs), rng.standard_normal(ks), rng.standard_normal(vs)
    tau = r.scale if r.scale is not None else 1 / math.sqrt(r.d)
    q, k, v = _shape_family(r, rng, q, k, v, tau)
    if r.score_limit is not None:
        # Keep the kernel's specified range: halve q until scale·Σ|q||k| fits.
        for _ in range(2000):
            if _scores_max(q, k, tau) < 0.9 * r.score_limit:
                break
            q = q / 2
    q, k, v = _fit(q, r.dtype), _fit(k, r.dtype), _fit(v, r.dtype)
    if fam == "nonfinite":
        q, k, v = _plant_nonfinite(r, rng, q, k, v)
    mask = None
    if r.mask_density is not None:
        mask = rng.random((r.b, r.hq, r.nq, r.nk)) >= r.mask_density
    case = Case(
        q,
        k,
        v,
        causal=r.causal,
        window=r.window,
        mask=mask,
        scale=r.scale,
        family=fam,
        seed=r.seed,
        params={"recipe": r.to_json()},
    )
    if r.cap_factor is not None or r.sink_offset is not None:
        case = with_softmax_options(case, cap_factor=r.cap_factor, sink_offset=r.sink_offset)
        if case.softcap is not None:
            # A float32 cap: what a kernel computing in fp32 holds is exactly the cap judged.
            case = replace(case, softcap=float(np.float32(case.softcap)))
    return case
