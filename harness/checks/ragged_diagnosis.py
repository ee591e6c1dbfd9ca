"""What a failing ragged case is consistent with, in words a kernel author recognises.

The accuracy check names the failing sequence and its worst element; these diagnoses add the
bug class when the output's pattern points at one:

- a sequence with no query rows sits at the first row of a failing sequence whose first row
  is wrong: a kernel that writes something for the empty sequence writes into its neighbour;
- O is right but LSE matches the exact LSE only with its query heads permuted: LSE written
  with the wrong head mapping (grouped-query heads indexed as (group member, kv head) instead
  of (kv head, group member), or the reverse).

Each diagnosis is a sentence; none changes a verdict.
"""

from __future__ import annotations

import numpy as np

from ..core.status import Status
from .ragged import RaggedCheckResult

__all__ = ["diagnose_ragged"]


def _empty_neighbour(res: RaggedCheckResult, b: int) -> str | None:
    case = res.case
    if case.layout != "varlen":
        return None
    o = res.sequences[b].verdict["o"]
    if o.verdict == Status.PASS or not o.worst or o.worst[0]["index"][2] != 0:
        return None
    cu = case.index["cu_seqlens_q"]
    empty = [a for a in range(case.sequences) if a != b and case.lengths(a)[0] == 0]
    for a in empty:
        if cu[a] == cu[b]:
            nk = case.lengths(a)[1]
            return (
                f"sequence {a} (Nq 0, Nk {nk}) has no query rows and sits at row {int(cu[b])}, "
                f"the first row of sequence {b}, which is wrong there: consistent with a "
                f"zero-length sequence writing into its neighbour's rows"
            )
    return None


def _head_mapping(res: RaggedCheckResult, b: int) -> str | None:
    seq = res.sequences[b]
    lse = seq.verdict.tensors.get("lse")
    if lse is None or lse.verdict == Status.PASS or seq.verdict["o"].verdict != Status.PASS:
        return None
    got, ref = seq.output.lse[0], seq.ref.lse.hi[0]  # (Hq, Nq)
    finite = np.isfinite(ref).all(axis=1)
    if got.shape[0] < 2 or not finite.all():
        return None
    dist = np.abs(got[:, None, :] - ref[None, :, :]).max(axis=2)  # kernel head x exact head
    match = dist.argmin(axis=1)
    close = dist[np.arange(len(match)), match] <= 1e-3 * (1 + np.abs(ref).max())
    if not close.all() or (match == np.arange(len(match))).all():
        return None
    moved = ", ".join(f"{h}→{int(m)}" for h, m in enumerate(match) if m != h)
    nq, nk = res.case.lengths(b)
    return (
        f"sequence {b} (Nq {nq}, Nk {nk}): O is right but LSE matches the exact LSE with its "
        f"query heads permuted (LSE head holds exact head: {moved}): consistent with LSE "
        "written with the wrong head mapping for grouped-query heads"
    )


def diagnose_ragged(res: RaggedCheckResult) -> list[str]:
    """Sentences naming the bug class a failing varlen or paged result is consistent with
    (module docstring); empty for a pass, a merge, or a failure with no such pattern."""
    out: list[str] = []
    for b, seq in enumerate(res.sequences):
        if seq is None or seq.passed:
            continue
        for found in (_empty_neighbour(res, b), _head_mapping(res, b)):
            if found is not None and found not in out:
                out.append(found)
    return out
