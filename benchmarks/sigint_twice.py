"""Two SIGINTs at a `flashcheck report`: one to the process, then, GAP seconds later, one to
its whole process group (what `timeout -s INT` and an impatient second Ctrl-C do), while
BUSY processes spin on the CPU (a loaded CI machine is where the second signal used to land
in Python's exit and print a traceback). One line per gap: exit status, seconds to exit,
whether the "results are safe" line and a traceback were printed.

    python benchmarks/sigint_twice.py [--flashcheck PATH] [--busy N] GAP ...

Runs in a temporary folder with tests/user/user_kernels.py, after 20 results are on disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def one(flashcheck: str, gap: float) -> str:
    work = Path(tempfile.mkdtemp())
    shutil.copy(HERE / "tests/user/user_kernels.py", work / "user_kernels.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    env.pop("PYTHONUNBUFFERED", None)
    cmd = [flashcheck, "report", "--kernel", "user_kernels:textbook", "--dtype", "fp16"]
    proc = subprocess.Popen(
        [*cmd, "--no-render"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    results = work / "reports/user_kernels-textbook/results.jsonl"
    deadline = time.monotonic() + 120
    while (not results.exists() or results.read_text().count('"result"') < 20) and (
        time.monotonic() < deadline and proc.poll() is None
    ):
        time.sleep(0.2)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(gap)
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    try:
        text, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - t0
    shutil.rmtree(work, ignore_errors=True)
    safe = "yes" if "results are safe" in text else "no"
    trace = "yes" if "Traceback" in text else "no"
    return f"| {gap:.2f} | {proc.returncode} | {took:.2f} | {safe} | {trace} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flashcheck", default=shutil.which("flashcheck") or "flashcheck")
    ap.add_argument("--busy", type=int, default=0, help="CPU-spinning processes alongside")
    ap.add_argument("gaps", type=float, nargs="+")
    args = ap.parse_args()
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print("| gap (s) | exit status | exit after first SIGINT (s) | results line | traceback |")
        print("|---|---|---|---|---|")
        for gap in args.gaps:
            print(one(args.flashcheck, gap), flush=True)
    finally:
        for p in spin:
            p.kill()


if __name__ == "__main__":
    main()
