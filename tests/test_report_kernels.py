"""`flashcheck report` on kernels defined outside the package, each a bug class seen in real
kernels (tests/user/user_kernels.py), run as a user runs it: the installed command in a folder
holding only the user's module. Each buggy kernel exits 1 with its bug named in the terminal
summary; the correct ones exit 0 with no FAIL."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_flashcheck

from flashcheck.harness.core.resultlog import read_records

# Each test runs a campaign of its own in a subprocess: seconds to tens of seconds.
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "user"

# kernel, dtype, what the terminal summary must say (the bug, in the harness's words)
BUGGY = [
    ("batch_leak", "fp32", "structural property batch-head-independence failed"),
    ("head_leak_aligned", "fp16", "structural property batch-head-independence failed"),
    ("sentinel_mask", "fp16", "fully masked rows with O != 0"),
    ("sentinel_max", "fp32", "consistent with a row maximum never below a finite value"),
    ("no_max_subtraction", "fp16", "consistent with exp(s) taken without subtracting the row max"),
    ("returns_q", "fp16", "exceed the deterministic bound"),
    ("scales_q_in_place", "fp16", "the kernel modified its input q:"),
    ("reuses_its_buffer", "fp16", "returned storage that the next call overwrote: O changed in"),
    ("always_raises", "fp16", "could not run at all (NotImplementedError"),
    ("always_hangs", "fp16", "could not run at all (it hung"),
]


@pytest.fixture
def user_dir(tmp_path):
    shutil.copy(HERE / "user_kernels.py", tmp_path / "user_kernels.py")
    return tmp_path


@pytest.mark.parametrize(("kernel", "dtype", "named"), BUGGY, ids=[b[0] for b in BUGGY])
def test_buggy_kernel_exits_1_with_its_bug_named(user_dir, kernel, dtype, named):
    args = ["report", "--preset", "smoke", "--dtype", dtype, "--kernel", f"user_kernels:{kernel}"]
    out = run_flashcheck([*args, "--timeout", "5", "--no-render"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert named in text, text
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("exit status 1"))
    assert any(f"user_kernels:{kernel} {dtype}" in line for line in lines[at + 1 :])
    # the report folder is named after the kernel, and every failure saved a replayable case
    records = read_records(user_dir / f"reports/user_kernels-{kernel}/results.jsonl")
    failing = [
        r for r in records if r.get("type") == "result" and r["status"] in ("FAIL", "FAIL-HARD")
    ]
    if failing:
        assert "flashcheck replay" in text
    if kernel == "always_raises":  # no results: the report says "none", not ": ."
        from flashcheck.harness.campaign.render import render_report

        path = user_dir / f"reports/user_kernels-{kernel}/results.jsonl"
        md = render_report(path, figures=False).read_text()
        assert "**0 results**: none. Kernels: user_kernels:always_raises" in md


def test_correct_kernels_pass_every_dtype(user_dir):
    kernels = ["--kernel", "user_kernels:textbook", "--kernel", "user_kernels:online_softmax"]
    out = run_flashcheck(["report", "--preset", "smoke", *kernels, "--no-render"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    records = read_records(
        user_dir / "reports/user_kernels-textbook+user_kernels-online_softmax" / "results.jsonl"
    )
    results = [r for r in records if r.get("type") == "result"]
    statuses = {r["status"] for r in results}
    assert statuses <= {"PASS", "SKIP"}, [r["reasons"] for r in results if r["status"] != "PASS"]
    assert {r["dtype"] for r in results if r["status"] == "PASS"} == {"fp16", "bf16", "fp32"}
    assert {
        r["property"] for r in results if r["part"] == "structural" and r["status"] == "PASS"
    } >= {"batch-head-independence", "integrity", "nan-rule", "options-applied", "padded-buffers"}


def test_contract_keeps_cases_inside_and_batches_above_one(user_dir):
    out = run_flashcheck(
        [
            "report",
            "--preset",
            "smoke",
            "--dtype",
            "fp32",
            "--kernel",
            "user_kernels:batch_leak",
            "--no-render",
        ],
        user_dir,
    )
    records = read_records(user_dir / "reports/user_kernels-batch_leak/results.jsonl")
    results = [r for r in records if r.get("type") == "result"]
    assert results, out.stdout + out.stderr
    # the probed multiple of 128 holds for every case, and no case was wasted as ERROR
    assert all(r["shape"]["Nq"] % 128 == 0 and r["shape"]["Nk"] % 128 == 0 for r in results)
    assert not [r for r in results if r["status"] == "ERROR"]
    assert any(r["shape"]["B"] * r["shape"]["Hq"] > 1 for r in results)
    contract = next(r for r in records if r.get("type") == "contract")
    assert "sequence lengths multiple of 128" in " ".join(contract["lines"])


def test_unusable_kernel_specs_are_usage_errors(user_dir):
    (user_dir / "broken_mod.py").write_text("raise RuntimeError('boom at import')\n")
    for args in (
        ["report", "--kernel", "broken_mod:fn"],
        ["report", "--kernel", "nosuch:fn"],
        ["test", "broken_mod:fn"],
    ):
        out = run_flashcheck(args, user_dir)
        assert out.returncode == 2, out.stdout + out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "cannot import" in out.stderr


def test_a_missing_triton_is_a_one_line_usage_error(user_dir):
    code = (
        "import sys; sys.modules['triton'] = None; from flashcheck.harness.cli import main; "
        "sys.exit(main(['report', '--kernel', 'triton', '--preset', 'smoke']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=user_dir, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stderr.strip() == (
        "flashcheck report: error: triton cannot run here: Triton is not installed "
        "(pip install triton)"
    )


def test_nan_to_num_kernel_names_the_declaration_and_passes_declared(user_dir):
    """nan_to_num on the probabilities breaks the NaN rule: exit 1 naming the declaration that
    accepts it; with --nan-inputs any the finding is a convention, exit 0."""
    args = ["report", "--preset", "smoke", "--dtype", "fp16", "--kernel", "user_kernels:nan_to_num"]
    args += ["--timeout", "5", "--no-render"]
    out = run_flashcheck(args, user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert 'declare nan_inputs="any" in flashcheck.kernel, or --nan-inputs any' in text, text
    out = run_flashcheck([*args, "--nan-inputs", "any", "--fresh"], user_dir)
    assert out.returncode == 0, out.stdout + out.stderr


def test_flashcheck_test_takes_the_nan_policy(user_dir):
    """`flashcheck test --nan-inputs any` accepts the nan_to_num kernel's NaN property."""
    args = ["test", "user_kernels:nan_to_num", "--dtype", "fp16"]
    only = ["--", "-k", "nan_inputs_propagate", "-p", "no:cacheprovider"]
    out = run_flashcheck([*args, *only], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert 'declare nan_inputs="any"' in text, text
    out = run_flashcheck([*args, "--nan-inputs", "any", *only], user_dir)
    assert out.returncode == 0, out.stdout + out.stderr


def test_batch_variant_kernel_is_reported_undeclared_and_fails_declared(user_dir):
    """A kernel that computes a batch of one in two KV halves: within its bounds, so the report
    exits 0 and says where it is not batch-invariant; declared batch-invariant, it exits 1."""
    args = ["report", "--preset", "smoke", "--dtype", "fp32", "--part", "structural"]
    out = run_flashcheck([*args, "--kernel", "user_kernels:split_kv_when_small"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    finding = "batch-invariant: no (measured; not declared, so not gated): O differs in"
    assert finding in text, text
    md = (user_dir / "reports/user_kernels-split_kv_when_small/error-report.md").read_text()
    assert "## Batch invariance" in md
    assert f"- **user_kernels:split_kv_when_small fp32**: {finding}" in md, md
    # The structural table does not count those differences as PASS (it said "3 PASS").
    row = next(x for x in md.splitlines() if "| fp32 | batch-invariance |" in x)
    assert " differing, not gated) | 0 | 0 | 0 | not batch-invariant (measured;" in row, row
    out = run_flashcheck([*args, "--kernel", "user_kernels:split_kv_declared"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "batch-invariance failed: user_kernels:split_kv_declared fp32" in text, text
    assert "batch-invariant: no, though declared (gated): O differs in" in text, text
    out = run_flashcheck([*args, "--kernel", "user_kernels:textbook"], user_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "batch-invariant: yes, bitwise over 2 cases (other shapes may differ" in out.stdout


def test_a_kernel_that_differs_alone_only_on_one_slice_is_found_by_the_report(user_dir):
    """The report's batch-invariance cases include one head and one key, where the sequence
    alone is a single (batch, head) slice: a kernel that takes another path for a single slice
    is found (the report's four-head cases alone said "yes" for a user's torch kernel that
    `flashcheck test` found varying)."""
    args = ["report", "--preset", "smoke", "--dtype", "fp32", "--part", "structural"]
    out = run_flashcheck([*args, "--kernel", "user_kernels:one_slice_alone_differs"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    finding = "batch-invariant: no (measured; not declared, so not gated): LSE differs in"
    assert finding in text and "B=2 Hq=1 Hk=1 Nq=17 Nk=1" in text, text


def test_a_kernel_that_runs_on_no_input_fails_the_suite_with_its_reason_alone(user_dir):
    # The failure showed a traceback into the suite's own test file, with its assert.
    args = ["test", "user_kernels:always_raises", "--", "-k", "runs_on_some_input"]
    out = run_flashcheck([*args, "-p", "no:cacheprovider"], user_dir)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "ran on none of the probe inputs" in text and "NotImplementedError" in text, text
    assert "assert kern.dtypes" not in text and not re.search(r"test_contract\.py:\d", text)
