"""The campaign's ``options`` part: soft-capping and sinks planned relative to each case's scores,
run only on kernels that take them, recorded so that the records and case files replay exactly,
and plain recipes keyed and written as before the part existed."""

import hashlib
import json
import math
from dataclasses import asdict, replace

import numpy as np

from flashcheck.harness.adapters.adapter import Kernel
from flashcheck.harness.campaign.option_plan import option_items, takes_item
from flashcheck.harness.campaign.plan import PARTS, PRESETS, Item
from flashcheck.harness.campaign.report import ReportOptions, run_report
from flashcheck.harness.campaign.resultrecords import (
    CaseOptions,
    GradientResult,
    ResultRecord,
    gradient_record,
    recipe_from_json,
)
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.cases.store import load_case
from flashcheck.harness.core.resultlog import read_records

PLAIN = Recipe("fp16", "randn", 2, 4, 2, 16, 9, 16, 16, 7, causal=True)


def _kernel(**contract) -> Kernel:
    return Kernel(name="planned", fn=lambda *a, **k: None, **contract)


def test_a_plain_recipe_is_written_and_keyed_as_before_the_options_existed():
    old = asdict(PLAIN)
    del old["cap_factor"], old["sink_offset"]
    assert PLAIN.to_json() == old
    blob = json.dumps(["grid", "t", "k", old], sort_keys=True)
    assert Item("grid", "t", PLAIN).key("k") == hashlib.sha256(blob.encode()).hexdigest()[:16]
    assert make_case(PLAIN).params["recipe"] == old
    r = replace(PLAIN, cap_factor=0.3, sink_offset=-3.0)
    assert recipe_from_json(json.loads(json.dumps(r.to_json()))) == r
    assert Item("grid", "t", r).key("k") != Item("grid", "t", PLAIN).key("k")


def test_a_recipe_sets_the_cap_and_sinks_from_the_case_scores():
    plain = make_case(PLAIN)
    assert plain.softcap is None and plain.sinks is None
    case = make_case(replace(PLAIN, cap_factor=0.02, sink_offset=40.0))
    np.testing.assert_array_equal(case.q, plain.q)
    q, k = plain.q.astype(np.float64), np.repeat(plain.k.astype(np.float64), 2, axis=1)
    s = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(16)
    # A float32 cap (what an fp32 kernel holds is the cap judged), far below the scores.
    assert case.softcap == float(np.float32(0.02 * np.abs(s).max()))
    assert case.sinks.dtype == np.float32 and case.sinks.shape == (4,)
    np.testing.assert_array_equal(case.sinks, (s.max(axis=(0, 2, 3)) + 40).astype(np.float32))


def test_the_options_part_plans_each_family_of_the_issue():
    smoke = option_items(PRESETS["smoke"], "fp16", 0)
    assert smoke == option_items(PRESETS["smoke"], "fp16", 0)
    assert smoke != option_items(PRESETS["smoke"], "fp16", 1)
    fwd = [it for it in smoke if not it.backward]
    grad = [it for it in smoke if it.backward]
    assert len(fwd) == PRESETS["smoke"].options_cases and len(grad) == 2
    assert all(it.part == "options" for it in smoke) and "options" in PARTS
    assert all(it.tag.startswith("gradients/") for it in grad)
    caps = [it.recipe.cap_factor for it in fwd if it.recipe.cap_factor is not None]
    sinks = [it.recipe.sink_offset for it in fwd if it.recipe.sink_offset is not None]
    assert min(caps) <= 0.02 and max(sinks) >= 40  # flattened rows; a dominating sink
    masked = [it.recipe for it in fwd if it.recipe.nq > it.recipe.nk and it.recipe.causal]
    assert masked and all(r.sink_offset is not None for r in masked)  # O = 0, LSE = σ rows
    assert any(it.recipe.sink_offset is not None for it in grad)  # dσ judged
    cpu = option_items(PRESETS["cpu"], "fp32", 0)
    assert len(cpu) == PRESETS["cpu"].options_cases + PRESETS["cpu"].options_gradient_cases


def test_an_item_runs_only_on_kernels_that_take_its_options():
    cap = Item("options", "x/cap/0", replace(PLAIN, cap_factor=0.3))
    both = Item("options", "x/both/0", replace(PLAIN, cap_factor=0.3, sink_offset=0.0))
    grad = Item("options", "gradients/x/0", replace(PLAIN, sink_offset=0.0))
    assert not takes_item(_kernel(), cap)  # options=None: causal/window/mask/scale only
    assert takes_item(_kernel(options=frozenset({"softcap"})), cap)
    assert not takes_item(_kernel(options=frozenset({"softcap"})), both)
    every = frozenset({"softcap", "sinks"})
    assert takes_item(_kernel(options=every), both)
    assert grad.backward and not takes_item(_kernel(options=every), grad)
    assert takes_item(_kernel(options=every, backward=lambda *a, **k: None), grad)


def test_case_options_are_written_only_where_set():
    plain = CaseOptions(causal=True, scale=0.5)
    assert set(plain.to_json()) == {"causal", "window", "mask", "scale"}
    both = CaseOptions(softcap=1.25, sinks=(0.5, -2.0))
    assert CaseOptions.from_json(json.loads(json.dumps(both.to_json()))) == both


def test_the_part_runs_forward_and_gradients_and_its_case_files_replay(tmp_path):
    opts = ReportOptions(
        name="opts",
        preset="smoke",
        kernels=("naive-numpy",),
        dtypes=("fp32",),
        out=str(tmp_path),
        isolate=False,
        parts=("options",),
        workers=1,
    )
    assert run_report(opts, echo=lambda *a, **k: None) == 0
    records = read_records(tmp_path / "opts/results.jsonl")
    results = [ResultRecord.from_json(r) for r in records if r["type"] == "result"]
    assert {r.part for r in results} == {"options"} and len(results) == 6
    grads = [r for r in results if isinstance(r, GradientResult)]
    assert len(grads) == 2 and all(r.status == "PASS" for r in results)
    assert all("dsinks" in r.gradients for r in grads if r.options.sinks is not None)
    assert any(r.options.softcap is not None for r in results)
    for rec in records:
        if rec["type"] == "result":  # written back exactly as read
            assert ResultRecord.from_json(rec).to_json() == rec
    saved = [r for r in records if r["type"] == "case-file"]
    assert saved
    by_key = {r.key: r for r in results}
    for rec in saved:
        case, _ = load_case(rec["case_id"], tmp_path / "opts/cases")
        want = make_case(by_key[rec["key"]].recipe)
        assert case.softcap == want.softcap
        if want.sinks is not None:
            np.testing.assert_array_equal(case.sinks, want.sinks)
    md = (tmp_path / "opts/error-report.md").read_text()
    assert "## Soft-capping and sinks" in md and "| dσ |" in md


def test_only_gradient_tags_of_the_options_part_are_gradient_records():
    assert gradient_record("options", "gradients/randn/sink+3/1")
    assert not gradient_record("options", "randn/sink+3/gradients")
    assert gradient_record("gradients", "randn/0") and not gradient_record("grid", "gradients/0")


def test_kernels_that_could_not_run_here_are_not_said_to_lack_the_options():
    from pathlib import Path

    from flashcheck.harness.campaign.logrecords import load
    from flashcheck.harness.campaign.option_sections import options_lines

    # The committed CPU sample: SDPA ran and takes neither option; triton-tf32 and flex take
    # both but need CUDA, so they ran nowhere in it.
    data = load(Path(__file__).parents[1] / "reports/samples/cpu/results.jsonl")
    cfg = data.header.config
    lines = options_lines(data, cfg.kernels, cfg.dtypes, "cases")
    lacking = next(x for x in lines if x.startswith("Not applicable"))
    absent = next(x for x in lines if x.startswith("Not run"))
    assert "sdpa-math" in lacking and "triton-tf32" not in lacking and "flex" not in lacking
    assert "triton-tf32" in absent and "flex" in absent and "sdpa-math" not in absent


def test_a_case_given_options_after_it_was_made_prints_an_expression_that_rebuilds_them():
    # The property suite sets the cap and sinks on a made case; its printed draw once read as
    # the recipe alone, which rebuilt the case without them (and passed).
    case = replace(make_case(PLAIN), softcap=1.25, sinks=np.array([0.5, -2.0, 3.0, 1.0], "f4"))
    text = repr(case)
    assert text.startswith("replace(make_case(Recipe(") and "softcap=1.25" in text
    back = eval(text.split("  # ")[0], {"replace": replace, "np": np, "make_case": make_case,
                                        "Recipe": Recipe})  # fmt: skip
    assert back.softcap == case.softcap and np.array_equal(back.sinks, case.sinks)
    np.testing.assert_array_equal(back.q, case.q)
    assert "replace(" not in repr(make_case(PLAIN))
