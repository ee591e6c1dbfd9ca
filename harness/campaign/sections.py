"""The sections of ``error-report.md`` beyond forward accuracy: structural properties,
gradients, the fit to each arithmetic class, kernel contracts, stopped kernels, limitations and
the environment."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from ..checks.batch_invariance import DECLARED_BUT, NOT_BATCH_INVARIANT, NOT_GATED, held_text
from ..core.status import Status
from ..judging.classes import precision_reason_class
from .logrecords import ResultsFile
from .tables import BROKEN, finite_max, fmt, groups, shape_text, status_counts

__all__ = [
    "CLASSES",
    "batch_invariance_lines",
    "batch_invariance_text",
    "class_fit",
    "contracts",
    "environment",
    "fit_lines",
    "fit_text",
    "gradient_table",
    "limitations",
    "stopped",
    "structural_table",
]

CLASSES = ("flash", "flash-fa1", "naive", "tf32")


def _bold(n: int) -> str:
    return f"**{n}**" if n else "0"


def contracts(data: ResultsFile, kernels: Sequence[str]) -> list[str]:
    """What each kernel accepts, one bullet per kernel."""
    lines = []
    for k in kernels:
        rec = data.contracts.get(k)
        if rec is None:
            continue
        lines.append(f"- **{k}**: " + "; ".join(rec.lines))
    return lines or ["(not recorded: a campaign from before contracts were probed)"]


def structural_table(
    data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str], case_dir: str
) -> list[str]:
    """Per kernel, dtype and property: status counts and the first failure."""
    rows = data.structural
    if not rows:
        if data.stopped:  # the stop came before the structural part
            return ["(none run: the campaign stopped before them; see the stop among the failures)"]
        return ["(no structural properties in this campaign)"]
    files = data.case_files
    lines = [
        "| kernel | dtype | property | PASS | FAIL | raised / hung | skipped | first failure |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, grp in groups(rows, kernels, dtypes):
        for prop in dict.fromkeys(r.property for r in grp):
            mine = [r for r in grp if r.property == prop]
            st = status_counts(mine)
            bad = next((r for r in mine if r.status == Status.FAIL), None)
            broken = next((r for r in mine if r.status.broken), None)
            first = "–"
            if bad is not None:
                first = bad.reasons[0]
                if bad.key in files:
                    first += f" (`flashcheck replay {files[bad.key].case_id} --dir {case_dir}`)"
            elif broken is not None:
                first = f"{broken.status}: {broken.reasons[0]}"
            # A difference measured on a kernel that does not declare batch invariance passes
            # the gate, but is no PASS in this table (a user read "3 PASS" above the section
            # saying "batch-invariant: no").
            ungated = [
                r
                for r in mine
                if r.status == Status.PASS and r.reasons[:1]
                if r.reasons[0].startswith(NOT_BATCH_INVARIANT)
            ]
            passed = str(st[Status.PASS] - len(ungated))
            if ungated:
                passed += f" (+{len(ungated)} differing, not gated)"
                first = ungated[0].reasons[0] if first == "–" else first
            hung = sum(st[s] for s in BROKEN)
            lines.append(
                f"| {k} | {dt} | {prop} | {passed} | {_bold(st[Status.FAIL])} | {hung} "
                f"| {st[Status.SKIP]} | {first} |"
            )
    return lines


def gradient_table(
    data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str], case_dir: str
) -> list[str]:
    """Per kernel, dtype and gradient tensor: verdict counts and the largest errors."""
    rows = data.gradients
    if not rows:
        return ["(no kernel with a backward in this campaign)"]
    lines = [
        "| kernel | dtype | gradient | cases | PASS | FAIL | FAIL-HARD | raised / hung / bad "
        "shape | skipped | max ULP | max bound util. | max naive ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, grp in groups(rows, kernels, dtypes):
        st = status_counts(grp)
        judged = [r for r in grp if r.status.judged and r.gradients is not None]
        broken = ", ".join(f"{st[s]} {s}" for s in BROKEN if st[s]) or "0"
        names = [("dq", "dQ"), ("dk", "dK"), ("dv", "dV")]
        if any("dsinks" in r.gradients for r in judged):
            names.append(("dsinks", "dσ"))  # cases with sinks (the options part)
        for name, label in names:
            per = [r.gradients[name] for r in judged if name in r.gradients]
            vs = Counter(g.verdict for g in per)
            ulps = [float(g.max_ulp) for g in per]
            util = [float(g.det_util) for g in per if g.det_util is not None]
            ratio = [float(g.naive_ratio) for g in per if g.naive_ratio is not None]
            lines.append(
                f"| {k} | {dt} | {label} | {len(per)} | {vs[Status.PASS]} "
                f"| {_bold(vs[Status.FAIL])} | {_bold(vs[Status.FAIL_HARD])} "
                f"| {broken} | {st[Status.SKIP]} "
                f"| {fmt(finite_max(ulps), nan='NaN') if ulps else '–'} "
                f"| {fmt(finite_max(util)) if util else '–'} "
                f"| {fmt(finite_max(ratio)) if ratio else '–'} |"
            )
    files = data.case_files
    worst = []
    for k, dt, grp in groups(rows, kernels, dtypes):
        for r in grp:
            if r.key in files:
                cid = files[r.key].case_id
                worst.append(
                    f"- **{k} {dt}** {r.status} ({r.family}, {shape_text(r)}): "
                    f"`flashcheck replay {cid} --dir {case_dir}`"
                )
    if worst:
        lines += ["", "Worst gradient cases, each replayable:", "", *worst]
    return lines


def batch_invariance_text(results: Iterable[Any]) -> str | None:
    """What the ``batch-invariance`` results of one kernel and dtype found, in one line
    (``None`` when the campaign did not run the property): ``yes`` over how many cases, or
    ``no`` with the first difference and its case (gated only when declared)."""
    rows = [r for r in results if getattr(r, "property", None) == "batch-invariance"]
    if not rows:
        return None
    failed = next((r for r in rows if r.status == Status.FAIL), None)
    if failed is not None:
        diff = failed.reasons[0].removeprefix(DECLARED_BUT)
        return (
            f"batch-invariant: **no**, though declared (gated): {diff}; case {failed.family}, "
            f"{shape_text(failed)}"
        )
    varies = next(
        (
            r
            for r in rows
            if r.status == Status.PASS and r.reasons[0].startswith(NOT_BATCH_INVARIANT)
        ),
        None,
    )
    if varies is not None:
        diff = varies.reasons[0][len(NOT_BATCH_INVARIANT) :]
        return f"batch-invariant: {NOT_GATED}{diff}; case {varies.family}, {shape_text(varies)}"
    passed = sum(r.status == Status.PASS for r in rows)
    if passed:
        other = "other shapes may differ: flashcheck test draws more"
        return f"batch-invariant: {held_text(passed, elsewhere=other)}"
    other = rows[0]
    return f"batch invariance not measured: {other.status}: {other.reasons[0]}"


def batch_invariance_lines(
    data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]
) -> list[str]:
    """One bullet per kernel and dtype: :func:`batch_invariance_text`."""
    lines = []
    for k, dt, grp in groups(data.structural, kernels, dtypes):
        text = batch_invariance_text(grp)
        if text is not None:
            lines.append(f"- **{k} {dt}**: {text}")
    return lines or ["(batch invariance was not measured in this campaign)"]


def _judged(results: Iterable[Any]) -> list[Any]:
    """The judged accuracy results that carry their fit to each class."""
    return [r for r in results if r.status.judged and getattr(r, "class_util", None) is not None]


def _fit(judged: list[Any], cls: str) -> tuple[str, bool] | None:
    """Class ``cls``'s cell (largest utilization, cases above 1) and whether every case fits
    its deterministic bound; ``None`` where the class does not apply."""
    present = [r.class_util for r in judged if cls in r.class_util]
    if not present:
        return None
    vals = [u[cls] for u in present]
    nonfinite = sum(v is None for v in vals)
    finite = [float(v) for v in vals if v is not None]
    over = sum(v > 1 for v in finite) + nonfinite
    top = float("nan") if nonfinite else max(finite, default=0.0)
    return f"{fmt(top, nan='NaN')} ({over})", over == 0


def fit_text(results: Iterable[Any]) -> str | None:
    """``"errors fit: flash, naive; not tf32"``: the classes whose deterministic bound every
    judged result of one kernel and dtype fits, and those it exceeds somewhere (``None``
    without judged results). Results with NaN/Inf outputs fit no class; they are counted apart
    so that they do not hide the fit of the others, and so are the cases with no judgeable
    output (BAD-OUTPUT, ERROR, TIMEOUT): a fit read from a few cases says so."""
    results = list(results)
    judged = _judged(results)
    broken = [r for r in judged if all(v is None for v in r.class_util.values())]
    judged = [r for r in judged if r not in broken]
    fits = [(c, f[1]) for c in CLASSES if (f := _fit(judged, c)) is not None]
    if not fits and not broken:
        return None
    yes = [c for c, ok in fits if ok]
    no = [c for c, ok in fits if not ok]
    text = "errors fit: " + (", ".join(yes) if yes else "no class")
    text += f"; not {', '.join(no)}" if no else ""
    # A case whose errors fit only a reduced class says "declare it"; when other cases exceed
    # that class's bound too, the declaration would not make them pass (a user's bf16 products
    # in an fp32 kernel were read as tf32 case by case).
    named = {precision_reason_class(w) for r in results for w in getattr(r, "reasons", ())}
    named &= set(no)
    for cls in sorted(named):
        text += (
            f"; {cls}, which the reasons of some cases name, does not fit the other cases: "
            f"their arithmetic is below {cls}, and declaring {cls} would not make them pass"
        )
    # Only forward accuracy cases (the records with a class fit) carry an output to judge:
    # a structural or gradient check that raised is counted in its own part of the summary.
    unjudged = sum(1 for r in results if r.status.broken and hasattr(r, "class_util"))
    apart = [
        f"{n} case{'s' if n > 1 else ''} {what}"
        for n, what in (
            (len(broken), "with NaN/Inf outputs"),
            (unjudged, "with no output to judge"),
        )
        if n
    ]
    return text + (f" ({' and '.join(apart)} left out)" if apart else "")


def fit_lines(data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]) -> list[str]:
    """One bullet per kernel and dtype: the classes its errors fit (:func:`fit_text`)."""
    lines = []
    for k, dt, grp in groups(data.results, kernels, dtypes):
        text = fit_text(grp)
        if text is not None:
            lines.append(f"- **{k} {dt}**: {text}")
    return lines


def class_fit(data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]) -> list[str]:
    """Bound utilization of each kernel's errors against every arithmetic class."""
    lines = [
        "| kernel | dtype | declared | "
        + " | ".join(f"{c} util. (cases > 1)" for c in CLASSES)
        + " | consistent with |",
        "|---|---|---|" + "---|" * len(CLASSES) + "---|",
    ]
    found = False
    for k, dt, grp in groups(data.results, kernels, dtypes):
        judged = _judged(grp)
        if not judged:
            continue
        found = True
        cells, fits = [], []
        for c in CLASSES:
            cell = _fit(judged, c)
            cells.append("n/a" if cell is None else cell[0])
            if cell is not None and cell[1]:
                fits.append(c)
        declared = judged[0].arithmetic or "–"
        verdict = ", ".join(fits) if fits else "none: above every class's bound in some case"
        lines.append(f"| {k} | {dt} | {declared} | " + " | ".join(cells) + f" | {verdict} |")
    return lines if found else ["(no judged results with class utilization)"]


def stopped(data: ResultsFile) -> list[str]:
    """The kernels stopped after repeated identical failures."""
    return [
        f"- **{r.kernel} {r.dtype}**: stopped after {r.count} identical failures "
        f"in a row ({r.reason}); its remaining cases were not run"
        for r in data.stopped
    ]


def environment(data: ResultsFile) -> list[str]:
    """One table per distinct environment the campaign ran in."""
    lines = []
    envs = []
    for s in data.sessions:
        env = {k: v for k, v in s.env.items() if k != "argv"}  # argv: how, not what
        if env not in envs:
            envs.append(env)
    for i, env in enumerate(envs):
        if len(envs) > 1:
            lines.append(
                f"Environment {i + 1} of {len(envs)} (the campaign was resumed in a "
                "different environment):"
            )
        lines += ["| | |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in env.items()]
        lines.append("")
    return lines


def _cell(value, sep: str = "; ") -> str:
    """An environment value in one table cell: a mapping (each kernel's source files and
    their digests) as ``key: value`` pairs, a nested one's pairs joined by commas."""
    if isinstance(value, dict):
        return sep.join(f"{k}: {_cell(v, ', ')}" for k, v in value.items()) or "-"
    return str(value)


def limitations(data: ResultsFile) -> list[str]:
    """What could not run here, and the cases outside a kernel's contract."""
    lines = []
    seen = set()
    for r in data.limitations:
        key = (r.kernel, r.dtype, r.reason)
        if key not in seen:
            seen.add(key)
            lines.append(f"- **{r.kernel}**, {r.dtype} on {r.device}: {r.reason}")
    skips = Counter((r.kernel, r.reasons[0]) for r in data.results if r.status == Status.SKIP)
    if skips:
        lines += [
            "",
            "Cases outside a kernel's contract (declared or probed; not run, not counted):",
            "",
        ]
        lines += [f"- {k}: {n} × {why}" for (k, why), n in sorted(skips.items())]
    return lines or ["None detected."]
