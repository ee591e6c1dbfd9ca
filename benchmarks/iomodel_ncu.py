"""Model vs hardware: DRAM bytes of naive attention and of the Triton kernel, measured with
Nsight Compute, against the IO model's prediction for the same program and tiling.

    python benchmarks/iomodel_ncu.py sweep [--out DIR]     # runs ncu on each config (GPU)
    python benchmarks/iomodel_ncu.py time [--out DIR]      # ceilings + achieved TFLOP/s (GPU)
    python benchmarks/iomodel_ncu.py run --kernel triton -n 4096 -d 128 --heads 16

``sweep`` launches ``ncu --profile-from-start off --clock-control none --metrics
dram__bytes_read.sum,dram__bytes_write.sum`` on ``run``; ``run`` warms up (JIT compile) and
profiles exactly one forward between cudaProfilerStart/Stop. The kernel bytes are summed over
every kernel launched in that window. Predictions (bf16, per head × heads):

- naive ``P = softmax(Q·Kᵀ); O = P·V`` in torch: compulsory traffic ``(4N² + 4Nd)·2`` bytes
  (S written, read; P written, read; Q, K, V read; O written);
- Triton kernel (Q-outer, ``BLOCK_M`` rows per program): Q read and O written once, K and V read
  once per query block, plus the fp32 LSE (``flashcheck.harness.iomodel.analytic.flash_fa2_bytes``);
- SDPA flash / cuDNN / efficient: the same formula with an assumed ``BLOCK_M = 128`` (their
  tiling is not visible from Python).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KERNELS = ("naive", "triton", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient")
CONFIGS = [(k, n, d) for k in KERNELS for n in (1024, 4096) for d in (64, 128)]
# SDPA's kernels do not expose their tiling; the model assumes FA2's 128-row query blocks.
SDPA_BLOCK_M = 128
HEADS = 16


def _forward(kernel: str, n: int, d: int, heads: int):
    """A zero-argument forward of ``kernel`` on fixed bf16 inputs ``(1, heads, n, d)``."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from flashcheck.kernels.triton_flash import flash_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(1, heads, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
        for _ in range(3)
    )
    backends = {
        "sdpa-flash": SDPBackend.FLASH_ATTENTION,
        "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
        "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
    }

    def fwd():
        if kernel == "naive":
            return torch.softmax(q @ k.mT, dim=-1) @ v
        if kernel == "triton":
            return flash_attention(q, k, v)[0]
        with sdpa_kernel(backends[kernel]):
            return sdpa(q, k, v)

    return fwd


def _run(kernel: str, n: int, d: int, heads: int) -> None:
    import torch

    fwd = _forward(kernel, n, d, heads)
    fwd()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fwd()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def _predict(kernel: str, n: int, d: int, heads: int) -> float:
    from flashcheck.harness.iomodel.analytic import flash_fa2_bytes, naive_bytes
    from flashcheck.kernels.triton_flash import portable_config

    if kernel == "naive":
        return heads * naive_bytes(n, d, bytes_per_element=2)
    # BLOCK_M = 128 at d <= 128 in the portable and the Hopper configurations alike
    block_m = portable_config(d, d, 2).block_m if kernel == "triton" else SDPA_BLOCK_M
    return heads * flash_fa2_bytes(n, d, block_m=block_m)


def _median_ms(fn, reps: int = 30) -> float:
    from flashcheck.harness.bench.timing import time_cuda

    return time_cuda(fn, [()], warmup=3, reps=reps, min_ms=0.0).median_ms


def _ceilings() -> tuple[float, float]:
    """bf16 matmul 8192³ in TFLOP/s and a 1 GiB device copy in TB/s (read + write)."""
    from flashcheck.harness.bench.ceilings import measure_ceilings

    c = measure_ceilings()
    return c["matmul_bf16_tflops"], c["copy_tbs"]


def _time(out: Path) -> int:
    """Ceilings measured in this run, and the achieved TFLOP/s of each configuration."""
    import torch

    mm, cp = _ceilings()
    res = {
        "matmul_tflops": mm,
        "copy_tbps": cp,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "points": [],
    }
    for kernel, n, d in CONFIGS:
        ms = _median_ms(_forward(kernel, n, d, HEADS))
        flops = HEADS * 4.0 * n * n * d
        res["points"].append(
            {"kernel": kernel, "N": n, "d": d, "ms": ms, "tflops": flops / ms / 1e9}
        )
        print(f"{kernel} N={n} d={d}: {ms:.3f} ms, {flops / ms / 1e9:.1f} TFLOP/s", flush=True)
    print(f"ceilings: bf16 matmul {mm:.0f} TFLOP/s, copy {cp:.2f} TB/s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "iomodel_timing.json").write_text(json.dumps(res, indent=2))
    return 0


def _sweep(out: Path) -> int:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    rows = []
    for kernel, n, d in CONFIGS:
        cmd = [
            ncu,
            "--profile-from-start",
            "off",
            "--clock-control",
            "none",
            "--csv",
            "--metrics",
            "dram__bytes_read.sum,dram__bytes_write.sum",
            sys.executable,
            __file__,
            "run",
            "--kernel",
            kernel,
            "-n",
            str(n),
            "-d",
            str(d),
            "--heads",
            str(HEADS),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
        text = proc.stdout
        start = text.find('"ID"')
        if proc.returncode != 0 or start < 0:
            print(
                f"{kernel} N={n} d={d}: ncu failed (rc {proc.returncode})\n"
                f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}"
            )
            return 1
        read = write = 0.0
        launches = set()
        for rec in csv.DictReader(io.StringIO(text[start:])):
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}[rec["Metric Unit"]]
            val = float(rec["Metric Value"].replace(",", "")) * scale
            launches.add(rec["ID"])
            if rec["Metric Name"] == "dram__bytes_read.sum":
                read += val
            else:
                write += val
        pred = _predict(kernel, n, d, HEADS)
        rows.append(
            {
                "kernel": kernel,
                "N": n,
                "d": d,
                "heads": HEADS,
                "launches": len(launches),
                "dram_read": read,
                "dram_write": write,
                "model": pred,
                "ratio": (read + write) / pred,
            }
        )
        print(
            f"{kernel} N={n} d={d}: measured {(read + write) / 1e6:.1f} MB, model "
            f"{pred / 1e6:.1f} MB, ratio {(read + write) / pred:.3f}",
            flush=True,
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "iomodel_ncu.json").write_text(json.dumps(rows, indent=2))
    print(
        "\n| kernel | N | d | heads | launches | DRAM read MB | DRAM write MB | model MB | "
        "measured / model |\n|---|---|---|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['kernel']} | {r['N']} | {r['d']} | {r['heads']} | {r['launches']} | "
            f"{r['dram_read'] / 1e6:.1f} | {r['dram_write'] / 1e6:.1f} | {r['model'] / 1e6:.1f} "
            f"| {r['ratio']:.3f} |"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("sweep", "time"):
        sw = sub.add_parser(name)
        sw.add_argument("--out", default=os.environ.get("OUT", "reports/iomodel"))
    r = sub.add_parser("run")
    r.add_argument("--kernel", choices=KERNELS, required=True)
    r.add_argument("-n", type=int, required=True)
    r.add_argument("-d", type=int, required=True)
    r.add_argument("--heads", type=int, default=HEADS)
    args = ap.parse_args()
    if args.cmd == "run":
        _run(args.kernel, args.n, args.d, args.heads)
        return 0
    if args.cmd == "time":
        return _time(Path(args.out))
    return _sweep(Path(args.out))


if __name__ == "__main__":
    sys.exit(main())
