"""Registers, spills and SASS instructions per score of the Triton backward's two kernels, on a
machine without a GPU: compile ``kernels/triton_flash_bwd.py``'s ``_bwd_dkdv`` and ``_bwd_dq``
for an sm_90 target (bf16, d = 128, N = 4096, H = 16, the tiles ``backward_config`` picks), plain
and soft-capped (accurate and approximate tanh), and print one table.

    python benchmarks/bwd_registers.py [--causal no|yes] [--n 4096]

Per score: the key loop's (dQ kernel) or row loop's (dK/dV kernel) instructions over the
``BLOCK_M·BLOCK_N/(32·warps)`` scores a thread holds per step (the mask-free loop, the
first innermost loop in the listing). Registers and spills from the bundled
``cuobjdump -res-usage``. Needs Triton >= 3.9 (ASTSource with attrs) and its bundled tools.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ptx_count import count_loops, resource_usage, signature

_PTRS = ("Q", "K", "V", "DO", "DK", "DV_", "DQ")
_FP32_PTRS = ("LSE", "Delta")
_FLOATS = ("sm_scale", "qk_scale", "c1", "c2")


def compile_backward(
    kernel: str, *, causal: bool, softcap: int, n: int, tile: tuple[int, ...] | None = None
) -> tuple[str, str, int]:
    """Compile ``_bwd_dkdv`` (``kernel="dkdv"``) or ``_bwd_dq`` for sm_90, bf16, d = 128, H =
    16, ``n`` queries and keys, ``SOFTCAP=softcap`` (0, 1 accurate, 2 approximate), with the
    tiles :func:`backward_config` picks or ``tile`` (rows, keys, warps, stages): (SASS,
    resource usage, scores per thread per step)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.tools.disasm import get_sass

    from kernels import triton_flash_bwd as fb

    d, h = 128, 16
    cfg = fb.backward_config(d, d, 2, approx_cap=softcap == 2, causal=causal)
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
        "OUT_K": True, "OUT_V": True, "DQ_ATOMIC": False,
    }  # fmt: skip
    sig, attrs = signature(fn.arg_names, const, values, bf16=_PTRS, fp32=_FP32_PTRS, floats=_FLOATS)
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    ck = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
    )
    tile = f"{bm}x{bn} w{warps} s{stages}"
    return (
        get_sass(ck.asm["cubin"]),
        f"{tile}: {resource_usage(ck.asm['cubin'])}",
        bm * bn // (32 * warps),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--causal", choices=["no", "yes"], default="no")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--dkdv-tile", default="", help="rows,keys,warps,stages (default: picked)")
    ap.add_argument("--dq-tile", default="", help="the same for the dQ kernel")
    args = ap.parse_args(argv)
    tiles = {
        "dkdv": tuple(int(x) for x in args.dkdv_tile.split(",")) if args.dkdv_tile else None,
        "dq": tuple(int(x) for x in args.dq_tile.split(",")) if args.dq_tile else None,
    }
    print("| kernel | tanh | tile and resources | instr/score | MUFU/score | FP32/score |")
    print("|---|---|---|---|---|---|")
    for kernel in ("dkdv", "dq"):
        for softcap, label in ((0, "no cap"), (1, "accurate"), (2, "approx")):
            sass, usage, per = compile_backward(
                kernel, causal=args.causal == "yes", softcap=softcap, n=args.n,
                tile=tiles[kernel],
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
