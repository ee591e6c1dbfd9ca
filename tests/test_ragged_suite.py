"""The property suite on kernels of ragged layouts: the strategy ``ragged_cases`` draws inside a
kernel's layout and contract, and `flashcheck test` (and the plugin) run as a user runs them on
the kernels of tests/user/user_layouts.py and user_varlen_grads.py (the correct ones pass, each
planted bug class fails with its bug named and a replayable case file)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from cli_helpers import run_flashcheck
from hypothesis import HealthCheck, given, settings

import flashcheck.properties
from flashcheck.harness.adapters.probe import resolved
from flashcheck.harness.adapters.ragged_call import ragged_supports
from flashcheck.harness.cases.ragged_variants import owned_slots
from flashcheck.properties.tested_kernels import layouts_of_test
from flashcheck.strategies import attention_cases, ragged_cases

USER = Path(__file__).parent / "user"


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


def _drawn(kernel, n=40, **kw):
    seen = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(ragged_cases(kernel, **kw))
    def collect(case):
        seen.append(case)

    collect()
    return seen


def test_ragged_cases_cover_the_layouts_edges_inside_the_contract(user):
    varlen = _drawn(user.varlen_ok, dtype="bf16")
    kern = resolved(user.varlen_ok)
    assert all(c.layout == "varlen" and c.dtype == "bf16" for c in varlen)
    assert all(ragged_supports(kern, c) is None for c in varlen)
    lens = [c.lengths(b) for c in varlen for b in range(c.sequences)]
    assert any(nq == 0 for nq, _ in lens) and any(nk == 0 for _, nk in lens)
    assert {15, 16, 17} & {n for pair in lens for n in pair}
    assert any(c.sequences > 1 for c in varlen) and any(c.causal for c in varlen)
    # The first example is the one shrinking ends at: one short sequence.
    assert varlen[0].sequences == 1 and max(varlen[0].lengths(0)) <= 1

    paged = _drawn(user.paged_ok, n=100, dtype="fp16")
    assert {c.tensors["k_cache"].shape[1] for c in paged} >= {1, 7, 16}
    assert {c.tensors["q"].shape[1] for c in paged} >= {1, 8}
    assert any(c.tensors["q"].shape[2] > c.tensors["k_cache"].shape[2] for c in paged)  # GQA
    shared = [c for c in paged if c.family == "randn" and c.params.get("shared_pages")]
    assert shared
    for c in shared:
        t = c.index["block_table"]
        n = c.params["shared_pages"]
        assert (t[0, :n] == t[1, :n]).all()
    for c in paged:  # every slot no sequence reads is NaN
        free = ~owned_slots(c).any(axis=0)
        assert np.isnan(c.tensors["k_cache"][free].astype(np.float32)).all()

    merge = _drawn(user.combine_ok, dtype="fp32")
    lse = [c.tensors["lse_partial"] for c in merge]
    assert any(np.isneginf(x).any() and not np.isneginf(x).all() for x in lse)
    assert any(np.isneginf(x).all(axis=0).any() for x in lse)  # a row with every split empty


def test_ragged_cases_say_how_to_fix_a_wrong_call(user):
    with pytest.raises(ValueError, match="attention_cases"):
        _drawn(lambda q, k, v: q, n=1)
    with pytest.raises(ValueError, match="dtype must be one of"):
        ragged_cases(user.varlen_ok, dtype="fp8")
    with pytest.raises(ValueError, match="max_batch is a positive int"):
        ragged_cases(user.varlen_ok, max_batch=0)
    assert attention_cases is not None  # exported side by side


def _suite(tmp_path, *args):
    """`flashcheck test ARGS` from a folder holding user_layouts.py, as a user runs it."""
    shutil.copy(USER / "user_layouts.py", tmp_path)
    out = run_flashcheck(["test", *args], cwd=tmp_path)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.slow
def test_the_plugin_passes_the_correct_ragged_kernels_and_fails_a_backward_bug(tmp_path):
    # Every layout in one pytest run (the plugin, as a project's own pytest loads it): the
    # correct kernels pass, a varlen backward that sums one row past its sequence fails.
    for name in ("user_layouts.py", "user_varlen_grads.py"):
        shutil.copy(USER / name, tmp_path)
    suite = Path(flashcheck.properties.__file__).parent / "suite.ini"
    kernels = [f"user_layouts:{k}" for k in ("varlen_ok", "paged_ok", "combine_ok")]
    kernels += [f"user_varlen_grads:{k}" for k in ("varlen_autograd", "varlen_bwd_neighbour_row")]
    args = [sys.executable, "-m", "pytest", "--pyargs", "flashcheck.properties", "-c", str(suite)]
    args += ["--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-v"]
    args += [x for k in kernels for x in ("--flashcheck-kernel", k)]
    args += ["--flashcheck-dtype", "fp16"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    out = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    acc, grads = "error_within_bounds_per_sequence", "gradients_within_bounds_per_sequence"
    ran = {
        "user_layouts:varlen_ok": (acc, "sequence_independence", "batch_invariance"),
        "user_layouts:paged_ok": (acc, "page_independence", "batch_invariance"),
        "user_layouts:combine_ok": (acc,),
        "user_varlen_grads:varlen_autograd": (acc, grads, "sequence_independence"),
    }
    for kern, tests in ran.items():
        for test in tests:
            assert re.search(rf"test_ragged_{test}\[{kern}-fp16\] PASSED", text), (test, text)
    failed = re.findall(r"test_ragged_(\w+)\[([\w:]+)-fp16\] FAILED", text)
    assert failed == [(grads, "user_varlen_grads:varlen_bwd_neighbour_row")], text
    assert re.search(r"FAILED \w+: gradients: sequence \d .*dK\[.*\n\s+flashcheck replay", text)
    # The dense properties are not applicable, and say so; none passes on a ragged kernel.
    assert "is a varlen kernel: this test applies to dense (B, H, N, d) kernels" in text
    # ... deselected, not listed one by one as skipped (32 lines for a varlen kernel), and
    # counted apart from the skips and passes.
    assert not re.search(r"test_(structure|accuracy|gradients)\.py\S+ SKIPPED", text), text
    assert re.search(r"user_layouts:varlen_ok: \d+ passed, \d+ not applicable\n", text), text
    assert "is a split-KV merge: this test applies to varlen kernels and paged" in text
    assert "declares no backward (its contract)" in text
    assert not re.search(r"test_(structure|accuracy|gradients)\.py\S+ PASSED", text), text
    assert "batch-invariant: yes, bitwise over" in text  # measured on varlen_ok and paged_ok


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kernel", "failed", "named"),
    [
        ("varlen_one_past", "accuracy", "one past the sequence's end"),
        ("combine_nan_when_empty", "accuracy", "every split is empty (lse = −inf) give NaN"),
        ("paged_whole_page", "page-independence", "it reads slots past cache_seqlens"),
    ],
)
def test_a_ragged_bug_class_fails_the_suite_with_its_bug_named(tmp_path, kernel, failed, named):
    # -x: the first failing property is enough (and the cheapest); the paged kernel's NaN
    # fails accuracy too, but page independence is the property that names its bug.
    only = ["-k", "page_independence"] if failed == "page-independence" else []
    code, text = _suite(tmp_path, f"user_layouts:{kernel}", "--dtype", "fp32", "--", "-x", *only)
    assert code == 1, text
    assert named in text, text
    found = re.search(rf"FAILED test_ragged_\w+: {failed}: .*\n\s+flashcheck replay (\w+)", text)
    assert found, text
    if failed == "page-independence":
        # The saved case replays from its file alone: the property fails again, the same way.
        again = run_flashcheck(["replay", found.group(1)], cwd=tmp_path)
        out = again.stdout + again.stderr
        assert again.returncode == 1, out
        assert "property page-independence: FAIL" in out and "(same verdict)" in out, out


def test_the_layouts_marker_names_known_layouts():
    def item(*args):
        mark = None if args == (None,) else pytest.mark.layouts(*args).mark
        return SimpleNamespace(name="t", get_closest_marker=lambda name: mark)

    assert layouts_of_test(item(None)) is None  # unmarked: every layout
    assert layouts_of_test(item("varlen", "paged")) == ("varlen", "paged")
    for bad in [(), ("ragged",)]:
        with pytest.raises(pytest.UsageError, match="takes one or more of dense, varlen"):
            layouts_of_test(item(*bad))
