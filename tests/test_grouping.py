"""A campaign's work grouped by compile key: the plain kernels' work keeps the plan's order,
each compiling kernel's work runs one key at a time, every key on one kernel worker, and the
progress line's ETA counts compile waits apart."""

import io
import os
import time
from dataclasses import replace
from pathlib import Path

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.adapters.palette import compile_key, palette_for
from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.adapters.worker import KernelRef
from flashcheck.harness.campaign.executor import LocalExecutor
from flashcheck.harness.campaign.fitting import fit_recipe
from flashcheck.harness.campaign.grouping import (
    affinity,
    compile_waits,
    grouped,
    palette_first,
)
from flashcheck.harness.campaign.plan import PRESETS, plan_items, structural_items
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.core.progress import Progress

KEYS = ("dtype", "nq", "nk", "d", "causal")
HERE = Path(__file__).stem  # the kernel workers import this module by the kernel's spec


def which_process(q, k, v, *, causal=False):
    """O filled with (a residue of) the id of the process that computed it."""
    import torch

    return torch.full((*q.shape[:3], v.shape[3]), float(os.getpid() % 1024))


def _kernel(name, **kw):
    return Kernel(name, lambda q, k, v, **o: q, **kw)


def _work(specs):
    p = PRESETS["cpu"]
    items = plan_items(p, ["fp16", "bf16"], 0) + structural_items(p, "fp16", 0)
    return [(it, list(specs)) for it in items]


def test_work_of_kernels_without_compile_keys_is_left_as_it_is():
    kernels = {"a": _kernel("a"), "b": _kernel("b")}
    work = _work(kernels)
    assert grouped(work, kernels) == work
    assert compile_waits(work, kernels) == (0, 0.0)
    assert affinity(kernels["a"], work[0][0].recipe) is None


def test_a_compiling_kernels_work_runs_one_key_at_a_time_after_the_plain_work():
    kernels = {"plain": _kernel("plain"), "jit": _kernel("jit", compile_keys=KEYS)}
    work = _work(kernels)
    out = grouped(work, kernels)
    plain = [(it, specs) for it, specs in out if specs == ["plain"]]
    assert plain == [(it, ["plain"]) for it, _ in work]  # the plan's order, first
    jit = out[len(plain) :]
    assert all(specs == ["jit"] for _, specs in jit) and len(jit) == len(work)
    keys = [compile_key(kernels["jit"], fit_recipe(it.recipe, kernels["jit"])) for it, _ in jit]
    runs = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(runs) == len(set(keys)) == 8  # 4 keys per dtype, each one run
    # within a key, the plan's order
    order = {id(it): i for i, (it, _) in enumerate(work)}
    for key in set(keys):
        idx = [order[id(it)] for (it, _), k in zip(jit, keys, strict=True) if k == key]
        assert idx == sorted(idx)
    assert grouped(work, kernels) == out  # a function of the work and the contracts
    assert compile_waits(work, kernels) == (8, 0.0)


def test_each_key_is_one_group_of_calls():
    jit = _kernel("jit", compile_keys=KEYS, compile_seconds=10.0)
    pal = palette_for(jit)
    pins = {}
    for it, _ in _work({"jit": jit}):
        r = fit_recipe(it.recipe, jit)
        pins.setdefault(compile_key(jit, r), set()).add(affinity(jit, r))
    assert all(len(p) == 1 for p in pins.values())
    groups = [next(iter(p)) for p in pins.values()]
    assert len(set(groups)) == len(groups)  # no two keys share a group (nor so a worker)
    assert len([k for k in pins if k[0] == "fp16"]) == len(pal)
    assert compile_waits(_work({"jit": jit}), {"jit": jit})[1] == 10.0


def test_under_a_budget_the_palettes_first_key_is_compiled_first():
    jit = _kernel("jit", compile_keys=KEYS, compile_seconds=10.0)
    kernels = {"jit": jit, "plain": _kernel("plain")}
    pal = palette_for(jit)
    work = _work(["jit"])
    out = palette_first(work, kernels)
    places = []
    for it, _ in out:
        r = fit_recipe(it.recipe, jit)
        places.append(pal.entries.index(tuple(getattr(r, x) for x in pal.dims)))
    # the first key (block-aligned, several key blocks: where batch indexing bugs show) first,
    # in every dtype, then the next; each key's cases in their earlier order
    assert places == sorted(places) and places[0] == 0
    first = [it for (it, _), p in zip(out, places, strict=True) if p == 0]
    assert {it.recipe.dtype for it in first} == {"fp16", "bf16"}
    order = {id(it): i for i, (it, _) in enumerate(work)}
    assert [order[id(it)] for it in first] == sorted(order[id(it)] for it in first)
    plain = _work(["plain"])
    assert palette_first(plain, kernels) == plain  # no compile keys: the order is kept


def test_the_eta_counts_compile_waits_apart():
    out = io.StringIO()
    p = Progress(100, stream=out, keys=5, compile_seconds=10.0, interval=0)
    p.t0 = time.monotonic() - 30.0  # 30 s elapsed, 20 of them compiling two keys
    p.compiling("compiling k fp16, 64")
    p.compiling("compiling k fp16, 129")
    p.compile_time = 20.0
    p.advance(10)
    # 90 units at 10 s per 10 units, plus 3 keys x 10 s
    assert abs(p.eta() - (90 + 30)) < 1.0
    assert "compiling k fp16, 64" in out.getvalue()  # said at once, off a terminal too
    plain = Progress(100, stream=io.StringIO())
    plain.t0 = time.monotonic() - 30.0
    plain.advance(10)
    assert abs(plain.eta() - 270) < 1.0


def test_the_first_eta_is_the_plans_estimate_then_the_measured_rate():
    import io

    from flashcheck.harness.core.progress import Progress

    p = Progress(1000, stream=io.StringIO(), prior_rate=0.15)
    assert p.eta() == 150 and "ETA ~2:30" in p.line()
    p.advance(10)  # 1 %: still the estimate (not the rate of one item)
    assert p.eta() == 990 * 0.15 and "ETA ~" in p.line()
    p.advance(90)  # 10 %: the measured rate
    assert "ETA ~" not in p.line()


def test_each_groups_calls_run_on_one_worker_and_free_calls_on_any():
    spec = f"{HERE}:which_process"
    ref = KernelRef.of(replace(resolve(spec), pending=frozenset()), spec)
    case = make_case(Recipe("fp32", "randn", 1, 1, 1, 4, 4, 4, 4, seed=0))
    with LocalExecutor(workers=1, kernel_workers=2, timeout=120) as ex:
        pinned = [ex.run(ref, case, "cpu", affinity=a) for a in (0, 1, 2, 3) * 3]
        free = [ex.run(ref, case, "cpu") for _ in range(4)]
        pids = [f.result().value.o.flat[0] for f in pinned]
        anywhere = {f.result().value.o.flat[0] for f in free}
    per_group = [set(pids[g::4]) for g in range(4)]
    assert all(len(p) == 1 for p in per_group)
    assert anywhere <= set(pids) and len(set(pids) | anywhere) == 2
