"""Hypothesis strategies for adversarial attention inputs (SPEC 4).

Hypothesis draws a small :class:`Recipe` (family, shapes, masks, scale, an RNG seed and a few
family parameters); :func:`make_case` turns it into arrays with numpy's seeded generator and
rounds them exactly into the input format. Shrinking therefore works on parameters, big arrays
are not one repeated value (what Hypothesis' own array fill tends to produce), and a failing
example prints as ``make_case(Recipe(...))``: an expression that rebuilds exactly the values
tested. The saved case file holds the bit patterns as well.

The families themselves (and :class:`Recipe`, :func:`make_case`) live in
:mod:`harness.families`, shared with the report campaign.
Lengths are biased to block edges; ``Nq != Nk``, causal with ``Nq > Nk`` (fully masked rows),
sliding windows, explicit masks and GQA/MQA come from the shared shape draw.
"""

from __future__ import annotations

from hypothesis import strategies as st

from harness.cases import DTYPES, Case
from harness.families import EDGES, FAMILIES, HEAD_DIMS, Recipe, magnitudes, make_case

__all__ = ["FAMILIES", "Recipe", "cases", "lengths", "make_case", "recipes"]


def lengths(max_len: int) -> st.SearchStrategy[int]:
    """Sequence lengths, mostly at block edges, never above ``max_len``."""
    edges = [n for n in EDGES if n <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len))


@st.composite
def recipes(
    draw,
    *,
    dtype: str,
    families: tuple[str, ...] = FAMILIES,
    max_len: int = 129,
    max_d: int = 128,
    masks: tuple[str, ...] = ("causal", "window", "mask"),
    score_limit: float | None = None,
    max_work: int = 1 << 16,
    min_slices: int = 1,
) -> Recipe:
    """A :class:`Recipe` for ``dtype``. ``score_limit`` caps ``scale·Σ|q||k|`` (the kernel's
    specified range); ``max_work`` caps ``B·Hq·Nq·Nk`` so one example stays fast;
    ``min_slices`` asks for at least that many (batch, head) slices."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    family = draw(st.sampled_from(families))
    nq, nk = draw(lengths(max_len)), draw(lengths(max_len))
    dims = [x for x in HEAD_DIMS if x <= max_d]
    d = draw(st.sampled_from(dims))
    dv = d if draw(st.booleans()) else draw(st.sampled_from(dims))
    hk = draw(st.sampled_from([1, 2]))
    hq = hk * draw(st.sampled_from([1, 2]))
    b = draw(st.sampled_from([1, 2]))
    if b * hq * nq * nk > max_work:
        b, hq, hk = 1, 1, 1
    if b * hq < min_slices:
        b = 2
        nq = max(1, min(nq, max_work // (b * hq * nk)))
    causal = "causal" in masks and draw(st.booleans())
    window = None
    if "window" in masks and draw(st.integers(0, 3)) == 0:
        window = (
            draw(st.one_of(st.none(), st.integers(0, max_len))),
            draw(st.one_of(st.none(), st.integers(0, max_len))),
        )
    mask_density = None
    if "mask" in masks and draw(st.integers(0, 4)) == 0:
        mask_density = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9]))
    scale = draw(st.sampled_from([None, None, 1.0, 0.125, 0.5, 2.0, 0.3]))
    magnitude = draw(st.sampled_from(magnitudes(family, dtype, score_limit)))
    seed = draw(st.integers(0, 2**32 - 1))
    return Recipe(
        dtype, family, b, hq, hk, nq, nk, d, dv, seed, causal, window, mask_density, scale,
        magnitude, score_limit,
    )  # fmt: skip


def cases(**kw) -> st.SearchStrategy[Case]:
    """Cases built by :func:`make_case` from :func:`recipes` (same keyword arguments)."""
    return recipes(**kw).map(make_case)
