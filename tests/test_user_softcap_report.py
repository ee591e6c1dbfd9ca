"""Soft-capping and sinks through ``flashcheck report``, as a user runs it: the installed
command in a folder that holds nothing but the user's module (tests/user/user_softcap.py), on
the campaign's ``options`` part. Each real bug class exits 1 with the option it is in named;
the correct kernels, and a kernel that takes neither option, exit 0."""

import itertools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_flashcheck

pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
# A subprocess each (about 5 s on the smoke preset, fp16, the options part alone).
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "user"
ARGS = ["--preset", "smoke", "--part", "options", "--dtype", "fp16"]


def _report(cwd, *kernels):
    specs = [a for k in kernels for a in ("--kernel", f"user_softcap:{k}")]
    out = run_flashcheck(["report", *specs, *ARGS], cwd, 300)
    return out.returncode, out.stdout + out.stderr


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("user")
    shutil.copy(HERE / "user_softcap.py", path / "user_softcap.py")
    return path


def _failed(text, what):
    """``(failed, of)`` from the summary's ``softcap/sinks:`` line for ``what``."""
    m = re.search(rf"{what} (\d+) of (\d+) failed", text)
    assert m, text
    return int(m.group(1)), int(m.group(2))


def test_correct_kernels_exit_0_and_one_without_the_options_does_not_run_them(user_dir):
    rc, text = _report(user_dir, "manual", "plain")
    assert rc == 0, text
    # a declared backward: the gradient cases ran, dσ judged (smoke: the forward cases of
    # the cap alone twice and the sinks alone twice, the gradient cases one of each)
    assert _failed(text, "soft-capped cases") == (0, 3)
    assert _failed(text, "with sinks cases") == (0, 3)
    assert _failed(text, "dσ") == (0, 1)
    assert "user_softcap:plain" not in text.split("report [")[-1]  # no result of its own
    md = next((user_dir / "reports").glob("*plain/error-report.md")).read_text()
    assert "Not applicable (their contract takes neither option): user_softcap:plain." in md
    rc, text = _report(user_dir, "correct")  # forward only (no backward declared)
    assert rc == 0, text
    assert _failed(text, "soft-capped cases") == (0, 2)
    assert _failed(text, "with sinks cases") == (0, 2)


@pytest.mark.parametrize(
    ("kernel", "named"),
    [
        ("cap_unscaled", "soft-capped cases"),  # the cap applied to the unscaled dot product
        ("cap_ignored", "soft-capped cases"),
        ("sink_scaled", "with sinks cases"),  # the sink multiplied by the softmax scale
    ],
)
def test_each_forward_bug_exits_1_named(user_dir, kernel, named):
    rc, text = _report(user_dir, kernel)
    assert rc == 1, text
    assert f"FAIL-HARD: user_softcap:{kernel} fp16" in text
    failed, of = _failed(text, named)
    assert failed == of > 0  # every case with the option fails
    assert "O elements exceed the deterministic bound" in text
    assert "flashcheck replay" in text


def test_the_sink_gradient_with_the_wrong_sign_exits_1_named(user_dir):
    rc, text = _report(user_dir, "sink_grad_sign")
    assert rc == 1, text
    assert "gradients FAIL-HARD: user_softcap:sink_grad_sign fp16" in text
    assert _failed(text, "dσ") == (1, 1)
    assert "dσ elements exceed the deterministic bound" in text


# The property suite (`flashcheck test`, the pytest plugin) on the same kernels: each bug is
# found with its bug class named, the correct kernel passes (one pytest process for all four).
SUITE_BUGS = {
    "cap_unscaled": "consistent with the soft-cap taken of the unscaled product",
    "cap_ignored": "softcap=",  # options-applied: "softcap=... did not change the output"
    "sink_scaled": "consistent with the sinks multiplied by the scale",
    "cap_slope_missing": "test_gradients_with_softcap_and_sinks: gradients: FAIL",
}


def test_the_property_suite_draws_softcap_and_sinks_and_names_each_bug(user_dir):
    specs = [
        a
        for k in ("correct", "manual", *SUITE_BUGS)
        for a in ("--flashcheck-kernel", f"user_softcap:{k}")
    ]
    args = [
        "--pyargs",
        "flashcheck.properties",
        "-k",
        "softcap_and_sinks",
        "-p",
        "no:cacheprovider",
    ]
    args += ["--flashcheck-dtype", "fp32", "--flashcheck-profile", "ci", *specs]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=user_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    summary = text[text.index("flashcheck summary") :]
    assert "user_softcap:correct fp32: 2 passed" in summary, summary
    assert "user_softcap:manual fp32: 3 passed\n" in summary, summary  # its gradients too
    for bug, named in SUITE_BUGS.items():
        lines = summary[summary.index(f"user_softcap:{bug} fp32:") :].splitlines()
        block = [lines[0], *itertools.takewhile(lambda x: x.startswith(" "), lines[1:])]
        assert any(x.strip().startswith("FAILED") and named in x for x in block), (bug, summary)
