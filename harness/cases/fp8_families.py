"""Adversarial input families for FP8 kernels: FP8 values and their descales, from a seed.

An :class:`Fp8Recipe` names a family, the FP8 format, the shapes and a seed;
:func:`make_fp8_case` turns it into a :class:`~.case.Case` holding FP8 values and float32
descales ``(B, Hk)``. Quantization happens here, before any kernel: the case holds FP8 values,
so a value "beyond 448" is an FP8 value times a descale that puts the exact input there.

- ``fp8_outliers``: FlashAttention-3's N(0,1) + N(0,100)·Bernoulli(0.001) for q, k and v,
  quantized per (batch, head) with ``descale = amax / max_fp8`` (its Table 3's inputs).
- ``fp8_saturated``: values at the format's largest value (±448 in e4m3) and descales that are
  powers of two up to 2^20, so exact inputs lie at and far beyond 448.
- ``fp8_binades``: descales spanning many binades: ``descale_q = 2^a``, ``descale_k = 2^−a``
  (a up to ±60; their product keeps the scores moderate), ``descale_v`` from 2^−100 to 2^100.
- ``fp8_flush``: one key per row dominates and most others sit 7–9 nats below it, so their
  weights ``p ≤ 2^−10`` flush to zero when P is quantized to e4m3; V positive (no cancellation).
- ``fp8_p_ties``: every key but one shares a weight ``p = 0.55``: e4m3 rounds it to 0.5625
  (2.3 %), e5m2 to 0.5 (9 %), the same way for every key, with V positive.
- ``fp8_uniform_long``: equal scores (P = 1 exactly); the first key's V is 448 and every other
  one 448·2^−12: an accumulator below fp32 (fp16, bf16) drops the small terms after the
  first (each is below half its spacing at 448), which over ~1000 keys is a 20 % error.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..core.formats import FP8_FORMATS, round_to_format
from ..core.fp8 import quantize
from .case import FP8_DTYPES, Case

__all__ = ["FP8_FAMILIES", "Fp8Recipe", "fa3_outliers", "make_fp8_case"]

FP8_FAMILIES = (
    "fp8_outliers",
    "fp8_saturated",
    "fp8_binades",
    "fp8_flush",
    "fp8_p_ties",
    "fp8_uniform_long",
)


@dataclass(frozen=True)
class Fp8Recipe:
    """A recipe of an FP8 case: family, FP8 format, ``(B, Hq, Hk, Nq, Nk, d)``, causal, seed."""

    family: str
    fmt: str = "e4m3"
    b: int = 1
    hq: int = 2
    hk: int = 1
    nq: int = 16
    nk: int = 64
    d: int = 32
    causal: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.family not in FP8_FAMILIES:
            raise ValueError(f"family must be one of {FP8_FAMILIES}, got {self.family!r}")
        if self.fmt not in FP8_DTYPES:
            raise ValueError(f"fmt must be one of {sorted(FP8_DTYPES)}, got {self.fmt!r}")
        if min(self.b, self.hq, self.hk, self.nq, self.nk, self.d) < 1 or self.hq % self.hk:
            raise ValueError("sizes must be >= 1 and hq a multiple of hk")


def fa3_outliers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """FlashAttention-3's outlier distribution N(0,1) + N(0,100)·Bernoulli(0.001)."""
    return rng.standard_normal(shape) + 10.0 * rng.standard_normal(shape) * (
        rng.random(shape) < 0.001
    )


def _fp8(x: np.ndarray, fmt: str) -> np.ndarray:
    return round_to_format(x, FP8_FORMATS[fmt]).astype(FP8_DTYPES[fmt])


def _f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def _gap_case(r: Fp8Recipe, rng: np.random.Generator, gaps: np.ndarray, v_lo: float):
    """q = e_0, key 0 carries 1 and key j carries ``1 − gaps_j / G`` in coordinate 0, so with
    ``descale_k = G/τ`` key j's score sits ``gaps_j`` nats below key 0's (up to the rounding of
    the FP8 value); V uniform in [v_lo, 2·v_lo] (positive)."""
    tau = 1.0 / math.sqrt(r.d)
    top = float(gaps.max()) if gaps.size else 1.0
    q = np.zeros((r.b, r.hq, r.nq, r.d))
    q[..., 0] = 1.0
    k = np.zeros((r.b, r.hk, r.nk, r.d))
    k[..., 0] = 1.0 - gaps / top
    v = v_lo * (1.0 + rng.random((r.b, r.hk, r.nk, r.d)))
    dk = _f32(np.full((r.b, r.hk), top / tau))
    return _fp8(q, r.fmt), _fp8(k, r.fmt), _fp8(v, r.fmt), None, dk, None


def _draw(r: Fp8Recipe, rng: np.random.Generator):
    """``(q8, k8, v8, descale_q, descale_k, descale_v)`` of the recipe's family."""
    big = FP8_FORMATS[r.fmt].max_finite
    qs, ks, vs = (r.b, r.hq, r.nq, r.d), (r.b, r.hk, r.nk, r.d), (r.b, r.hk, r.nk, r.d)
    if r.family == "fp8_outliers":
        q8, dq = quantize(fa3_outliers(rng, qs), r.fmt, heads=r.hk)
        k8, dk = quantize(fa3_outliers(rng, ks), r.fmt)
        v8, dv = quantize(fa3_outliers(rng, vs), r.fmt)
        return q8, k8, v8, dq, dk, dv
    if r.family == "fp8_saturated":
        pick = [rng.choice([-big, big], s) * (rng.random(s) < 0.3) for s in (qs, ks, vs)]
        base = [rng.standard_normal(s) * big / 4 for s in (qs, ks, vs)]
        q, k, v = (np.where(p != 0, p, b) for p, b in zip(pick, base, strict=True))
        dk, dv = np.exp2(rng.integers(0, 21, (2, r.b, r.hk)))
        # K and V reach 448·2^20; descale_q keeps the scores within ~±30 nats
        dq = _f32(30.0 / (big * big * math.sqrt(r.d) * dk))
        return _fp8(q, r.fmt), _fp8(k, r.fmt), _fp8(v, r.fmt), dq, _f32(dk), _f32(dv)
    if r.family == "fp8_binades":
        a = rng.integers(-60, 61, (r.b, r.hk))
        q8, dq = quantize(rng.standard_normal(qs), r.fmt, heads=r.hk)
        k8, dk = quantize(rng.standard_normal(ks), r.fmt)
        v8, dv = quantize(rng.standard_normal(vs), r.fmt)
        dv = _f32(dv * np.exp2(rng.integers(-100, 101, (r.b, r.hk))))
        return q8, k8, v8, _f32(dq * np.exp2(a)), _f32(dk * np.exp2(-a)), dv
    if r.family == "fp8_flush":
        gaps = rng.uniform(7.0, 9.0, (r.b, r.hk, r.nk))
        gaps[..., rng.integers(r.nk)] = rng.uniform(0, 2)  # one more key of real weight
        gaps[..., 0] = 0.0
        return _gap_case(r, rng, gaps, 1.0)
    if r.family == "fp8_p_ties":
        gaps = np.full((r.b, r.hk, r.nk), -math.log(0.55))
        gaps[..., 0] = 0.0
        return _gap_case(r, rng, gaps, 1.0)
    # fp8_uniform_long: q = 0, so every score is 0 and P = 1 exactly
    v = np.full(vs, big * 2.0**-12)
    v[:, :, 0] = big
    q8, k8, v8 = (_fp8(x, r.fmt) for x in (np.zeros(qs), rng.standard_normal(ks), v))
    return q8, k8, v8, None, None, None


def make_fp8_case(r: Fp8Recipe) -> Case:
    """The case of recipe ``r`` (FP8 values, descales; ``params["recipe"]`` records ``r``)."""
    rng = np.random.default_rng(r.seed)
    q8, k8, v8, dq, dk, dv = _draw(r, rng)
    return Case(
        q8,
        k8,
        v8,
        causal=r.causal,
        family=r.family,
        seed=r.seed,
        params={"recipe": asdict(r)},
        descale_q=dq,
        descale_k=dk,
        descale_v=dv,
    )
