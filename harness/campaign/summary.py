"""The terminal's summary of a campaign: per kernel and dtype the verdict counts, the most
frequent reasons and the replay command of the worst case."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from ..core.status import Status
from .logrecords import CaseFileRecord, LimitationRecord, Record, StoppedRecord
from .option_sections import options_summary
from .records import gist
from .resultrecords import GradientResult, ResultRecord, StructuralResult
from .sections import batch_invariance_text, fit_text

__all__ = ["terminal_summary"]


def _counts(statuses: Iterable[Status]) -> str:
    """``"3 FAIL, 12 PASS"``: counts in the order of the statuses' names."""
    return ", ".join(f"{n} {s}" for s, n in sorted(Counter(statuses).items()))


def _group_lines(rows: list[ResultRecord], files: dict[str, str], case_dir: str) -> list[str]:
    """The summary of one kernel and dtype: counts, the frequent reasons, the worst case."""
    k, dt = rows[0].kernel, rows[0].dtype
    struct = [r.status for r in rows if isinstance(r, StructuralResult)]
    grad = [r.status for r in rows if isinstance(r, GradientResult)]
    acc = [r.status for r in rows if not isinstance(r, StructuralResult | GradientResult)]
    segments = [_counts(acc)] if acc else []
    if struct:
        ran = sum(s != Status.SKIP for s in struct)
        # A check that raised, hung or got a wrong shape failed too, and says how.
        failed = [s for s in struct if s not in (Status.PASS, Status.SKIP, Status.NOT_APPLICABLE)]
        text = f"structural: {ran} checks, {len(failed)} failed"
        if any(s != Status.FAIL for s in failed):
            text += f" ({_counts(failed)})"
        if skipped := len(struct) - ran:
            # The report lists these too (SKIP, with why): say so, or the counts disagree.
            text += f", {skipped} skipped"
        segments.append(text)
    if grad:
        segments.append("gradients: " + _counts(grad))
    lines = [f"{k} {dt}: {'; '.join(segments)}"]
    fits = fit_text(rows)
    if fits is not None:
        lines.append(f"    {fits}")
    if (opts := options_summary(rows)) is not None:
        lines.append(f"    {opts}")
    invariance = batch_invariance_text(rows)
    if invariance is not None:
        lines.append(f"    {invariance.replace('**', '')}")
    bad = [r for r in rows if r.status not in (Status.PASS, Status.SKIP)]
    reasons = Counter(gist(why) for r in bad for why in r.reasons[:1])
    example = {gist(why): why for r in reversed(bad) for why in r.reasons[:1]}
    for why, n in reasons.most_common(3):
        lines.append(f"    {n} result{'s' if n > 1 else ''}, e.g. {example[why]}")
    # The bug class the outputs point at, wherever it stands among a result's reasons.
    named = Counter(gist(w) for r in bad for w in r.reasons if w.startswith("consistent with"))
    said = {gist(w): w for r in reversed(bad) for w in r.reasons if w.startswith("consistent")}
    for why, n in named.most_common(2):
        lines.append(f"    {n} result{'s' if n > 1 else ''} {said[why]}")
    worst = sorted(
        (r for r in rows if r.key in files), key=lambda r: (-r.status.severity, -r.score)
    )
    if worst and worst[0].status != Status.PASS:
        lines.append(f"    worst: flashcheck replay {files[worst[0].key]} --dir {case_dir}")
    return lines


def terminal_summary(records: Sequence[Record], case_dir: str) -> list[str]:
    """What the terminal shows at the end: per kernel and dtype the verdict counts, the most
    frequent reasons and the replay command of the worst case."""
    files = {r.key: r.case_id for r in records if isinstance(r, CaseFileRecord)}
    groups: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in records:
        if isinstance(r, ResultRecord):
            groups.setdefault((r.kernel, r.dtype), []).append(r)
    lines = [
        f"{r.kernel} {r.dtype}: could not run at all: {r.reason}"
        for r in records
        if isinstance(r, LimitationRecord) and r.no_run
    ]
    for rows in groups.values():
        lines += _group_lines(rows, files, case_dir)
    # What could not run here, said where the results are read (a user's bf16 under the Triton
    # interpreter was told only in the report's Limitations section).
    lines += list(
        dict.fromkeys(
            f"{r.kernel} {r.dtype}: not run here: {r.reason}"
            for r in records
            if isinstance(r, LimitationRecord) and not r.no_run
        )
    )
    lines += [
        f"{r.kernel} {r.dtype}: stopped after {r.count} identical failures ({r.reason})"
        for r in records
        if isinstance(r, StoppedRecord)
    ]
    return lines
