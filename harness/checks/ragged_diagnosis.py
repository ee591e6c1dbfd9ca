"""What a failing ragged case is consistent with, in words a kernel author recognises.

The accuracy check names the failing sequence and its worst element; these diagnoses add the
bug class when the output's pattern points at one:

- a sequence with no query rows sits at the first row of a failing sequence whose first rows
  are wrong and the rest right: a kernel that writes something for the empty sequence writes
  into its neighbour;
- a sequence without keys whose rows are not ``O = 0``, ``LSE = −inf`` (where its empty
  neighbour does not explain them): the sequence left unwritten, or divided by its zero sum;
- O is right but LSE matches the exact LSE only with its query heads permuted: LSE written
  with the wrong head mapping (grouped-query heads indexed as (group member, kv head) instead
  of (kv head, group member), or the reverse);
- a varlen sequence's output passes against the exact attention over its keys and the next
  sequence's first key: a key range that runs one past the sequence's end;
- a varlen sequence's output passes against the exact attention over the key rows its query
  offsets would give: the key range taken from ``cu_seqlens_q`` instead of ``cu_seqlens_k``,
  both ends or only its start (its count from ``cu_seqlens_k``);
- a merge returns NaN in the rows whose every split is empty, and only there: it divides by
  (or subtracts) the −inf LSE of those rows.

Each diagnosis is a sentence; none changes a verdict.
"""

from __future__ import annotations

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.ragged import RaggedCase
from ..core.status import Status
from .accuracy import check_case
from .check_results import CheckResult
from .ragged import RaggedCheckResult

__all__ = ["diagnose_ragged"]


def _wrong_rows(seq: CheckResult) -> np.ndarray:
    """Which query rows of a judged sequence hold an O or LSE element the check fails hard:
    beyond its deterministic bound, or not the exact value where that is not finite (LSE
    −inf) or needs no bound (a sequence without keys: ``O = 0``, ``LSE = −inf``)."""
    wrong = np.zeros(seq.output.o.shape[2], bool)
    for name in seq.verdict.tensors:
        y, ref = np.asarray(getattr(seq.output, name), np.float64), seq.ref[name]
        exact = y != ref.hi
        if seq.bounds is not None:
            with np.errstate(invalid="ignore", over="ignore"):
                err = np.abs((y - ref.hi) - ref.lo)
            # ``not <=`` so a NaN output counts as wrong
            exact = np.where(np.isfinite(ref.hi), ~(err <= seq.bounds[name].det), exact)
        wrong |= exact.any(axis=tuple(a for a in range(exact.ndim) if a != 2))
    return wrong


def _empty_neighbour(res: RaggedCheckResult, b: int) -> str | None:
    case, seq = res.case, res.sequences[b]
    if case.layout != "varlen" or seq.verdict.verdict == Status.PASS:
        return None
    cu = case.index["cu_seqlens_q"]
    empty = [a for a in range(case.sequences) if a != b and case.lengths(a)[0] == 0]
    sitting = [a for a in empty if cu[a] == cu[b]]
    if not sitting:
        return None
    # An empty sequence can only have written its neighbour's first rows: with a later row
    # wrong, or every row, something else broke them (a kernel that left a sequence without
    # keys unwritten was told its empty neighbour had written there).
    rows = _wrong_rows(seq)
    wrong = np.flatnonzero(rows)
    n = len(wrong)
    if n == 0 or n == len(rows) or wrong[-1] != n - 1:
        return None
    a = sitting[0]
    said = "which is wrong there" if n == 1 else f"whose first {n} rows are wrong"
    return (
        f"sequence {a} (Nq=0, Nk={case.lengths(a)[1]}) has no query rows and sits at row "
        f"{int(cu[b])}, the first row of sequence {b}, {said} (the rest within their bounds): "
        "consistent with a zero-length sequence writing into its neighbour's rows"
    )


def _keyless(res: RaggedCheckResult, b: int) -> str | None:
    seq = res.sequences[b]
    nq, nk = res.case.lengths(b)
    if nk != 0 or seq.passed:
        return None
    wrong = _wrong_rows(seq)
    if not wrong.any():
        return None
    o = np.asarray(seq.output.o, np.float64)[0][:, wrong]
    held = (
        f"none of its {nq} query rows holds"
        if wrong.all()
        else f"{int(wrong.sum())} of its {nq} query rows do not hold"
    )
    why = "a sequence without keys left unwritten (its rows keep what the output buffer held)"
    if np.isnan(o).any():
        why = (
            "a sequence without keys normalized by its zero sum (O = acc / l with l = 0: 0/0 "
            "is NaN), or left unwritten"
        )
    return (
        f"sequence {b} (Nq={nq}, Nk=0) has no keys, and {held} O = 0, LSE = −inf: "
        f"consistent with {why}"
    )


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
        f"sequence {b} (Nq={nq}, Nk={nk}): O is right but LSE matches the exact LSE with its "
        f"query heads permuted (LSE head holds exact head: {moved}): consistent with LSE "
        "written with the wrong head mapping for grouped-query heads"
    )


def _reads_as(res: RaggedCheckResult, adapter: Kernel, b: int, keys: slice) -> bool:
    """Whether sequence ``b``'s output passes against the exact attention of its query rows
    over the packed key rows ``keys`` (another reading of which keys are its own)."""
    case, seq = res.case, res.sequences[b]
    rq, t = case.batch.query_rows(b), case.tensors
    ext = RaggedCase(
        "varlen",
        {"q": t["q"][rq], "k": t["k"][keys], "v": t["v"][keys]},
        {
            "cu_seqlens_q": np.array([0, rq.stop - rq.start], np.int32),
            "cu_seqlens_k": np.array([0, keys.stop - keys.start], np.int32),
        },
        **case.options(),
    )
    return check_case(adapter, ext.sequence(0), device=res.device, output=seq.output).passed


def _one_past(res: RaggedCheckResult, adapter: Kernel, b: int) -> str | None:
    case, seq = res.case, res.sequences[b]
    if case.layout != "varlen" or seq.verdict["o"].verdict == Status.PASS:
        return None
    rq, rk = case.batch.query_rows(b), case.batch.key_rows(b)
    if rk.stop >= case.tensors["k"].shape[0]:
        return None
    if not _reads_as(res, adapter, b, slice(rk.start, rk.stop + 1)):
        return None
    nq, nk = rq.stop - rq.start, rk.stop - rk.start
    return (
        f"sequence {b} (Nq={nq}, Nk={nk}) returns the attention over its {nk} keys and one "
        "more, the next sequence's first key: consistent with a key range one past the "
        "sequence's end"
    )


def _keys_at_query_offsets(res: RaggedCheckResult, adapter: Kernel, b: int) -> str | None:
    """Sequence ``b``'s output is the attention over the key rows ``cu_seqlens_q`` gives it
    (clipped to the packed keys) rather than ``cu_seqlens_k``'s: both ends from
    ``cu_seqlens_q``, or its start with the count from ``cu_seqlens_k``. (A user's kernel with
    the first bug was told it wrote for an empty sequence into its neighbour, which it never
    did; another user's, with the second, the form real kernels take, was told nothing.)"""
    case, seq = res.case, res.sequences[b]
    if case.layout != "varlen" or seq.verdict["o"].verdict == Status.PASS:
        return None
    rq, rk = case.batch.query_rows(b), case.batch.key_rows(b)
    total = case.tensors["k"].shape[0]
    nq, nk = rq.stop - rq.start, rk.stop - rk.start
    start = min(rq.start, total)
    own = f"its own {rk.start}..{rk.stop - 1}" if nk else "none (it has no keys)"
    readings = (
        (
            slice(start, min(rq.stop, total)),
            "(its query rows' offsets)",
            "the key range taken from cu_seqlens_q instead of cu_seqlens_k",
        ),
        (
            slice(start, min(rq.start + nk, total)),
            f"({nk} keys from its first query row's offset"
            + (", clipped to the packed keys)" if rq.start + nk > total else ")"),
            "the key start taken from cu_seqlens_q instead of cu_seqlens_k (the key count "
            "from cu_seqlens_k)",
        ),
    )
    tried = {(rk.start, rk.stop)}
    for keys, which, bug in readings:
        # (no keys at all, offsets past the packed keys or none of its own: nothing to
        # recompute against; the check of such a case raised)
        if (keys.start, keys.stop) in tried or keys.stop == keys.start:
            continue
        tried.add((keys.start, keys.stop))
        if _reads_as(res, adapter, b, keys):
            return (
                f"sequence {b} (Nq={nq}, Nk={nk}) returns the attention over packed key rows "
                f"{keys.start}..{keys.stop - 1} {which} instead of {own}: consistent with {bug}"
            )
    return None


def _empty_merge(res: RaggedCheckResult) -> str | None:
    lse_p = res.case.tensors["lse_partial"]
    empty = np.isneginf(lse_p).all(axis=0)
    bad = np.isnan(res.output.o).any(axis=-1)
    if not (empty & bad).any() or (bad & ~empty).any():
        return None
    return (
        f"{int((empty & bad).sum())} of the {int(empty.sum())} rows whose every split is empty "
        "(lse = −inf) give NaN, and only those: consistent with a merge that computes "
        "exp(lse_s − LSE) with LSE = −inf (−inf − (−inf) is NaN) instead of O = 0, LSE = −inf"
    )


def diagnose_ragged(res: RaggedCheckResult, adapter: Kernel) -> list[str]:
    """Sentences naming the bug class a failing varlen or paged result is consistent with
    (module docstring); empty for a pass, a merge, or a failure with no such pattern. Only
    the two worst failing sequences are examined (the last diagnosis runs the oracle), so
    the sequence the verdict names is always among them."""
    if res.merge is not None:
        found = None if res.passed else _empty_merge(res)
        return [] if found is None else [found]
    out: list[str] = []
    for b in res.failing_sequences()[:2]:
        # The readings checked against the oracle first: they recompute the sequence, so a
        # match is evidence, where the empty-neighbour rule only reads a pattern (which the
        # cu_seqlens_q reading also makes when an empty sequence shares its first row).
        found = _keys_at_query_offsets(res, adapter, b)
        if found is not None:
            out.append(found)
            continue
        # Where the empty neighbour explains a keyless sequence's wrong first row, the rest
        # of it is right: it was written, and saying otherwise would be a second story.
        for found in (_empty_neighbour(res, b) or _keyless(res, b), _head_mapping(res, b)):
            if found is not None and found not in out:
                out.append(found)
        if not out:
            found = _one_past(res, adapter, b)
            if found is not None:
                out.append(found)
    return out
