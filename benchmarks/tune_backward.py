"""Tile sweep of the Triton backward (kernels/triton_flash_bwd.py) on one GPU, side by side with
SDPA's flash and cuDNN backwards.

    python benchmarks/tune_backward.py [--budget 420] [--shape 128:0:4096 ...]

Shapes follow the bench's grid (bf16, B·N = 16384 tokens, H·d = 2048). For each shape: SDPA
flash and cuDNN backward times (``torch.autograd.grad(O, (Q, K, V), dO, retain_graph=True)``
through a graph built before timing, as ``flashcheck bench --pass bwd`` does), then every
candidate :class:`BackwardConfig` timed on ``flash_attention_backward`` alone, each with its
dQ, dK, dV compared with an fp32 SDPA-math backward on the same (upcast) inputs by
``‖g − ref‖ / ‖ref‖`` (bf16 operands land near 1e-3 to 1e-2; a wrong tile shows far above).
Times are ``triton.testing.do_bench`` medians. FLOPs: 2.5 × the forward's ``4·N²·d`` per head,
halved for causal. A candidate that fails to compile (shared memory, registers) is listed as
such. New candidates stop starting after ``--budget`` seconds; the table prints last.

``--per-kernel`` sweeps the two kernels apart: each dK/dV tile of ``DKDV_WIDE`` (d = 256;
``DKDV_NARROW`` for d ≤ 128) runs beside a fixed dQ tile, then each dQ tile of ``DQ_WIDE``
(``DQ_NARROW``) beside the fastest dK/dV tile, with every kernel's own device time taken
from ``torch.profiler`` (mean of 20 calls); the fastest pair is then timed whole.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.kernels.triton_flash import flash_attention
from flashcheck.kernels.triton_flash_bwd import BackwardConfig, backward_config, launch_backward

TOKENS, WIDTH = 16384, 2048
# (dK/dV: block_m rows stepped, block_n keys owned, warps, stages) + (dQ: rows owned, keys
# stepped, warps, stages). The dK/dV program wants a wide key tile and narrow row steps; dQ
# the transpose (as in the Triton tutorial's backward).
NARROW = [
    ((32, 64, 4, 2), (32, 64, 4, 2)),
    ((32, 128, 4, 3), (128, 32, 4, 3)),
    ((32, 128, 8, 3), (128, 32, 8, 3)),
    ((64, 128, 8, 2), (128, 64, 8, 2)),
    ((32, 128, 4, 5), (128, 32, 4, 5)),
    ((64, 64, 4, 3), (64, 64, 4, 3)),
    ((64, 128, 4, 2), (128, 64, 4, 2)),
    ((32, 64, 4, 3), (64, 32, 4, 3)),
]
WIDE = [  # d = 256: two fp32 accumulators of block_n × 256 per dK/dV program
    ((32, 32, 4, 1), (32, 32, 4, 1)),
    ((64, 64, 8, 2), (64, 64, 8, 2)),
    ((32, 64, 8, 2), (64, 32, 8, 2)),
    ((64, 64, 8, 3), (64, 64, 8, 3)),
    ((64, 64, 4, 2), (64, 64, 4, 2)),
    ((64, 128, 8, 2), (128, 64, 8, 2)),
    ((32, 64, 8, 2), (64, 64, 8, 2)),
    ((64, 64, 8, 2), (128, 32, 8, 2)),
    ((64, 32, 8, 2), (32, 64, 8, 2)),
]


# Swept one kernel at a time (--per-kernel): dK/dV (block_m, block_n, warps, stages, dK and
# dV in two launches), dQ (block_m, block_n, warps, stages).
DKDV_WIDE = [
    (64, 64, 8, 2, False),
    (64, 32, 4, 2, False),
    (32, 64, 8, 2, False),
    (32, 128, 8, 2, True),
    (64, 128, 8, 2, True),
    (32, 128, 8, 3, True),
    (64, 128, 8, 1, True),
    (16, 128, 8, 2, True),
    (64, 64, 4, 2, True),
    (32, 64, 4, 2, True),
]
DQ_WIDE = [
    (128, 32, 8, 3),
    (128, 32, 8, 2),
    (128, 64, 8, 1),
    (64, 64, 4, 2),
]
DKDV_NARROW = [
    (32, 64, 4, 3, False),
    (32, 128, 4, 3, False),
    (32, 128, 8, 3, True),
    (64, 128, 8, 2, True),
    (64, 128, 8, 3, True),
    (32, 128, 4, 3, True),
    (64, 64, 4, 3, True),
]
DQ_NARROW = [
    (64, 32, 4, 3),
    (128, 32, 4, 3),
    (128, 32, 8, 3),
    (128, 64, 8, 2),
    (64, 64, 4, 3),
]


def _kernel_ms(run, reps: int = 20) -> dict[str, float]:
    """Mean device time per call of each backward kernel, by name, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if ev.key.startswith("_bwd"):
            out[ev.key] = total / reps / 1e3
    return out


def _cfg(pair) -> BackwardConfig:
    kv, (qm, qn, qw, qs) = pair
    m, n, w, s, *apart = kv
    return BackwardConfig(m, n, w, s, True, qm, qn, qw, qs, kv_apart=bool(apart and apart[0]))


def _sdpa_grad_fn(backend, q, k, v, do, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = getattr(SDPBackend, backend)
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    with sdpa_kernel([b]):
        out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)

    def fn():
        with sdpa_kernel([b]):
            return torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True)

    return fn


def _per_kernel_sweep(tag, q, k, v, o, lse, do, causal, d, ref, t_start, budget):
    """Time each kernel's candidates apart; return the fastest pair (and the default's)."""

    def run_with(cfg):
        return functools.partial(
            launch_backward,
            q,
            k,
            v,
            o,
            lse,
            do,
            causal=causal,
            window=None,
            scale=d**-0.5,
            allow_tf32=False,
            config=cfg,
        )

    def measure(cfg, kernel):
        if time.perf_counter() - t_start > budget:
            return None
        try:
            grads = run_with(cfg)()
            torch.cuda.synchronize()
            err = max(_rel(x, r) for x, r in zip(grads, ref, strict=True))
            ms = _kernel_ms(run_with(cfg))
        except Exception as exc:  # a tile that does not fit: report it, go on
            print(
                f"{tag} {kernel} {tuple(cfg)}: {type(exc).__name__}: {str(exc)[:100]}", flush=True
            )
            return None
        got = ms.get(kernel)
        print(
            f"{tag} {kernel} {tuple(cfg)}: {got:.3f} ms (all kernels: "
            + ", ".join(f"{n} {t:.3f}" for n, t in sorted(ms.items()))
            + f") rel err {err:.2e}",
            flush=True,
        )
        return got if err < 2e-2 else None

    kv_list, dq_list = (DKDV_WIDE, DQ_WIDE) if d > 128 else (DKDV_NARROW, DQ_NARROW)
    fixed_dq = dq_list[0]
    kv_times = {}
    for kv in kv_list:
        t = measure(_cfg((kv, fixed_dq)), "_bwd_dkdv")
        if t is not None:
            kv_times[kv] = t
    best_kv = min(kv_times, key=kv_times.get) if kv_times else kv_list[0]
    dq_times = {}
    for dq in dq_list:
        t = measure(_cfg((best_kv, dq)), "_bwd_dq")
        if t is not None:
            dq_times[dq] = t
    best_dq = min(dq_times, key=dq_times.get) if dq_times else fixed_dq
    print(
        f"{tag}: fastest dK/dV {best_kv} ({kv_times.get(best_kv, float('nan')):.3f} ms), "
        f"fastest dQ {best_dq} ({dq_times.get(best_dq, float('nan')):.3f} ms)",
        flush=True,
    )
    return [_cfg((best_kv, best_dq)), _cfg((best_kv, fixed_dq))]


def _rel(g, ref) -> float:
    return float((g.float() - ref).norm() / ref.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=420.0, help="seconds")
    ap.add_argument(
        "--per-kernel",
        action="store_true",
        help="sweep the dK/dV and dQ kernels one at a time",
    )
    ap.add_argument(
        "--shape",
        action="append",
        metavar="D:CAUSAL:N",
        help="e.g. 128:1:4096 (default: d 64/128/256 at 4K; 128 causal)",
    )
    args = ap.parse_args()
    shapes = [
        tuple(int(x) for x in s.split(":"))
        for s in args.shape or ("64:0:4096", "128:0:4096", "128:1:4096", "256:0:4096")
    ]
    t_start = time.perf_counter()
    rows = []
    print(
        f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}",
        flush=True,
    )
    for d, causal, n in shapes:
        b, h = TOKENS // n, WIDTH // d
        causal = bool(causal)
        flops = 2.5 * 4 * n * n * d * b * h / (2 if causal else 1)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (
            torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(4)
        )
        qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
        with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.MATH]):
            of = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
        ref = torch.autograd.grad(of, (qf, kf, vf), do.float())
        del of, qf, kf, vf
        o, lse = flash_attention(q, k, v, causal=causal)
        tag = f"d={d} {'causal' if causal else 'full'} N={n} ({b}x{h})"
        peers = {}
        for name, backend in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
            try:
                fn = _sdpa_grad_fn(backend, q, k, v, do, causal)
                peers[name] = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
            except RuntimeError as exc:
                print(f"{tag} {name}: {str(exc)[:80]}", flush=True)
        default = backward_config(d, d, 2)
        cands = [default] + [_cfg(p) for p in (WIDE if d > 128 else NARROW)]
        if args.per_kernel:
            cands = _per_kernel_sweep(
                tag, q, k, v, o, lse, do, causal, d, ref, t_start, args.budget
            )
            cands = [default, *cands]
        for cfg in dict.fromkeys(cands):
            if time.perf_counter() - t_start > args.budget:
                print(f"budget of {args.budget:.0f} s spent: later candidates not run", flush=True)
                break

            run = functools.partial(
                launch_backward,
                q,
                k,
                v,
                o,
                lse,
                do,
                causal=causal,
                window=None,
                scale=d**-0.5,
                allow_tf32=False,
                config=cfg,
            )
            try:
                grads = run()
                torch.cuda.synchronize()
                err = max(_rel(x, r) for x, r in zip(grads, ref, strict=True))
                ms = triton.testing.do_bench(run, warmup=50, rep=200, return_mode="median")
            except Exception as exc:  # a tile that does not fit: report it, go on
                print(f"{tag} {cfg}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                rows.append((tag, cfg, None, None, peers, flops, cfg == default))
                continue
            rows.append((tag, cfg, ms, err, peers, flops, cfg == default))
            print(
                f"{tag} {tuple(cfg)}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOP/s rel err "
                f"{err:.2e}" + "".join(f" {p} {ms_p / ms:.2f}x" for p, ms_p in peers.items()),
                flush=True,
            )
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s\n")
    print(
        "| shape | dK/dV (m, n, warps, stages) | dQ (m, n, warps, stages) | ms | TFLOP/s | "
        "vs SDPA flash | vs cuDNN | rel. error |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for tag, cfg, ms, err, peers, flops, is_default in rows:
        kv = f"{cfg.block_m}, {cfg.block_n}, {cfg.warps}, {cfg.stages}"
        kv += ", dK and dV apart" if cfg.kv_apart else ""
        dq = ", ".join(str(x) for x in cfg.for_dq())
        mark = " (default)" if is_default else ""
        if ms is None:
            print(f"| {tag} | {kv}{mark} | {dq} | failed | | | | |")
            continue
        ratios = [f"{peers[p] / ms:.2f}x" if p in peers else "–" for p in ("flash", "cudnn")]
        print(
            f"| {tag} | {kv}{mark} | {dq} | {ms:.3f} | {flops / ms / 1e9:.0f} | "
            f"{ratios[0]} | {ratios[1]} | {err:.1e} |"
        )


if __name__ == "__main__":
    main()
