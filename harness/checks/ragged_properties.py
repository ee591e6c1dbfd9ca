"""Properties of kernels of a ragged layout: one sequence's result against itself, bit for bit.

- ``sequence-independence``: a sequence's O and LSE do not change when every input it does not
  own is drawn again (:func:`~flashcheck.harness.cases.ragged_variants.others_redrawn`). A
  kernel that reads a neighbour's keys, takes a row maximum over them or shares a reduction
  with another sequence changes; a correct one is bitwise the same.
- ``page-independence`` (paged): the pages moved elsewhere in the pool with the block table
  following them, and every slot no sequence owns set to 0 instead of NaN, change nothing. A
  kernel that reads past ``cache_seqlens`` (the last page whole) or orders its sums by where
  pages lie in memory changes.
- ``batch-invariance``: each sequence computed alone and inside the batch is bitwise the same.
  Measured for every kernel, gated only for a kernel declared ``batch_invariant=True`` (a
  kernel that picks its number of KV splits from the batch size is within its error bound
  either way, so no accuracy check sees it).

A difference fails the first two only when the kernel reproduces its own result bit for bit
on the unchanged case; a kernel that does not (atomics, a nondeterministic reduction) gives
these properties nothing to compare, which the result says. Merges (``op="combine"``) have no
sequences: the properties do not apply to them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..adapters.adapter import Kernel, KernelOutput
from ..adapters.ragged_call import call_ragged, ragged_output
from ..cases.ragged import RaggedCase
from ..cases.ragged_variants import (
    others_redrawn,
    pool_permuted,
    sequence_alone,
    unowned_filled,
)
from .batch_invariance import BATCH_INVARIANT, DECLARED_BUT, NOT_BATCH_INVARIANT
from .structural import StructuralResult, same_bits

__all__ = [
    "RAGGED_PROPERTIES",
    "UNSTABLE",
    "batch_invariance",
    "page_independence",
    "sequence_independence",
    "sequence_outputs",
]


UNSTABLE = (
    "the kernel does not reproduce its own result bit for bit on the same case, so a "
    "difference cannot be told from its own variation"
)


def sequence_outputs(case: RaggedCase, out: KernelOutput, b: int) -> dict[str, np.ndarray]:
    """Sequence ``b``'s rows of a kernel's ``O`` (and ``LSE``), in the layout's axes."""
    if case.layout == "varlen":
        rows = case.batch.query_rows(b)
        got = {"O": out.o[rows]}
        if out.lse is not None:
            got["LSE"] = out.lse[:, rows]
    else:
        got = {"O": out.o[b]}
        if out.lse is not None:
            got["LSE"] = out.lse[b]
    return got


def _difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> str | None:
    """Where two outputs of one sequence first differ in their bits, or ``None``."""
    for name, x in a.items():
        y = b.get(name)
        if y is None or same_bits(x, y):
            continue
        differ = ~((x == y) | (np.isnan(x) & np.isnan(y)))
        i = tuple(int(j) for j in np.argwhere(differ)[0])
        at = ", ".join(map(str, i))
        return (
            f"{name} differs in {int(differ.sum())} of {x.size} elements, first "
            f"{name}[{at}] = {float(x[i])!r} vs {float(y[i])!r}"
        )
    return None


def _run(adapter: Kernel, case: RaggedCase, device: str) -> KernelOutput:
    return ragged_output(adapter, case, call_ragged(adapter, case, device))


def _label(case: RaggedCase, b: int) -> str:
    nq, nk = case.lengths(b)
    return f"sequence {b} (Nq={nq}, Nk={nk})"


def _judged(case: RaggedCase) -> list[int]:
    """The sequences that have query rows (the others have no output to compare)."""
    return [b for b in range(case.sequences) if case.lengths(b)[0] > 0]


class _Reference:
    """The kernel's output on the unchanged case, and whether it reproduces it bitwise."""

    def __init__(self, adapter: Kernel, case: RaggedCase, device: str) -> None:
        self.adapter, self.case, self.device = adapter, case, device
        self.out = _run(adapter, case, device)
        self._stable: bool | None = None

    def stable(self) -> bool:
        if self._stable is None:
            again = _run(self.adapter, self.case, self.device)
            self._stable = all(
                _difference(
                    sequence_outputs(self.case, self.out, b),
                    sequence_outputs(self.case, again, b),
                )
                is None
                for b in _judged(self.case)
            )
        return self._stable


def _compare(
    ref: _Reference, variants: list[tuple[str, str, RaggedCase]], proved: str
) -> StructuralResult:
    """Each sequence of ``ref``'s case against the same sequence of each variant
    ``(when, meaning, case)``: the change made and what a difference means."""
    for when, meaning, variant in variants:
        out = _run(ref.adapter, variant, ref.device)
        for b in _judged(ref.case):
            found = _difference(
                sequence_outputs(ref.case, ref.out, b), sequence_outputs(variant, out, b)
            )
            if found is None:
                continue
            if not ref.stable():
                return StructuralResult.not_applicable(UNSTABLE)
            return StructuralResult.failed(
                f"{_label(ref.case, b)}: its output changes when {when}: {found}; {meaning}"
            )
    return StructuralResult.passed(proved)


def sequence_independence(
    adapter: Kernel, case: RaggedCase, device: str, *, seed: int = 0
) -> StructuralResult:
    """Each sequence against the same case with every other sequence's inputs redrawn."""
    if case.layout == "combine":
        return StructuralResult.not_applicable("a merge has no sequences")
    ref = _Reference(adapter, case, device)
    judged = _judged(case)
    # Each variant keeps one sequence's inputs; only that sequence is compared on it.
    for b in judged:
        variant = others_redrawn(case, b, seed=seed + b)
        found = _difference(
            sequence_outputs(case, ref.out, b),
            sequence_outputs(variant, _run(adapter, variant, device), b),
        )
        if found is None:
            continue
        if not ref.stable():
            return StructuralResult.not_applicable(UNSTABLE)
        return StructuralResult.failed(
            f"{_label(case, b)}: its output changes when the inputs of the other "
            f"{case.sequences - 1} sequences change: {found}; it reads or writes outside its "
            "own rows"
        )
    return StructuralResult.passed(
        f"each of {len(judged)} sequences bitwise the same with the others' inputs redrawn"
    )


def page_independence(
    adapter: Kernel, case: RaggedCase, device: str, *, seed: int = 0
) -> StructuralResult:
    """The case against its pool permuted and against its unowned slots set to 0."""
    if case.layout != "paged":
        return StructuralResult.not_applicable(f"a {case.layout} case has no pages")
    ref = _Reference(adapter, case, device)
    return _compare(
        ref,
        [
            (
                "the slots past cache_seqlens and the spare pages hold 0 instead of NaN",
                "it reads slots past cache_seqlens",
                unowned_filled(case, 0.0),
            ),
            (
                "its pages move in the pool (the block table following them)",
                "its result depends on where its pages lie",
                pool_permuted(case, seed=seed),
            ),
        ],
        "every sequence bitwise the same with its pages moved in the pool and the unowned "
        "slots 0 instead of NaN",
    )


def batch_invariance(
    adapter: Kernel, case: RaggedCase, device: str, *, seed: int = 0
) -> StructuralResult:
    """Each sequence alone against the batch, bitwise; FAIL only when declared."""
    if case.layout == "combine":
        return StructuralResult.not_applicable("a merge has no sequences")
    judged = _judged(case)
    if case.sequences < 2 or not judged:
        return StructuralResult.not_applicable("a batch of one sequence")
    whole = _run(adapter, case, device)
    for b in judged:
        alone = sequence_alone(case, b)
        found = _difference(
            sequence_outputs(alone, _run(adapter, alone, device), 0),
            sequence_outputs(case, whole, b),
        )
        if found is None:
            continue
        where = (
            f"{_label(case, b)} alone vs at position {b} of a batch of {case.sequences}: "
            f"{found.replace(' vs ', ' alone, ')} in the batch"
        )
        if adapter.batch_invariant:
            return StructuralResult.failed(DECLARED_BUT + where)
        return StructuralResult.passed(NOT_BATCH_INVARIANT + where)
    return StructuralResult.passed(
        f"{BATCH_INVARIANT}each of {len(judged)} sequences alone and inside the batch of "
        f"{case.sequences}: bitwise equal"
    )


Property = Callable[..., StructuralResult]

# The properties of ragged kernels by name, in the order a campaign runs them.
RAGGED_PROPERTIES: dict[str, Property] = {
    "sequence-independence": sequence_independence,
    "page-independence": page_independence,
    "batch-invariance": batch_invariance,
}
