"""The ``flashcheck test`` subcommand: the property suite on a kernel (pytest with flashcheck's
plugin)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ..judging.classes import WIDE_CLASSES
from .args import duration, positive, positive_float

__all__ = ["add_test"]


def _cmd_test(args: argparse.Namespace, extra: list[str]) -> int:
    # Said before anything heavy is imported: the kernel's module (torch with it), then the
    # suite's own pytest process, take seconds to start, more on a loaded machine.
    what = "the built-in kernels" if args.spec == "builtin" else args.spec
    print(f"flashcheck test: loading {what} and starting the property suite ...", flush=True)
    import contextlib
    import importlib.resources
    import os
    import subprocess
    import tempfile

    import pytest

    from ..adapters.fp8_contract import suite_refusal
    from ..adapters.registry import resolve

    if args.spec != "builtin":
        try:
            kern = resolve(args.spec)
        except ValueError as err:
            print(f"flashcheck test: error: {err}", file=sys.stderr)
            return 2
        if (why := suite_refusal(args.spec, kern)) is not None:
            print(f"flashcheck test: error: {why}", file=sys.stderr)
            return 2
    suite = importlib.resources.files("flashcheck.properties")
    argv = [
        "--pyargs",
        "flashcheck.properties",
        "-c",
        str(suite / "suite.ini"),
        "--rootdir",
        str(Path.cwd()),
        "--flashcheck-profile",
        args.profile,
        "--flashcheck-kernel",
        args.spec,
    ]
    for dt in args.dtype or ():
        argv += ["--flashcheck-dtype", dt]
    if args.device:
        argv += ["--flashcheck-device", args.device]
    if args.nan_inputs:
        argv += ["--flashcheck-nan-inputs", args.nan_inputs]
    if args.arithmetic:
        argv += ["--flashcheck-arithmetic", args.arithmetic]
    if args.palette is not None:
        argv += ["--flashcheck-palette", str(args.palette)]
    if args.budget is not None:
        argv += ["--flashcheck-budget", str(args.budget)]
    if args.timeout is not None:
        argv += ["--flashcheck-timeout", str(args.timeout)]
    extra = extra[1:] if extra[:1] == ["--"] else extra
    if not any(re.fullmatch(r"-[qv]+|--quiet|--verbose", x) for x in extra):
        argv.append("-v")  # each property named as it starts, its outcome when it ends
    argv += extra
    # A fresh interpreter: pytest then imports flashcheck itself, as a plugin it may rewrite
    # (from inside this process it would warn that the package is already imported).
    with tempfile.TemporaryDirectory(prefix="flashcheck-test-") as tmp:
        mark = Path(tmp) / "session"
        env = dict(os.environ, FLASHCHECK_SESSION_FILE=str(mark))
        if args.profile == "ci" and "HYPOTHESIS_STORAGE_DIRECTORY" not in env:
            # The ci profile keeps no example database: nothing of Hypothesis' belongs in the
            # user's folder (it would leave .hypothesis/ behind there).
            env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(Path(tmp) / "hypothesis")
        child = subprocess.Popen([sys.executable, "-m", "pytest", *argv], env=env)
        try:
            code = child.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached pytest too: let it print what it has, then say where it stopped.
            with contextlib.suppress(KeyboardInterrupt):
                child.wait()
            last = mark.read_text() if mark.exists() else ""
            where = f" in {last}" if last and last != "finished" else ""
            print(
                f"\nflashcheck test: interrupted{where}. The tests above it finished; failing "
                "cases found so far are saved (reports/cases/, each with its replay command). "
                "Run the same command again to start over (the ci profile draws the same "
                "examples), or add -k NAME to run one property.",
                file=sys.stderr,
            )
            return 130
        last = mark.read_text() if mark.exists() else ""
    # ("hung": a kernel call the time limit could not stop ended the run; it said so itself)
    if last not in ("finished", "hung") and code not in (0, pytest.ExitCode.USAGE_ERROR):
        where = f"in {last}" if last else "before the first test"
        print(
            f"\nflashcheck test: the test process ended abruptly {where} (exit status {code}): "
            "the kernel probably killed it (a crash, os._exit). 'flashcheck report --kernel "
            f"{args.spec}' runs the kernel in an isolated process and records such crashes "
            "with their inputs.",
            file=sys.stderr,
        )
    # pytest's own codes, except a usage error, which is 2 here as in every flashcheck command.
    return 2 if code == pytest.ExitCode.USAGE_ERROR else code


def add_test(sub) -> None:
    """Add ``test`` to the subparsers ``sub``."""
    t = sub.add_parser(
        "test",
        help="run the property suite on a kernel (pytest with flashcheck's plugin)",
        usage="flashcheck test SPEC [--profile P] [--dtype D] [--device D] [pytest options]",
        description="Run flashcheck's Hypothesis property suite against SPEC: accuracy against "
        "the mpmath oracle with a-priori error bounds and the empirical rule, batch/head "
        "independence, padded buffers, determinism, key permutation, the NaN rule, the "
        "integrity of inputs and returned results, and the pinned regression cases; on a "
        "varlen, paged or split-KV merge kernel, accuracy and gradients per sequence, "
        "sequence and page independence and batch invariance instead; every "
        "input drawn inside the kernel's contract (declared "
        "with flashcheck.kernel(...), or probed). SPEC is a built-in name, 'builtin' (the "
        "project's own kernels), an entry point of group flashcheck.kernels, or "
        "package.module:function (the current directory is searched first). Options it does "
        "not know go to pytest (e.g. -x, -k accuracy, --hypothesis-seed=N). A failing case is "
        "saved to reports/cases/ and printed with its 'flashcheck replay' command. Exit "
        "status: pytest's (0 all passed, 1 a test failed, 5 nothing ran), 2 usage error.",
    )
    t.add_argument("spec", metavar="SPEC", help="the kernel to test (first, before pytest options)")
    t.add_argument(
        "--profile",
        choices=("ci", "dev", "thorough", "sweep"),
        default="ci",
        help="Hypothesis profile: ci (default; the same examples every run, 40 per "
        "accuracy property), dev (random examples), thorough (1000), sweep "
        "(10000)",
    )
    t.add_argument(
        "--dtype",
        action="append",
        choices=("fp16", "bf16", "fp32"),
        help="only this input format; repeat for several (default: the kernel's)",
    )
    t.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="device (default: cuda if available and the kernel runs there)",
    )
    t.add_argument(
        "--budget",
        type=duration,
        default=None,
        metavar="DURATION",
        help="a time budget (e.g. 5m, 90s): batch/head independence and the other structural "
        "properties first, then accuracy and gradients; properties not started when it is "
        "spent are skipped, and the run says so",
    )
    t.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="seconds one kernel call may take: past it the call is stopped, its property "
        "fails with TIMEOUT and the case is saved (default 300)",
    )
    t.add_argument(
        "--nan-inputs",
        choices=("propagate", "any"),
        help="NaN policy of a kernel declaring none: 'any' accepts finite outputs where a NaN "
        "input is involved as a convention (default: propagate)",
    )
    t.add_argument(
        "--arithmetic",
        choices=WIDE_CLASSES,
        help="arithmetic class of a kernel declaring none, so that its error bounds apply "
        "(default: unknown, held to the input format's precision)",
    )
    t.add_argument(
        "--palette",
        type=positive,
        default=None,
        metavar="N",
        help="compile keys per dtype for a kernel that compiles per shape (found by the probe "
        "or declared with compile_keys=): its lengths, head dims and causal flag come from N "
        "combinations (default 4)",
    )
    t.set_defaults(func=_cmd_test, passthrough=True)
