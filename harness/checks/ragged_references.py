"""The reference work of a ragged case, one sequence at a time.

Judging a sequence of a varlen or paged case needs, besides the kernel's output, what the
dense check of that sequence computes (:func:`~.accuracy.check_case`): the oracle's ``O`` and
``LSE``, the naive baseline's errors and the bounds of the kernel's arithmetic class with the
sequence's own lengths; judging its gradients needs the oracle's gradients for the sequence's
``dO``, the naive backward's errors and the gradient bounds. None of it depends on the kernel's
output, so a campaign computes it on other processes while the kernel runs, one task per
sequence (the oracle's cost grows with ``Nq·Nk``: one long sequence is most of a case's work).

The functions here take a dense sequence and plain values (picklable: they run in pool
processes) and compute exactly what the checks compute inline when no reference is given, so
a verdict is the same wherever its reference was computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..cases.case import Case
from ..judging.bounds import Bounds, problem_bounds
from ..judging.gradient_bounds import GradientBounds, problem_gradient_bounds
from ..oracle.evaluate import OracleResult
from .accuracy import case_oracle, gradient_oracle, naive_gradient_reference, naive_reference

__all__ = [
    "GradientSequenceReference",
    "SequenceReference",
    "forward_reference",
    "gradient_reference",
]


@dataclass(frozen=True)
class SequenceReference:
    """What the accuracy check of one sequence needs besides the kernel's output: ``ref`` (the
    oracle), ``naive`` (the naive baseline's O error in floored ulps and LSE error) and
    ``bounds`` (``None`` for a sequence with no keys, whose exact result needs none);
    ``seconds``: the wall time it took."""

    ref: OracleResult
    naive: tuple[float | None, float | None]
    bounds: Bounds | None
    seconds: float


@dataclass(frozen=True)
class GradientSequenceReference:
    """What the gradient check of one sequence needs besides the kernel's gradients: the
    oracle's gradients for the sequence's ``dO``, the naive backward's errors (``None``
    outside its domain) and the gradient bounds; ``seconds`` as for
    :class:`SequenceReference`."""

    ref: OracleResult
    naive: dict[str, float] | None
    bounds: GradientBounds
    seconds: float


def forward_reference(
    seq: Case, *, arithmetic: str, key_block: int | None, tanh: str = "accurate"
) -> SequenceReference:
    """The oracle, the naive baseline and the bounds of class ``arithmetic`` (blocks of
    ``key_block`` keys) of the dense sequence ``seq``. A sequence with no keys gets the oracle
    only: its exact result (``O = 0``, ``LSE = −inf``) is demanded as such, and the bounds'
    reductions over the keys would be empty. ``tanh``: the kernel's soft-cap tanh
    (:func:`~flashcheck.harness.judging.bounds.error_bounds`)."""
    if not isinstance(seq, Case):
        raise TypeError(f"seq must be a dense Case (RaggedCase.sequence(b)), got {type(seq)}")
    t0 = time.perf_counter()
    ref = case_oracle(seq)
    if seq.k.shape[2] == 0:
        return SequenceReference(ref, (None, None), None, time.perf_counter() - t0)
    naive = naive_reference(seq, ref)
    bounds = problem_bounds(seq.problem, arithmetic=arithmetic, key_block=key_block, tanh=tanh)
    return SequenceReference(ref, naive, bounds, time.perf_counter() - t0)


def gradient_reference(
    seq: Case, *, arithmetic: str, key_block: int | None, tanh: str = "accurate"
) -> GradientSequenceReference:
    """The oracle's gradients for ``seq`` and its ``dO`` (:meth:`Case.grad_output`), the naive
    backward's errors and the gradient bounds of the backward class ``arithmetic``."""
    if not isinstance(seq, Case):
        raise TypeError(f"seq must be a dense Case (with its dO), got {type(seq)}")
    t0 = time.perf_counter()
    ref = gradient_oracle(seq)
    naive = naive_gradient_reference(seq, ref)
    bounds = problem_gradient_bounds(
        seq.problem, seq.grad_output(), arithmetic=arithmetic, key_block=key_block, tanh=tanh
    )
    return GradientSequenceReference(ref, naive, bounds, time.perf_counter() - t0)
