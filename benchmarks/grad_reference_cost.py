"""What the bench's gradient check costs on the CPU with each softmax option, end to end.

    python benchmarks/grad_reference_cost.py [--n 4096] [--option plain|softcap|sinks ...]

``flashcheck.harness.bench.grad_check.grad_reference`` as ``flashcheck bench --pass bwd`` calls
it for one shape (bf16, d = 128, H = 16, B·N = 16K, non-causal, seeded normal inputs, dK/dV by
the float64 reference: ``--grad-oracle-max-n 0``), on CPU tensors: the certified oracle's dQ on
the 12 sampled rows of two heads, the float64 dK, dV of 12 keys and the naive backward's
errors. On a GPU the last two run on the device; the oracle runs on the CPU either way. One
line per option: seconds, and the oracle's share.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import torch

    from flashcheck.harness.bench.check import sample_rows
    from flashcheck.harness.bench.grad_check import grad_reference
    from flashcheck.harness.oracle import evaluate

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--option", action="append", choices=["plain", "softcap", "sinks"])
    args = ap.parse_args()
    spent = {"oracle": 0.0}
    real = evaluate.oracle

    def timed(*a, **kw):
        t = time.perf_counter()
        try:
            return real(*a, **kw)
        finally:
            spent["oracle"] += time.perf_counter() - t

    evaluate.oracle = timed
    import flashcheck.harness.bench.grad_check as gc

    gc.oracle = timed
    n, h, d = args.n, 16, 128
    print("| N | option | seconds | of which the oracle |")
    print("|---|---|---|---|")
    for option in args.option or ["plain", "softcap", "sinks"]:
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (
            torch.randn(max(1, 16384 // n), h, n, d, generator=g).to(torch.bfloat16)
            for _ in range(4)
        )
        kw = {"softcap": 2.0} if option == "softcap" else {}
        if option == "sinks":
            kw["sinks"] = torch.randn(h, generator=g)
        spent["oracle"] = 0.0
        t = time.perf_counter()
        grad_reference(q, k, v, do, causal=False, rows=sample_rows(n), oracle_max_n=0, **kw)
        print(f"| {n} | {option} | {time.perf_counter() - t:.1f} | {spent['oracle']:.1f} |")


if __name__ == "__main__":
    main()
