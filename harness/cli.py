"""The ``flashcheck`` command line: env, formats, kernels, report, render, replay, iomodel."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .core.environment import __version__, environment
from .core.formats import FORMATS


def _positive(text: str) -> int:
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if val < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {val}")
    return val


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
    from .cases.store import CaseFileError
    from .checks.replay import replay

    try:
        _, verdict, _ = replay(
            args.case, directory=args.dir, device=args.device, kernel=args.kernel
        )
    except (CaseFileError, RuntimeError, ValueError) as err:
        print(f"flashcheck replay: error: {err}", file=sys.stderr)
        return 2
    return 0 if verdict == "PASS" else 1


def _cmd_iomodel(args: argparse.Namespace) -> int:
    from .iomodel import GPUSpec, Profiler, flash_attention, standard_attention

    presets = {
        "v100": GPUSpec.sim_v100,
        "a100": GPUSpec.sim_a100,
        "h100": GPUSpec.sim_h100,
        "h100-real": GPUSpec.h100_sxm,
        "h200-real": GPUSpec.h200,
    }
    spec = presets[args.gpu]()
    std = Profiler(spec, f"standard attention N={args.n} d={args.d}")
    standard_attention(std, args.n, args.d)
    fl = Profiler(spec, f"flash attention N={args.n} d={args.d} B={args.block}")
    flash_attention(fl, args.n, args.d, block_size=args.block)
    print(std.report(), "", fl.report(), "", sep="\n")
    print("| metric | standard | flash | saving |\n|---|---|---|---|")
    for label, a, b in (
        ("HBM traffic (floats)", std.hbm_traffic, fl.hbm_traffic),
        ("peak HBM (floats)", std.peak_hbm_usage, fl.peak_hbm_usage),
        ("compute cycles", std.cycles_compute, fl.cycles_compute),
        ("total cycles", std.total_cycles, fl.total_cycles),
    ):
        saving = round(100 * (1 - b / a), 1) + 0.0  # + 0.0: no "-0.0%" for equal values
        print(f"| {label} | {a:,.0f} | {b:,.0f} | {saving:.1f}% |")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .campaign.report import ReportOptions, run_report
    from .core.resultlog import ResultLogError

    opts = ReportOptions(
        name=args.name,
        preset=args.preset,
        seed=args.seed,
        kernels=tuple(args.kernel or ()),
        dtypes=tuple(args.dtype or ("fp16", "bf16", "fp32")),
        device=args.device,
        out=args.out,
        timeout=args.timeout,
        isolate=not args.no_isolate,
        fresh=args.fresh,
        render=not args.no_render,
        fail_on=args.fail_on,
        streak=args.stop_after,
        arithmetic=args.arithmetic,
        workers=args.workers,
        kernel_workers=args.kernel_workers,
        executor=args.executor,
        address=args.address,
        parts=tuple(args.part or ()),
    )
    try:
        return run_report(opts)
    except (ValueError, ResultLogError) as err:
        print(f"flashcheck report: error: {err}", file=sys.stderr)
        return 2


def _cmd_render(args: argparse.Namespace) -> int:
    from .campaign.render import render_report
    from .core.resultlog import ResultLogError

    try:
        path = render_report(args.results, args.out, figures=not args.no_figures)
    except (OSError, ResultLogError) as err:
        print(f"flashcheck render: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.render import render_bench, summary_text
    from .bench.suite import PARTS, BenchOptions, run_bench
    from .core.resultlog import ResultLogError

    def chosen(values):
        return tuple(dict.fromkeys(values)) if values else None

    if args.render_only:
        if not args.name:
            print(
                "flashcheck bench: error: --render-only needs --name (the directory under "
                f"{args.out})",
                file=sys.stderr,
            )
            return 2
        results = Path(args.out) / args.name / "results.jsonl"
        if not results.is_file():
            print(
                f"flashcheck bench: error: no results at {results}; run 'flashcheck bench "
                f"--name {args.name}' on a GPU first",
                file=sys.stderr,
            )
            return 2
        try:
            md = render_bench(results, figures=not args.no_figures)
        except (OSError, ResultLogError, KeyError) as err:
            print(f"flashcheck bench: error: {results} cannot be rendered: {err}", file=sys.stderr)
            return 2
        print(f"bench report: {md}")
        print(summary_text(results))
        return 0
    opts = BenchOptions(
        name=args.name,
        out=args.out,
        parts=tuple(dict.fromkeys(args.part or PARTS)),
        providers=tuple(dict.fromkeys(args.provider)) if args.provider else None,
        quick=args.quick,
        fresh=args.fresh,
        render=not args.no_render,
        seed=args.seed,
        passes=chosen(args.pass_) or ("fwd",),
        ns=chosen(args.n),
        head_dims=chosen(args.d),
        dtypes=chosen(args.dtype),
        oracle_max_n=args.grad_oracle_max_n,
    )
    try:
        code = run_bench(opts)
    except (ValueError, ResultLogError) as err:
        print(f"flashcheck bench: error: {err}", file=sys.stderr)
        return 2
    return code


def _add_bench(sub) -> None:
    from .bench.grad_check import ORACLE_MAX_N
    from .bench.providers import PROVIDERS
    from .bench.suite import PARTS, PASSES

    b = sub.add_parser(
        "bench",
        help="GPU benchmark: the Triton kernel vs SDPA backends, FlexAttention and naive",
        description="Forward TFLOP/s of this project's Triton kernel, torch SDPA's flash, "
        "cuDNN, efficient and math backends, compiled FlexAttention and naive attention, side "
        "by side on the same inputs (grid: N 1K-32K, d 64/128/256, fp16/bf16, causal and not, "
        "B*N = 16384, H*d = 2048); a model-width sweep; peak memory and wall-clock vs N; fp32 "
        "with IEEE and tf32 dots. --pass bwd times the backward (fwd+bwd: both) with "
        "backward FLOPs 2.5x (3.5x) the forward's. Every output (every gradient) is checked "
        "against the mpmath oracle on sampled rows (and keys); a wrong output does not score. "
        "Writes reports/bench/<gpu>/results.jsonl "
        "(resumable), bench.md, bench.json and figures. Needs a CUDA GPU. Exit status: 0 done, "
        "2 usage error or no GPU, 130 interrupted (run again to resume).",
    )
    b.add_argument("--name", help="report name: <out>/<name>/ (default: the GPU model, e.g. h100)")
    b.add_argument("--out", default="reports/bench", help="parent directory (default %(default)s)")
    b.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="run only this part; repeat for several (default: all)",
    )
    b.add_argument(
        "--provider",
        action="append",
        choices=list(PROVIDERS),
        help="run only this provider; repeat for several (default: all)",
    )
    b.add_argument(
        "--pass",
        dest="pass_",
        action="append",
        choices=PASSES,
        help="what is timed: fwd (default), bwd (the backward alone, on a retained "
        "graph) or fwd+bwd; repeat for several",
    )
    b.add_argument(
        "--n",
        action="append",
        type=int,
        metavar="N",
        help="only shapes with this sequence length; repeat for several",
    )
    b.add_argument(
        "--d",
        action="append",
        type=int,
        metavar="D",
        help="only shapes with this head dim; repeat for several",
    )
    b.add_argument(
        "--dtype",
        action="append",
        choices=("bf16", "fp16", "fp32"),
        help="only shapes of this dtype; repeat for several",
    )
    b.add_argument(
        "--grad-oracle-max-n",
        type=int,
        default=ORACLE_MAX_N,
        metavar="N",
        help="backward passes: dK/dV checked by the certified oracle up to this N, "
        "above it against a float64 reference (default %(default)s)",
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="a small grid (N 1K and 4K, d 64 and 128, bf16): a smoke test",
    )
    b.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    b.add_argument(
        "--fresh",
        action="store_true",
        help="discard existing results of this name instead of resuming",
    )
    b.add_argument("--no-render", action="store_true", help="measure only")
    b.add_argument(
        "--render-only",
        action="store_true",
        help="re-render bench.md, bench.json, figures from results.jsonl",
    )
    b.add_argument("--no-figures", action="store_true", help="with --render-only: markdown only")
    b.set_defaults(func=_cmd_bench)


def _cmd_test(args: argparse.Namespace, extra: list[str]) -> int:
    import importlib.resources
    import os
    import subprocess
    import tempfile

    import pytest

    from .adapters.registry import resolve

    if args.spec != "builtin":
        try:
            resolve(args.spec)
        except ValueError as err:
            print(f"flashcheck test: error: {err}", file=sys.stderr)
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
    argv += extra[1:] if extra[:1] == ["--"] else extra
    # A fresh interpreter: pytest then imports flashcheck itself, as a plugin it may rewrite
    # (from inside this process it would warn that the package is already imported).
    with tempfile.TemporaryDirectory(prefix="flashcheck-test-") as tmp:
        mark = Path(tmp) / "session"
        env = dict(os.environ, FLASHCHECK_SESSION_FILE=str(mark))
        try:
            code = subprocess.run([sys.executable, "-m", "pytest", *argv], env=env).returncode
        except KeyboardInterrupt:
            return 130
        last = mark.read_text() if mark.exists() else ""
    if last != "finished" and code not in (0, pytest.ExitCode.USAGE_ERROR):
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


def _add_test(sub) -> None:
    t = sub.add_parser(
        "test",
        help="run the property suite on a kernel (pytest with flashcheck's plugin)",
        usage="flashcheck test SPEC [--profile P] [--dtype D] [--device D] [pytest options]",
        description="Run flashcheck's Hypothesis property suite against SPEC: accuracy against "
        "the mpmath oracle with a-priori error bounds and the empirical rule, batch/head "
        "independence, padded buffers, determinism, key permutation, the NaN rule and the "
        "pinned regression cases, every input drawn inside the kernel's contract (declared "
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
    t.set_defaults(func=_cmd_test, passthrough=True)


def _cmd_kernels(args: argparse.Namespace) -> int:
    from .adapters.registry import builtin_kernels, entry_point_kernels, resolve

    table = dict(builtin_kernels())
    for name in entry_point_kernels():
        try:
            table[name] = resolve(name)
        except ValueError as err:
            print(f"{name}: {err}", file=sys.stderr)
    print("| kernel | arithmetic | dtypes | devices | masks | here |")
    print("|---|---|---|---|---|---|")
    for name, a in table.items():
        here = []
        for dev in a.devices:
            for dt in a.dtypes:
                why = a.unavailable(dt, dev)
                here.append(f"{dt}/{dev}: " + ("yes" if why is None else f"no ({why})"))
        print(
            f"| {name} | {a.arithmetic} | {', '.join(a.dtypes)} | {', '.join(a.devices)} "
            f"| {', '.join(sorted(a.masks)) or 'none'} | {'; '.join(here)} |"
        )
    return 0


def _positive_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not val > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {val}")
    return val


def _add_report(sub) -> None:
    from .campaign.plan import PARTS
    from .campaign.report import GATES
    from .campaign.runner import PRESETS

    p = sub.add_parser(
        "report",
        help="run an accuracy campaign and write reports/<name>/error-report.md",
        description="Run every kernel on adversarial inputs (kernels x dtypes x input families "
        "x sizes, plus a targeted worst-case search per kernel and dtype), judge each result "
        "against the mpmath oracle and the error bounds, and render a markdown report with "
        "figures. Results are appended to reports/<name>/results.jsonl as they are produced: "
        "an interrupted run resumes where it stopped when the same command is run again. "
        "Exit status: 0 nothing at the --fail-on gate, 1 something was, 2 usage error, "
        "130 interrupted.",
    )
    p.add_argument(
        "--name",
        help="report name: reports/<name>/ (default: made from the --kernel "
        "specs, else cpu or the GPU model)",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="campaign size (default: cpu on a CPU machine, gpu with CUDA); smoke "
        "is a seconds-long sanity run",
    )
    p.add_argument("--seed", type=int, default=0, help="campaign seed (default 0)")
    p.add_argument(
        "--kernel",
        action="append",
        metavar="SPEC",
        help="kernel to test: a built-in name (see 'flashcheck kernels'), an entry "
        "point of group flashcheck.kernels, or package.module:function; repeat for "
        "several (default: every built-in kernel)",
    )
    p.add_argument(
        "--dtype",
        action="append",
        choices=("fp16", "bf16", "fp32"),
        help="input format; repeat for several (default: all three)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="device for the kernels that support it (default: cuda if available)",
    )
    p.add_argument("--out", default="reports", help="parent directory (default reports)")
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=300.0,
        help="seconds one kernel call may take before it is killed and recorded "
        "as TIMEOUT (default 300)",
    )
    p.add_argument(
        "--no-isolate",
        action="store_true",
        help="run kernels in this process (no timeout; for debugging)",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="discard existing results of this name instead of resuming",
    )
    p.add_argument("--no-render", action="store_true", help="run the campaign only")
    p.add_argument(
        "--fail-on",
        choices=list(GATES),
        default="fail-hard",
        help="what makes the exit status 1 (default fail-hard: FAIL-HARD, wrong-shape "
        "outputs, a kernel that raised or hung inside its contract, a failed "
        "structural property, a kernel that could not run at all; fail adds FAIL; "
        "never)",
    )
    p.add_argument(
        "--arithmetic",
        choices=("naive", "flash", "flash-fa1", "tf32"),
        help="declare the arithmetic class of the --kernel functions that do not "
        "declare one, so that class's error bounds apply (default: unknown, the "
        "loosest bound of every class)",
    )
    p.add_argument(
        "--workers",
        type=_positive,
        default=None,
        metavar="N",
        help="processes for the oracle, bounds and baselines (default: one per "
        "core); results do not depend on it",
    )
    p.add_argument(
        "--kernel-workers",
        type=_positive,
        default=None,
        metavar="N",
        help="isolated processes running the kernels (default: one per GPU with "
        "--device cuda, else one per core); with more than the GPUs, they share "
        "them",
    )
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="run on this machine (default) or on a Ray cluster (pip install "
        "'flashcheck[ray]'; docs/report.md)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="with --executor ray: the cluster's address (default: a Ray instance "
        "started on this machine)",
    )
    p.add_argument(
        "--stop-after",
        type=_positive,
        default=5,
        metavar="N",
        help="stop a kernel for a dtype after N identical failures in a row "
        "(raised, hung or bad output; default 5)",
    )
    p.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        metavar="PART",
        help=f"run only this part of the campaign; repeat for several (default: "
        f"all: {', '.join(PARTS)})",
    )
    p.set_defaults(func=_cmd_report)
    r = sub.add_parser(
        "render",
        help="re-render an error report from its results.jsonl (runs nothing)",
        description="Write error-report.md and its figures from a results file alone.",
    )
    r.add_argument("results", help="path to a results.jsonl written by 'flashcheck report'")
    r.add_argument("--out", default=None, help="output directory (default: the file's own)")
    r.add_argument("--no-figures", action="store_true", help="markdown only")
    r.set_defaults(func=_cmd_render)
    k = sub.add_parser(
        "kernels",
        help="list the kernels flashcheck knows and whether each can run here",
        description="Built-in kernels, library adapters and entry points of group "
        "flashcheck.kernels, with their arithmetic class, dtypes, devices and masks.",
    )
    k.set_defaults(func=_cmd_kernels)


def main(argv: list[str] | None = None) -> int:
    import signal

    # `flashcheck replay <id> | head`: end quietly when the reader goes away, as Unix tools do.
    if hasattr(signal, "SIGPIPE") and argv is None:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
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
    p_io = sub.add_parser(
        "iomodel",
        help="standard vs flash attention in the seeds' memory-hierarchy simulator",
        description="Trace one head of standard and flash attention through the simulated GPU "
        "of seed 000 (additive HBM + compute cycle model) and print both reports and the savings.",
    )
    p_io.add_argument(
        "--gpu",
        choices=("v100", "a100", "h100", "h100-real", "h200-real"),
        default="a100",
        help="seed 000's simulated preset, or datasheet figures of a real part (default a100)",
    )
    p_io.add_argument("-n", type=_positive, default=4096, help="sequence length (default 4096)")
    p_io.add_argument("-d", type=_positive, default=64, help="head dimension (default 64)")
    p_io.add_argument("--block", type=_positive, default=64, help="flash block size (default 64)")
    p_io.set_defaults(func=_cmd_iomodel)
    _add_test(sub)
    _add_report(sub)
    _add_bench(sub)
    args, extra = parser.parse_known_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "passthrough", False):
        return args.func(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
