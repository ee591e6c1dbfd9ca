"""The report's section on soft-capping and attention sinks (the campaign's ``options`` part):
each case with its cap and sinks, its verdict and failure margin, and the kernels the part did
not run on."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..core.status import Status
from .logrecords import ResultsFile
from .resultrecords import GradientResult, ResultRecord
from .tables import fmt, groups, shape_text

__all__ = ["OPTIONS_TEXT", "options_lines", "options_summary"]

OPTIONS_TEXT = (
    "Cases with a soft-cap (scores c·tanh(s/c), c set from the case's own largest score: far "
    "below it, around it, above it) and attention sinks (one logit per query head, from far "
    "below to far above the head's scores; causal rows that keep no key, where O = 0 and "
    "LSE = σ), forward and backward (dσ judged with dQ, dK, dV). They run only on kernels "
    "whose contract takes the options a case sets; for the others they do not apply and are "
    "not run (docs/report.md)."
)


def options_lines(
    data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str], case_dir: str
) -> list[str]:
    """One row per result of the ``options`` part, then the kernels it did not run on."""
    rows = [r for r in data.every_result if r.part == "options"]
    parts = data.header.config.parts
    if parts is not None and "options" not in parts:
        return ["(the options part did not run in this campaign)"]
    files = data.case_files
    lines = [
        "| kernel | dtype | case | shape and options | verdict | margin | reason or replay |",
        "|---|---|---|---|---|---|---|",
    ]
    if not rows:
        lines = ["(no kernel of this campaign takes either option)"]
    for k, dt, grp in groups(rows, kernels, dtypes):
        for r in grp:
            note = r.reason if not r.status.judged else ""
            if r.key in files:
                note = f"`flashcheck replay {files[r.key].case_id} --dir {case_dir}`"
            lines.append(
                f"| {k} | {dt} | {r.tag} | {shape_text(r)} | {r.status} | {fmt(r.score)} "
                f"| {note or '–'} |"
            )
    ran = {r.kernel for r in rows}
    idle = [k for k in kernels if k not in ran]
    # A kernel limited in every dtype of the campaign (no CUDA device, a missing package...)
    # could not run here: its contract may well take the options.
    limited: dict[str, set[str]] = {}
    for lim in data.limitations:
        limited.setdefault(lim.kernel, set()).add(lim.dtype)
    absent = [k for k in idle if set(dtypes) <= limited.get(k, set())]
    lacking = [k for k in idle if k not in absent]
    if lacking:
        lines += [
            "",
            f"Not applicable (their contract takes neither option): {', '.join(lacking)}.",
        ]
    if absent:
        lines += ["", f"Not run (they could not run here at all): {', '.join(absent)}."]
    return lines


def options_summary(rows: Iterable[ResultRecord]) -> str | None:
    """One line for the terminal: of one kernel and dtype's ``options`` results, how many of
    the cases with a soft-cap, with sinks, and of the sink gradients dσ failed (``None``
    without such results). Which of them fail names the option a bug is in."""
    judged = [r for r in rows if r.part == "options" and r.status != Status.SKIP]
    if not judged:
        return None
    words = []
    for name, label in (("softcap", "soft-capped"), ("sinks", "with sinks")):
        mine = [r for r in judged if getattr(r.options, name) is not None]
        if mine:
            bad = sum(r.status.failed for r in mine)
            words.append(f"{label} cases {bad} of {len(mine)} failed")
    ds = [
        r.gradients["dsinks"]
        for r in judged
        if isinstance(r, GradientResult) and r.gradients and "dsinks" in r.gradients
    ]
    if ds:
        words.append(f"dσ {sum(g.verdict.failed for g in ds)} of {len(ds)} failed")
    return "softcap/sinks: " + "; ".join(words)
