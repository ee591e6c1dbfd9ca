"""The accuracy check of a kernel of a ragged layout on one :class:`RaggedCase`.

Varlen and paged: the kernel runs once on the whole batch; its output is cut into sequences,
and each sequence is judged as the dense case it is (:func:`~.accuracy.check_case`: the oracle,
the bounds of the kernel's class with the sequence's own lengths, the naive baseline). The worst
sequence decides the case's verdict; its reasons name the sequence, its lengths and its worst
element. Every row of the output belongs to a sequence, so a kernel that writes into a
neighbour's rows fails on the neighbour; a sequence with no query rows has nothing to judge.
The generated paged inputs hold NaN in every slot no sequence owns: a kernel that reads past
``cache_seqlens`` returns NaN and fails.

Combine: the merge's output against the merge oracle
(:func:`~flashcheck.harness.oracle.combine.combine_oracle`) and the merge bounds
(:mod:`flashcheck.harness.judging.merge_bounds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel, KernelOutput
from ..adapters.ragged_call import call_ragged, ragged_output, ragged_supports
from ..cases.ragged import RaggedCase
from ..core.status import Status
from ..judging.merge_bounds import MergeBounds, merge_bounds
from ..judging.tensor_verdict import Verdict
from ..judging.verdict import judge
from ..oracle.combine import CombineResult, combine_oracle
from .accuracy import bounds_key, check_case
from .check_results import CheckResult, Replayable
from .ragged_references import SequenceReference, forward_reference
from .text import format_check, format_reason_groups

__all__ = [
    "RaggedCheckResult",
    "check_ragged_case",
    "format_ragged_check",
]


@dataclass(repr=False)
class RaggedCheckResult(Replayable):
    """One kernel judged on one ragged case.

    ``sequences``: the dense :class:`~.accuracy.CheckResult` of each sequence, in batch order
    (``None`` for a sequence with no query rows); ``merge``: for a combine case, the
    :class:`Verdict` of the merged ``O`` and ``LSE`` (with ``ref`` and ``bounds``);
    ``verdict``: the worst status; ``reasons``: each failing sequence's reasons, prefixed by
    the sequence and its lengths; ``case_id``: the saved case file's id, if one was.
    """

    kernel: str
    device: str
    case: RaggedCase
    output: KernelOutput
    sequences: list[CheckResult | None] = field(default_factory=list)
    merge: Verdict | None = None
    ref: CombineResult | None = None
    bounds: MergeBounds | None = None
    case_id: str | None = None
    case_dir: str | None = None
    diagnosis: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> Status:
        if self.merge is not None:
            return self.merge.verdict
        return Status.worst(r.verdict.verdict for r in self.sequences if r is not None)

    @property
    def passed(self) -> bool:
        return self.verdict == Status.PASS

    @property
    def worst_sequence(self) -> int | None:
        """The index of the sequence that decides the verdict (``None`` for combine)."""
        ranked = self._ranked()
        return ranked[0] if ranked else None

    def failing_sequences(self) -> list[int]:
        """The failing sequences' indices, the worst first (as :attr:`worst_sequence` ranks)."""
        return [b for b in self._ranked() if not self.sequences[b].passed]

    def _ranked(self) -> list[int]:
        """The judged sequences' indices, the most severe verdict and the largest bound
        utilization first (in batch order among equals)."""
        judged = [(b, r) for b, r in enumerate(self.sequences) if r is not None]
        judged.sort(
            key=lambda br: (
                br[1].verdict.verdict.severity,
                _finite(br[1].verdict.det_util, failed=not br[1].passed),
            ),
            reverse=True,
        )
        return [b for b, _ in judged]

    @property
    def reasons(self) -> list[str]:
        if self.merge is not None:
            at, of_o, rest = self.merge_reasons()
            return [f"{at}: {r}" if at else r for r in of_o] + rest
        return [f"{head}: {r}" for head, rs in self.reasons_by_sequence() for r in rs]

    def merge_reasons(self) -> tuple[str | None, list[str], list[str]]:
        """A merge's reasons: its worst output element (``"worst element O[s, h, c]"``, or
        ``None`` where O passes), O's reasons, and the others (LSE's)."""
        if self.merge is None:
            raise ValueError("a varlen or paged case has no merge")
        o = self.merge["o"]
        at = None
        if o.verdict != Status.PASS and o.worst:
            at = f"worst element O[{', '.join(map(str, o.worst[0]['index']))}]"
        return at, list(o.reasons), [r for r in self.merge.reasons if r not in o.reasons]

    def reasons_by_sequence(self) -> list[tuple[str, list[str]]]:
        """Each failing sequence's heading (its index, lengths and worst element) and its
        reasons; empty for a combine case."""
        if self.merge is not None:
            return []
        out = []
        for b, res in enumerate(self.sequences):
            if res is None or res.passed:
                continue
            out.append((f"sequence {b} {self._where(b, res)}", list(res.verdict.reasons)))
        return out

    def _where(self, b: int, res: CheckResult) -> str:
        """The sequence's lengths and its worst element, in the layout's own indices: O's
        where O fails, else LSE's."""
        nq, nk = self.case.lengths(b)
        text = f"(Nq={nq}, Nk={nk})"
        o, lse = res.verdict["o"], res.verdict.tensors.get("lse")
        if o.verdict != Status.PASS and o.worst:
            _, h, i, c = o.worst[0]["index"]
            text += f", worst element {self._element('O', b, i, h, c)}"
        elif lse is not None and lse.errors is not None and lse.errors.size:
            errs = np.nan_to_num(lse.errors, nan=np.inf)
            _, h, i = np.unravel_index(int(np.argmax(errs)), errs.shape)
            text += f", worst element {self._element('LSE', b, int(i), int(h))}"
        return text

    def _element(self, name: str, b: int, i: int, h: int, c: int | None = None) -> str:
        last = "" if c is None else f", {c}"
        if self.case.layout == "varlen":
            row = int(self.case.index["cu_seqlens_q"][b]) + i
            at = f"{row}, {h}{last}" if name == "O" else f"{h}, {row}"
            return f"{name}[{at}] (query {i} of the sequence)"
        return f"{name}[{b}, {i}, {h}{last}]" if name == "O" else f"LSE[{b}, {h}, {i}]"

    def as_dict(self) -> dict[str, Any]:
        """The verdict as stored in a case file: the status, the reasons and per sequence
        (or for the merge) the dense verdict's numbers."""
        out: dict[str, Any] = {"verdict": str(self.verdict), "reasons": self.reasons}
        if self.diagnosis:
            out["diagnosis"] = list(self.diagnosis)
        if self.merge is not None:
            out["merge"] = self.merge.as_dict()
        else:
            out["sequences"] = [None if r is None else r.verdict.as_dict() for r in self.sequences]
        return out

    def __str__(self) -> str:
        text = format_ragged_check(self)
        return text + (f"\nreplay: {self.replay}" if self.replay else "")


def _finite(x: float, *, failed: bool) -> float:
    """A utilization for ranking: NaN (no finite error, or no bound: a sequence with no keys)
    ranks first among failures and last among passes (a passing check named an empty
    sequence "the worst", with a table of zeros)."""
    if math.isnan(x):
        return math.inf if failed else -math.inf
    return x


def _sequence_output(case: RaggedCase, out: KernelOutput, b: int) -> KernelOutput:
    """Sequence ``b``'s rows of the kernel's output, as a dense ``(1, Hq, Nq_b, dv)`` output."""
    if case.layout == "varlen":
        cu = case.index["cu_seqlens_q"]
        rows = slice(int(cu[b]), int(cu[b + 1]))
        o = out.o[rows].transpose(1, 0, 2)[None]
        lse = None if out.lse is None else out.lse[:, rows][None]
    else:
        o = out.o[b].transpose(1, 0, 2)[None]
        lse = None if out.lse is None else out.lse[b][None]
    return KernelOutput(np.ascontiguousarray(o), lse, out.o_dtype)


def check_ragged_case(
    adapter: Kernel,
    case: RaggedCase,
    *,
    device: str = "cpu",
    references: Callable[[int], SequenceReference] | None = None,
) -> RaggedCheckResult:
    """Judge ``adapter`` on ``case`` (module docstring); the kernel must take the case's
    layout (``ValueError`` otherwise). ``references(b)``, where given, returns sequence
    ``b``'s :class:`~.ragged_references.SequenceReference` computed elsewhere (called after
    the kernel ran, once per sequence with query rows; it may wait for a pool); without it
    each is computed here (:func:`~.ragged_references.forward_reference`)."""
    why = ragged_supports(adapter, case)
    if why:
        raise ValueError(f"{case.layout} case outside {adapter.name}'s contract: {why}")
    out = ragged_output(adapter, case, call_ragged(adapter, case, device))
    res = RaggedCheckResult(adapter.name, device, case, out)
    if case.layout == "combine":
        return _judge_merge(res)
    for b in range(case.sequences):
        if case.lengths(b)[0] == 0:
            res.sequences.append(None)
            continue
        seq = case.sequence(b)
        if references is None:
            pre = forward_reference(
                seq, arithmetic=adapter.arithmetic, key_block=adapter.key_block, tanh=adapter.tanh
            )
        else:
            pre = references(b)
        # A sequence with no keys has no bounds (its reference says None): its rows must be
        # exactly O = 0, LSE = −inf, which the judge demands of such rows by itself.
        bounds = {bounds_key(adapter, seq): pre.bounds}
        got = _sequence_output(case, out, b)
        res.sequences.append(
            check_case(
                adapter,
                seq,
                device=device,
                output=got,
                ref=pre.ref,
                naive=pre.naive,
                bounds_cache=bounds,
            )
        )
    return res


def _judge_merge(res: RaggedCheckResult) -> RaggedCheckResult:
    """The merge judged in the format its ``O`` comes back in: fp32 partials are commonly
    merged into an fp16 or bf16 output (FlashAttention's combine writes the input format)."""
    o_p, lse_p = res.case.tensors["out_partial"], res.case.tensors["lse_partial"]
    ref = combine_oracle(o_p, lse_p, fmt=res.output.o_dtype)
    bounds = merge_bounds(o_p, lse_p, ref.lse.hi + ref.lse.lo, fmt=ref.fmt)
    res.ref, res.bounds = ref, bounds
    res.merge = judge(res.output.o, res.output.lse, ref, bounds, naive_ulp=None)
    return res


def format_ragged_check(res: RaggedCheckResult) -> str:
    """The verdict, its reasons and, for the worst sequence, the dense side-by-side."""
    lines = [f"kernel {res.kernel} on {res.device}: {res.case.describe()}"]
    lines.append(f"verdict {res.verdict}")
    if res.merge is not None:
        # O's worst element once, O's reasons under it (it prefixed every reason, the LSE's
        # among them).
        lines += [f"  - {d}" for d in res.diagnosis]
        at, of_o, rest = res.merge_reasons()
        lines += format_reason_groups([(at, of_o)]) if at else [f"  - {r}" for r in of_o]
        lines += [f"  - {r}" for r in rest]
        for t in res.merge.tensors.values():
            lines.append(t.line())
        return "\n".join(lines)
    # A diagnosis of a failing sequence goes first under its heading, its lengths not said
    # twice (a user read the sequence named in two bullets); others (about an empty sequence
    # beside it, say) stand alone.
    groups, placed = [], set()
    for head, reasons in res.reasons_by_sequence():
        at = head.split(", worst element")[0] + " "
        mine = [d for d in res.diagnosis if d.startswith(at)]
        placed.update(mine)
        groups.append((head, [d.removeprefix(at) for d in mine] + reasons))
    lines += [f"  - {d}" for d in res.diagnosis if d not in placed]
    lines += format_reason_groups(groups)
    b = res.worst_sequence
    if b is not None:
        lines += ["", f"sequence {b} (the worst), as a dense case:"]
        lines.append(format_check(res.sequences[b]))
    return "\n".join(lines)
