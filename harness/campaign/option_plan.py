"""The campaign's ``options`` part: soft-capping and attention sinks, forward and gradients.

Each item is a planned case with a cap and/or sinks set relative to its own scores
(:mod:`flashcheck.harness.cases.softmax_families`): the cap a fraction of the largest score
magnitude, each head's sink an offset from that head's largest score. The scenarios, in order
(a preset takes the first ``options_cases`` forward and ``options_gradient_cases`` gradient
ones per dtype, cycling), ordered so that the first few give a kernel taking one option alone
cases of that option (a kernel taking only ``softcap`` once got one forward case and no gradient
case in the smoke preset, and passed with its cap applied after the causal mask):

- causal rows with scores around the cap (0.3·max|s|), the cap alone: a cap applied after the
  mask turns the masked scores' −inf into −c, and those keys leak into the softmax;
- causal rows with Nq > Nk that keep no key, with a sink: O = 0 and LSE = σ exactly;
- scores far beyond the cap (huge logits, cap 0.02·max|s|: every row flattened towards uniform);
- a sink 40 above every score: it takes almost all the weight, O ≈ 0 and LSE ≈ σ;
- both options, scores around the cap and a sink among the scores;
- an invisible sink (40 below every score), a cap at the largest score of a spiked row, both
  options on huge logits (a cap above the scores, a sink just above them).

An item runs only on the kernels whose contract takes every option it sets (and, for the
gradient items, that have a backward); for the others it is not applicable and is not run, so
their results are those of a campaign without this part.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..adapters.adapter import Kernel
from ..cases.families import Recipe, magnitudes
from .plan import Item, Preset, rng_for, seed32

__all__ = [
    "OPTION_GRADIENT_SCENARIOS",
    "OPTION_SCENARIOS",
    "option_items",
    "option_work",
    "takes_item",
]

# (family, options): recipe fields, plus ``masked_rows`` (Nq > Nk, causal: rows that keep no key).
OPTION_SCENARIOS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("randn", {"causal": True, "cap_factor": 0.3}),
    ("randn", {"causal": True, "masked_rows": True, "sink_offset": -3.0}),
    ("huge_logits", {"cap_factor": 0.02}),
    ("randn", {"sink_offset": 40.0}),
    ("randn", {"cap_factor": 0.3, "sink_offset": 0.0}),
    ("randn", {"sink_offset": -40.0}),
    ("spike", {"cap_factor": 1.0}),
    ("huge_logits", {"cap_factor": 4.0, "sink_offset": 3.0}),
)
OPTION_GRADIENT_SCENARIOS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("randn", {"causal": True, "cap_factor": 0.3}),
    ("randn", {"causal": True, "masked_rows": True, "sink_offset": 3.0}),
    ("randn", {"cap_factor": 0.3, "sink_offset": 0.0}),
    ("huge_logits", {"cap_factor": 0.02}),
    ("randn", {"sink_offset": 40.0}),
)


def _label(opts: dict[str, Any]) -> str:
    """``cap0.02``, ``sink+40``, ``cap0.3-sink+0``: the options of a scenario, for its tag."""
    words = []
    if "cap_factor" in opts:
        words.append(f"cap{opts['cap_factor']:g}")
    if "sink_offset" in opts:
        words.append(f"sink{opts['sink_offset']:+g}")
    return "-".join(words)


def _recipe(
    preset: Preset, dtype: str, seed: int, words: tuple, family: str, opts: dict[str, Any]
) -> Recipe:
    """A scenario's recipe: two batches of four query heads on two key/value heads at one of
    the preset's grid lengths, within its grid work."""
    opts = dict(opts)
    rng = rng_for(seed, "options", dtype, *words)
    d = int(rng.choice(preset.head_dims))
    nq = nk = int(rng.choice(preset.grid_lengths))
    if opts.pop("masked_rows", False):
        nq, nk = nq + 8, max(1, nq // 2)
    while 2 * 4 * nq * nk > preset.grid_max_work and max(nq, nk) > 16:
        nq, nk = max(1, nq // 2), max(1, nk // 2)
    # The smallest magnitude of the family: huge logits just below the format's exp overflow,
    # so the scores reach far beyond a small cap without leaving a kernel's score range.
    mag = float(magnitudes(family, dtype)[0])
    return Recipe(dtype, family, 2, 4, 2, nq, nk, d, d, seed32(rng), magnitude=mag, **opts)


def option_items(preset: Preset, dtype: str, seed: int) -> list[Item]:
    """The ``options`` part for one dtype: ``preset.options_cases`` forward items cycling
    through :data:`OPTION_SCENARIOS`, then ``preset.options_gradient_cases`` gradient items
    (tagged ``gradients/...``) cycling through :data:`OPTION_GRADIENT_SCENARIOS`."""
    items = []
    for i in range(preset.options_cases):
        family, opts = OPTION_SCENARIOS[i % len(OPTION_SCENARIOS)]
        r = _recipe(preset, dtype, seed, ("forward", i), family, opts)
        items.append(Item("options", f"{family}/{_label(opts)}/{i}", r))
    for i in range(preset.options_gradient_cases):
        family, opts = OPTION_GRADIENT_SCENARIOS[i % len(OPTION_GRADIENT_SCENARIOS)]
        r = _recipe(preset, dtype, seed, ("gradients", i), family, opts)
        items.append(Item("options", f"gradients/{family}/{_label(opts)}/{i}", r))
    return items


def takes_item(kernel: Kernel, item: Item) -> bool:
    """Whether ``kernel``'s contract takes every softmax option ``item`` sets (and it has a
    backward, for a gradient item)."""
    r = item.recipe
    need = {"softcap"} if r.cap_factor is not None else set()
    need |= {"sinks"} if r.sink_offset is not None else set()
    # options=None: causal/window/mask/scale only, neither softmax option
    if not need <= (kernel.options or frozenset()):
        return False
    return not item.backward or kernel.backward is not None


def option_work(
    preset: Preset, dtypes: Sequence[str], seed: int, kernels: Mapping[str, Kernel]
) -> list[tuple[Item, list[str]]]:
    """The part's items in every dtype, each with the kernels (specs) that run it: those that
    take its options (:func:`takes_item`); an item no kernel takes is left out."""
    work = []
    for it in (it for dt in dtypes for it in option_items(preset, dt, seed)):
        takers = [spec for spec, kern in kernels.items() if takes_item(kern, it)]
        work += [(it, takers)] if takers else []
    return work
