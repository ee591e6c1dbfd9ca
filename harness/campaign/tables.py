"""The forward-accuracy tables of ``error-report.md``: verdicts by kernel and dtype, failure
reasons, worst cases, the FlashAttention-3-style RMSE table and the per-family tables, with the
number formatting every table of the report shares.

Definitions (see docs/report.md):

- *judged* cases are those with a verdict (PASS, FAIL or FAIL-HARD); SKIP (outside the kernel's
  declared contract), ERROR, TIMEOUT and BAD-OUTPUT are counted apart;
- *max ULP* is the largest floored-ULP error of O in a case; the tables give the median over
  cases of that maximum, and the maximum over cases;
- *bound util.* is error / deterministic bound, maximized over elements (O) — above 1 is a
  FAIL-HARD; *naive ratio* is max ULP / the same-precision naive kernel's max ULP on the case;
- RMSE in the FlashAttention-3 table pools all elements of all outlier cases:
  ``sqrt(Σ err² / Σ n)``.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from ..checks.text import elide_shapes
from ..core.status import Status
from .logrecords import (
    ResultsFile,
)
from .resultrecords import (
    AccuracyResult,
    ResultRecord,
)

__all__ = [
    "BROKEN",
    "HUGE_MARK",
    "HUGE_NOTE",
    "HUGE_ULP",
    "JUDGED",
    "fa3_table",
    "failures",
    "family_tables",
    "finite_max",
    "fmt",
    "groups",
    "shape_text",
    "status_counts",
    "verdict_table",
    "worst_cases",
    "worst_key",
]

# Statuses in the order the report lists them.
JUDGED = tuple(s for s in Status if s.judged)
BROKEN = tuple(s for s in Status if s.broken)

R = TypeVar("R", bound=ResultRecord)


def fmt(x: float | None, digits: int = 3, nan: str = "–") -> str:
    """A number for a table; ``None`` (not applicable) is "–", NaN is ``nan`` ("NaN" where the
    value is an error: a NaN output is never shown as a small error), ±inf "∞"."""
    if x is None:
        return "–"
    x = float(x)
    if math.isnan(x):
        return nan
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(1, digits - 1)}e}"


def _metric(rows: Iterable[AccuracyResult], name: str) -> list[float]:
    """The metric of each row, NaN (an error that is NaN) kept, missing values dropped."""
    vals = (r.metric(name) for r in rows)
    return [float(v) for v in vals if v is not None]


def finite_max(vals: list[float]) -> float:
    """The max; NaN if any value is NaN (an error no finite value can stand for)."""
    if any(math.isnan(v) for v in vals):
        return float("nan")
    return max(vals) if vals else float("nan")


def _finite_median(vals: list[float]) -> float | None:
    vals = [v for v in vals if math.isfinite(v)]
    return statistics.median(vals) if vals else None


def groups(
    results: Iterable[R], kernels: Sequence[str], dtypes: Sequence[str]
) -> Iterator[tuple[str, str, list[R]]]:
    """``(kernel, dtype, results)`` in the campaign's kernel and dtype order, non-empty only."""
    by: dict[tuple[str, str], list[R]] = defaultdict(list)
    for r in results:
        by[(r.kernel, r.dtype)].append(r)
    for k in kernels:
        for dt in dtypes:
            if by.get((k, dt)):
                yield k, dt, by[(k, dt)]


def status_counts(rows: Iterable[ResultRecord]) -> Counter[Status]:
    """How many results of each status."""
    return Counter(r.status for r in rows)


def _bold(n: int) -> str:
    return f"**{n}**" if n else "0"


def _broken_cell(st: Counter[Status]) -> str:
    return ", ".join(f"{st[s]} {s}" for s in BROKEN if st[s]) or "0"


def _summary_cells(rows: list[AccuracyResult]) -> dict[str, str]:
    st = status_counts(rows)
    judged = [r for r in rows if r.status.judged]
    maxes = _metric(judged, "max_ulp")
    return {
        "cases": str(len(judged)),
        "pass": str(st[Status.PASS]),
        "fail": _bold(st[Status.FAIL]),
        "hard": _bold(st[Status.FAIL_HARD]),
        "broken": _broken_cell(st),
        "skipped": str(st[Status.SKIP]),
        "median": fmt(_finite_median(maxes)),
        "max": _huge(finite_max(maxes), HUGE_ULP, nan="NaN") if maxes else "–",
        "util": fmt(finite_max([u for r in judged if (u := r.utilization) is not None])),
        "ratio": _huge(
            finite_max([v for v in _metric(judged, "naive_ratio") if not math.isnan(v)]), 1e6
        ),
        "nan": _mismatches(judged),
        "lse": "yes" if any(r.metrics and r.metrics.has_lse for r in judged) else "no",
    }


# Beyond these a number needs its reason: more floored ulps than any format has significand
# bits for, or an error a million times the naive kernel's.
HUGE_ULP = 2.0**24
HUGE_MARK = "‡"
HUGE_NOTE = (
    f"{HUGE_MARK} Beyond 2^24 ulp (or 10^6 times the naive kernel's error): there the exact "
    "value and its floor W_c are 0 or tiny, so the floored ulp is the smallest subnormal and an "
    "absolute error of a few units counts as that many subnormals; a naive ratio that large "
    "means the naive kernel was exact there. The worst-case table has each case; `flashcheck "
    "replay` shows the elements."
)


def _huge(x: float, limit: float, nan: str = "–") -> str:
    """:func:`fmt`, marked with :data:`HUGE_MARK` past ``limit`` (finite values only)."""
    text = fmt(x, nan=nan)
    return text + HUGE_MARK if math.isfinite(x) and x >= limit else text


def _mismatches(judged: list[AccuracyResult]) -> str:
    """NaN/Inf mismatches on finite inputs (each one a failure) / on NaN-Inf inputs (where the
    documented NaN rule lets ±inf inputs give NaN, see docs/oracle.md)."""
    fin = sum(int(r.metric("nonfinite_mismatches")) for r in judged if r.finite_inputs)
    nonfin = sum(int(r.metric("nonfinite_mismatches")) for r in judged if not r.finite_inputs)
    return f"{fin} / {nonfin}"


def _reason_words(why: str) -> str:
    """A failure reason without its per-case numbers: failures group on the words."""
    text = re.sub(r"^(FAIL(-HARD)?: )?\d+ ", r"\1N ", why)
    text = re.sub(r"(convention difference: )\d+ ", r"\1N ", text)
    text = re.sub(r" \((max|naive)[^)]*\)", "", text)
    return re.sub(r"error [-+\d.e]+ above", "error above", elide_shapes(text))


def failures(data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]) -> list[str]:
    """Each distinct failure reason per kernel and dtype, with counts and families."""
    lines = []
    for k, dt, rows in groups(data.results, kernels, dtypes):
        reasons: dict[str, list[str]] = defaultdict(list)
        for r in rows:
            if r.status.failed:
                # The first three reasons, and every diagnosis ("consistent with ...") after
                # them: the bug class is the line a reader needs, wherever it stands.
                named = [w for w in r.reasons[3:] if w.startswith("consistent with")]
                for why in [*r.reasons[:3], *named]:
                    text = _reason_words(why)
                    reasons[f"{r.status}: {text}" if r.status.broken else text].append(r.family)
        for why, fams in reasons.items():
            fam = ", ".join(f"{f} ×{n}" for f, n in Counter(fams).most_common())
            lines.append(f"- **{k} {dt}**: {why} — in {len(fams)} of {len(rows)} results ({fam})")
    return lines or ["No FAIL, FAIL-HARD or broken results."]


def verdict_table(data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]) -> list[str]:
    """Verdict counts and error summaries per kernel and dtype."""
    lines = [
        "| kernel | dtype | device | cases | PASS | FAIL | FAIL-HARD | raised / hung / bad shape "
        "| skipped | median max-ULP | max ULP | max bound util. | max naive ratio | NaN/Inf "
        "mismatches (finite / NaN-Inf inputs) | LSE checked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, rows in groups(data.results, kernels, dtypes):
        c = _summary_cells(rows)
        lines.append(
            f"| {k} | {dt} | {rows[0].device} | {c['cases']} | {c['pass']} | {c['fail']} "
            f"| {c['hard']} | {c['broken']} | {c['skipped']} | {c['median']} | {c['max']} "
            f"| {c['util']} | {c['ratio']} | {c['nan']} | {c['lse']} |"
        )
    if any(HUGE_MARK in line for line in lines[2:]):
        lines += ["", HUGE_NOTE]
    return lines


def family_tables(data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str]) -> list[str]:
    """One folded table per input family."""
    out = []
    fams = list(dict.fromkeys(r.family for r in data.results))
    for fam in fams:
        rows = [r for r in data.results if r.family == fam]
        out += [
            f"<details><summary><b>{fam}</b> ({sum(r.status.judged for r in rows)} "
            "judged results)</summary>",
            "",
            "| kernel | dtype | cases | PASS | FAIL | FAIL-HARD | other | median max-ULP "
            "| max ULP | max bound util. | max naive ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k, dt, grp in groups(rows, kernels, dtypes):
            c = _summary_cells(grp)
            other = c["broken"] if c["broken"] != "0" else f"{c['skipped']} skipped"
            out.append(
                f"| {k} | {dt} | {c['cases']} | {c['pass']} | {c['fail']} | {c['hard']} "
                f"| {other} | {c['median']} | {c['max']} | {c['util']} | {c['ratio']} |"
            )
        out += ["", "</details>", ""]
    return out


def shape_text(r: ResultRecord) -> str:
    """The case's shape and options, as the tables show them."""
    s, o = r.shape, r.options
    txt = f"B={s.B} Hq={s.Hq} Hk={s.Hk} Nq={s.Nq} Nk={s.Nk} d={s.d}"
    if s.dv != s.d:
        txt += f" dv={s.dv}"
    extras = [name for name, on in (("causal", o.causal), ("mask", o.mask)) if on]
    if o.window is not None:
        extras.append(f"window={o.window}")
    if o.scale is not None:
        extras.append(f"scale={o.scale}")
    if o.softcap is not None:
        extras.append(f"softcap {o.softcap:.4g}")
    if o.sinks is not None:
        extras.append("sinks")
    return txt + (" " + " ".join(extras) if extras else "")


def _recipe_expr(r: ResultRecord) -> str:
    args = ", ".join(f"{k}={v!r}" for k, v in r.recipe.to_json().items())
    return f"make_case(Recipe({args}))"


def worst_key(r: ResultRecord) -> tuple[int, float, str]:
    """Sorts results worst first: by severity, then failure margin, then key."""
    return (-r.status.severity, -r.score, r.key)


def worst_cases(
    data: ResultsFile, kernels: Sequence[str], dtypes: Sequence[str], case_dir: str
) -> list[str]:
    """The saved worst cases, each with its replay command; the first broken result of each
    kernel and dtype with the expression that rebuilds its inputs."""
    lines = [
        "| kernel | dtype | verdict | margin | max ULP | bound util. | naive ratio | family (part) "
        "| shape | replay |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    files = data.case_files
    for k, dt, rows in groups(data.results, kernels, dtypes):
        saved = sorted((r for r in rows if r.key in files), key=worst_key)
        for r in saved:
            cid = files[r.key].case_id
            lines.append(
                f"| {k} | {dt} | {r.status} | {fmt(r.score)} "
                f"| {fmt(r.metric('max_ulp'), nan='NaN')} "
                f"| {fmt(r.utilization)} | {fmt(r.metric('naive_ratio'))} | {r.family} "
                f"({r.part}) | {shape_text(r)} | `flashcheck replay {cid} --dir {case_dir}` |"
            )
    broken = [r for r in data.results if r.status.broken]
    if broken:
        lines += [
            "",
            "Kernels that raised, hung or returned a wrong shape (first per kernel "
            "and dtype; rebuild the inputs with the expression shown, from "
            "`from flashcheck.strategies import Recipe, make_case`):",
            "",
        ]
        seen = set()
        for r in broken:
            if (r.kernel, r.dtype, r.status) in seen:
                continue
            seen.add((r.kernel, r.dtype, r.status))
            lines.append(f"- **{r.kernel} {r.dtype}** {r.status}: {r.reasons[0]}  ")
            lines.append(f"  `{_recipe_expr(r)}`")
    return lines


def _rmse(grp: list[AccuracyResult], key: str = "sse") -> float:
    sse = sum(float(r.metric(key)) for r in grp)
    n = sum(int(r.metric("n_finite")) for r in grp)
    return math.sqrt(sse / n) if n else float("nan")


def fa3_table(data: ResultsFile, kernels: Sequence[str]) -> list[str]:
    """RMSE of O on FlashAttention-3's outlier inputs, pooled over every element."""
    rows = [r for r in data.results if r.part == "fa3" and r.status.judged]
    if not rows:
        return ["(no fp16/bf16 outlier cases in this campaign)"]
    dts = [dt for dt in ("fp16", "bf16") if any(r.dtype == dt for r in rows)]
    shape = shape_text(rows[0])
    lines = [
        f"Inputs: Q, K, V ~ N(0,1) + N(0,100)·Bernoulli(0.001), {shape}, "
        f"{len({r.recipe.seed for r in rows if r.dtype == dts[0]})} seeds per dtype. "
        "RMSE of O against the oracle, pooled over all elements. *Correctly rounded* is the "
        "RMSE of the oracle's own output rounded to the format: no kernel can do better.",
        "",
        "| kernel | kind | " + " | ".join(f"RMSE {dt}" for dt in dts) + " |",
        "|---|---|" + "---|" * len(dts),
    ]
    floor = []
    for dt in dts:
        one_per_case = {r.recipe.seed: r for r in rows if r.dtype == dt}
        floor.append(_rmse(list(one_per_case.values()), "oracle_rn_sse"))
    lines.append("| correctly rounded | – | " + " | ".join(fmt(x) for x in floor) + " |")
    for k in kernels:
        grp = [r for r in rows if r.kernel == k]
        if not grp:
            continue
        arith = grp[0].arithmetic or "flash"  # older results did not record it
        if k.startswith(("naive", "sdpa-math")) or arith == "naive":
            kind = "standard attention"
        else:
            kind = "unknown" if arith == "unknown" else "flash / fused"
        cells = [fmt(_rmse([r for r in grp if r.dtype == dt])) for dt in dts]
        lines.append(f"| {k} | {kind} | " + " | ".join(cells) + " |")
    return lines
