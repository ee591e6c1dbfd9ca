"""The ``flashcheck bench`` subcommand: GPU speed and memory of the Triton kernel side by side
with its peers (docs/bench.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["add_bench"]


def _cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.render import render_bench, summary_text
    from ..bench.suite import PARTS, BenchOptions, run_bench
    from ..core.resultlog import ResultLogError

    def chosen(values):
        return tuple(dict.fromkeys(values)) if values else None

    if args.decode:
        return _cmd_decode(args)
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
        kernels=tuple(dict.fromkeys(args.kernel or ())),
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


def _cmd_decode(args: argparse.Namespace) -> int:
    """``--decode``: the paged decode benchmark (its own results folder, default ``decode``)."""
    from ..bench.decode_bench import DecodeOptions, run_decode_bench
    from ..bench.decode_report import render_decode

    name = args.name or "decode"
    if args.kernel:
        print(
            "flashcheck bench: error: --kernel races a dense attention kernel in the forward "
            "benchmark; the paged decode benchmark (--decode) takes --decode-provider only",
            file=sys.stderr,
        )
        return 2
    if args.render_only:
        results = Path(args.out) / name / "results.jsonl"
        if not results.is_file():
            named = f"--name {args.name}" if args.name else "--name NAME (default: decode)"
            print(
                f"flashcheck bench: error: no decode results at {results}; render a decode "
                f"run with --decode --render-only {named}, or run 'flashcheck bench --decode' "
                "on a GPU first",
                file=sys.stderr,
            )
            return 2
        try:
            print(f"decode bench report: {render_decode(results)}")
        except (OSError, ValueError) as err:
            print(f"flashcheck bench: error: {results} cannot be rendered: {err}", file=sys.stderr)
            return 2
        return 0
    providers = tuple(dict.fromkeys(args.decode_provider)) if args.decode_provider else None
    opts = DecodeOptions(name=name, out=args.out, providers=providers, quick=args.quick)
    opts.fresh, opts.render, opts.seed = args.fresh, not args.no_render, args.seed
    try:
        return run_decode_bench(opts)
    except ValueError as err:
        print(f"flashcheck bench: error: {err}", file=sys.stderr)
        return 2


def add_bench(sub) -> None:
    """Add ``bench`` to the subparsers ``sub``."""
    b = sub.add_parser(
        "bench",
        help="GPU benchmark: the Triton kernel vs SDPA backends, FlexAttention and naive",
        description="Forward TFLOP/s of this project's Triton kernel, torch SDPA's flash, "
        "cuDNN, efficient and math backends, compiled FlexAttention and naive attention, side "
        "by side on the same inputs (grid: N 1K-32K, d 64/128/256, fp16/bf16, causal and not, "
        "B*N = 16384, H*d = 2048); a model-width sweep; peak memory and wall-clock vs N; fp32 "
        "with IEEE and tf32 dots. --kernel races your own kernel beside them. --pass bwd "
        "times the backward (fwd+bwd: both) with "
        "backward FLOPs 2.5x (3.5x) the forward's. Every output (every gradient) is checked "
        "against the mpmath oracle on sampled rows (and keys); a wrong output does not score. "
        "Writes reports/bench/<gpu>/results.jsonl "
        "(resumable), bench.md, bench.json and figures. Needs a CUDA GPU. Exit status: 0 done, "
        "2 usage error or no GPU, 130 interrupted (run again to resume).",
    )
    b.add_argument("--name", help="report name: <out>/<name>/ (default: the GPU model, e.g. h100)")
    b.add_argument("--out", default="reports/bench", help="parent directory (default %(default)s)")
    _add_selection(b)
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
    b.add_argument(
        "--decode",
        action="store_true",
        help="the paged decode benchmark instead: latency and K/V bandwidth of "
        "triton-decode-paged, SDPA and FlexAttention's paged attention (docs/bench.md)",
    )
    b.add_argument(
        "--decode-provider",
        action="append",
        choices=("triton-decode-paged", "sdpa", "flex-paged"),
        help="with --decode: run only this provider; repeat for several",
    )
    b.set_defaults(func=_cmd_bench)


def _add_selection(b: argparse.ArgumentParser) -> None:
    """What runs: parts, providers, passes, shapes, and the backward's oracle limit."""
    from ..bench.grad_check import ORACLE_MAX_N
    from ..bench.providers import PROVIDERS
    from ..bench.suite import PARTS, PASSES

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
        "--kernel",
        action="append",
        metavar="MODULE:FUNCTION",
        help="race your kernel beside the providers: package.module:function (a "
        "flashcheck.kernel(...) or a plain fn(q, k, v, *, causal=...) -> O or (O, LSE)), an "
        "entry point of group flashcheck.kernels or a built-in kernel name (as 'flashcheck "
        "report --kernel'); repeat for several. With --provider, only those run beside it",
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
