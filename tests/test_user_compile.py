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
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent / "user"
LIMIT_S = 180


def _report(cwd, *args, compile_s):
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    env.update(USER_COMPILE_SECONDS=str(compile_s), USER_COMPILE_LOG=str(cwd / "compiles.log"))
    t0 = time.monotonic()
    out = subprocess.run(
        [*cmd, "report", "--kernel", "user_compile:jit_batch_bug", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=LIMIT_S + 120,
    )
    return out, time.monotonic() - t0


def test_a_kernel_that_compiles_10_s_per_shape_has_its_batch_bug_found_in_3_minutes(tmp_path):
    shutil.copy(HERE / "user_compile.py", tmp_path / "user_compile.py")
    out, secs = _report(tmp_path, compile_s=10)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert secs <= LIMIT_S, f"took {secs:.0f} s\n{text}"
    assert "compile keys dtype, nq, nk, d, causal" in text
    assert "compiling user_compile:jit_batch_bug" in text  # the progress line says so
    for dt in ("fp16", "bf16", "fp32"):
        assert f"FAIL-HARD: user_compile:jit_batch_bug {dt}" in text, text
    # Every key compiled once: 7 probe shapes, then 4 palette keys per dtype, each on one
    # worker (the structural checks' variants may add a few).
    lines = (tmp_path / "compiles.log").read_text().splitlines()
    keys = Counter(line.split(" ", 1)[1] for line in lines)
    assert max(keys.values()) == 1, keys
    assert len(keys) <= 7 + 3 * 4 + 3, keys


def test_flashcheck_test_on_it_exits_1_in_5_minutes_under_a_budget(tmp_path):
    """`flashcheck test --dtype fp16 --budget 90s` (CI time: the whole suite on all three
    dtypes with a 3-minute budget exits 1 in about 3.3 minutes, benchmarks/RESULTS.md): the
    probe and each property say what they are doing from the first seconds; batch/head
    independence runs first and fails; what the budget left out is skipped with that reason,
    and the run says so."""
    shutil.copy(HERE / "user_compile.py", tmp_path / "user_compile.py")
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    env["USER_COMPILE_SECONDS"] = "10"
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [*cmd, "test", "user_compile:jit_batch_bug", "--dtype", "fp16", "--budget", "90s"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first = proc.stdout.readline()
    first_s = time.monotonic() - t0
    rest, _ = proc.communicate(timeout=420)
    secs = time.monotonic() - t0
    text = first + rest
    assert first.startswith("flashcheck: probing the contract of user_compile:jit_batch_bug")
    assert first_s <= 5, f"the first line came after {first_s:.1f} s"
    assert proc.returncode == 1, text
    assert secs <= 300, f"took {secs:.0f} s\n{text}"
    assert "test_batch_and_head_independence[user_compile:jit_batch_bug-fp16] FAILED" in text
    assert "compiling user_compile:jit_batch_bug for dtype=fp16" in text, text
    assert "were not started, each skipped with that reason" in text


def test_palette_sets_the_keys_per_dtype_and_the_configuration_records_it(tmp_path):
    shutil.copy(HERE / "user_compile.py", tmp_path / "user_compile.py")
    args = ["--preset", "smoke", "--dtype", "fp16", "--palette", "2", "--no-render"]
    out, _ = _report(tmp_path, *args, compile_s=1)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    lines = (tmp_path / "compiles.log").read_text().splitlines()
    pids = Counter(line.split(" ", 1)[0] for line in lines)
    # the probe's 7 shapes and its worker's palette keys; the other worker: its palette keys
    # (a causal key's options check adds its non-causal variant)
    assert len(lines) <= 7 + 2 + 1, lines
    assert len(pids) <= 2
    results = next((tmp_path / "reports").glob("*/results.jsonl"))
    header = json.loads(results.read_text().splitlines()[0])
    assert header["config"]["palette"] == 2 and "--palette 2" in header["command"]
