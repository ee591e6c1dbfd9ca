"""Hypothesis strategies for adversarial attention inputs (docs/properties.md, Inputs), drawn
inside a kernel's contract.

Hypothesis draws a small :class:`Recipe` (family, shapes, masks, scale, an RNG seed and a few
family parameters); :func:`make_case` turns it into arrays with numpy's seeded generator and
rounds them exactly into the input format. Shrinking therefore works on parameters, big arrays
are not one repeated value (what Hypothesis' own array fill tends to produce), and a failing
example prints as ``make_case(Recipe(...))``: an expression that rebuilds exactly the values
tested. The saved case file holds the bit patterns as well.

The families themselves (and :class:`Recipe`, :func:`make_case`) live in
:mod:`flashcheck.harness.cases.families`, shared with the report campaign. Lengths are biased
to block edges (or are multiples of a kernel's required multiple); ``Nq != Nk``, causal
with ``Nq > Nk`` (fully masked rows), sliding windows, explicit masks and GQA/MQA come from the
shared shape draw, each only where the kernel's contract takes it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from ..harness.adapters.palette import DEFAULT_PALETTE, Palette, palette_for
from ..harness.adapters.probe import resolved
from ..harness.adapters.registry import as_kernel
from ..harness.cases.case import DTYPES, Case
from ..harness.cases.families import (
    EDGES,
    FAMILIES,
    HEAD_DIMS,
    Recipe,
    magnitudes,
    make_case,
)
from ..harness.cases.softmax_families import CAP_FACTORS, SINK_OFFSETS, with_softmax_options
from .ragged_strategies import ragged_cases

__all__ = [
    "FAMILIES",
    "SOFTMAX_OPTIONS",
    "Recipe",
    "attention_cases",
    "cases",
    "contract_limits",
    "lengths",
    "make_case",
    "ragged_cases",
    "recipes",
    "softmax_options_taken",
    "with_drawn_softmax_options",
]


def lengths(max_len: int, multiple: int = 1) -> st.SearchStrategy[int]:
    """Sequence lengths, mostly at block edges, never above ``max_len``; with ``multiple > 1``,
    the multiples up to ``max_len`` (at least 1, 2 and 3 times the multiple)."""
    if multiple > 1:
        top = max(3, max_len // multiple)
        return st.sampled_from([multiple * i for i in range(1, top + 1)])
    edges = [n for n in EDGES if n <= max_len]
    return st.one_of(st.sampled_from(edges), st.integers(1, max_len))


def contract_limits(kernel: Any, *, palette: int = DEFAULT_PALETTE) -> dict[str, Any]:
    """The :func:`recipes` keywords that keep every draw inside ``kernel``'s contract; for a
    kernel with compile keys, its palette of ``palette`` keys per dtype too
    (:mod:`flashcheck.harness.adapters.palette`)."""
    keys = palette_for(kernel, palette) if kernel.compile_keys else None
    limits = {
        "masks": tuple(m for m in ("causal", "window", "mask") if m in kernel.masks),
        "head_dims": kernel.head_dims,
        "max_d": kernel.max_head_dim,
        "gqa": kernel.gqa,
        "unequal_lengths": kernel.unequal_lengths,
        "distinct_dv": kernel.distinct_dv,
        "batched": kernel.batched,
        "seq_multiple": kernel.seq_multiple,
        "explicit_scale": kernel.options is None or "scale" in kernel.options,
    }
    return limits if keys is None else {**limits, "palette": keys}


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
    head_dims: tuple[int, ...] | None = None,
    gqa: bool = True,
    unequal_lengths: bool = True,
    distinct_dv: bool = True,
    batched: bool = True,
    seq_multiple: int = 1,
    explicit_scale: bool = True,
    with_option: bool = False,
    palette: Palette | None = None,
) -> Recipe:
    """A :class:`Recipe` for ``dtype``. ``score_limit`` caps ``scale·Σ|q||k|`` (the kernel's
    specified range); ``max_work`` caps ``B·Hq·Nq·Nk`` so one example stays fast;
    ``min_slices`` asks for at least that many (batch, head) slices; ``with_option`` for at
    least one of ``causal``, a window and an explicit scale (among those allowed);
    ``palette``: the compile keys of a kernel that compiles per shape (its lengths, head dims
    and causal flag come from one entry, drawn first). The remaining keywords are a kernel's
    contract (:func:`contract_limits`)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    family = draw(st.sampled_from(families))
    keyed = palette.entries[draw(st.integers(0, len(palette) - 1))] if palette else ()
    keys = dict(zip(palette.dims, keyed, strict=True)) if palette else {}
    m = seq_multiple
    nq = draw(lengths(max_len, m))
    nk = draw(lengths(max_len, m)) if unequal_lengths else nq
    pool = HEAD_DIMS if head_dims is None else head_dims
    dims = [x for x in pool if x <= max_d] or [min(pool)]
    d = draw(st.sampled_from(dims))
    dv = d if not distinct_dv or draw(st.booleans()) else draw(st.sampled_from(dims))
    nq, nk, d, dv = (keys.get(x, y) for x, y in (("nq", nq), ("nk", nk), ("d", d), ("dv", dv)))
    hk = draw(st.sampled_from([1, 2])) if batched else 1
    hq = hk * draw(st.sampled_from([1, 2])) if (batched and gqa) else hk
    b = draw(st.sampled_from([1, 2])) if batched else 1
    if b * hq * nq * nk > max_work:
        b, hq, hk = 1, 1, 1
    if batched and b * hq < min_slices:
        b = 2
        fit = max_work // (b * hq * nk)
        nq = max(m, min(nq, fit) // m * m) if unequal_lengths and "nq" not in keys else nq
    causal = keys.get("causal", "causal" in masks and draw(st.booleans()))
    window = None
    if "window" in masks and draw(st.integers(0, 3)) == 0:
        window = _window(draw, max_len)
    mask_density = None
    if "mask" in masks and draw(st.integers(0, 4)) == 0:
        mask_density = draw(st.sampled_from([0.0, 0.1, 0.5, 0.9]))
    scale = (
        draw(st.sampled_from([None, None, 1.0, 0.125, 0.5, 2.0, 0.3])) if explicit_scale else None
    )
    if with_option and not causal and window is None and scale is None:
        causal, window, scale = _one_option(draw, masks, explicit_scale, max_len)
    magnitude = draw(st.sampled_from(magnitudes(family, dtype, score_limit)))
    seed = draw(st.integers(0, 2**32 - 1))
    return Recipe(
        dtype,
        family,
        b,
        hq,
        hk,
        nq,
        nk,
        d,
        dv,
        seed,
        causal,
        window,
        mask_density,
        scale,
        magnitude,
        score_limit,
    )


def _one_option(draw: Any, masks: tuple[str, ...], explicit_scale: bool, max_len: int):
    """``(causal, window, scale)`` with exactly one of them set, among those allowed."""
    offered = [m for m in ("causal", "window") if m in masks]
    offered += ["scale"] if explicit_scale else []
    if not offered:
        raise ValueError("with_option=True needs causal, window or an explicit scale allowed")
    pick = draw(st.sampled_from(offered))
    window = _window(draw, max_len) if pick == "window" else None
    scale = draw(st.sampled_from([1.0, 0.125, 0.5, 2.0, 0.3])) if pick == "scale" else None
    return pick == "causal", window, scale


def _window(draw: Any, max_len: int) -> tuple[int | None, int | None]:
    return (
        draw(st.one_of(st.none(), st.integers(0, max_len))),
        draw(st.one_of(st.none(), st.integers(0, max_len))),
    )


def cases(**kw) -> st.SearchStrategy[Case]:
    """Cases built by :func:`make_case` from :func:`recipes` (same keyword arguments)."""
    return recipes(**kw).map(make_case)


SOFTMAX_OPTIONS = frozenset({"softcap", "sinks"})


def softmax_options_taken(kernel: Any) -> frozenset[str]:
    """The softmax options (``softcap``, ``sinks``) a kernel's contract takes."""
    return SOFTMAX_OPTIONS & frozenset(kernel.options or ())


def with_drawn_softmax_options(
    drawn: st.SearchStrategy[Case], takes: frozenset[str]
) -> st.SearchStrategy[Case]:
    """The cases of ``drawn``, each given a soft-cap, sinks or both among ``takes``, set
    relative to its scores (:func:`~flashcheck.harness.cases.softmax_families.with_softmax_options`:
    caps of :data:`CAP_FACTORS` times the largest score, sinks at :data:`SINK_OFFSETS` from a
    head's largest score)."""
    caps = st.sampled_from(CAP_FACTORS) if "softcap" in takes else st.none()
    offsets = st.sampled_from(SINK_OFFSETS) if "sinks" in takes else st.none()
    pairs = st.tuples(st.one_of(st.none(), caps), st.one_of(st.none(), offsets)).filter(
        lambda t: t != (None, None)
    )
    return st.tuples(drawn, pairs).map(
        lambda x: with_softmax_options(x[0], cap_factor=x[1][0], sink_offset=x[1][1])
    )


def attention_cases(
    kernel: Any = None,
    *,
    dtype: str | None = None,
    families: tuple[str, ...] = FAMILIES,
    max_len: int = 129,
    max_work: int = 1 << 16,
    min_slices: int = 1,
    palette: int = DEFAULT_PALETTE,
    softmax_options: bool = False,
) -> st.SearchStrategy[Case]:
    """Adversarial attention inputs (docs/properties.md) as
    :class:`~flashcheck.harness.cases.case.Case` objects, inside ``kernel``'s contract when one is
    given.

    ``kernel``: a function, a :func:`flashcheck.kernel` declaration or a spec string; its
    contract (declared, or probed on first draw) decides the dtypes, head dims, masks, GQA,
    ``Nq != Nk``, ``dv != d``, batch and sequence-length multiple drawn. ``dtype``: one input
    format (default: any the kernel takes). ``families``: a subset of :data:`FAMILIES`.
    ``max_len``: the longest sequence (lengths cluster at block edges 1, 15-17, 31-33, ...).
    ``max_work``: a cap on ``B·Hq·Nq·Nk`` per example. ``min_slices``: at least that many
    (batch, head) slices (to exercise batch and head indexing). ``palette``: for a kernel
    with compile keys (declared, or found by the probe), how many combinations of its lengths,
    head dims and causal flag are drawn per dtype (each new one costs the kernel a compile;
    :mod:`flashcheck.harness.adapters.palette`); batch, heads, values and the other options
    vary freely. No effect on other kernels. ``softmax_options``: every case also gets a
    soft-cap, sinks or both, set relative to its scores
    (:mod:`flashcheck.harness.cases.softmax_families`); the kernel must take them.
    """
    bad = [f for f in families if f not in FAMILIES]
    if bad:
        raise ValueError(f"unknown families {bad}: choose from {FAMILIES}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    if not isinstance(palette, int) or isinstance(palette, bool) or palette < 1:
        raise ValueError(f"palette is a positive int (compile keys per dtype), got {palette!r}")

    def build() -> st.SearchStrategy[Case]:
        dtypes = [dtype] if dtype else list(DTYPES)
        kern, limits, work = None, {}, max_work
        if kernel is not None:
            kern = resolved(as_kernel(kernel))
            if not any(dt in kern.dtypes for dt in dtypes):
                raise ValueError(
                    f"{kern.name} takes none of the dtypes {dtypes} (its contract: "
                    f"{'; '.join(kern.contract_lines())})"
                )
            dtypes = [dt for dt in dtypes if dt in kern.dtypes]
            limits = contract_limits(kern, palette=palette)
            # Room for several slices at the kernel's smallest accepted length.
            work = max(max_work, 4 * kern.seq_multiple**2)

        def for_dtype(dt: str) -> st.SearchStrategy[Case]:
            score = None if kern is None else kern.score_limit.get(dt)
            return cases(
                dtype=dt,
                families=families,
                max_len=max_len,
                max_work=work,
                min_slices=min_slices,
                score_limit=score,
                **limits,
            )

        drawn = st.sampled_from(dtypes).flatmap(for_dtype)
        if not softmax_options:
            return drawn
        takes = SOFTMAX_OPTIONS if kern is None else softmax_options_taken(kern)
        if not takes:
            raise ValueError(
                f"softmax_options=True needs a kernel that takes softcap or sinks; {kern.name} "
                "takes neither (name them in its signature, or declare options=...)"
            )
        return with_drawn_softmax_options(drawn, takes)

    # Deferred: a contract is probed on the first draw, not when the test module is imported.
    return st.deferred(build)
