"""The ``flashcheck`` command line: env, formats, kernels, report, render, replay, iomodel."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from ..core.environment import __version__, environment
from ..core.formats import FORMATS
from ..core.status import Status
from .args import positive, positive_float
from .bench import add_bench
from .campaign import add_campaign_commands
from .test import add_test


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
    from ..adapters.call_limit import CallLimit, KernelHung, limit_calls
    from ..cases.store import CaseFileError
    from ..checks.replay import replay

    try:
        with limit_calls(CallLimit(args.timeout)):
            _, verdict, _ = replay(
                args.case, directory=args.dir, device=args.device, kernel=args.kernel
            )
    except (CaseFileError, RuntimeError, ValueError) as err:
        print(f"flashcheck replay: error: {err}", file=sys.stderr)
        return 2
    except KernelHung as err:  # in a property replayed after the accuracy check
        print(f"{Status.TIMEOUT}: {err}")
        return 1
    return 0 if verdict == Status.PASS else 1


def _cmd_iomodel(args: argparse.Namespace) -> int:
    from ..iomodel import (
        BlockTooLarge,
        GPUSpec,
        Profiler,
        flash_attention,
        flash_bytes,
        standard_attention,
    )

    presets = {
        "v100": GPUSpec.sim_v100,
        "a100": GPUSpec.sim_a100,
        "h100": GPUSpec.sim_h100,
        "h100-real": GPUSpec.h100_sxm,
        "h200-real": GPUSpec.h200,
    }
    spec = presets[args.gpu]()
    n, d, block = args.n, args.d, args.block
    flash = {}
    for schedule, title in (("fa1", "K/V blocks outer (FA1)"), ("fa2", "Q blocks outer (FA2)")):
        flash[schedule] = Profiler(spec, f"flash attention, {title}, N={n} d={d} B={block}")
        try:
            flash_attention(flash[schedule], n, d, block_size=block, schedule=schedule)
        except BlockTooLarge as err:
            fix = f" (--block {err.largest})" if err.largest else ""
            print(f"flashcheck iomodel: error: {err}{fix}", file=sys.stderr)
            return 2
    std = Profiler(spec, f"standard attention N={n} d={d}")
    standard_attention(std, n, d)
    fa1, fa2 = flash["fa1"], flash["fa2"]
    print(std.report(), "", fa1.report(), "", fa2.report(), "", sep="\n")
    print("| metric | standard | flash FA1 | saving | flash FA2 | saving |")
    print("|---|---|---|---|---|---|")
    for label, get in (
        ("HBM traffic (floats)", lambda p: p.hbm_traffic),
        ("peak HBM (floats)", lambda p: p.peak_hbm_usage),
        ("compute cycles", lambda p: p.cycles_compute),
        ("total cycles", lambda p: p.total_cycles),
    ):
        cells = [f"{get(std):,.0f}"]
        for p in (fa1, fa2):
            saving = round(100 * (1 - get(p) / get(std)), 1) + 0.0  # + 0.0: no "-0.0%"
            cells += [f"{get(p):,.0f}", f"{saving:.1f}%"]
        print(f"| {label} | {' | '.join(cells)} |")
    t = -(-n // min(block, n))
    fa1_count = flash_bytes(n, d, block=block, schedule="fa1", bytes_per_element=1)
    fa2_count = flash_bytes(n, d, block=block, schedule="fa2", bytes_per_element=1)
    print(
        f"\nWith T = ⌈N/B⌉ = {t} block{'s' if t > 1 else ''} of B rows:\n"
        "- FA1 reads K and V once, but every O block is updated once per K/V block and all\n"
        "  of O cannot stay in SRAM: O and its running row max and sum go to HBM and back\n"
        f"  between K/V blocks, N·d·(1 + 3T) + 4N·(T − 1) = {fa1_count:,.0f} floats.\n"
        "- FA2 keeps each O block in SRAM for its whole K/V loop and writes it once, but\n"
        f"  reads K and V once per query block, N·d·(2 + 2T) = {fa2_count:,.0f} floats."
    )
    return 0


# Options whose value a user may write with a sign: argparse takes "-5s" for an option of its
# own and says "expected one argument", where the option's own check says what is wrong.
_SIGNED = ("--budget", "--timeout")


def _signed_values(argv: list[str]) -> list[str]:
    """``argv`` with ``--budget -5s`` written ``--budget=-5s`` (up to a ``--``: what follows
    it goes to pytest as it is)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return out + argv[i:]
        nxt = argv[i + 1] if i + 1 < len(argv) else ""
        if a in _SIGNED and nxt[:1] == "-" and nxt[1:2].isdigit():
            out.append(f"{a}={nxt}")
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    import signal

    # `flashcheck replay <id> | head`: end quietly when the reader goes away, as Unix tools do.
    if hasattr(signal, "SIGPIPE") and argv is None:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if argv is None:
        # SIGTERM (`timeout`, `kill`, a batch scheduler) ended the process at once and left
        # its worker processes running, orphaned: it now stops the run as Ctrl-C does.
        signal.signal(signal.SIGTERM, _on_sigterm)
    if argv is None and hasattr(sys.stdout, "reconfigure"):
        # Into a pipe (`| tee run.log`, a CI log, a scheduler) Python buffers stdout by the
        # block: "probing the contract ..." and each kernel's summary would arrive minutes
        # late, or at the exit. Each line goes out as it is printed.
        sys.stdout.reconfigure(line_buffering=True)
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
        "Exit status: 0 PASS, 1 FAIL, FAIL-HARD, BAD-OUTPUT, ERROR (the kernel raised) or "
        "TIMEOUT, 2 the case could not be replayed.",
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
    p_rep.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        help="seconds a kernel call may take before it is stopped and the replay reports "
        "TIMEOUT (default 300)",
    )
    p_rep.set_defaults(func=_cmd_replay)
    p_io = sub.add_parser(
        "iomodel",
        help="standard vs flash attention in a memory-hierarchy simulator",
        description="Trace one head of standard attention and of flash attention's two loop "
        "orders (FlashAttention-1: K/V blocks outer; FlashAttention-2: query blocks outer) "
        "through the simulated GPU (additive HBM + compute cycle model, docs/iomodel.md) and "
        "print the reports and the savings.",
    )
    p_io.add_argument(
        "--gpu",
        choices=("v100", "a100", "h100", "h100-real", "h200-real"),
        default="a100",
        help="a simulated preset (V100, A100, H100 classes), or datasheet figures of a real "
        "part (default a100)",
    )
    p_io.add_argument("-n", type=positive, default=4096, help="sequence length (default 4096)")
    p_io.add_argument("-d", type=positive, default=64, help="head dimension (default 64)")
    p_io.add_argument(
        "--block",
        type=positive,
        default=64,
        help="flash block size B, for query and K/V blocks alike; its tile must fit in the "
        "GPU's SRAM (default 64)",
    )
    p_io.set_defaults(func=_cmd_iomodel)
    add_test(sub)
    add_campaign_commands(sub)
    add_bench(sub)
    args, extra = parser.parse_known_args(_signed_values(sys.argv[1:] if argv is None else argv))
    args.entry = argv is None  # the program's own command line, not a call from Python
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "passthrough", False):
        return args.func(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    code = args.func(args)
    if code == 130 and _TERMINATED:
        code = 128 + signal.SIGTERM  # as the shell reports a process SIGTERM ended
    if code in (130, 128 + signal.SIGTERM) and args.entry:
        # Interrupted, with every result on disk and the user told so. A later SIGINT (the
        # group-wide one of `timeout -s INT`, a second Ctrl-C) would only print a traceback
        # from Python's exit, which joins the process pool's threads (seen in CI).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        # That exit joins the pool's reader thread, which a worker killed in the middle of
        # sending a result leaves waiting for ever (seen on a 2-core machine): past a few
        # seconds, end regardless.
        threading.Thread(target=_exit_soon, args=(code, 5.0), daemon=True).start()
    return code


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as an interrupt: the workers stopped, the results kept."""


_TERMINATED: list[int] = []


def _on_sigterm(signum: int, _frame: object) -> None:
    if not _TERMINATED:  # (a second one, while the run stops, changes nothing)
        _TERMINATED.append(signum)
        raise _Terminated


def _exit_soon(code: int, seconds: float) -> None:
    time.sleep(seconds)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
