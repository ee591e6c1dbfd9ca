"""Where the soft-capped backward's time goes, kernel by kernel, on one CUDA GPU.

    python benchmarks/gpu_softcap_bwd_split.py [--reps 30] [--n 4096] [--dq TILES]
        [--dkdv TILES] [--tiles-only]

A tile is ``m,n,warps,stages`` with an optional fifth field, 1 or 0: the loops' loads through
TMA descriptors or pointers (``BackwardConfig.tma``; it applies to both kernels of the run),
and an optional sixth: a cap on that kernel's registers a thread (``maxnreg``; 0: none). The
other kernel keeps its pointer-load tile of ``backward_config``; the first row of each table is
the tile the launcher picks on this GPU (descriptor loads on Hopper).

bf16, d = 128, H = 16, B·N = 16K, causal and not: the deterministic backward
(``flash_attention_backward``) plain, with a soft-cap of 2 and the accurate tanh, and with
``approx_tanh=True``. Each of its three launches (preprocess, dK/dV, dQ) is timed with CUDA
events around the launch (median of ``--reps`` calls, the three variants interleaved), and the
compiled kernels' registers and spills are read from the launch's return value. Prints a
table: per variant and kernel, milliseconds and the ratio to the plain backward's kernel.
"""

from __future__ import annotations

import argparse
import statistics

from probe_softcap_configs import bench_inputs  # the shapes and inputs of the other probes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument(
        "--dq",
        default="",
        help="dQ tiles to try: 'm,n,warps,stages[,tma[,maxnreg]];...' (tma: 1 or 0)",
    )
    ap.add_argument("--dkdv", default="", help="dK/dV tiles to try, the same way")
    ap.add_argument(
        "--tiles-only", action="store_true", help="skip the per-kernel table; time the tiles only"
    )
    args = ap.parse_args(argv)
    import torch

    from flashcheck.kernels import triton_flash_bwd as fb
    from flashcheck.kernels.triton_flash import flash_attention

    times: dict[str, list[float]] = {}
    regs: dict[str, str] = {}
    current = {"variant": ""}

    def timed(name, jit):
        run = jit.run

        def wrapped(*a, **kw):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            kernel = run(*a, **kw)
            end.record()
            key = f"{current['variant']}/{name}"
            times.setdefault(key, []).append((start, end))
            regs[key] = f"{kernel.n_regs} regs, {kernel.n_spills} spills"
            return kernel

        jit.run = wrapped

    timed("preprocess", fb._bwd_preprocess)
    timed("dkdv", fb._bwd_dkdv)
    timed("dq", fb._bwd_dq)
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    n = args.n
    variants = {
        "plain": {},
        "cap accurate": {"softcap": 2.0},
        "cap approx": {"softcap": 2.0, "approx_tanh": True},
    }
    lines = []
    for causal in (False, True) if not args.tiles_only else ():
        q, k, v, do = bench_inputs(n, 4)
        fwd = {name: flash_attention(q, k, v, causal=causal, **o) for name, o in variants.items()}
        times.clear()
        for rep in range(args.reps + 2):
            for name, o in variants.items():
                current["variant"] = name if rep >= 2 else "warmup"
                out, lse = fwd[name]
                fb.flash_attention_backward(q, k, v, out, lse, do, causal=causal, **o)
        torch.cuda.synchronize()
        ms = {
            key: statistics.median(s.elapsed_time(e) for s, e in pairs)
            for key, pairs in times.items()
            if not key.startswith("warmup")
        }
        for kernel in ("preprocess", "dkdv", "dq"):
            base = ms[f"plain/{kernel}"]
            for name in variants:
                key = f"{name}/{kernel}"
                lines.append(
                    f"| {'yes' if causal else 'no'} | {n} | {kernel} | {name} | {ms[key]:.3f} | "
                    f"{ms[key] / base:.3f} | {regs[key]} |"
                )
        for name in variants:
            total = sum(ms[f"{name}/{x}"] for x in ("preprocess", "dkdv", "dq"))
            plain = sum(ms[f"plain/{x}"] for x in ("preprocess", "dkdv", "dq"))
            lines.append(
                f"| {'yes' if causal else 'no'} | {n} | all three | {name} | {total:.3f} | "
                f"{total / plain:.3f} | |"
            )
    if lines:
        print("\n| causal | N | kernel | variant | ms | / plain | compiled |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(lines))
    if args.dq:
        other_tiles(args, "dq", fb, flash_attention, times, regs, current)
    if args.dkdv:
        other_tiles(args, "dkdv", fb, flash_attention, times, regs, current)
    return 0


def other_tiles(args, kernel, fb, flash_attention, times, regs, current) -> None:
    """One kernel (``kernel``: "dq" or "dkdv") at other tiles (``--dq`` / ``--dkdv``
    'm,n,warps,stages[,tma[,maxnreg]];...'), the other at the default's: that kernel's
    milliseconds plain and capped (approximate tanh), and its outputs' largest difference from
    the default tiles', relative to their max (another block size may sum in another order)."""
    import torch

    n, d = args.n, 128  # bench_inputs' head dim
    spec = args.dq if kernel == "dq" else args.dkdv
    tiles = [tuple(int(x) for x in t.split(",")) for t in spec.split(";")]
    out = []
    for causal in (False, True):
        q, k, v, do = bench_inputs(n, 4)
        for opts in ({}, {"softcap": 2.0, "approx_tanh": True}):
            o, lse = flash_attention(q, k, v, causal=causal, **opts)
            # The first row, the reference of the diff column, is the launcher's own pick on
            # this GPU: with descriptor loads on Hopper (as launch_backward decides).
            hopper = torch.cuda.get_device_capability()[0] == 9
            default = fb.backward_config(d, d, 2, approx_cap=bool(opts), causal=causal, tma=hopper)
            base = fb.backward_config(d, d, 2, approx_cap=bool(opts), causal=causal)
            ref = None
            first = default.for_dq() if kernel == "dq" else default[:4]
            first = (*first, int(default.tma))
            for tile in [first, *tiles]:
                if kernel == "dq":
                    cfg = base._replace(
                        dq_block_m=tile[0], dq_block_n=tile[1], dq_warps=tile[2],
                        dq_stages=tile[3],
                    )  # fmt: skip
                else:
                    cfg = base._replace(
                        block_m=tile[0], block_n=tile[1], warps=tile[2], stages=tile[3]
                    )
                if len(tile) > 4:  # a fifth field: loads through TMA (1) or pointers (0)
                    cfg = cfg._replace(tma=bool(tile[4]))
                if len(tile) > 5 and tile[5]:  # a sixth: a cap on the registers a thread
                    field = "dq_maxnreg" if kernel == "dq" else "maxnreg"
                    cfg = cfg._replace(**{field: tile[5]})
                times.clear()
                current["variant"] = "t"
                row = (
                    f"| {'yes' if causal else 'no'} | {'approx cap' if opts else 'plain'} | {tile}"
                )
                try:
                    fb.check_config(cfg, fused=False)
                except ValueError as e:  # a class that faulted on a GPU (check_config)
                    out.append(f"{row} | refused | {e} | |")
                    print(out[-1], flush=True)
                    continue
                for _ in range(args.reps + 2):
                    grads = fb.launch_backward(
                        q, k, v, o, lse, do, causal=causal, window=None, scale=d**-0.5,
                        allow_tf32=False, config=cfg, softcap=opts.get("softcap"),
                        approx_tanh=bool(opts),
                    )  # fmt: skip
                torch.cuda.synchronize()
                key = f"t/{kernel}"
                ms = statistics.median(s.elapsed_time(e) for s, e in times[key][2:])
                got = grads[:1] if kernel == "dq" else grads[1:3]
                if ref is None:
                    ref = [x.float() for x in got]
                diff = max(
                    ((x.float() - r).abs().max() / r.abs().max()).item()
                    for x, r in zip(got, ref, strict=True)
                )
                out.append(f"{row} | {ms:.3f} | {regs[key]} | {diff:.1e} |")
                print(out[-1], flush=True)
    print(f"\n| causal | variant | {kernel} tile (m, n, warps, stages) | ms | compiled | diff |")
    print("|---|---|---|---|---|---|")
    print("\n".join(out))


if __name__ == "__main__":
    raise SystemExit(main())
