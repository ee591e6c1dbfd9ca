"""``error-report.md`` of a campaign on ragged kernels, from its results file alone.

Sections: the verdicts per kernel and dtype (accuracy, and each property), the failures with
the sequence each names and the case file that replays it, batch invariance as measured, the
families, the kernels' contracts and what could not run (docs/report.md, "Ragged batches").
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ..checks.batch_invariance import BATCH_INVARIANT, held_text
from ..core.status import Status
from .ragged_campaign import checks_of
from .ragged_records import RaggedResult, RaggedResults, load_ragged

__all__ = ["render_ragged_report"]

_INTRO = (
    "Each kernel takes a batch of sequences in one call: packed variable-length sequences "
    "(varlen), a KV cache in pages with a block table (paged), or split-KV partial results "
    "to merge (combine). **accuracy**: each sequence of the batch is cut out of the kernel's "
    "output and judged as the dense problem it is (the oracle, the error bounds, the naive "
    "baseline); the worst sequence decides, and its reason names it with its lengths. "
    "**gradients** (varlen kernels with a backward): dQ, dK, dV for a drawn dO, each sequence "
    "judged as the dense gradient check does; keys no query attends to must get exactly 0. Every "
    "slot of the paged cache that no sequence owns holds NaN, so a kernel that reads past "
    "cache_seqlens returns NaN. **sequence-independence**: a sequence's output is bitwise the "
    "same when the other sequences' inputs are drawn again. **page-independence**: the same "
    "with the pages moved in the pool, and with 0 instead of NaN in the unowned slots. "
    "**batch-invariance**: each sequence alone vs inside the batch, bitwise; measured for "
    "every kernel, a failure only for a kernel declared batch-invariant."
)

_FAMILIES = (
    "Families: varlen *block-edges* (lengths around multiples of 16), *empty-sequences* "
    "(no query rows, or no keys), *one-long*; paged *page-sizes* (1, 16, 256, 7 slots), "
    "*shared-prefix* (block tables sharing pages), *decode* (1-8 queries, far more keys than "
    "a split, grouped-query heads); combine *empty-splits*, *all-empty-rows*, *huge-spread*."
)


def _counts(rows: list[RaggedResult]) -> str:
    st = Counter(r.status for r in rows)
    return ", ".join(f"{n} {s}" for s, n in sorted(st.items(), key=lambda x: -x[0].severity))


def _verdicts(data: RaggedResults) -> list[str]:
    checks = ["accuracy", "gradients", "sequence-independence", "page-independence"]
    checks.append("batch-invariance")
    lines = ["| kernel | dtype | " + " | ".join(checks) + " |", "|---" * (len(checks) + 2) + "|"]
    groups: dict[tuple[str, str], list[RaggedResult]] = {}
    for r in data.results:
        groups.setdefault((r.kernel, r.dtype), []).append(r)
    for (k, dt), rows in groups.items():
        applies = {*checks_of(rows[0].layout), *(r.check for r in rows)}
        cells = [
            _cell(c, [r for r in rows if r.check == c]) if c in applies else "n/a" for c in checks
        ]
        lines.append(f"| {k} | {dt} | " + " | ".join(cells) + " |")
    return lines if groups else ["No results on file."]


def _cell(check: str, rows: list[RaggedResult]) -> str:
    """A check's counts; batch invariance of a kernel that does not declare it is measured,
    not judged: its cell says how many cases differed, not PASS."""
    if check != "batch-invariance":
        return _counts(rows)
    measured = [r for r in rows if r.status == Status.PASS]
    varies = [r for r in measured if not (r.reasons and r.reasons[0].startswith(BATCH_INVARIANT))]
    if not measured or not varies:
        return _counts(rows)
    judged = _counts([r for r in rows if r not in measured])
    text = f"measured: differs in {len(varies)} of {len(measured)}"
    return f"{judged}, {text}" if judged else text


def _failures(data: RaggedResults, case_dir: str) -> list[str]:
    bad = [r for r in data.results if r.status.severity > 0 or r.status == Status.FAIL]
    if not bad:
        return ["None."]
    lines = []
    for r in bad:
        why = r.reasons[0] if r.reasons else str(r.status)
        replay = f" (`flashcheck replay {r.case_id} --dir {case_dir}`)" if r.case_id else ""
        lines.append(
            f"- **{r.kernel} {r.dtype}**, {r.check} **{r.status}**, {r.family}: {why}{replay}"
        )
        lines.append(f"  <br>case: {r.case}")
    return lines


def _invariance(data: RaggedResults) -> list[str]:
    """Per kernel and dtype: over how many cases each sequence alone gave the bits it gave
    inside the batch, and the first case where it did not."""
    groups: dict[tuple[str, str], list[RaggedResult]] = {}
    for r in data.results:
        if r.check == "batch-invariance" and r.status.counted:
            groups.setdefault((r.kernel, r.dtype), []).append(r)
    lines = []
    for (k, dt), rows in groups.items():
        held = [r for r in rows if r.reasons and r.reasons[0].startswith(BATCH_INVARIANT)]
        if len(held) == len(rows):
            text = held_text(len(rows), elsewhere="other batches may differ")
            lines.append(f"- {k} {dt}: batch-invariant: {text}")
            continue
        first = next(r for r in rows if r not in held)
        gated = " (declared: a failure)" if first.status == Status.FAIL else ""
        lines.append(
            f"- {k} {dt}: differs in {len(rows) - len(held)} of {len(rows)} cases{gated}; "
            f"first, {first.family}: {first.reasons[0] if first.reasons else first.status}"
        )
    return lines or ["Not measured."]


def _contracts(data: RaggedResults) -> list[str]:
    lines = []
    for rec in data.contracts:
        lines.append(f"- **{rec.kernel}**: " + "; ".join(rec.lines))
    for lim in data.limitations:
        what = "could not run at all" if lim.no_run else "not run"
        lines.append(f"- {lim.kernel} {lim.dtype} {what} on {lim.device}: {lim.reason}")
    return lines or ["None recorded."]


def render_ragged_report(results_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write ``error-report.md`` for a ragged campaign's results file; returns its path."""
    data = load_ragged(results_path)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    h, cfg = data.header, data.header.config
    case_dir = h.case_dir or str(out / "cases")
    md = [
        f"# flashcheck error report: {cfg.name}",
        "",
        f"Regenerate every number here with `{h.command}` (preset `{cfg.preset}`, seed "
        f"{cfg.seed}, device {cfg.device}); re-render without re-running: "
        f"`flashcheck render {results_path}`.",
        "",
        *(
            []
            if data.complete
            else ["> **Incomplete campaign**: run the same command again to resume it.", ""]
        ),
        f"**{len(data.results)} results**: {_counts(list(data.results)) or 'none'}.",
        "",
        "## Ragged batches",
        "",
        _INTRO,
        "",
        *_verdicts(data),
        "",
        _FAMILIES,
        "",
        "### Failures",
        "",
        *_failures(data, case_dir),
        "",
        "### Batch invariance",
        "",
        *_invariance(data),
        "",
        "### Kernel contracts and limitations",
        "",
        *_contracts(data),
    ]
    path = out / "error-report.md"
    tmp = path.with_name(".error-report.md.tmp")
    tmp.write_text("\n".join(md).rstrip() + "\n")
    os.replace(tmp, path)
    return path
