"""GPU check of the Triton backward (kernels/triton_flash_bwd.py): gradients against the oracle,
then the backward's peak extra memory at one long shape.

    python benchmarks/gpu_backward_check.py [fp16 bf16 fp32]   # on a machine with a CUDA GPU

1. For fp16, bf16 and fp32 (IEEE dots), on a grid with ragged lengths, Nq != Nk both ways,
   causal with rows that keep no key, sliding windows, GQA/MQA and odd head dims up to 256
   (lengths <= 512: the gradient oracle runs on the CPU): dQ, dK, dV of the registered
   ``triton`` kernel judged by ``check_gradients`` (floored-ULP errors against the oracle, the
   flash-class deterministic and probabilistic gradient bounds, the empirical rule against the
   same-precision naive backward, NaN/Inf where the exact gradient is finite). Before each run
   the allocator's free memory is filled with NaN, so an element the kernel fails to write
   shows up as NaN.
2. Peak memory of the backward alone at B=1, H=16, N=16384, d=128, bf16 (causal): what it
   allocates beyond its inputs, against dQ + dK + dV + D (O(N·d)); an N×N score matrix per head
   would be 8 GiB.
Prints the tables last; writes ``$OUT/gpu_backward_check.json`` when ``$OUT`` is set.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.harness.checks.array_checks import check_gradients
from flashcheck.harness.cli import environment
from flashcheck.kernels.triton_flash import flash_attention
from flashcheck.kernels.triton_flash_bwd import flash_attention_backward

GRID = [
    # (B, Hq, Hk, Nq, Nk, d, dv, causal, window)
    (2, 4, 2, 33, 47, 40, 40, True, None),
    (1, 2, 1, 300, 117, 72, 72, True, None),  # Nq > Nk causal: 183 rows keep no key
    (1, 2, 2, 129, 511, 59, 59, False, (64, 16)),
    (1, 3, 1, 255, 255, 111, 111, True, None),  # MQA
    (1, 4, 4, 200, 400, 128, 128, False, None),  # Nq < Nk
    (1, 4, 2, 129, 257, 256, 256, True, None),
    (1, 2, 2, 64, 500, 96, 64, False, None),  # dv != d
    (1, 8, 1, 77, 77, 16, 16, False, (8, None)),  # MQA, left window only
]
DTYPES = [("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)]


def _poison_free_memory(nbytes: int) -> None:
    """Fill a freed block of at least ``nbytes`` with NaN: the caching allocator hands it to the
    next allocations of that size class, so unwritten outputs read NaN instead of zeros."""
    x = torch.full((nbytes // 4 + 1024,), float("nan"), device="cuda")
    del x


def check(dtypes: list[str], seed: int = 0) -> list[dict]:
    out = []
    for name, dt in DTYPES:
        if name not in dtypes:
            continue
        for shape in GRID:
            b, hq, hk, nq, nk, d, dv, causal, window = shape
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(b, hq, nq, d, generator=g).to(dt)
            k = torch.randn(b, hk, nk, d, generator=g).to(dt)
            v = torch.randn(b, hk, nk, dv, generator=g).to(dt)
            do = torch.randn(b, hq, nq, dv, generator=g).to(dt)
            _poison_free_memory(2 * (q.numel() + k.numel() + v.numel()) * q.element_size())
            t0 = time.perf_counter()
            res = check_gradients(
                "triton", q, k, v, do=do, causal=causal, window=window, device="cuda", save="never"
            )
            secs = time.perf_counter() - t0
            row = {
                "dtype": name,
                "shape": list(shape[:7]),
                "causal": causal,
                "window": window,
                "verdict": res.verdict,
                "seconds": round(secs, 1),
            }
            for gname, ver in res.verdicts.items():
                row[gname] = {
                    "max_ulp": ver.max_ulp,
                    "naive_ulp": ver.naive_ulp,
                    "det_util": ver.det_util,
                    "prob_util": ver.prob_util,
                }
            # A non-finite error: the kernel returned NaN/Inf where the oracle is finite.
            row["nonfinite"] = any(not math.isfinite(row[g]["max_ulp"]) for g in ("dq", "dk", "dv"))
            row["reasons"] = res.reasons
            out.append(row)
            print(
                f"{name} {shape}: {res.verdict} "
                + " ".join(
                    f"{g} {row[g]['max_ulp']:.3g}/{row[g]['naive_ulp']:.3g} ulp "
                    f"det {row[g]['det_util']:.2g}"
                    for g in ("dq", "dk", "dv")
                )
                + f" ({secs:.1f} s)",
                flush=True,
            )
    return out


def memory() -> dict:
    b, h, n, d = 1, 16, 16384, 128
    dt = torch.bfloat16
    q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=dt) for _ in range(4))
    o, lse = flash_attention(q, k, v, causal=True)
    flash_attention_backward(q, k, v, o, lse, do, causal=True)  # compile outside the window
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    grads = flash_attention_backward(q, k, v, o, lse, do, causal=True)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    extra = torch.cuda.max_memory_allocated() - base
    expected = sum(x.numel() * x.element_size() for x in grads) + b * h * n * 4  # + D
    del grads
    return {
        "shape": [b, h, n, d],
        "dtype": "bf16",
        "causal": True,
        "extra_mib": extra / 2**20,
        "grads_plus_d_mib": expected / 2**20,
        "scores_per_head_mib": n * n * 4 / 2**20,
        "seconds": secs,
    }


def main() -> int:
    env = environment()
    env["gpu"] = torch.cuda.get_device_name()
    print("environment:", ", ".join(f"{k} {v}" for k, v in env.items()))
    dtypes = sys.argv[1:] or [name for name, _ in DTYPES]  # e.g. `... fp16 bf16`
    t0 = time.perf_counter()
    rows = check(dtypes)
    mem = memory()
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    print(
        "\n| dtype | (B, Hq, Hk, Nq, Nk, d, dv) | mask | verdict | dQ ulp (naive) | dK ulp (naive) "
        "| dV ulp (naive) | max det-bound util |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mask = ("causal " if r["causal"] else "") + (f"window {r['window']}" if r["window"] else "")
        cells = [f"{r[g]['max_ulp']:.3g} ({r[g]['naive_ulp']:.3g})" for g in ("dq", "dk", "dv")]
        util = max(r[g]["det_util"] for g in ("dq", "dk", "dv"))
        print(
            f"| {r['dtype']} | {tuple(r['shape'])} | {mask.strip() or '-'} | {r['verdict']} | "
            + " | ".join(cells)
            + f" | {util:.3g} |"
        )
    print(
        f"\nbackward peak extra memory, bf16 causal B=1 H=16 N=16384 d=128: "
        f"{mem['extra_mib']:.0f} MiB (dQ + dK + dV + D = {mem['grads_plus_d_mib']:.0f} MiB; "
        f"one head's N×N fp32 scores would be {mem['scores_per_head_mib']:.0f} MiB); "
        f"{mem['seconds'] * 1e3:.1f} ms one call"
    )
    ok = (
        all(r["verdict"] == "PASS" for r in rows)
        and mem["extra_mib"] <= 1.5 * mem["grads_plus_d_mib"]
    )
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "gpu_backward_check.json"
        path.write_text(
            json.dumps(
                {"environment": env, "grid": rows, "memory": mem, "ok": ok}, indent=1, default=str
            )
        )
        print(f"wrote {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
