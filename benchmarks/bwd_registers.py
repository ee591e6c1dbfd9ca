"""Registers, spills and SASS instructions per score of the Triton backward's two kernels, on a
machine without a GPU: compile ``kernels/triton_flash_bwd.py``'s ``_bwd_dkdv`` and ``_bwd_dq``
for an sm_90 target (bf16, d = 128, N = 4096, H = 16, the tiles ``backward_config`` picks), plain
and soft-capped (accurate and approximate tanh), and print one table.

    python benchmarks/bwd_registers.py [--causal no|yes] [--n 4096] [--tma] [--maxnreg R]
        [--timeline dkdv|dq]

Per score: the key loop's (dQ kernel) or row loop's (dK/dV kernel) instructions over the
``BLOCK_M·BLOCK_N/(32·warps)`` scores a thread holds per step (the mask-free loop, the
first innermost loop in the listing). Registers and spills from the bundled
``cuobjdump -res-usage``, shared memory from the compiled kernel's metadata. Needs Triton
3.6 or later (ASTSource with attrs) and its bundled
tools. ``--timeline dkdv|dq`` prints that kernel's loop as products, waits and what lies
between them, plain and capped.
``--tma`` compiles the loops' loads through host-built descriptors (``BackwardConfig.tma``,
what an sm_90 GPU runs at 64 < d <= 128 with aligned tensors), and the picked tiles are then
``backward_config(..., tma=True)``'s; without it, through pointers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ptx_count import count_loops, first_loop, opcode, resource_usage, signature

_PTRS = ("Q", "K", "V", "DO", "DK", "DV_", "DQ")
_FP32_PTRS = ("LSE", "Delta")
_FLOATS = ("sm_scale", "qk_scale", "c1", "c2")


def compile_backward(
    kernel: str,
    *,
    causal: bool,
    softcap: int,
    n: int,
    tile: tuple[int, ...] | None = None,
    tma: bool = False,
    maxnreg: int | None = None,
) -> tuple[str, str, int]:
    """Compile ``_bwd_dkdv`` (``kernel="dkdv"``) or ``_bwd_dq`` for sm_90, bf16, d = 128, H =
    16, ``n`` queries and keys, ``SOFTCAP=softcap`` (0, 1 accurate, 2 approximate), with the
    tiles :func:`backward_config` picks or ``tile`` (rows, keys, warps, stages): (SASS,
    resource usage, scores per thread per step). ``tma``: the loops' loads through
    descriptors (Q and dO in dK/dV, K and V in dQ), with ``backward_config(..., tma=True)``'s
    tiles by default; ``maxnreg``: a cap on the registers a thread."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.disasm import get_sass

    from kernels import triton_flash_bwd as fb

    d, h = 128, 16
    cfg = fb.backward_config(d, d, 2, approx_cap=softcap == 2, causal=causal, tma=tma)
    if kernel == "dkdv":
        fn, (bm, bn, warps, stages) = fb._bwd_dkdv, tile or cfg[:4]
    else:
        fn, (bm, bn, warps, stages) = fb._bwd_dq, tile or cfg.for_dq()
    tensor = (h * n * d, n * d, d, 1)
    rowwise = (h * n, n, 1)
    strides = {}
    for prefix, shape in (
        ("sq", tensor), ("sk", tensor), ("sv", tensor), ("sdo", tensor), ("sl", rowwise),
        ("sd", rowwise), ("sdk", tensor), ("sdv", tensor), ("sdq", tensor),
    ):  # fmt: skip
        suffixes = "bhmd" if len(shape) == 4 else "bhm"
        if prefix in ("sk", "sv", "sdk", "sdv"):
            suffixes = "bhnd"
        strides.update({prefix + s: v for s, v in zip(suffixes, shape, strict=True)})
    values = {
        **strides, "H": h, "H_KV": h, "GROUP": 1, "NQ": n, "NK": n, "D": d, "DV": d,
        "win_left": -1, "win_right": -1,
    }  # fmt: skip
    const = {
        "CAUSAL": causal, "WINDOW": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_D": d,
        "BLOCK_DV": d, "PRECISION": "ieee", "SPLIT": True, "SOFTCAP": softcap,
        "OUT_K": True, "OUT_V": True, "DQ_ATOMIC": False, "TMA": tma,
    }  # fmt: skip
    fixed = {}
    if tma:  # host-built 4-D descriptors, blocks of one (batch, head) slice
        for name in ("Q", "DO") if kernel == "dkdv" else ("K", "V"):
            fixed[name] = f"tensordesc<bf16[1, 1, {bm if kernel == 'dkdv' else bn}, {d}]>"
    sig, attrs = signature(
        fn.arg_names, const, values, bf16=_PTRS, fp32=_FP32_PTRS, floats=_FLOATS, fixed=fixed
    )
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    options = {"num_warps": warps, "num_stages": stages}
    if maxnreg:
        options["maxnreg"] = maxnreg
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    tile = f"{bm}x{bn} w{warps} s{stages}"
    return (
        get_sass(ck.asm["cubin"]),
        f"{tile}: {resource_usage(ck.asm['cubin'])}, {ck.metadata.shared} bytes of shared memory",
        bm * bn // (32 * warps),
    )


def tiles_of(args: argparse.Namespace) -> dict[str, tuple[int, ...] | None]:
    """The ``--dkdv-tile`` and ``--dq-tile`` options as tuples (None: the picked tiles)."""
    return {
        "dkdv": tuple(int(x) for x in args.dkdv_tile.split(",")) if args.dkdv_tile else None,
        "dq": tuple(int(x) for x in args.dq_tile.split(",")) if args.dq_tile else None,
    }


# Up to this many other instructions between two products keep them in one run.
_RUN_GAP = 8


def loop_timeline(sass: str) -> list[str]:
    """The first innermost loop of a SASS listing as a timeline, in program order: runs of
    tensor-core products (``HGMMA xN``, with the address arithmetic interleaved in them), each
    wait for products (``WARPGROUP.DEPBAR...``) and barrier, and between them the count of other
    instructions (of which MUFU)."""
    out: list[str] = []
    run = 0  # products in the open run
    other = [0, 0]  # instructions (MUFU) since the last product, wait or barrier

    def close(*, run_too: bool) -> None:
        nonlocal run
        if run and (run_too or other[0] > _RUN_GAP):
            out.append(f"HGMMA x{run}")
            run = 0
        if not run and other[0]:
            out.append(f"{other[0]} other instructions ({other[1]} MUFU)")
            other[:] = [0, 0]

    for line in first_loop(sass):
        op = opcode(line)
        if op.startswith("WARPGROUP.ARRIVE"):
            continue
        if op.startswith("HGMMA"):
            close(run_too=False)
            run += 1
            other[:] = [0, 0]
        elif op.startswith(("WARPGROUP.DEPBAR", "BAR.")):
            close(run_too=True)
            out.append(line[line.index(op) :].split(";")[0])
        else:
            other[0] += 1
            other[1] += op.startswith("MUFU")
    close(run_too=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--causal", choices=["no", "yes"], default="no")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--dkdv-tile", default="", help="rows,keys,warps,stages (default: picked)")
    ap.add_argument("--dq-tile", default="", help="the same for the dQ kernel")
    ap.add_argument("--tma", action="store_true", help="loads through TMA descriptors")
    ap.add_argument("--maxnreg", type=int, default=0, help="cap the registers a thread (0: none)")
    ap.add_argument(
        "--timeline",
        nargs="?",
        const="dkdv",
        choices=["dkdv", "dq"],
        help="print that kernel's loop (alone: dkdv), plain and capped (approximate tanh): "
        "its products, waits and the instructions between them",
    )
    args = ap.parse_args(argv)
    if args.timeline:
        for softcap, label in ((0, "no cap"), (2, "capped, approximate tanh")):
            sass, usage, _ = compile_backward(
                args.timeline, causal=args.causal == "yes", softcap=softcap, n=args.n,
                tile=tiles_of(args)[args.timeline], tma=args.tma, maxnreg=args.maxnreg,
            )  # fmt: skip
            print(f"{args.timeline}, {label}, {usage}:")
            print("\n".join(f"  {x}" for x in loop_timeline(sass)))
        return 0
    tiles = tiles_of(args)
    print("| kernel | tanh | tile and resources | instr/score | MUFU/score | FP32/score |")
    print("|---|---|---|---|---|---|")
    for kernel in ("dkdv", "dq"):
        for softcap, label in ((0, "no cap"), (1, "accurate"), (2, "approx")):
            sass, usage, per = compile_backward(
                kernel, causal=args.causal == "yes", softcap=softcap, n=args.n,
                tile=tiles[kernel], tma=args.tma, maxnreg=args.maxnreg,
            )  # fmt: skip
            loops = count_loops(sass, sass=True)
            c = loops[0]
            print(
                f"| {kernel} | {label} | {usage} | {c.instructions / per:.2f} | "
                f"{c.mufu / per:.2f} | {c.fp32 / per:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
