"""The palette: a compiling kernel's few compile keys per dtype, fitted to its contract, and
the campaign's plan and search drawing their key dimensions from it."""

from dataclasses import replace

import pytest

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.adapters.palette import (
    DEFAULT_PALETTE,
    TEMPLATE,
    Palette,
    compile_key,
    palette_for,
)
from flashcheck.harness.campaign.plan import (
    PRESETS,
    fit_recipe,
    mutate,
    plan_items,
    rng_for,
    structural_items,
)
from flashcheck.harness.cases.families import Recipe, make_case

KEYS = ("dtype", "nq", "nk", "d", "causal")


def _kernel(**kw):
    return Kernel("k", lambda q, k, v, **o: q, **kw)


def test_no_compile_keys_no_palette_and_recipes_left_alone():
    assert palette_for(_kernel()) is None
    assert palette_for(_kernel(compile_keys=("dtype",))) is None  # the dtype is the plan's loop
    plain = _kernel()
    for it in plan_items(PRESETS["smoke"], ["fp16"], 0):
        assert fit_recipe(it.recipe, plain, palette=1) == fit_recipe(it.recipe, plain)
    assert compile_key(plain, plan_items(PRESETS["smoke"], ["fp16"], 0)[0].recipe) == ()


def test_the_default_palette_keeps_the_edges():
    pal = palette_for(_kernel(compile_keys=KEYS))
    assert len(pal) == DEFAULT_PALETTE and pal.dims == ("nq", "nk", "d", "causal")
    nq = {e[0] for e in pal.entries}
    assert any(n % 16 == 0 for n in nq) and any(n % 16 for n in nq)  # aligned and ragged
    assert {e[2] for e in pal.entries} == {64, 128}  # both head-dim regimes
    assert {e[3] for e in pal.entries} == {True, False}  # causal both ways
    assert any(e[0] > e[1] and e[3] for e in pal.entries)  # causal Nq > Nk: masked rows
    assert any(e[0] < e[1] for e in pal.entries)


def test_the_palette_is_fitted_to_the_contract_and_its_size_is_kept():
    k = _kernel(
        compile_keys=("nq", "d"),
        seq_multiple=32,
        unequal_lengths=False,
        head_dims=(32, 64),
        masks=frozenset(),
    )
    pal = palette_for(k, 3)
    # Nq = Nk is required: both lengths are keyed together
    assert pal.dims == ("nq", "nk", "d") and len(pal) == 3
    for nq, nk, d in pal.entries:
        assert nq == nk and nq % 32 == 0 and d in (32, 64)
    assert len(palette_for(_kernel(compile_keys=("causal",)), 8)) == 2  # only two values exist
    assert len(palette_for(_kernel(compile_keys=KEYS), 8)) == len(TEMPLATE)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            palette_for(k, bad)
    with pytest.raises(ValueError, match="dims among"):
        Palette(("b",), ((1,),))


def test_snap_moves_only_the_keys_to_the_nearest_entry():
    pal = Palette(("nq", "nk", "causal"), ((16, 16, False), (128, 128, True)))
    r = Recipe("fp16", "randn", 2, 4, 2, 100, 120, 40, 40, 7, causal=True, scale=0.5)
    snapped = pal.snap(r)
    assert (snapped.nq, snapped.nk, snapped.causal) == (128, 128, True)
    assert replace(snapped, nq=100, nk=120) == r  # batch, heads, dims, seed, scale unchanged
    assert pal.snap(replace(r, nq=20, nk=9, causal=False)).nq == 16
    assert pal.apply(r, 0).nq == 16


@pytest.mark.parametrize("size", [1, 2, 4])
def test_every_fitted_campaign_case_uses_at_most_size_keys_per_dtype(size):
    preset = replace(PRESETS["cpu"], palette=size)
    k = _kernel(compile_keys=KEYS)
    keys = {}
    items = plan_items(preset, ["fp16", "bf16"], 0)
    items += structural_items(preset, "fp16", 0) + structural_items(preset, "bf16", 0)
    for it in items:
        r = fit_recipe(it.recipe, k, palette=size)
        assert k.supports(make_case(r)) is None
        keys.setdefault(r.dtype, set()).add(compile_key(k, r))
    assert {dt: len(v) for dt, v in keys.items()} == {"fp16": size, "bf16": size}
    # batch and heads still vary: batch > 1 with a block-aligned length is there
    fitted = [fit_recipe(it.recipe, k, palette=size) for it in items]
    assert any(r.b > 1 and r.nq % 16 == 0 for r in fitted)


def test_the_search_draws_key_dimensions_from_the_palette():
    preset = PRESETS["cpu"]
    k = _kernel(compile_keys=KEYS)
    pal = palette_for(k, preset.palette)
    rng = rng_for(0, "search-test")
    r = fit_recipe(Recipe("fp16", "randn", 1, 2, 2, 64, 64, 64, 64, 1), k)
    seen = set()
    for _ in range(60):
        r = mutate(rng, r, preset, k)
        key = (r.nq, r.nk, r.d, r.causal)
        assert key in pal.entries
        seen.add(key)
    assert len(seen) == len(pal)  # and it moves between them


def test_the_search_of_a_kernel_without_keys_is_unchanged():
    preset = PRESETS["cpu"]
    k = _kernel()
    a, b = rng_for(0, "x"), rng_for(0, "x")
    r = Recipe("fp16", "randn", 1, 2, 2, 64, 64, 64, 64, 1)
    got = [mutate(a, r, preset, k) for _ in range(20)]
    assert got == [mutate(b, r, replace(preset, palette=1), k) for _ in range(20)]
    assert len({(x.nq, x.nk, x.d) for x in got}) > 4
    assert all(x.dtype == "fp16" for x in got)


# -- the strategies --------------------------------------------------------------------------


def test_the_strategies_draw_key_dimensions_from_the_palette_and_the_rest_freely():
    from hypothesis import given, settings

    import flashcheck
    from flashcheck.strategies import attention_cases

    def fn(q, k, v, *, causal=False, scale=None):
        return q

    kern = flashcheck.kernel(
        fn,
        api="numpy",
        devices=("cpu",),
        dtypes=("fp16",),
        head_dims=(64, 128),
        masks=("causal",),
        gqa=True,
        unequal_lengths=True,
        distinct_dv=True,
        batched=True,
        seq_multiple=1,
        compile_keys=("nq", "nk", "d", "causal"),
    )
    pal = palette_for(kern, 2)
    seen, batches = set(), set()

    @settings(max_examples=60, database=None, derandomize=True)
    @given(attention_cases(kern, palette=2))
    def draw(case):
        b, hq, _, nq, nk, d, _ = case.shape
        seen.add((nq, nk, d, case.causal))
        batches.add((b, hq))

    draw()
    assert seen <= set(pal.entries) and len(seen) == 2
    assert len(batches) > 1
    with pytest.raises(ValueError, match="palette is a positive int"):
        attention_cases(kern, palette=0)


def test_the_strategies_of_a_kernel_without_keys_are_unchanged():
    from flashcheck.properties.strategies import contract_limits

    k = _kernel()
    assert "palette" not in contract_limits(k)
    assert contract_limits(_kernel(compile_keys=("d",)))["palette"] == palette_for(
        _kernel(compile_keys=("d",))
    )
