"""The ``flashcheck`` command line. Subcommands grow with the project (report, replay, bench)."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys

from harness import __version__
from harness.formats import FORMATS


def environment() -> dict[str, str]:
    """Versions of everything that can change a numerical result, for reports and case files."""
    env = {"flashcheck": __version__, "python": platform.python_version()}
    for mod in ("numpy", "mpmath", "gmpy2", "ml_dtypes", "hypothesis", "torch", "triton"):
        try:
            env[mod] = getattr(importlib.import_module(mod), "__version__", "?")
        except ImportError:
            env[mod] = "not installed"
    import mpmath.libmp

    env["mpmath backend"] = mpmath.libmp.BACKEND
    env["machine"] = f"{platform.system()} {platform.machine()}"
    return env


def _cmd_env(_args: argparse.Namespace) -> int:
    for key, val in environment().items():
        print(f"{key:15s} {val}")
    return 0


def _cmd_formats(_args: argparse.Namespace) -> int:
    print("| format | p | emin | emax | u | max finite | min normal | min subnormal |")
    print("|---|---|---|---|---|---|---|---|")
    for f in FORMATS.values():
        print(
            f"| {f.name} | {f.p} | {f.emin} | {f.emax} | 2^-{f.p} | {f.max_finite:.6g} "
            f"| {f.min_normal:.6g} | {f.min_subnormal:.6g} |"
        )
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from harness.casestore import CaseFileError
    from harness.replay import replay

    try:
        _, verdict, _ = replay(
            args.case, directory=args.dir, device=args.device, kernel=args.kernel
        )
    except (CaseFileError, RuntimeError, ValueError) as err:
        print(f"flashcheck replay: error: {err}", file=sys.stderr)
        return 2
    return 0 if verdict == "PASS" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flashcheck",
        description="Numerics and property-testing harness for softmax attention kernels.",
    )
    parser.add_argument("--version", action="version", version=f"flashcheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p_env = sub.add_parser("env", help="print the versions that can change numerical results")
    p_env.set_defaults(func=_cmd_env)
    p_fmt = sub.add_parser("formats", help="print the floating-point formats as a markdown table")
    p_fmt.set_defaults(func=_cmd_formats)
    p_rep = sub.add_parser(
        "replay",
        help="re-run a saved failing case and print kernel vs oracle side by side",
        description="Re-run a case saved by a failing property (reports/cases/<id>.json + .npz) "
        "and print the kernel's worst elements next to the oracle's, the bounds and the verdict. "
        "Exit status: 0 PASS, 1 FAIL or FAIL-HARD, 2 the case could not be replayed.",
    )
    p_rep.add_argument("case", help="case id (or a path to <id>.json)")
    p_rep.add_argument(
        "--dir",
        default=None,
        help="case directory (default: $FLASHCHECK_CASE_DIR or reports/cases)",
    )
    p_rep.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="device to run on (default: the recorded one if available)",
    )
    p_rep.add_argument(
        "--kernel", default=None, help="run another kernel on the case (name or module:function)"
    )
    p_rep.set_defaults(func=_cmd_replay)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
