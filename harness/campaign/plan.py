"""What a report campaign runs: presets, the fixed plan of input cases, and search mutations.

A campaign is a deterministic function of its configuration. :func:`plan_items` turns a
:class:`Preset`, the dtypes and the seed into the fixed parts; :func:`mutate` is the search's
one-step change of a recipe. Every random choice comes from an RNG seeded by the campaign seed
and stable words (CRC-32), so a plan is the same on every run and machine. The parts
(:data:`PARTS`, run by :mod:`flashcheck.harness.campaign.runner`):

- ``grid``: every input family of :mod:`flashcheck.harness.cases.families` at the preset's
  lengths, with shapes, masks, GQA and scale drawn from an RNG seeded by (seed, dtype, family,
  length);
- ``length``: N(0,1) inputs at growing sequence length (the error-vs-N figure);
- ``edge``: causal attention with Nq > Nk, whose first rows keep no key (O = 0, LSE = −inf);
- ``logit``: the ``huge_logits`` family at growing score magnitude (error vs max |logit|);
- ``fa3``: FlashAttention-3's outlier inputs, N(0,1) + N(0,100)·Bernoulli(0.001), fp16/bf16
  (the RMSE table);
- ``structural``: per kernel and dtype, the structural properties of
  :mod:`flashcheck.harness.checks.structural` (batch/head independence, padded buffers,
  determinism, key permutation, the NaN rule, options applied), conformance and integrity
  (:mod:`flashcheck.harness.checks.integrity`; the gradient variant on kernels with a
  backward) on a few cases each;
- ``gradients``: for kernels with a backward, dQ, dK and dV on the scenarios of
  :data:`~flashcheck.harness.campaign.plan.GRADIENT_SCENARIOS` (masked rows, off-grid lengths,
  huge logits, ties, windows; two batches of four query heads on two kv heads), judged against
  the gradient oracle, the backward class's bounds and the naive backward;
- ``search``: per kernel and dtype, a targeted search for the worst case. Generation ``g``
  mutates the ``parents`` highest-scoring cases found so far for that kernel and dtype
  (lengths to neighbouring block edges, magnitudes ×/÷, head dims, masks, scale, family, RNG
  seed). The score is the *failure margin*: the larger of the deterministic-bound utilization
  and ``max_ulp / (2·E_naive + 1)`` (the empirical limit), infinite for a NaN/Inf mismatch;
  above 1 means the case fails. A generation runs for every kernel and dtype at once;
- ``options``: soft-capping and attention sinks (:mod:`flashcheck.harness.campaign.option_plan`),
  forward and gradients (dσ judged), run only by the kernels whose contract takes the options
  an item sets; the search never starts from them.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel
from ..adapters.palette import DEFAULT_PALETTE, palette_for
from ..cases.families import (
    EDGES,
    FAMILIES,
    HEAD_DIMS,
    Recipe,
    magnitudes,
)
from ..checks.registry import GRADIENT_CHECKS
from .fitting import fit_recipe
from .resultrecords import gradient_record

__all__ = [
    "GRADIENT_SCENARIOS",
    "PARTS",
    "PRESETS",
    "STRUCTURAL",
    "Item",
    "Preset",
    "fit_recipe",
    "gradient_items",
    "mutate",
    "plan_items",
    "rng_for",
    "seed32",
    "structural_items",
]


# The parts of a campaign (runner.py's module docstring says what each one runs), in order.
PARTS = (
    "grid",
    "length",
    "edge",
    "logit",
    "fa3",
    "structural",
    "gradients",
    "options",
    "search",
)


@dataclass(frozen=True)
class Preset:
    """How big a campaign is. ``cpu`` is the default on a CPU machine (≤ 10 min on 2 cores)."""

    name: str
    families: tuple[str, ...] = FAMILIES
    grid_lengths: tuple[int, ...] = (16, 64, 129, 200)
    grid_max_work: int = 1 << 16  # B·Hq·Nq·Nk per grid case
    head_dims: tuple[int, ...] = (16, 40, 64, 111)
    length_sweep: tuple[int, ...] = (1, 17, 64, 129, 256, 512, 1024)
    length_d: int = 64
    logit_magnitudes: tuple[float, ...] = (1, 10, 30, 100, 1e3, 1e4, 6e4, 1e6, 1e12, 1e30)
    logit_n: int = 128
    fa3_shape: tuple[int, int, int, int] = (1, 2, 256, 64)  # B, H, N, d
    fa3_seeds: int = 3
    search_generations: int = 4
    search_population: int = 8
    search_parents: int = 3
    search_max_len: int = 129
    search_max_work: int = 1 << 14
    structural_cases: int = 2  # per structural property, kernel and dtype
    gradient_cases: int = 7  # per dtype, for kernels with a backward (one per scenario first)
    options_cases: int = 7  # forward cases with a soft-cap and/or sinks, per dtype
    options_gradient_cases: int = 4  # gradient cases with them, per dtype
    # Keys per dtype of a kernel with compile keys (flashcheck.harness.adapters.palette).
    palette: int = DEFAULT_PALETTE


PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        "smoke",
        families=("randn", "huge_logits", "negative_rows", "nonfinite"),
        grid_lengths=(16,),
        grid_max_work=1 << 10,
        head_dims=(16,),
        length_sweep=(1, 17, 33),
        length_d=16,
        logit_magnitudes=(1, 100, 1e4),
        logit_n=16,
        fa3_shape=(1, 1, 32, 16),
        fa3_seeds=1,
        search_generations=1,
        search_population=2,
        search_parents=1,
        search_max_len=33,
        search_max_work=1 << 10,
        structural_cases=1,
        gradient_cases=2,
        options_cases=4,
        options_gradient_cases=2,
    ),
    # The options part at 5 + 3 cases per dtype: 37 s of CPU time over the built-in
    # kernels that take the options, measured on 2 shared cores (7 + 4 took 48 s).
    "cpu": Preset("cpu", options_cases=5, options_gradient_cases=3),
    "gpu": Preset(
        "gpu",
        grid_lengths=(16, 64, 129, 257),
        grid_max_work=1 << 18,
        head_dims=(16, 40, 64, 111, 128, 256),
        length_sweep=(1, 17, 64, 129, 256, 512, 1024),
        length_d=128,
        logit_n=256,
        fa3_shape=(1, 2, 512, 128),
        fa3_seeds=2,
        search_generations=3,
        search_population=6,
        search_max_len=257,
        search_max_work=1 << 17,
        structural_cases=3,
        gradient_cases=7,
    ),
}


@dataclass(frozen=True)
class Item:
    """One input case of a campaign part; ``tag`` distinguishes items within the part."""

    part: str
    tag: str
    recipe: Recipe

    def key(self, kernel: str) -> str:
        blob = json.dumps([self.part, self.tag, kernel, self.recipe.to_json()], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def check(self) -> str | None:
        """The structural check a ``structural`` item runs (``None`` in other parts)."""
        return self.tag.split("/")[0] if self.part == "structural" else None

    @property
    def backward(self) -> bool:
        """Whether the item calls the kernels' backward: it runs on kernels that have one."""
        return gradient_record(self.part, self.tag) or self.check in GRADIENT_CHECKS

    def cost(self) -> float:
        r = self.recipe
        return 1.0 + r.b * r.hq * r.nq * r.nk * (r.d + r.dv) / 65536

    def weight(self) -> float:
        """What one unit of :meth:`cost` weighs for this item: a backward case costs about
        three forwards (its oracle and bounds likewise)."""
        return 3.0 if self.backward and self.part != "structural" else 1.0


def rng_for(seed: int, *words: Any) -> np.random.Generator:
    """An RNG determined by the campaign seed and ``words`` (stable across runs and machines)."""
    keys = [zlib.crc32(str(w).encode()) for w in words]
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def seed32(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**32 - 1))


def _near_edge(rng: np.random.Generator, n: int, max_len: int) -> int:
    cands = [e for e in EDGES if e <= max_len and abs(e - n) <= max(2, n // 2)] or [n]
    return int(rng.choice(cands))


def _grid_recipe(rng: np.random.Generator, dtype: str, family: str, n: int, p: Preset) -> Recipe:
    d = int(rng.choice(p.head_dims))
    dv = d if rng.random() < 0.8 else int(rng.choice(p.head_dims))
    nk = n if rng.random() < 0.6 else _near_edge(rng, n, max(p.grid_lengths))
    hk = int(rng.choice([1, 2]))
    hq = hk * int(rng.choice([1, 2]))
    b = int(rng.choice([1, 2]))
    while b * hq * n * nk > p.grid_max_work and (b > 1 or hq > 1):
        b, hq, hk = (1, hq, hk) if b > 1 else (1, hk, hk) if hq > hk else (1, 1, 1)
    causal = bool(rng.random() < 0.4)
    window = None
    if rng.random() < 0.15:
        window = (
            int(rng.integers(0, n + 1)),
            None if rng.random() < 0.5 else int(rng.integers(0, 8)),
        )
    mask_density = float(rng.choice([0.1, 0.5])) if rng.random() < 0.1 else None
    scale = [None, None, None, 0.5, 2.0][int(rng.integers(5))]
    magnitude = float(rng.choice(magnitudes(family, dtype)))
    return Recipe(
        dtype,
        family,
        b,
        hq,
        hk,
        n,
        nk,
        d,
        dv,
        seed32(rng),
        causal,
        window,
        mask_density,
        scale,
        magnitude,
    )


def plan_items(preset: Preset, dtypes: Sequence[str], seed: int) -> list[Item]:
    """The fixed parts of the campaign (everything but the search), in execution order."""
    items: list[Item] = []
    for dt in dtypes:
        for fam in preset.families:
            for n in preset.grid_lengths:
                rng = rng_for(seed, "grid", dt, fam, n)
                items.append(Item("grid", f"{fam}/{n}", _grid_recipe(rng, dt, fam, n, preset)))
        d = preset.length_d
        for n in preset.length_sweep:
            r = Recipe(dt, "randn", 1, 1, 1, n, n, d, d, seed32(rng_for(seed, "length", dt, n)))
            items.append(Item("length", str(n), r))
        # Causal with Nq > Nk: the first Nq - Nk rows keep no key (O = 0, LSE = -inf; see
        # docs/oracle.md).
        r = Recipe(
            dt, "randn", 1, 2, 1, 24, 9, 32, 32, seed32(rng_for(seed, "masked", dt)), causal=True
        )
        items.append(Item("edge", "masked-rows", r))
        n = preset.logit_n
        for m in preset.logit_magnitudes:
            r = Recipe(
                dt,
                "huge_logits",
                1,
                2,
                2,
                n,
                n,
                64,
                64,
                seed32(rng_for(seed, "logit", dt, m)),
                magnitude=float(m),
            )
            items.append(Item("logit", f"{m:g}", r))
        if dt in ("fp16", "bf16"):
            b, h, n, d = preset.fa3_shape
            for s in range(preset.fa3_seeds):
                r = Recipe(
                    dt, "fa3_outliers", b, h, h, n, n, d, d, seed32(rng_for(seed, "fa3", dt, s))
                )
                items.append(Item("fa3", str(s), r))
    return items


# The structural properties every campaign runs on every kernel (checks/structural.py), and
# the input family each draws from.
STRUCTURAL = {
    "batch-head-independence": "randn",
    "padded-buffers": "randn",
    "determinism": "monotone",
    "key-permutation": "randn",
    "nan-rule": "nonfinite",
    "options-applied": "randn",
    # Flash-class kernels against the emulated arithmetic of their class, within one key block
    # (Nk <= 16); NOT-APPLICABLE (recorded as SKIP) for every other class.
    "conformance": "randn",
    # Inputs (the mask among them) bitwise unchanged by a call, results by the next call; the
    # gradient variant runs for kernels with a backward.
    "integrity": "randn",
    "gradient-integrity": "randn",
    # A sequence alone and inside batches of several sizes, bitwise: measured for every kernel
    # that takes several sequences, gated only when declared.
    "batch-invariance": "randn",
    # The backward's gradients the same with dO strided or expanded as with dO contiguous.
    "gradient-do-layouts": "randn",
}
CONFORMANCE_KEYS = (16, 9)  # one key block, aligned and ragged


def structural_items(preset: Preset, dtype: str, seed: int) -> list[Item]:
    """The structural part for one dtype: ``preset.structural_cases`` cases per property, with
    two batches of four query heads on two key/value heads, block-aligned and ragged lengths,
    and ``causal``, a window or an explicit scale set where the property is about options
    (each kernel gets them fitted to its contract)."""
    items = []
    for name, family in STRUCTURAL.items():
        for i in range(preset.structural_cases):
            rng = rng_for(seed, "structural", dtype, name, i)
            d = int(rng.choice(preset.head_dims))
            # Block-aligned lengths first (where fast paths and their indexing bugs live),
            # then ragged ones.
            n = {"smoke": 16, "cpu": 32}.get(preset.name, 64) + (i % 2)
            nk = int(rng.choice([n, n - 1, (n + 1) // 2])) if i % 2 else n
            if name == "conformance":
                nk = CONFORMANCE_KEYS[i % 2]
            opts: dict[str, Any] = {}
            if name == "options-applied":
                # Every option at once; the check takes each away in turn (those a kernel does
                # not take are dropped when the case is fitted to it). The cap at half the
                # largest score magnitude and each head's sink at its largest score both move
                # the answer well beyond the bounds.
                opts = {
                    "causal": True, "window": (8, None), "scale": 0.5,
                    "cap_factor": 0.5, "sink_offset": 0.0,
                }  # fmt: skip
            elif name == "integrity" and i % 2 == 0:
                opts = {"mask_density": 0.5}  # an explicit mask: one more input to keep intact
            elif name != "key-permutation":
                opts = {"causal": bool(rng.random() < 0.5)}
            # Four query heads on two key/value heads: a wrong group mapping shows.
            r = Recipe(
                dtype,
                family,
                2,
                4,
                2,
                n,
                nk,
                d,
                d,
                seed32(rng),
                magnitude=float(rng.choice(magnitudes(family, dtype))),
                **opts,
            )
            items.append(Item("structural", f"{name}/{i}", r))
        if name == "batch-invariance":
            items.append(_one_slice_item(preset, dtype, seed))
    return items


def _one_slice_item(preset: Preset, dtype: str, seed: int) -> Item:
    """One more batch-invariance case: one head and one key, so that the sequence alone is a
    single (batch, head) slice and its products matrix-vector ones, where libraries switch to
    other code paths. (A user's kernel of plain torch products gave other LSE bits alone than
    in a batch only at such a shape: ``flashcheck test`` drew one, the report's cases of four
    heads never varied.) No oracle is needed, so the case costs four kernel calls."""
    rng = rng_for(seed, "structural", dtype, "batch-invariance", "one-slice")
    d = int(rng.choice(preset.head_dims))
    n = {"smoke": 16, "cpu": 32}.get(preset.name, 64) + 1
    r = Recipe(dtype, "randn", 2, 1, 1, n, 1, d, d, seed32(rng))
    return Item("structural", "batch-invariance/one-slice", r)


# The gradient part's scenarios, in order: where backward bugs and precision loss
# live. Each is (family, options); lengths, head dims and seeds come from the campaign's RNG.
GRADIENT_SCENARIOS = (
    ("randn", {}),
    ("randn", {"causal": True, "masked_rows": True}),  # Nq > Nk: rows that keep no key
    ("randn", {"off_grid": True}),  # lengths just past the 16/32/64/128 block edges
    ("huge_logits", {}),
    ("near_ties", {"causal": True}),
    ("spike", {"window": (16, 0)}),
    ("negative_rows", {}),
)


def gradient_items(preset: Preset, dtype: str, seed: int) -> list[Item]:
    """The gradient part for one dtype: ``preset.gradient_cases`` cases cycling through
    :data:`GRADIENT_SCENARIOS`, each with two batches of four query heads on two key/value heads
    (dK and dV sum over a group) and ``dO`` drawn from the inputs' hash (Case.grad_output)."""
    items = []
    for i in range(preset.gradient_cases):
        family, opts = GRADIENT_SCENARIOS[i % len(GRADIENT_SCENARIOS)]
        opts = dict(opts)
        rng = rng_for(seed, "gradients", dtype, i)
        d = int(rng.choice(preset.head_dims))
        n = int(rng.choice(preset.grid_lengths))
        nq = nk = n
        if opts.pop("masked_rows", False):
            nq, nk = n + 8, max(1, n // 2)
        if opts.pop("off_grid", False):
            nq, nk = 17, int(rng.choice([33, 65, 129]))
        # Grid-sized work at most: every query row of the group enters dK and dV.
        while 2 * 4 * nq * nk > preset.grid_max_work and max(nq, nk) > 16:
            nq, nk = max(1, nq // 2), max(1, nk // 2)
        mag = float(rng.choice(magnitudes(family, dtype)))
        r = Recipe(dtype, family, 2, 4, 2, nq, nk, d, d, seed32(rng), magnitude=mag, **opts)
        items.append(Item("gradients", f"{family}/{i}", r))
    return items


def mutate(rng: np.random.Generator, r: Recipe, p: Preset, adapter: Kernel) -> Recipe:
    """One random change to ``r`` (then a fresh RNG seed), within the search's size limits."""
    op = int(rng.integers(8))
    if op == 0:
        r = replace(r, nq=_near_edge(rng, r.nq, p.search_max_len))
    elif op == 1:
        r = replace(r, nk=_near_edge(rng, r.nk, p.search_max_len))
    elif op == 2:
        cands = magnitudes(r.family, r.dtype, adapter.score_limit.get(r.dtype))
        r = replace(r, magnitude=float(rng.choice(cands)))
    elif op == 3:
        dims = [x for x in HEAD_DIMS if x <= adapter.max_head_dim]
        if adapter.head_dims is not None:
            dims = [x for x in dims if x in adapter.head_dims]
        d = int(rng.choice(dims))
        r = replace(r, d=d, dv=d if rng.random() < 0.7 else int(rng.choice(dims)))
    elif op == 4:
        r = replace(r, causal=not r.causal)
    elif op == 5:
        r = replace(r, scale=[None, 0.125, 0.5, 2.0, 0.3][int(rng.integers(5))])
    elif op == 6:
        fam = str(rng.choice(FAMILIES))
        r = replace(r, family=fam, magnitude=float(rng.choice(magnitudes(fam, r.dtype))))
    else:
        win = (int(rng.integers(0, r.nk + 1)), None) if r.window is None else None
        r = replace(r, window=win)
    keys = palette_for(adapter, p.palette) if adapter.compile_keys else None
    if keys is not None and op in (0, 1, 3, 4) and set(keys.dims) & _TOUCHED[op]:
        # A compiling kernel's lengths, head dims or causal flag move to another palette key.
        r = keys.apply(r, int(rng.integers(len(keys))))
    while r.b * r.hq * r.nq * r.nk > p.search_max_work and r.nq > adapter.seq_multiple:
        r = replace(r, nq=max(1, r.nq // 2))
    return fit_recipe(replace(r, seed=seed32(rng)), adapter, palette=p.palette)


# The recipe fields each length, head-dim and causal mutation of mutate() changes.
_TOUCHED = {0: {"nq"}, 1: {"nk"}, 3: {"d", "dv"}, 4: {"causal"}}
