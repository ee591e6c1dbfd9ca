"""Running the installed ``flashcheck`` command as a user would, for the tests."""

import os
import subprocess
import sys
from pathlib import Path


def run_flashcheck(args, cwd, timeout=400):
    """``flashcheck ARGS`` in ``cwd`` with no FLASHCHECK_* variables of the test run."""
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    return subprocess.run(
        [*cmd, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
