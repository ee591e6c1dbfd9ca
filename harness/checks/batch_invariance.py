"""``batch-invariance``: a sequence's outputs are bitwise the same computed alone and inside
batches of several sizes.

Batch invariance is what makes batched inference deterministic: a request's tokens must not
depend on which other requests share its batch. A kernel that picks its tiling, its number of
KV splits or its reduction order from the batch size (to fill the GPU) gives each sequence
slightly different roundings in different batches: every result stays within its error bound,
so no accuracy check sees it. This check runs the case's first sequence alone and at a
different position inside batches of :data:`BATCHES` sizes (filled with the case's other
sequences, or copies of the first when it has one), and compares its O (and LSE, where the
kernel returns one) bit for bit.

The finding is measured for every kernel that takes several sequences per call, and gated only
for a kernel that declares ``batch_invariant=True``: undeclared, a difference is a PASS whose
message starts with :data:`NOT_BATCH_INVARIANT` (the report lists it per kernel and dtype).
"""

from __future__ import annotations

import numpy as np

from ..adapters.adapter import Kernel, KernelOutput
from ..cases.case import Case
from .structural import StructuralResult, same_bits

__all__ = [
    "BATCHES",
    "BATCH_INVARIANT",
    "DECLARED_BUT",
    "NOT_BATCH_INVARIANT",
    "NOT_GATED",
    "batch_invariance",
    "held_text",
]

# (batch size, position of the sequence in it): a batch of 2, 3 and 5, the sequence last, first
# and inside, so that both the batch size and the sequence's offset change.
BATCHES = ((2, 1), (3, 0), (5, 3))
BATCH_INVARIANT = "batch-invariant: "
DECLARED_BUT = "declared batch-invariant, but "
NOT_BATCH_INVARIANT = "not batch-invariant (measured; gated only when declared): "
# How a difference is summed up for a kernel that does not declare batch invariance, in the
# report and at the end of `flashcheck test` alike.
NOT_GATED = "no (measured; not declared, so not gated): "


def held_text(cases: int, *, elsewhere: str) -> str:
    """The summary where no case differed: a count of samples, not a proof (a user read the
    report's "yes" over three cases against `flashcheck test`'s "no" on a shape it drew).
    ``elsewhere``: where other shapes are drawn."""
    return f"yes, bitwise over {cases} case{'s' * (cases != 1)} ({elsewhere})"


def _first_difference(alone: KernelOutput, inside: KernelOutput, pos: int) -> str | None:
    """Where the sequence's outputs in a batch first differ from its outputs alone."""
    pairs = [("O", alone.o[0], inside.o[pos])]
    if alone.lse is not None and inside.lse is not None:
        pairs.append(("LSE", alone.lse[0], inside.lse[pos]))
    for name, a, b in pairs:
        if same_bits(a, b):
            continue
        differ = ~((a == b) | (np.isnan(a) & np.isnan(b)))
        i = tuple(int(x) for x in np.argwhere(differ)[0])
        at = ", ".join(str(x) for x in i)
        return (
            f"{name} differs in {int(differ.sum())} of {a.size} elements; first {name}[{at}] = "
            f"{float(a[i])!r} alone, {float(b[i])!r}"
        )
    return None


def batch_invariance(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The case's first sequence alone against the same sequence inside larger batches,
    bitwise; FAIL only for a kernel declared batch-invariant."""
    if not adapter.batched:
        return StructuralResult.not_applicable("the kernel takes one (batch, head) slice per call")
    b_n = case.shape[0]
    alone = adapter.run(case.take([0]), device)
    others = list(range(1, b_n)) or [0]
    for size, pos in BATCHES:
        fill = iter(others * size)
        order = [0 if i == pos else next(fill) for i in range(size)]
        found = _first_difference(alone, adapter.run(case.take(order), device), pos)
        if found is None:
            continue
        where = f"{found} at position {pos} of a batch of {size} (sequence 0 of this case)"
        if adapter.batch_invariant:
            return StructuralResult.failed(DECLARED_BUT + where)
        return StructuralResult.passed(NOT_BATCH_INVARIANT + where)
    sizes = ", ".join(str(s) for s, _ in BATCHES)
    return StructuralResult.passed(
        f"{BATCH_INVARIANT}the sequence alone and inside batches of {sizes}: bitwise equal"
    )
