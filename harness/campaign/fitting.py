"""Fitting a campaign's planned recipe to one kernel's contract (and its palette)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ..adapters.adapter import Kernel, score_magnitude
from ..adapters.palette import DEFAULT_PALETTE, palette_for
from ..cases.families import HEAD_DIMS, Recipe, make_case

__all__ = ["fit_recipe"]


def _nearest(x: int, allowed: Sequence[int]) -> int:
    return min(allowed, key=lambda a: (abs(a - x), -a))


def fit_recipe(r: Recipe, kernel: Kernel, *, palette: int = DEFAULT_PALETTE) -> Recipe:
    """``r`` moved inside ``kernel``'s contract, deterministically: masks, an explicit scale, a
    soft-cap and sinks it does not take are dropped, head dims move to the nearest it accepts,
    ``Hk = Hq`` without grouped-query heads, one (batch, head) slice if it takes no more,
    ``Nk = Nq`` if it needs equal lengths, and lengths round up to its multiple ``m`` (so the
    preset's lengths keep their reach). A kernel with compile keys then has them moved to the
    nearest entry of its palette of ``palette`` keys per dtype
    (:mod:`flashcheck.harness.adapters.palette`). The score range is capped at the kernel's
    limit.

    Every kernel of a campaign runs the same plan, each on the plan's cases fitted to it;
    kernels whose fitted cases coincide share one oracle evaluation."""
    masks = kernel.masks
    out = replace(
        r,
        causal=r.causal and "causal" in masks,
        window=r.window if "window" in masks else None,
        mask_density=r.mask_density if "mask" in masks else None,
        scale=r.scale if (kernel.options is None or "scale" in kernel.options) else None,
        # options=None: causal/window/mask/scale only, neither softmax option
        cap_factor=r.cap_factor if "softcap" in (kernel.options or ()) else None,
        sink_offset=r.sink_offset if "sinks" in (kernel.options or ()) else None,
    )
    dims = [x for x in (kernel.head_dims or HEAD_DIMS) if x <= kernel.max_head_dim]
    if kernel.head_dims is not None or max(out.d, out.dv) > kernel.max_head_dim:
        out = replace(out, d=_nearest(out.d, dims), dv=_nearest(out.dv, dims))
    if not kernel.distinct_dv:
        out = replace(out, dv=out.d)
    if not kernel.gqa:
        out = replace(out, hk=out.hq)
    if not kernel.batched:
        out = replace(out, b=1, hq=1, hk=1)
    if not kernel.unequal_lengths:
        out = replace(out, nk=out.nq)
    m = kernel.seq_multiple
    if m > 1:
        out = replace(out, nq=m * max(1, -(-out.nq // m)), nk=m * max(1, -(-out.nk // m)))
    keys = palette_for(kernel, palette) if kernel.compile_keys else None
    if keys is not None:
        out = keys.snap(out)
    limit = kernel.score_limit.get(out.dtype)
    if limit is not None and score_magnitude(make_case(out)) >= limit:
        # Only then: a recipe left alone keeps sharing its oracle call with other kernels.
        out = replace(out, score_limit=limit)
    return out
