"""Tuning sweep of the Triton kernel's launch configurations on a Hopper GPU.

    python benchmarks/tune_hopper.py [--d 64 128 256] [--n 4096 16384] [--dtype bf16]

For each head dim, causal flag and N (``B·N = 16384`` tokens, ``H·d = 2048``), times every
candidate configuration of ``flashcheck.kernels.triton_flash`` and SDPA's flash and cuDNN backends
in the same process (CUDA events, warm-up, median; ``flashcheck.harness.bench.timing``), checks each
candidate's output against SDPA flash (max abs difference, a coarse guard: the oracle check is
``flashcheck bench``'s job), and prints one markdown table: TFLOP/s and the ratio to SDPA
flash and cuDNN. Candidates that fail to compile or run are listed with their error.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from flashcheck.harness.bench.providers import PROVIDERS
from flashcheck.harness.bench.timing import copies_for_l2, time_cuda
from flashcheck.kernels.triton_flash import LaunchConfig, last_compiled, launch

C = LaunchConfig
CANDIDATES = {
    64: [
        ("128x64 w8 s3", C(128, 64, 8, 3)),
        ("128x64 w4 s3", C(128, 64, 4, 3)),
        ("128x128 w4 s3", C(128, 128, 4, 3)),
        ("128x128 w4 s3 tma", C(128, 128, 4, 3, tma=True)),
        ("128x128 w8 s3", C(128, 128, 8, 3)),
        ("128x64 w8 s3 acc", C(128, 64, 8, 3, acc_in_dot=True)),
        ("128x64 w8 s3 acc pre", C(128, 64, 8, 3, acc_in_dot=True, prefetch=True)),
        ("128x64 w4 s3 acc", C(128, 64, 4, 3, acc_in_dot=True)),
        ("128x64 w4 s3 acc pre", C(128, 64, 4, 3, acc_in_dot=True, prefetch=True)),
        ("256x64 w8 s3 acc", C(256, 64, 8, 3)),
        ("256x64 w8 s2 acc", C(256, 64, 8, 2)),
        # What the Triton tutorial's autotuner picked on an H100 (fp16, benchmarks/RESULTS.md):
        # one warpgroup per CTA, so two or three CTAs share an SM.
        ("64x64 w4 s2", C(64, 64, 4, 2)),
        ("64x64 w4 s3", C(64, 64, 4, 3)),
        ("128x64 w4 s2", C(128, 64, 4, 2)),
        ("128x64 w4 s4", C(128, 64, 4, 4)),
        # Through host-built TMA descriptors (the loads need no per-thread address).
        ("128x64 w8 s3 tma", C(128, 64, 8, 3, tma=True)),
        ("128x64 w4 s3 tma", C(128, 64, 4, 3, tma=True)),
        ("64x64 w4 s3 tma", C(64, 64, 4, 3, tma=True)),
    ],
    128: [
        ("128x64 w8 s3", C(128, 64, 8, 3)),
        ("128x64 w8 s2", C(128, 64, 8, 2)),
        ("128x64 w8 s4", C(128, 64, 8, 4)),
        ("128x128 w8 s3", C(128, 128, 8, 3)),
        ("128x128 w8 s3 tma", C(128, 128, 8, 3, tma=True)),
        # Issue 16: the accumulator as the P·V product's addend (as the Triton tutorial
        # writes it; the default since), and QKᵀ of the next block issued before the current
        # softmax; 256-row tiles.
        ("128x64 w8 s3 noacc", C(128, 64, 8, 3, acc_in_dot=False)),
        ("128x64 w8 s3 acc", C(128, 64, 8, 3, acc_in_dot=True)),
        ("128x64 w8 s3 pre", C(128, 64, 8, 3, prefetch=True)),
        ("128x64 w8 s3 acc pre", C(128, 64, 8, 3, acc_in_dot=True, prefetch=True)),
        ("128x128 w8 s3 acc", C(128, 128, 8, 3, acc_in_dot=True)),
        ("128x128 w8 s3 acc pre", C(128, 128, 8, 3, acc_in_dot=True, prefetch=True)),
        ("128x64 w8 s3 tma acc pre", C(128, 64, 8, 3, tma=True, acc_in_dot=True, prefetch=True)),
        ("128x128 w8 s2 tma acc pre", C(128, 128, 8, 2, tma=True, acc_in_dot=True, prefetch=True)),
        ("256x64 w8 s2 acc", C(256, 64, 8, 2)),
        ("256x64 w8 s3 acc", C(256, 64, 8, 3)),
        ("256x32 w8 s3 acc", C(256, 32, 8, 3)),
        ("256x64 w16 s2 acc", C(256, 64, 16, 2)),
        ("256x64 w16 s3 acc", C(256, 64, 16, 3)),
        ("128x128 w8 s2 acc", C(128, 128, 8, 2)),
        ("128x32 w4 s3 acc", C(128, 32, 4, 3)),
        # Round 4: two CTAs per SM (registers capped, two stages to halve shared memory), so
        # that one CTA's softmax runs while the other's products do; and 64-row tiles with
        # one warpgroup, several CTAs per SM.
        ("128x64 w8 s2 r128", C(128, 64, 8, 2, maxnreg=128)),
        ("128x64 w8 s3 r128", C(128, 64, 8, 3, maxnreg=128)),
        ("128x64 w8 s2 tma r128", C(128, 64, 8, 2, tma=True, maxnreg=128)),
        ("128x32 w8 s3 r128", C(128, 32, 8, 3, maxnreg=128)),
        ("64x64 w4 s2", C(64, 64, 4, 2)),
        ("64x64 w4 s3", C(64, 64, 4, 3)),
        ("64x128 w4 s2", C(64, 128, 4, 2)),
        ("64x64 w4 s2 tma", C(64, 64, 4, 2, tma=True)),
        # The Triton tutorial's autotuner's H100 picks (fp16): one warpgroup per CTA.
        ("128x64 w4 s2", C(128, 64, 4, 2)),
        ("128x64 w4 s3", C(128, 64, 4, 3)),
        # The same through TMA (as the tutorial loads): no per-thread load addresses, which
        # spilled registers above.
        ("128x64 w4 s2 tma", C(128, 64, 4, 2, tma=True)),
        ("128x64 w4 s3 tma", C(128, 64, 4, 3, tma=True)),
        ("64x64 w4 s3 tma", C(64, 64, 4, 3, tma=True)),
        ("128x64 w8 s3 tma", C(128, 64, 8, 3, tma=True)),
        ("256x64 w8 s3 tma", C(256, 64, 8, 3, tma=True)),
    ],
    256: [
        ("128x64 w8 s2 tma", C(128, 64, 8, 2, tma=True)),
        ("128x64 w8 s2", C(128, 64, 8, 2)),
        ("64x64 w4 s3 tma", C(64, 64, 4, 3, tma=True)),
        ("64x64 w4 s3", C(64, 64, 4, 3)),
        ("128x32 w8 s3", C(128, 32, 8, 3)),
        ("128x64 w8 s2 tma acc", C(128, 64, 8, 2, tma=True, acc_in_dot=True)),
        ("128x64 w8 s2 tma acc pre", C(128, 64, 8, 2, tma=True, acc_in_dot=True, prefetch=True)),
        ("128x64 w8 s2 tma pre", C(128, 64, 8, 2, tma=True, prefetch=True)),
        ("256x64 w16 s2 tma acc", C(256, 64, 16, 2, tma=True)),
        ("128x32 w8 s2 tma acc", C(128, 32, 8, 2, tma=True)),
    ],
}


def ctas_per_sm(kern, warps: int) -> str:
    """Resident CTAs per Hopper SM allowed by registers (64 K per SM, allocated per warp in
    units of 256) and shared memory (228 KiB per SM, 1 KiB reserved per CTA): an estimate,
    not the profiler's achieved occupancy."""
    regs, smem = (
        getattr(kern, "n_regs", None),
        getattr(getattr(kern, "metadata", None), "shared", None),
    )
    if not regs or smem is None:
        return "?"
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem + 1024)
    return str(min(by_regs, by_smem, 64 // warps))


def flops(b: int, h: int, n: int, d: int, causal: bool) -> float:
    return 4.0 * b * h * n * n * d * (0.5 if causal else 1.0)


def emit(row: tuple) -> None:
    d, causal, n, label, tf, rf, rc, err, comp, spread, msg = row
    print(
        f"| {d} | {'yes' if causal else 'no'} | {n} | {label} | {tf:.0f} | {rf:.2f} | "
        f"{rc:.2f} | {err:.3g} | {comp:.1f} | {spread:.2f} | {msg} |",
        flush=True,
    )


def emit_and_keep(rows: list[tuple], row: tuple) -> None:
    rows.append(row)
    emit(row)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--n", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    ap.add_argument("--only", nargs="*", default=None, help="candidate labels to keep")
    args = ap.parse_args()
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    print(
        f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {__import__('triton').__version__}, {args.dtype}"
    )
    print(
        "\n| d | causal | N | config | TFLOP/s | ×flash | ×cuDNN | max abs diff vs flash "
        "| compile+1st (s) | spread | error |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows: list[tuple] = []
    for d in args.d:
        for causal in causals:
            for n in args.n:
                b, h = max(1, 16384 // n), 2048 // d
                g = torch.Generator(device="cuda").manual_seed(0)
                per = 3 * b * h * n * d * 2
                sets = [
                    tuple(
                        torch.randn(b, h, n, d, device="cuda", dtype=dt, generator=g)
                        for _ in range(3)
                    )
                    for _ in range(copies_for_l2(per))
                ]
                f = flops(b, h, n, d, causal)
                ref = None
                base = {}
                for name in ("sdpa-flash", "sdpa-cudnn"):
                    fn = PROVIDERS[name].make(*sets[0], causal)
                    try:
                        t = time_cuda(fn, sets)
                        base[name] = f / t.median_ms / 1e9
                        if name == "sdpa-flash":
                            ref = fn(*sets[0]).float()
                    except Exception as exc:
                        base[name] = float("nan")
                        print(f"{name} d={d} causal={causal} n={n}: {exc!s:.200}")
                for label, cfg in CANDIDATES[d]:
                    if args.only and label not in args.only:
                        continue
                    sc = d**-0.5

                    def fn(q, k, v, cfg=cfg, sc=sc, causal=causal):
                        return launch(
                            q,
                            k,
                            v,
                            causal=causal,
                            window=None,
                            scale=sc,
                            allow_tf32=False,
                            config=cfg,
                        )[0]

                    t0 = time.perf_counter()
                    try:
                        out = fn(*sets[0]).float()
                        torch.cuda.synchronize()
                        comp = time.perf_counter() - t0
                        err = (out - ref).abs().max().item() if ref is not None else float("nan")
                        t = time_cuda(fn, sets)
                        tf = f / t.median_ms / 1e9
                        kern = last_compiled()
                        meta = getattr(kern, "metadata", None)
                        info = (
                            f"regs {getattr(kern, 'n_regs', '?')}, spills "
                            f"{getattr(kern, 'n_spills', '?')}, smem {getattr(meta, 'shared', '?')}"
                            f", CTAs/SM {ctas_per_sm(kern, cfg.warps)}"
                        )
                        emit_and_keep(
                            rows,
                            (
                                d,
                                causal,
                                n,
                                label,
                                tf,
                                tf / base["sdpa-flash"],
                                tf / base["sdpa-cudnn"],
                                err,
                                comp,
                                t.spread,
                                info,
                            ),
                        )
                    except Exception as exc:
                        msg = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else ""
                        emit_and_keep(
                            rows,
                            (
                                d,
                                causal,
                                n,
                                label,
                                float("nan"),
                                float("nan"),
                                float("nan"),
                                float("nan"),
                                0.0,
                                0.0,
                                f"{type(exc).__name__}: {msg}",
                            ),
                        )
                emit_and_keep(
                    rows,
                    (
                        d,
                        causal,
                        n,
                        "= sdpa-flash",
                        base["sdpa-flash"],
                        1.0,
                        base["sdpa-flash"] / base["sdpa-cudnn"],
                        0.0,
                        0.0,
                        0.0,
                        "",
                    ),
                )
                emit_and_keep(
                    rows,
                    (
                        d,
                        causal,
                        n,
                        "= sdpa-cudnn",
                        base["sdpa-cudnn"],
                        base["sdpa-cudnn"] / base["sdpa-flash"],
                        1.0,
                        0.0,
                        0.0,
                        0.0,
                        "",
                    ),
                )
                del sets
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
