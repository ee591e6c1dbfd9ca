"""The campaign plan (harness/campaign/plan.py): a deterministic function of (preset, dtypes,
seed); recipes fitted to a kernel's contract; search mutations that stay inside it; the
structural and gradient items."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.campaign.plan import (
    GRADIENT_SCENARIOS,
    PRESETS,
    STRUCTURAL,
    Item,
    fit_recipe,
    gradient_items,
    mutate,
    plan_items,
    rng_for,
    structural_items,
)
from flashcheck.harness.cases.families import HEAD_DIMS, Recipe, make_case

SMOKE = PRESETS["smoke"]
CPU = PRESETS["cpu"]


def _kernel(**contract) -> Kernel:
    return Kernel(name="planned", fn=lambda *a, **k: None, **contract)


BASE = Recipe(
    "fp32",
    "randn",
    2,
    4,
    2,
    24,
    9,
    40,
    59,
    123,
    causal=True,
    window=(8, None),
    mask_density=0.5,
    scale=0.5,
)

# Contracts that each take away something the base recipe uses.
NARROW = {
    "no masks": {"masks": frozenset()},
    "causal only": {"masks": frozenset({"causal"})},
    "no scale option": {"options": frozenset()},
    "fixed head dims": {"head_dims": (32, 64, 128)},
    "small head dim": {"max_head_dim": 32},
    "d = dv": {"distinct_dv": False},
    "no GQA": {"gqa": False},
    "one slice": {"batched": False},
    "equal lengths": {"unequal_lengths": False},
    "multiple of 16": {"seq_multiple": 16},
    "everything": {
        "masks": frozenset(),
        "options": frozenset(),
        "head_dims": (64,),
        "gqa": False,
        "unequal_lengths": False,
        "distinct_dv": False,
        "seq_multiple": 64,
    },
}


# -- the plan is a function of (preset, dtypes, seed) -------------------------------------------


@pytest.mark.parametrize("preset", ["smoke", "cpu", "gpu"])
def test_plan_is_deterministic(preset):
    p = PRESETS[preset]
    a = plan_items(p, ("fp16", "bf16", "fp32"), 7)
    assert a == plan_items(p, ("fp16", "bf16", "fp32"), 7)
    assert a != plan_items(p, ("fp16", "bf16", "fp32"), 8)
    keys = [it.key("k") for it in a]
    assert len(set(keys)) == len(keys)  # every item has its own result key


def test_plan_of_a_dtype_does_not_depend_on_the_others():
    """Each item's RNG is seeded by words, not by its place in the plan: adding a dtype does
    not move the items of another."""
    alone = plan_items(CPU, ("bf16",), 3)
    both = [it for it in plan_items(CPU, ("fp16", "bf16"), 3) if it.recipe.dtype == "bf16"]
    assert alone == both


def test_plan_covers_the_preset():
    items = plan_items(CPU, ("fp16", "fp32"), 0)
    parts = {it.part for it in items}
    assert parts == {"grid", "length", "edge", "logit", "fa3"}
    grid = [it for it in items if it.part == "grid"]
    assert {it.recipe.family for it in grid} == set(CPU.families)
    assert {it.recipe.nq for it in grid} == set(CPU.grid_lengths)
    assert all(
        it.recipe.b * it.recipe.hq * it.recipe.nq * it.recipe.nk <= CPU.grid_max_work for it in grid
    )
    assert [
        it.recipe.nq for it in items if it.part == "length" and it.recipe.dtype == "fp16"
    ] == list(CPU.length_sweep)
    logits = [
        it.recipe.magnitude for it in items if it.part == "logit" and it.recipe.dtype == "fp32"
    ]
    assert logits == [float(m) for m in CPU.logit_magnitudes]
    assert all(it.recipe.dtype != "fp32" for it in items if it.part == "fa3")
    assert sum(it.part == "fa3" for it in items) == CPU.fa3_seeds  # fp16 only here
    (edge,) = [it for it in items if it.part == "edge" and it.recipe.dtype == "fp16"]
    assert edge.recipe.causal and edge.recipe.nq > edge.recipe.nk  # rows that keep no key


def test_rng_for_is_stable_and_word_sensitive():
    a = rng_for(5, "grid", "fp16").integers(0, 2**32, 4)
    assert (a == rng_for(5, "grid", "fp16").integers(0, 2**32, 4)).all()
    assert not (a == rng_for(5, "grid", "bf16").integers(0, 2**32, 4)).all()
    assert not (a == rng_for(6, "grid", "fp16").integers(0, 2**32, 4)).all()


# -- fit_recipe ------------------------------------------------------------------------------


def test_fit_leaves_a_recipe_inside_a_wide_contract_alone():
    assert fit_recipe(BASE, _kernel()) == BASE


def test_fit_drops_masks_and_scale_the_kernel_does_not_take():
    r = fit_recipe(BASE, _kernel(masks=frozenset()))
    assert (r.causal, r.window, r.mask_density) == (False, None, None)
    assert r.scale == BASE.scale  # options=None: every option taken
    r = fit_recipe(BASE, _kernel(masks=frozenset({"causal"})))
    assert (r.causal, r.window, r.mask_density) == (True, None, None)
    assert fit_recipe(BASE, _kernel(options=frozenset())).scale is None
    assert fit_recipe(BASE, _kernel(options=frozenset({"scale"}))).scale == BASE.scale


def test_fit_drops_the_softmax_options_the_kernel_does_not_take():
    r = replace(BASE, cap_factor=0.5, sink_offset=0.0)
    plain = fit_recipe(r, _kernel())  # options=None: causal/window/mask/scale only
    assert (plain.cap_factor, plain.sink_offset) == (None, None)
    both = fit_recipe(r, _kernel(options=frozenset({"scale", "softcap", "sinks"})))
    assert (both.cap_factor, both.sink_offset) == (0.5, 0.0)
    cap = fit_recipe(r, _kernel(options=frozenset({"softcap"})))
    assert (cap.cap_factor, cap.sink_offset) == (0.5, None)


def test_fit_moves_head_dims_to_the_nearest_allowed():
    r = fit_recipe(BASE, _kernel(head_dims=(32, 64, 128)))
    assert (r.d, r.dv) == (32, 64)  # 40 -> 32, 59 -> 64
    # Ties go to the larger dim: 48 is as far from 32 as from 64.
    assert fit_recipe(replace(BASE, d=48, dv=48), _kernel(head_dims=(32, 64))).d == 64
    r = fit_recipe(BASE, _kernel(max_head_dim=32))
    assert max(r.d, r.dv) <= 32 and r.d in HEAD_DIMS and r.dv in HEAD_DIMS
    r = fit_recipe(BASE, _kernel(distinct_dv=False))
    assert r.dv == r.d == BASE.d


def test_fit_shapes_heads_and_lengths():
    r = fit_recipe(BASE, _kernel(gqa=False))
    assert r.hk == r.hq == BASE.hq
    r = fit_recipe(BASE, _kernel(batched=False))
    assert (r.b, r.hq, r.hk) == (1, 1, 1)
    r = fit_recipe(BASE, _kernel(unequal_lengths=False))
    assert r.nk == r.nq == BASE.nq
    r = fit_recipe(BASE, _kernel(seq_multiple=16))
    assert (r.nq, r.nk) == (32, 16)  # rounded up, never down
    assert fit_recipe(replace(BASE, nq=1, nk=1), _kernel(seq_multiple=64)).nq == 64


def test_fit_caps_the_score_range_only_where_it_is_reached():
    huge = replace(BASE, family="huge_logits", magnitude=1e6)
    limited = _kernel(score_limit={"fp32": 1e3})
    assert fit_recipe(huge, limited).score_limit == 1e3
    assert fit_recipe(replace(BASE, magnitude=1.0), limited).score_limit is None


@pytest.mark.parametrize("name", NARROW)
def test_fitted_recipes_are_inside_the_contract(name):
    k = _kernel(**NARROW[name])
    items = plan_items(SMOKE, ("fp16", "fp32"), 1) + structural_items(SMOKE, "fp16", 1)
    items += [*gradient_items(SMOKE, "bf16", 1), Item("x", "base", BASE)]
    for it in items:
        assert k.supports(make_case(fit_recipe(it.recipe, k))) is None, (name, it)
    assert k.supports(make_case(BASE)) is not None, name  # the narrowing matters


def test_fit_is_idempotent_and_deterministic():
    k = _kernel(**NARROW["everything"])
    once = fit_recipe(BASE, k)
    assert fit_recipe(once, k) == once == fit_recipe(BASE, k)


# -- mutate ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["no masks", "fixed head dims", "one slice", "everything"])
def test_mutations_stay_inside_the_contract_and_the_search_limits(name):
    k = _kernel(**NARROW[name])
    rng = np.random.default_rng(0)
    r = fit_recipe(replace(BASE, b=1, hq=2, hk=1, nq=16, nk=16, d=16, dv=16), k)
    seen = set()
    for _ in range(200):
        child = mutate(rng, r, SMOKE, k)
        assert k.supports(make_case(child)) is None, (name, child)
        assert child.b * child.hq * child.nq * child.nk <= SMOKE.search_max_work or (
            child.nq <= k.seq_multiple
        )
        assert child.seed != r.seed  # a fresh draw every time
        seen.add(child)
        r = child
    assert len(seen) > 50  # it explores


def test_mutate_is_deterministic_in_its_rng():
    k = _kernel()
    a = [mutate(np.random.default_rng(9), BASE, SMOKE, k) for _ in range(2)]
    assert a[0] == a[1]
    assert mutate(np.random.default_rng(10), BASE, SMOKE, k) != a[0]


# -- structural and gradient items -----------------------------------------------------------


def test_structural_items():
    items = structural_items(CPU, "bf16", 4)
    assert items == structural_items(CPU, "bf16", 4) != structural_items(CPU, "bf16", 5)
    # batch invariance adds one case of one head and one key (a single slice alone)
    assert len(items) == len(STRUCTURAL) * CPU.structural_cases + 1
    one = [it for it in items if it.tag == "batch-invariance/one-slice"]
    assert len(one) == 1 and (one[0].recipe.b, one[0].recipe.hq, one[0].recipe.nk) == (2, 1, 1)
    for it in items:
        name = it.tag.split("/")[0]
        assert it.part == "structural" and name in STRUCTURAL
        r = it.recipe
        assert r.family == STRUCTURAL[name] and r.dtype == "bf16"
        if it not in one:
            assert (r.b, r.hq, r.hk) == (2, 4, 2)  # a wrong group mapping shows
        if name == "options-applied":
            assert r.causal and r.window is not None and r.scale is not None
            assert r.cap_factor is not None and r.sink_offset is not None
    seeds = [it.recipe.seed for it in structural_items(CPU, "fp16", 4)]
    assert seeds != [it.recipe.seed for it in items]  # each dtype draws its own cases
    # block-aligned lengths first, then ragged ones
    first = [it for it in items if it.tag.endswith("/0")]
    assert all(it.recipe.nq == 32 for it in first)
    assert all(it.recipe.nk == 32 for it in first if not it.tag.startswith("conformance"))
    assert all(it.recipe.nq == 33 for it in items if it.tag.endswith("/1"))
    # conformance compares with the emulation inside one key block: 16 keys, then 9
    conf = [it.recipe.nk for it in items if it.tag.startswith("conformance/")]
    assert conf == [16, 9][: CPU.structural_cases]


def test_gradient_items():
    items = gradient_items(CPU, "fp16", 2)
    assert items == gradient_items(CPU, "fp16", 2) != gradient_items(CPU, "fp16", 3)
    assert len(items) == CPU.gradient_cases
    fams = [it.recipe.family for it in items]
    assert fams == [f for f, _ in GRADIENT_SCENARIOS][: len(items)]
    for it in items:
        r = it.recipe
        assert it.part == "gradients" and (r.b, r.hq, r.hk) == (2, 4, 2)
        assert 2 * 4 * r.nq * r.nk <= CPU.grid_max_work or max(r.nq, r.nk) <= 16
    masked, off_grid = items[1].recipe, items[2].recipe
    assert masked.causal and masked.nq > masked.nk  # rows that keep no key
    assert off_grid.nq == 17 and off_grid.nk in (33, 65, 129)
    assert items[5].recipe.window == (16, 0)
    assert len(gradient_items(SMOKE, "fp16", 2)) == SMOKE.gradient_cases
    # each dtype draws its own cases
    seeds = [it.recipe.seed for it in gradient_items(CPU, "bf16", 2)]
    assert seeds != [it.recipe.seed for it in items]
