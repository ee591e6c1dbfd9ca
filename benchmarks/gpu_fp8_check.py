"""GPU check of FP8 attention (issue 32): FlashAttention-3's Table 3 and the FP8 campaign.

    python benchmarks/gpu_fp8_check.py [--kernel SPEC ...] [--n 4096] [--device cuda]

1. Table 3: RMSE against the exact result on N(0,1) + N(0,100)·Bernoulli(0.001) inputs,
   N = 4096, d = 128 (over 512 evenly spaced query rows), for every FP8 and 16-bit kernel that
   runs: the project's Triton forward (fp16, bf16), torch SDPA's flash and cuDNN backends,
   flash-attn if installed, each --kernel given (an FP8 kernel declared with
   ``flashcheck.kernel(fn, dtypes=("e4m3",), arithmetic="flash-fp8", ...)`` taking
   ``descale_q=, descale_k=, descale_v=``), and the numpy references (exact flash-fp8
   emulation, fp16 naive) on the CPU. Beside the paper's figures.
2. With an FP8 --kernel: one FP8 report (``flashcheck report --kernel SPEC --kernel triton
   ... --preset gpu --name gpu-fp8``): the FP8 kernels' campaign and Table 3 over every kernel,
   written to reports/gpu-fp8/error-report.md (``--n`` is then the preset's 4096).
Prints the tables last.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.harness.adapters.fp8_contract import fp8_kernels
from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.campaign.fp8_report import run_fp8_report
from flashcheck.harness.campaign.fp8_table import TABLE3_PAPER, table3_rows
from flashcheck.harness.campaign.report import ReportOptions

REFERENCES = ("triton", "sdpa-flash", "sdpa-cudnn", "flash-attn")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", action="append", default=[], help="an FP8 kernel spec")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="gpu")
    args = ap.parse_args()
    adapters = {}
    for spec in (*args.kernel, *REFERENCES):
        try:
            adapters[spec] = resolve(spec)
        except Exception as err:  # a library not installed here: say so, go on
            print(f"skip {spec}: {err}")
    t0 = time.time()
    rc = 0
    if any(fp8_kernels(a) for a in adapters.values()):
        # one FP8 report: the campaign of the FP8 kernels, Table 3 over every kernel
        opts = ReportOptions(
            kernels=tuple(adapters), preset=args.preset, device=args.device, name="gpu-fp8"
        )
        rc = run_fp8_report(opts)
        text = (Path("reports/gpu-fp8/error-report.md")).read_text()
        print(f"\n({time.time() - t0:.0f} s) reports/gpu-fp8/error-report.md, exit {rc}")
        print(text[text.index("## FP8: FlashAttention-3's Table 3") :])
        return rc
    rows = table3_rows(adapters, n=args.n, device=args.device)
    print(f"\nTable 3 (N = {args.n}, d = 128; {time.time() - t0:.0f} s)")
    print("| kernel | inputs | RMSE vs exact | RMSE vs own inputs | note |")
    print("|---|---|---|---|---|")
    for r in rows:
        if r.vs_exact is None or r.vs_own is None:
            print(f"| {r.kernel} | {r.dtype} | – | – | {r.error} |")
        else:
            print(f"| {r.kernel} | {r.dtype} | {r.vs_exact:.3g} | {r.vs_own:.3g} | |")
    print("\nPaper: " + "; ".join(f"{w} {v:.2g}" for w, v in TABLE3_PAPER))
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
