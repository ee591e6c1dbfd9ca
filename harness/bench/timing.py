"""GPU wall-clock of one call, the way attention kernels are compared.

Each run is bracketed by CUDA events on the current stream, after warm-up runs (which also
pay for JIT compilation and autotuning); the figure is the median over the timed runs. Kernels
to be compared are best timed in turn (:func:`time_round_robin`), so that they share the clocks
of a GPU that runs at its power limit. Inputs
rotate through several copies whose total size exceeds the L2 cache, so a kernel is not
credited with reading back its previous call's operands from L2.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Timing", "copies_for_l2", "time_cuda", "time_interleaved", "time_round_robin"]

# H100's L2 is 50 MiB; two of it so that no copy survives one rotation.
ROTATE_BYTES = 100 * 2**20
MAX_COPIES = 8


@dataclass(frozen=True)
class Timing:
    """Per-run milliseconds of the timed runs, in order."""

    runs_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.runs_ms)

    @property
    def spread(self) -> float:
        """(p90 − p10) / median: how steady the runs were."""
        xs = sorted(self.runs_ms)
        lo, hi = xs[len(xs) // 10], xs[(9 * len(xs)) // 10]
        return (hi - lo) / self.median_ms if self.median_ms > 0 else 0.0


def copies_for_l2(bytes_per_copy: int) -> int:
    """How many input copies to rotate through so that their total exceeds ``ROTATE_BYTES``."""
    if bytes_per_copy <= 0:
        raise ValueError(f"bytes_per_copy must be positive, got {bytes_per_copy}")
    return max(1, min(MAX_COPIES, math.ceil(ROTATE_BYTES / bytes_per_copy)))


def time_cuda(
    fn: Callable[..., Any],
    inputs: Sequence[tuple],
    *,
    warmup: int = 5,
    reps: int = 30,
    min_ms: float = 200.0,
    max_reps: int = 200,
) -> Timing:
    """Median-of-runs timing of ``fn(*inputs[i % len(inputs)])`` with CUDA events.

    ``reps`` is raised (up to ``max_reps``) until the timed runs add up to about ``min_ms``,
    so short kernels get enough samples for a stable median.
    """
    import torch

    if not inputs:
        raise ValueError("inputs must hold at least one argument tuple")
    if warmup < 1 or reps < 1:
        raise ValueError(f"warmup and reps must be >= 1, got {warmup}, {reps}")
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    # One more timed call sizes the sample.
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn(*inputs[0])
    z.record()
    torch.cuda.synchronize()
    est = max(a.elapsed_time(z), 1e-3)
    n = int(min(max_reps, max(reps, math.ceil(min_ms / est))))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for i, (a, z) in enumerate(events):
        args = inputs[(i + 1) % len(inputs)]
        a.record()
        fn(*args)
        z.record()
    torch.cuda.synchronize()
    return Timing(tuple(a.elapsed_time(z) for a, z in events))


def time_interleaved(
    fns: Sequence[Callable[[], Any]], *, reps: int, warmup: int = 2, seed: int = 0
) -> list[float]:
    """Median milliseconds of each of ``fns`` (CUDA events), the calls interleaved round by
    round after ``warmup`` rounds: variants of one kernel compared this way see the same clocks
    and the same cache state, so their ratio holds even where the absolute times drift. Each
    round takes the functions in a new order (a shuffle seeded by ``seed``): with one fixed
    order, one configuration timed twice in a round read 0.92 of itself at a short shape on an
    H200, and with the order only rotated 0.95-0.98 (it still always ran right after its twin;
    benchmarks/RESULTS.md)."""
    import torch

    if not fns or reps < 1 or warmup < 0:
        raise ValueError(f"need at least one function and reps >= 1, got {len(fns)}, {reps}")
    for _ in range(warmup):
        for f in fns:
            f()
    times: list[list[float]] = [[] for _ in fns]
    order = list(range(len(fns)))
    shuffle = random.Random(seed).shuffle
    for _ in range(reps):
        shuffle(order)
        for i in order:
            f = fns[i]
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            z.record()
            z.synchronize()
            times[i].append(a.elapsed_time(z))
    return [statistics.median(t) for t in times]


def time_round_robin(
    calls: Sequence[tuple[Callable[..., Any], Sequence[tuple]]],
    *,
    warmup: int = 3,
    reps: int = 20,
    min_ms: float = 150.0,
    max_reps: int = 200,
    before: Callable[[], Any] | None = None,
) -> list[Timing]:
    """Per-run milliseconds of each ``(fn, inputs)`` of ``calls``, the calls taken in turn,
    round after round, back to back (CUDA events around each call, one synchronization at the
    end): ``fn(*inputs[r % len(inputs)])`` in round ``r``. ``before()``, if given, is queued
    before every call, outside its events (the decode bench overwrites the L2 cache there).

    Providers timed one after the other are not timed alike on a GPU that runs at its power
    limit: on an H200 the first ran at higher clocks than the ones after it, which shifted the
    ratio of two kernels by up to 15 % (benchmarks/timing_methods.py). In turn, every call sees
    the clocks the whole group runs at. Each call gets at least ``reps`` runs, more (up to
    ``max_reps``) until the group's timed rounds add up to about ``min_ms`` per call."""
    import torch

    if not calls or any(not inputs for _, inputs in calls):
        raise ValueError("calls must hold at least one (fn, inputs) with at least one input")
    if warmup < 1 or reps < 1:
        raise ValueError(f"warmup and reps must be >= 1, got {warmup}, {reps}")
    for r in range(warmup):
        for fn, inputs in calls:
            fn(*inputs[r % len(inputs)])
    torch.cuda.synchronize()
    sizing = []
    for fn, inputs in calls:
        a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
        a.record()
        fn(*inputs[0])
        z.record()
        sizing.append((a, z))
    torch.cuda.synchronize()
    per_call = max(sum(a.elapsed_time(z) for a, z in sizing), 1e-3) / len(calls)
    n = int(min(max_reps, max(reps, math.ceil(min_ms / per_call))))
    events = [[] for _ in calls]
    for r in range(n):
        for i, (fn, inputs) in enumerate(calls):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if before is not None:
                before()
            a.record()
            fn(*inputs[(r + 1) % len(inputs)])
            z.record()
            events[i].append((a, z))
    torch.cuda.synchronize()
    return [Timing(tuple(a.elapsed_time(z) for a, z in ev)) for ev in events]
