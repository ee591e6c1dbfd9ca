"""How a campaign's processes are set up: one thread each, the reference pool's priority, and
which GPU each kernel worker sees.

Every worker process computes single-threaded (``SINGLE_THREAD`` in its environment before it
starts, one torch thread), so that results do not depend on how many workers share the
machine. The reference processes run at a lower priority than the kernel workers, whose calls
are the campaign's critical path. Kernel worker ``i`` sees one GPU, the ``i % n``-th of the
``n`` this process sees.
"""

from __future__ import annotations

import os
import signal

__all__ = [
    "REFERENCE_NICENESS",
    "SINGLE_THREAD",
    "gpu_count",
    "pool_process_setup",
    "warm",
    "worker_gpus",
]

# Set for every worker process before it starts: one thread each, so that results do not
# depend on how many workers share the machine.
SINGLE_THREAD = {
    name: "1"
    for name in (
        "OMP_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
    )
}


def warm() -> None:  # pragma: no cover - runs in pool processes
    """Nothing: submitted once per pool process so that each starts (and imports) early."""


# Added to the reference processes' nice value (Linux: 10 makes a process's share of a busy
# core about a tenth of a default-priority one's).
REFERENCE_NICENESS = 10


def pool_process_setup(torch_too: bool = True) -> None:  # pragma: no cover - in pool processes
    """The reference pool's initializer: Ctrl-C left to the campaign, a lower priority,
    one torch thread (``torch_too``: a pool that never imports torch skips its import)."""
    # Ctrl-C reaches the whole process group; the campaign handles it and shuts the pool down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Kernel calls are the campaign's critical path (an idle kernel worker idles its GPU);
    # a reference only has to be ready when its kernel's result is compared. When a search
    # generation fills every core with references, a kernel worker's host work (launches,
    # compiles, copies) would wait for a time slice behind them; at a lower priority they
    # yield it at once. Results do not depend on the order work runs in.
    try:
        os.nice(REFERENCE_NICENESS)
    except OSError:  # not allowed here (a container's policy): the default priority
        pass
    if not torch_too:
        # Work that never imports torch: its import (a second of CPU per process) is saved; a
        # torch imported later still reads OMP_NUM_THREADS=1.
        return
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def worker_gpus(gpus: int, visible: str | None) -> list[str]:
    """What each kernel worker's ``CUDA_VISIBLE_DEVICES`` names, worker ``i`` taking entry
    ``i % gpus``: the ``gpus`` devices this process sees, as its own ``CUDA_VISIBLE_DEVICES``
    (``visible``) names them, or their indices where it is unset. An index is relative to the
    parent's list: a campaign started with ``CUDA_VISIBLE_DEVICES=2,3`` and workers told ``0``
    and ``1`` would run on the machine's GPUs 0 and 1."""
    if not visible:
        return [str(i) for i in range(gpus)]
    # CUDA stops reading the list at its first invalid entry: the first ``gpus`` are the ones
    # torch counted.
    names = [x.strip() for x in visible.split(",") if x.strip()][:gpus]
    return names if len(names) == gpus else [str(i) for i in range(gpus)]


def gpu_count() -> int:
    """The CUDA devices torch sees here (0 without torch or CUDA)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0
