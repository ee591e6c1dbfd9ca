"""Which results the worst-case search breeds from and which get case files: pure functions of
the typed results on file."""

from __future__ import annotations

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.campaign.casefiles import worst_results
from flashcheck.harness.campaign.plan import PRESETS
from flashcheck.harness.campaign.resultrecords import (
    AccuracyResult,
    CaseOptions,
    CaseShape,
    GradientResult,
    StructuralResult,
)
from flashcheck.harness.campaign.search import children, parents
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.core.status import Status


def _res(key, status, score=0.0, *, part="grid", tag="t", kernel="k", seed=0, prop=None):
    cls = {"structural": StructuralResult, "gradients": GradientResult}.get(part, AccuracyResult)
    extra = {"property": prop or "nan-rule"} if part == "structural" else {}
    return cls(
        key=key,
        part=part,
        tag=tag,
        kernel=kernel,
        dtype="fp16",
        device="cpu",
        family="randn",
        recipe=Recipe("fp16", "randn", 1, 1, 1, 16, 16, 16, 16, seed),
        shape=CaseShape(1, 1, 1, 16, 16, 16, 16),
        options=CaseOptions(),
        status=Status(status),
        score=score,
        **extra,
    )


def test_worst_results_pick_the_worst_and_failing_ones():
    rows = [
        _res("a", "PASS", 0.9),
        _res("b", "FAIL", 1.5),
        _res("c", "FAIL-HARD", 1.0),
        _res("d", "FAIL", 3.0),
        _res("e", "FAIL", 2.0),
        _res("f", "ERROR", float("inf")),  # broken: nothing to replay against the oracle
        _res("g", "SKIP"),
        _res("s1", "FAIL", part="structural", prop="padded-buffers"),
        _res("s2", "FAIL", part="structural", prop="padded-buffers"),
        _res("s3", "PASS", part="structural", prop="determinism"),
        _res("g1", "PASS", 0.5, part="gradients"),
        _res("g2", "FAIL", 1.2, part="gradients"),
    ]
    keys = [r.key for r in worst_results(rows, per_group=3)]
    # FAIL-HARD first whatever its margin, then the failing ones by margin; the worst gradient
    # case; the first failure of each structural property.
    assert keys == ["c", "d", "e", "g2", "s1"]
    assert [r.key for r in worst_results(rows, per_group=1)] == ["c", "g2", "s1"]
    # a kernel that passes everything still has its worst case saved
    assert [r.key for r in worst_results([_res("a", "PASS", 0.2), _res("b", "PASS", 0.7)])] == ["b"]


def test_search_parents_come_from_earlier_generations_only():
    rows = [
        _res("a", "PASS", 0.5, seed=1),
        _res("b", "FAIL", 2.0, seed=2),
        _res("c", "SKIP", 0.0, seed=3),
        _res("d", "PASS", 9.0, part="search", tag="1/0", seed=4),  # generation 1
        _res("e", "PASS", 5.0, part="search", tag="0/0", seed=5),  # generation 0
        _res("f", "FAIL", 9.0, part="structural", seed=6),
        _res("g", "PASS", 9.0, kernel="other", seed=7),
    ]
    seeds = [r.seed for r in parents(rows, "k", "fp16", 0, 5)]
    assert seeds == [2, 1]  # by score; no SKIP, no later generation, no structural
    assert [r.seed for r in parents(rows, "k", "fp16", 1, 5)] == [5, 2, 1]
    assert [r.seed for r in parents(rows, "k", "fp16", 2, 2)] == [4, 5]


def test_search_children_are_deterministic_and_supported():
    kernel = Kernel(name="k", fn=lambda *a, **k: None, masks=frozenset(), gqa=False)
    pool = [Recipe("fp16", "randn", 1, 2, 2, 16, 16, 16, 16, 3)]
    kw = {"spec": "k", "dtype": "fp16", "preset": PRESETS["cpu"], "adapter": kernel}
    a = children(pool, gen=0, seed=0, device="cpu", **kw)
    assert a == children(pool, gen=0, seed=0, device="cpu", **kw)
    assert a != children(pool, gen=1, seed=0, device="cpu", **kw)
    assert len(a) == PRESETS["cpu"].search_population
    assert [it.tag for it in a[:2]] == ["0/0", "0/1"] and all(it.part == "search" for it in a)
    assert all(kernel.supports(make_case(it.recipe)) is None for it in a)
    assert children([], gen=0, seed=0, device="cpu", **kw) == []
