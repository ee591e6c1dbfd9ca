"""A kernel that compiles per shape, run as a user runs it: the installed ``flashcheck
report`` in a folder that holds nothing but the user's module (tests/user/user_compile.py).

The kernel sleeps 10 s on every new (Nq, Nk, d, causal, dtype), as a JIT compile or an
autotuner does, and reads the wrong batch at block-aligned lengths. The probe must find its
compile keys, the palette keep the campaign to a few compiles, and the batch bug must be found
(exit 1, FAIL-HARD) within 3 minutes on 2 CPU cores.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

# Minutes of sleeping kernel calls in a subprocess.
# serial: they time what a user waits for (tox runs them alone, conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.serial]

HERE = Path(__file__).parent / "user"
LIMIT_S = 180


def _start(cwd, *args, compile_s=10):
    """The installed command on the user's kernel, started in ``cwd`` (its output piped)."""
    shutil.copy(HERE / "user_compile.py", cwd / "user_compile.py")
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    env.update(USER_COMPILE_SECONDS=str(compile_s), USER_COMPILE_LOG=str(cwd / "compiles.log"))
    return subprocess.Popen(
        [*cmd, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_a_kernel_that_compiles_10_s_per_shape_is_caught_by_report_and_test(tmp_path):
    """Both commands at once (they spend most of their time in the kernel's sleeps, so CI runs
    them side by side): `flashcheck report` exits 1 with FAIL-HARD in every dtype within 3
    minutes; `flashcheck test --dtype fp16 --budget 90s` (the whole suite on all three dtypes
    with a 3-minute budget exits 1 in about 3.3 minutes, benchmarks/RESULTS.md) says what it is
    doing within 5 s (its first line; the contract's probe follows once the kernel's module and
    pytest have loaded), runs batch/head independence first, exits 1 within 5 minutes, and says
    what the budget left out."""
    (tmp_path / "r").mkdir()
    (tmp_path / "t").mkdir()
    t0 = time.monotonic()
    report = _start(tmp_path / "r", "report", "--kernel", "user_compile:jit_batch_bug")
    test = _start(
        tmp_path / "t", "test", "user_compile:jit_batch_bug", "--dtype", "fp16", "--budget", "90s"
    )
    first = test.stdout.readline()
    first_s = time.monotonic() - t0
    test_text = first + test.communicate(timeout=420)[0]
    test_s = time.monotonic() - t0
    report_text = report.communicate(timeout=LIMIT_S + 120)[0]
    report_s = time.monotonic() - t0

    assert report.returncode == 1, report_text
    assert report_s <= LIMIT_S, f"report took {report_s:.0f} s\n{report_text}"
    assert "compile keys dtype, nq, nk, d, causal" in report_text
    assert "compiling user_compile:jit_batch_bug" in report_text  # the progress line says so
    for dt in ("fp16", "bf16", "fp32"):
        assert f"FAIL-HARD: user_compile:jit_batch_bug {dt}" in report_text, report_text
    # Every key compiled once: 7 probe shapes, then 4 palette keys per dtype, each on one
    # worker (the structural checks' variants may add a few).
    lines = (tmp_path / "r" / "compiles.log").read_text().splitlines()
    keys = Counter(line.split(" ", 1)[1] for line in lines)
    assert max(keys.values()) == 1, keys
    assert len(keys) <= 7 + 3 * 4 + 3, keys

    assert first.startswith("flashcheck test: loading user_compile:jit_batch_bug"), first
    assert first_s <= 5, f"the first line came after {first_s:.1f} s"
    assert "flashcheck: probing the contract of user_compile:jit_batch_bug" in test_text
    assert test.returncode == 1, test_text
    assert test_s <= 300, f"test took {test_s:.0f} s\n{test_text}"
    assert "test_batch_and_head_independence[user_compile:jit_batch_bug-fp16] FAILED" in test_text
    assert "compiling user_compile:jit_batch_bug for dtype=fp16" in test_text, test_text
    # said as it happens, not after the test in its captured output
    lines = test_text.splitlines()
    said = min(i for i, x in enumerate(lines) if "compiling user_compile:jit_batch_bug" in x)
    failed = "test_batch_and_head_independence[user_compile:jit_batch_bug-fp16] FAILED"
    assert said < min(i for i, x in enumerate(lines) if failed in x), test_text
    assert "were not started, each skipped with that reason" in test_text


def test_palette_sets_the_keys_per_dtype_and_the_configuration_records_it(tmp_path):
    args = ["--preset", "smoke", "--dtype", "fp16", "--palette", "2", "--no-render"]
    proc = _start(tmp_path, "report", "--kernel", "user_compile:jit_batch_bug", *args, compile_s=1)
    text = proc.communicate(timeout=LIMIT_S + 120)[0]
    assert proc.returncode == 1, text
    lines = (tmp_path / "compiles.log").read_text().splitlines()
    pids = Counter(line.split(" ", 1)[0] for line in lines)
    # the probe's 7 shapes and its worker's palette keys; the other worker: its palette keys
    # (a causal key's options check adds its non-causal variant)
    assert len(lines) <= 7 + 2 + 1, lines
    assert len(pids) <= 2
    results = next((tmp_path / "reports").glob("*/results.jsonl"))
    header = json.loads(results.read_text().splitlines()[0])
    assert header["config"]["palette"] == 2 and "--palette 2" in header["command"]
