"""Why two timing methods disagree on the soft-cap's cost: the plain and the capped forward
(approximate tanh) timed five ways on one CUDA GPU.

    python benchmarks/timing_methods.py [--n 4096,16384] [--reps 40]

bf16, d = 128, H = 16, B·N = 16K, non-causal, ``flash_attention`` with its default tiles.
Until 2026-11-29 ``flashcheck bench`` timed each provider's calls back to back over input
copies rotated past the L2 cache, one provider after the other (method A);
``benchmarks/probe_softcap_configs.py`` interleaves the variants and synchronizes after every
call on one input set (D). The other methods change one thing at a time: B is A on one input
set, C is D over rotated copies, E takes the two kernels in turn, back to back, without
synchronizing (``time_round_robin``, what the bench does now). Prints per method each
kernel's median milliseconds and the capped/plain ratio.
"""

from __future__ import annotations

import argparse
import time

from probe_softcap_configs import bench_inputs  # the shapes and inputs of the other probes

from flashcheck.harness.bench.timing import (
    copies_for_l2,
    time_cuda,
    time_interleaved,
    time_round_robin,
)


def five_ways(n: int, plain, capped, reps: int) -> tuple[int, dict[str, list[float]]]:
    """The number of rotated copies at ``n`` keys, and each method's medians (plain, capped)."""
    one = tuple(bench_inputs(n, 3))
    copies = copies_for_l2(3 * one[0].numel() * one[0].element_size())
    flat = bench_inputs(n, 3 * copies)
    rotated = [tuple(flat[3 * i : 3 * i + 3]) for i in range(copies)]
    turn = {"i": 0}

    def rotating(f):
        def call():
            turn["i"] += 1
            return f(*rotated[turn["i"] % copies])

        return call

    methods = {
        "A bench: back to back, rotated": lambda: [
            time_cuda(f, rotated, reps=reps).median_ms for f in (plain, capped)
        ],
        "B back to back, one set": lambda: [
            time_cuda(f, [one], reps=reps).median_ms for f in (plain, capped)
        ],
        "C interleaved + sync, rotated": lambda: time_interleaved(
            [rotating(plain), rotating(capped)], reps=reps
        ),
        "D probe: interleaved + sync, one set": lambda: time_interleaved(
            [lambda: plain(*one), lambda: capped(*one)], reps=reps
        ),
        "E interleaved back to back, rotated": lambda: [
            t.median_ms
            for t in time_round_robin([(plain, rotated), (capped, rotated)], reps=reps, min_ms=0.0)
        ],
    }
    ms = {}
    for name, run in methods.items():
        # Wall-clock stamps, to line the methods up with a clock and power log taken beside.
        print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} start {name}")
        ms[name] = run()
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} end")
    return copies, ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="4096,16384")
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args(argv)
    import torch

    from flashcheck.kernels.triton_flash import flash_attention

    print(f"device: {torch.cuda.get_device_name()}", flush=True)

    def plain(q, k, v):
        return flash_attention(q, k, v)

    def capped(q, k, v):
        return flash_attention(q, k, v, softcap=2.0, approx_tanh=True)

    rows = []
    for n in (int(x) for x in args.n.split(",")):
        copies, ms = five_ways(n, plain, capped, args.reps)
        for method, (p, c) in ms.items():
            rows.append(f"| {n} | {copies} | {method} | {p:.3f} | {c:.3f} | {c / p:.3f} |")
            print(rows[-1], flush=True)
    print("\n| N | copies | method | plain ms | capped ms | capped/plain |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
