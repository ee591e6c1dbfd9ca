"""What limits the Triton kernel: Nsight Compute on it and on SDPA cuDNN, side by side.

    python benchmarks/profile_limits.py [-n 8192] [-d 128] [--heads 16] [--out DIR]
    python benchmarks/profile_limits.py --pass bwd [-n 4096] [-d 128] [--causal] ...
    python benchmarks/profile_limits.py --pass bwd --providers triton,triton-capped
    python benchmarks/profile_limits.py -n 1024 -d 64 --heads 32 --batch 16 --dtype fp16 \
        --providers triton,tutorial_attention:attention     # a peer kernel on PYTHONPATH

Profiles one bf16 non-causal forward of each (``benchmarks/iomodel_ncu.py run``, which warms
up, then brackets a single call with cudaProfilerStart/Stop) with the SpeedOfLight,
ComputeWorkloadAnalysis, Occupancy, LaunchStats and WarpStateStats sections, saves the raw CSV
and prints the metrics that say where the time goes: tensor-pipe (GMMA) activity, the
special-function pipe (XU: exp2), FMA/ALU pipes, issue activity, warp stall reasons,
registers and occupancy. ``--pass bwd`` profiles one backward instead (the Triton backward's
kernels against cuDNN's, on a graph built and warmed up before the profiled window) and prints
every kernel that takes at least 3 % of its backward's time. A provider ``module:function``
is a forward ``fn(q, k, v, *, causal=False)`` importable from ``PYTHONPATH`` (as
``flashcheck bench --kernel`` takes), profiled on the same inputs as ``triton``.
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "Occupancy", "LaunchStats", "WarpStateStats")
KEEP = (
    "gpu__time_duration.sum",
    "sm__throughput.avg.pct",
    "gmma",
    "pipe_tensor",
    "pipe_xu",
    "pipe_fma",
    "pipe_alu",
    "issue_active",
    "inst_executed.avg.per_cycle_active",
    "warps_active.avg.pct",
    "registers",
    "smsp__pcsamp_warps_issue_stalled",
    "average_warp_latency_issue_stalled",
    "dram__throughput.avg.pct",
)


def run_backward(kernel: str, n: int, d: int, heads: int, causal: bool) -> None:
    """Warm up, then run exactly one backward of ``kernel`` between cudaProfilerStart/Stop."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(ROOT))
    from flashcheck.kernels.triton_flash_bwd import flash_attention_differentiable

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (
        torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(4)
    )
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    if kernel == "triton":
        out = flash_attention_differentiable(q, k, v, causal=causal)
    elif kernel == "triton-capped":  # soft-cap 2 with the GPU's tanh, as the options bench
        out = flash_attention_differentiable(q, k, v, causal=causal, softcap=2.0, approx_tanh=True)
    else:
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    for _ in range(5):
        torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    torch.autograd.grad(out, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run_forward(
    kernel: str, n: int, d: int, heads: int, causal: bool, batch: int, dtype: str
) -> None:
    """Warm up, then run exactly one forward of ``kernel`` (``triton`` or ``module:function``)
    on ``(batch, heads, n, d)`` inputs between cudaProfilerStart/Stop."""
    import importlib

    import torch

    sys.path.insert(0, str(ROOT))
    from flashcheck.kernels.triton_flash import flash_attention

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(batch, heads, n, d, device="cuda", dtype=dt, generator=g) for _ in range(3)
    )
    if kernel == "triton":
        fn = flash_attention
    else:
        module, name = kernel.split(":")
        fn = getattr(importlib.import_module(module), name)
    for _ in range(5):
        fn(q, k, v, causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    fn(q, k, v, causal=causal)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def profile(
    kernel: str,
    n: int,
    d: int,
    heads: int,
    backward: bool = False,
    causal: bool = False,
    *,
    batch: int = 1,
    dtype: str = "bf16",
) -> list[dict[str, str]]:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--csv", "--page", "raw"]
    for s in SECTIONS:
        cmd += ["--section", s]
    if backward:
        cmd += [
            sys.executable,
            __file__,
            "--run-bwd",
            kernel,
            "-n",
            str(n),
            "-d",
            str(d),
            "--heads",
            str(heads),
        ] + (["--causal"] if causal else [])
    elif ":" in kernel or batch != 1 or dtype != "bf16" or causal:
        cmd += [sys.executable, __file__, "--run-fwd", kernel, "-n", str(n), "-d", str(d)]
        cmd += ["--heads", str(heads), "--batch", str(batch), "--dtype", dtype]
        cmd += ["--causal"] if causal else []
    else:
        cmd += [
            sys.executable,
            str(ROOT / "benchmarks" / "iomodel_ncu.py"),
            "run",
            "--kernel",
            kernel,
            "-n",
            str(n),
            "-d",
            str(d),
            "--heads",
            str(heads),
        ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith('"')]
    if res.returncode or not lines:
        raise SystemExit(
            f"ncu failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        )
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    return [r for r in rows if r.get("ID", "").isdigit()]  # drop the units row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=8192)
    ap.add_argument("-d", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None, help="where to save the raw CSV rows")
    ap.add_argument("--pass", dest="which_pass", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--batch", type=int, default=1, help="forward only")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="forward only")
    ap.add_argument(
        "--providers",
        default="triton,sdpa-cudnn",
        help="comma-separated, of triton, sdpa-cudnn, (--pass bwd) triton-capped: the "
        "Triton backward with a soft-cap of 2 and approx_tanh=True, and (forward) "
        "module:function kernels",
    )
    ap.add_argument(
        "--run-bwd", choices=("triton", "triton-capped", "sdpa-cudnn"), help=argparse.SUPPRESS
    )
    ap.add_argument("--run-fwd", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_bwd:  # the profiled child process
        run_backward(args.run_bwd, args.n, args.d, args.heads, args.causal)
        return 0
    if args.run_fwd:
        run_forward(args.run_fwd, args.n, args.d, args.heads, args.causal, args.batch, args.dtype)
        return 0
    backward = args.which_pass == "bwd"
    found: dict[str, dict[str, str]] = {}
    providers = args.providers.split(",")
    bad = sorted(
        set(providers)
        - {"triton", "sdpa-cudnn", "triton-capped"}
        - {p for p in providers if ":" in p}
    )
    if args.batch != 1 or args.dtype != "bf16" or (args.causal and not backward):
        bad += [p for p in providers if p == "sdpa-cudnn"]  # iomodel_ncu.py's fixed inputs
    if bad or ("triton-capped" in providers and not backward):
        ap.error(f"--providers: {bad or 'triton-capped'} (triton-capped with --pass bwd only)")
    for kernel in providers:
        rows = profile(
            kernel, args.n, args.d, args.heads, backward, args.causal,
            batch=args.batch, dtype=args.dtype,
        )  # fmt: skip
        for i, row in enumerate(rows):
            name = row.get("Kernel Name", "?")[:60]
            found[f"{kernel}: {name} #{i}" if backward else f"{kernel}: {name}"] = row
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "profile_limits.csv", "w", newline="") as f:
            keys = sorted({k for r in found.values() for k in r})
            w = csv.DictWriter(f, fieldnames=["which", *keys])
            w.writeheader()
            for which, r in found.items():
                w.writerow({"which": which, **r})

    # the forward kernel of each (the longest), side by side
    def dur(r):
        try:
            return float(r.get("gpu__time_duration.sum", "0").replace(",", ""))
        except ValueError:
            return 0.0

    main_rows = {}
    if backward:
        # every kernel that takes >= 3 % of its provider's backward
        totals: dict[str, float] = {}
        for which, r in found.items():
            totals[which.split(":")[0]] = totals.get(which.split(":")[0], 0.0) + dur(r)
        for which, r in found.items():
            if dur(r) >= 0.03 * totals[which.split(":")[0]]:
                main_rows[which] = (which, r)
        print(
            "backward time (sum of kernel durations): "
            + ", ".join(f"{k} {t:,.0f}" for k, t in totals.items())
        )
    for which, r in found.items():
        k = which.split(":")[0]
        if backward:
            break
        if k not in main_rows or dur(r) > dur(main_rows[k][1]):
            main_rows[k] = (which, r)
    names = sorted({m for _, r in main_rows.values() for m in r if any(s in m for s in KEEP)})
    cols = list(main_rows)
    print(
        f"{args.which_pass}, {args.dtype}, N={args.n}, d={args.d}, heads={args.heads}, "
        f"B={args.batch}, "
        f"{'causal' if args.causal else 'non-causal'}"
    )
    print("| metric | " + " | ".join(main_rows[c][0] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for m in names:
        print(f"| {m} | " + " | ".join(main_rows[c][1].get(m, "") for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
