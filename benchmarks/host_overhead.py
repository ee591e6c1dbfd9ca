"""Host (CPU) time per call of the Triton forward, separately from its device time.

    python benchmarks/host_overhead.py [--calls 3000]

On a tiny problem (B = H = 1, N = 128, d = 128, bf16: a few microseconds of GPU work) the
GPU waits for the host, so the wall time of many back-to-back calls divided by their number is
the host's cost of one call. Measured for ``flash_attention`` (checks, configuration choice,
allocation, launch), ``launch`` with the configuration given (no choice), ``check_inputs``
alone, two ``torch.empty`` (the outputs) and SDPA's flash and cuDNN forwards for comparison.
Then, for the bench's N = 1K shapes (B = 16, H = 16, d = 128), the device time per call
(CUDA events, ``triton.testing.do_bench`` median) next to the host time: while the host
time stays below the device time, launches queue up and host overhead costs nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashcheck.kernels.triton_flash import check_inputs, flash_attention, launch, launch_config


def host_us(fn, calls: int) -> float:
    """Median over 5 rounds of the wall time of ``calls`` back-to-back calls, per call (µs)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / calls * 1e6)
    return sorted(rounds)[2]


def sdpa(backend: str, q, k, v, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b = getattr(SDPBackend, backend)

    def fn():
        with sdpa_kernel([b]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def calls(q, k, v, causal: bool) -> dict:
    """The calls timed, by name, on one problem."""
    b, h, n, d = q.shape
    cfg = launch_config(q, k, v, causal=causal)  # what the default path picks, given
    return {
        "flash_attention": lambda: flash_attention(q, k, v, causal=causal),
        "launch (config given)": lambda: launch(
            q, k, v, causal=causal, window=None, scale=d**-0.5, allow_tf32=False, config=cfg
        ),
        "check_inputs": lambda: check_inputs(q, k, v, window=None, scale=None),
        "2 x torch.empty": lambda: (torch.empty_like(q), torch.empty(b, h, n, device=q.device)),
        "sdpa-flash": sdpa("FLASH_ATTENTION", q, k, v, causal),
        "sdpa-cudnn": sdpa("CUDNN_ATTENTION", q, k, v, causal),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    print(
        f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}",
        flush=True,
    )
    rows = []
    for b, h, n in ((1, 1, 128), (16, 16, 1024)):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (
            torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)
        )
        for causal in (False, True):
            for name, fn in calls(q, k, v, causal).items():
                try:
                    hus = host_us(fn, args.calls if n <= 128 else max(200, args.calls // 10))
                    dev = (
                        triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
                        if name != "check_inputs"
                        else float("nan")
                    )
                except Exception as exc:  # a backend that refuses the shape
                    print(f"{name}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                    continue
                rows.append((f"B={b} H={h} N={n}{' causal' if causal else ''}", name, hus, dev))
                print(rows[-1], flush=True)
    print(
        "\n| shape (d = 128, bf16) | call | wall per back-to-back call (µs) | "
        "do_bench median (µs) |"
    )
    print("|---|---|---|---|")
    for shape, name, hus, dev in rows:
        print(f"| {shape} | {name} | {hus:.1f} | {dev:.1f} |")


if __name__ == "__main__":
    main()
