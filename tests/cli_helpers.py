"""Running the installed ``flashcheck`` command as a user would, for the tests."""

import os
import subprocess
import sys
from pathlib import Path


def run_flashcheck(args, cwd, timeout=400, *, one_worker=True):
    """``flashcheck ARGS`` in ``cwd`` with no FLASHCHECK_* variables of the test run.

    ``one_worker``: a ``report`` without ``--workers``/``--kernel-workers`` gets one of each.
    Its results do not depend on them (tests/test_report.py runs one and two of each and
    compares the bits), and by default a report starts a reference and a kernel process per core,
    each importing torch: on CI's two cores, with two tests at once, those imports were most of
    a smoke report's CPU time. ``one_worker=False`` runs the command exactly as given (the
    tests that run reports as users do, with their defaults, do not use this helper).
    """
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    args = list(args)
    if one_worker and args[:1] == ["report"]:
        for flag in ("--workers", "--kernel-workers"):
            if flag not in args:
                args += [flag, "1"]
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
