"""The ``flashcheck report``, ``render`` and ``kernels`` subcommands: run an accuracy campaign,
re-render its report, list the kernels."""

from __future__ import annotations

import argparse
import sys
import time

from ..judging.classes import WIDE_CLASSES
from .args import duration, positive, positive_float

__all__ = ["add_campaign_commands"]


def _cmd_report(args: argparse.Namespace) -> int:
    from ..campaign.budget import process_age
    from ..campaign.report import ReportOptions, run_report
    from ..campaign.selection import ragged_run
    from ..core.resultlog import ResultLogError

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
        nan_inputs=args.nan_inputs,
        workers=args.workers,
        kernel_workers=args.kernel_workers,
        executor=args.executor,
        address=args.address,
        parts=tuple(args.part or ()),
        palette=args.palette,
        budget=args.budget,
        # A budget on the command line counts from the process's start (imports too).
        started=time.monotonic() - process_age() if args.entry else None,
        profile_phases=args.profile_phases,
    )
    try:
        if ragged_run(opts.kernels):
            from ..campaign.ragged_report import run_ragged_report

            return run_ragged_report(opts)
        from ..campaign.fp8_report import fp8_run, run_fp8_report

        if fp8_run(opts.kernels):
            return run_fp8_report(opts)
        return run_report(opts)
    except (ValueError, ResultLogError) as err:
        print(f"flashcheck report: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # where no campaign step said more (FP8 campaign, rendering)
        print(
            "\ninterrupted: the results so far are safe in the report's results.jsonl; run the "
            "same command again to resume and render the report",
            file=sys.stderr,
        )
        return 130


def _cmd_render(args: argparse.Namespace) -> int:
    from ..campaign.figures import figures_unavailable
    from ..campaign.render import render_report
    from ..core.resultlog import ResultLogError

    try:
        path = render_report(args.results, args.out, figures=not args.no_figures)
    except (OSError, ResultLogError) as err:
        print(f"flashcheck render: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    if not args.no_figures and (why := figures_unavailable()) is not None:
        print(f"  (figures left out: {why})")
    return 0


def _contracts(specs: list[str], timeout: float) -> int:
    """Each kernel's contract, probed where not declared (``flashcheck kernels SPEC ...``), in
    a worker process with a time limit, as ``flashcheck test`` and ``report`` probe it: a
    kernel that killed its process on a probe input ended this command silently, exit 3."""
    from functools import partial

    from ..adapters.call_limit import CallLimit, KernelHung, limit_calls
    from ..adapters.probe import default_probe_device, resolved
    from ..adapters.registry import resolve
    from ..adapters.worker import KernelRef, KernelWorker

    status = 0
    with KernelWorker(timeout=timeout) as worker:
        for spec in specs:
            try:
                kern = resolve(spec)
            except ValueError as err:
                print(f"flashcheck kernels: error: {err}", file=sys.stderr)
                status = 2
                continue
            device = default_probe_device(kern)
            if kern.pending:
                print(f"probing the contract of {spec} on {device} ...", flush=True)
            runner = partial(worker.run, KernelRef.of(kern, spec), device=device)
            try:
                # (a kernel of a ragged layout is probed in this process: under the same limit)
                with limit_calls(CallLimit(timeout)):
                    kern = resolved(kern, device, runner)
            except KernelHung as err:
                print(f"flashcheck kernels: error: {spec}: {err}", file=sys.stderr)
                status = 2
                continue
            print(f"{spec}:")
            for line in kern.contract_lines():
                print(f"  {line}")
    return status


def _cmd_kernels(args: argparse.Namespace) -> int:
    from ..adapters.registry import builtin_kernels, entry_point_kernels, resolve

    if args.specs:
        return _contracts(args.specs, args.timeout)
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
        if a.op == "combine" or a.layout != "dense":
            name += " (split-KV merge)" if a.op == "combine" else f" ({a.layout} layout)"
        print(
            f"| {name} | {a.arithmetic} | {', '.join(a.dtypes)} | {', '.join(a.devices)} "
            f"| {', '.join(sorted(a.masks)) or 'none'} | {'; '.join(here)} |"
        )
    return 0


def add_campaign_commands(sub) -> None:
    """Add ``report``, ``render`` and ``kernels`` to the subparsers ``sub``."""
    p = _add_report(sub)
    _add_run_options(p)
    _add_execution_options(p)
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
        help="list the kernels flashcheck knows and whether each can run here, or the "
        "contract of the kernels named",
        description="Built-in kernels, library adapters and entry points of group "
        "flashcheck.kernels, with their arithmetic class, dtypes, devices and masks. With "
        "kernel specs (a built-in name or package.module:function), each one's contract: "
        "what it declares, and what a probe on tiny inputs finds for the rest.",
    )
    k.add_argument("specs", nargs="*", metavar="KERNEL", help="kernels whose contract to show")
    k.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds a probe call may take (300)"
    )
    k.set_defaults(func=_cmd_kernels)


def _add_report(sub) -> argparse.ArgumentParser:
    """The ``report`` parser with what chooses the campaign: name, preset, seed, kernels,
    dtypes, device."""
    from ..campaign.runner import PRESETS

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
    return p


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Where results go, time limits, resuming, rendering and the gate."""
    from ..campaign.gates import GATES

    p.add_argument("--out", default="reports", help="parent directory (default reports)")
    p.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        help="seconds one kernel call may take before it is killed and recorded "
        "as TIMEOUT (default 300)",
    )
    p.add_argument(
        "--no-isolate",
        action="store_true",
        help="run kernels in this process (no timeout; for debugging); for ragged kernels, "
        "the references too",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="discard existing results of this name instead of resuming",
    )
    p.add_argument("--no-render", action="store_true", help="run the campaign only")
    p.add_argument(
        "--profile-phases",
        action="store_true",
        help="time the run's phases (start-up, worker start, probing, reference work, kernel "
        "work, case files, rendering), append the timeline to results.jsonl and print its "
        "table last, with the serial share: the time no kernel worker was busy",
    )
    p.add_argument(
        "--fail-on",
        choices=list(GATES),
        default="fail-hard",
        help="what makes the exit status 1 (default fail-hard: FAIL-HARD, wrong-shape "
        "outputs, a kernel that raised or hung inside its contract, a failed "
        "structural property, a kernel that could not run at all; fail adds FAIL; "
        "never)",
    )


def _add_execution_options(p: argparse.ArgumentParser) -> None:
    """Arithmetic class, workers, executor, streaks and parts."""
    from ..campaign.plan import PARTS

    p.add_argument(
        "--arithmetic",
        choices=WIDE_CLASSES,
        help="declare the arithmetic class of the --kernel functions that do not "
        "declare one, so that class's error bounds apply (default: unknown, the "
        "loosest bound of every class)",
    )
    p.add_argument(
        "--nan-inputs",
        choices=("propagate", "any"),
        help="declare the NaN policy of the --kernel functions: 'any' accepts finite outputs "
        "where a NaN input is involved (e.g. nan_to_num on the probabilities) as a convention, "
        "not a failure (default: what each kernel declares, else propagate)",
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=None,
        metavar="N",
        help="processes for the oracle, bounds and baselines (default: one per "
        "core); results do not depend on it",
    )
    p.add_argument(
        "--kernel-workers",
        type=positive,
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
        type=positive,
        default=5,
        metavar="N",
        help="stop a kernel for a dtype after N identical failures in a row "
        "(raised, hung or bad output; default 5)",
    )
    p.add_argument(
        "--budget",
        type=duration,
        default=None,
        metavar="DURATION",
        help="stop cleanly after this long (e.g. 3m, 90s, 1h) with a report that says what "
        "it covered; the work that finds bugs runs first (every input family and structural "
        "property once, batches of several sequences early, then breadth). The same command "
        "without --budget resumes it to the end",
    )
    p.add_argument(
        "--palette",
        type=positive,
        default=4,
        metavar="N",
        help="compile keys per dtype for kernels that compile per shape (found by the probe "
        "or declared with compile_keys=): their lengths, head dims and causal flag come from "
        "N combinations; no effect on other kernels (default 4)",
    )
    p.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        metavar="PART",
        help=f"run only this part of the campaign; repeat for several (default: "
        f"all: {', '.join(PARTS)})",
    )
