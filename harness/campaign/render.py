"""Rendering a campaign's JSONL into ``error-report.md`` (with
:mod:`flashcheck.harness.campaign.figures` PNGs).

The renderer reads nothing but the results file: a report can be re-rendered (after a change to
this module, or on another machine) without re-running a single kernel.

Definitions used in the tables (see docs/report.md):

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
import os
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..core.resultlog import num, read_records

__all__ = ["load", "render_report"]

JUDGED = ("PASS", "FAIL", "FAIL-HARD")
BROKEN = ("BAD-OUTPUT", "ERROR", "TIMEOUT")


def load(path: str | os.PathLike) -> dict[str, Any]:
    """The results file split by record type (``header``, ``results``, ...)."""
    records = read_records(path)
    out: dict[str, Any] = {
        "header": records[0],
        "results": [],
        "structural": [],
        "gradients": [],
        "sessions": [],
        "limitations": [],
        "case_files": {},
        "contracts": {},
        "stopped": [],
        "complete": False,
    }
    for r in records[1:]:
        kind = r.get("type")
        if kind == "result":
            part = r.get("part")
            out[part if part in ("structural", "gradients") else "results"].append(r)
        elif kind == "contract":
            out["contracts"][r["kernel"]] = r
        elif kind == "stopped":
            out["stopped"].append(r)
        elif kind == "session":
            out["sessions"].append(r)
        elif kind == "limitation":
            out["limitations"].append(r)
        elif kind == "case-file":
            out["case_files"][r["key"]] = r
        elif kind == "complete":
            out["complete"] = True
    return out


def _fmt(x: Any, digits: int = 3, nan: str = "–") -> str:
    """A number for a table; ``None`` (not applicable) is "–", NaN is ``nan`` ("NaN" where the
    value is an error: a NaN output is never shown as a small error), ±inf "∞"."""
    if x is None:
        return "–"
    x = num(x)
    if math.isnan(x):
        return nan
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if x == 0:
        return "0"
    if 1e-3 <= abs(x) < 1e5:
        return f"{x:.{digits}g}"
    return f"{x:.{max(1, digits - 1)}e}"


def _metric(rows: Iterable[dict[str, Any]], name: str) -> list[float]:
    """The metric of each row, NaN (an error that is NaN) kept, missing values dropped."""
    vals = [r["metrics"].get(name) for r in rows if "metrics" in r]
    return [num(v) for v in vals if v is not None]


def _max(vals: list[float]) -> float:
    """The max; NaN if any value is NaN (an error no finite value can stand for)."""
    if any(math.isnan(v) for v in vals):
        return float("nan")
    return max(vals) if vals else float("nan")


def _finite_median(vals: list[float]) -> float | None:
    vals = [v for v in vals if math.isfinite(v)]
    return statistics.median(vals) if vals else None


def _groups(results: list[dict[str, Any]], kernels: list[str], dtypes: list[str]):
    by = defaultdict(list)
    for r in results:
        by[(r["kernel"], r["dtype"])].append(r)
    for k in kernels:
        for dt in dtypes:
            if by.get((k, dt)):
                yield k, dt, by[(k, dt)]


def _summary_cells(rows: list[dict[str, Any]]) -> dict[str, str]:
    st = Counter(r["status"] for r in rows)
    judged = [r for r in rows if r["status"] in JUDGED]
    maxes = _metric(judged, "max_ulp")
    return {
        "cases": str(len(judged)),
        "PASS": str(st["PASS"]),
        "FAIL": f"**{st['FAIL']}**" if st["FAIL"] else "0",
        "FAIL-HARD": f"**{st['FAIL-HARD']}**" if st["FAIL-HARD"] else "0",
        "broken": ", ".join(f"{st[s]} {s}" for s in BROKEN if st[s]) or "0",
        "skipped": str(st["SKIP"]),
        "median": _fmt(_finite_median(maxes)),
        "max": _fmt(_max(maxes), nan="NaN") if maxes else "–",
        "util": _fmt(_max([v for v in _metric(judged, "det_util") if not math.isnan(v)])),
        "ratio": _fmt(_max([v for v in _metric(judged, "naive_ratio") if not math.isnan(v)])),
        "nan": _mismatches(judged),
        "lse": "yes" if any(r["metrics"].get("has_lse") for r in judged) else "no",
    }


def _mismatches(judged: list[dict[str, Any]]) -> str:
    """NaN/Inf mismatches on finite inputs (each one a failure) / on NaN-Inf inputs (where the
    documented NaN rule lets ±inf inputs give NaN, see docs/oracle.md)."""
    fin = sum(
        int(num(r["metrics"]["nonfinite_mismatches"]))
        for r in judged
        if r.get("finite_inputs", True)
    )
    nonfin = sum(
        int(num(r["metrics"]["nonfinite_mismatches"]))
        for r in judged
        if not r.get("finite_inputs", True)
    )
    return f"{fin} / {nonfin}"


def _failures(data, kernels, dtypes) -> list[str]:
    """Each distinct failure reason per kernel and dtype, with counts and families."""
    lines = []
    for k, dt, rows in _groups(data["results"], kernels, dtypes):
        reasons: dict[str, list[str]] = defaultdict(list)
        for r in rows:
            if r["status"] in ("FAIL", "FAIL-HARD", *BROKEN):
                for why in r["reasons"][:3]:
                    # Numbers inside a reason vary per case: group on the words.
                    text = re.sub(r"^(FAIL(-HARD)?: )?\d+ ", r"\1N ", why)
                    text = re.sub(r"(convention difference: )\d+ ", r"\1N ", text)
                    text = re.sub(r" \((max|naive)[^)]*\)", "", text)
                    text = re.sub(r"error [-+\d.e]+ above", "error above", text)
                    reasons[f"{r['status']}: {text}" if r["status"] in BROKEN else text].append(
                        r["family"]
                    )
        for why, fams in reasons.items():
            fam = ", ".join(f"{f} ×{n}" for f, n in Counter(fams).most_common())
            lines.append(f"- **{k} {dt}**: {why} — in {len(fams)} of {len(rows)} results ({fam})")
    return lines or ["No FAIL, FAIL-HARD or broken results."]


def _verdict_table(data, kernels, dtypes) -> list[str]:
    lines = [
        "| kernel | dtype | device | cases | PASS | FAIL | FAIL-HARD | raised / hung / bad shape "
        "| skipped | median max-ULP | max ULP | max bound util. | max naive ratio | NaN/Inf "
        "mismatches (finite / NaN-Inf inputs) | LSE checked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, rows in _groups(data["results"], kernels, dtypes):
        c = _summary_cells(rows)
        lines.append(
            f"| {k} | {dt} | {rows[0]['device']} | {c['cases']} | {c['PASS']} | {c['FAIL']} "
            f"| {c['FAIL-HARD']} | {c['broken']} | {c['skipped']} | {c['median']} | {c['max']} "
            f"| {c['util']} | {c['ratio']} | {c['nan']} | {c['lse']} |"
        )
    return lines


def _family_tables(data, kernels, dtypes) -> list[str]:
    out = []
    fams = list(dict.fromkeys(r["family"] for r in data["results"]))
    for fam in fams:
        rows = [r for r in data["results"] if r["family"] == fam]
        out += [
            f"<details><summary><b>{fam}</b> ({sum(r['status'] in JUDGED for r in rows)} "
            "judged results)</summary>",
            "",
            "| kernel | dtype | cases | PASS | FAIL | FAIL-HARD | other | median max-ULP "
            "| max ULP | max bound util. | max naive ratio |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k, dt, grp in _groups(rows, kernels, dtypes):
            c = _summary_cells(grp)
            other = c["broken"] if c["broken"] != "0" else f"{c['skipped']} skipped"
            out.append(
                f"| {k} | {dt} | {c['cases']} | {c['PASS']} | {c['FAIL']} | {c['FAIL-HARD']} "
                f"| {other} | {c['median']} | {c['max']} | {c['util']} | {c['ratio']} |"
            )
        out += ["", "</details>", ""]
    return out


def _shape(r: dict[str, Any]) -> str:
    s, o = r["shape"], r["options"]
    txt = f"B={s['B']} Hq={s['Hq']} Hk={s['Hk']} Nq={s['Nq']} Nk={s['Nk']} d={s['d']}"
    if s["dv"] != s["d"]:
        txt += f" dv={s['dv']}"
    extras = [name for name in ("causal", "mask") if o.get(name)]
    if o.get("window") is not None:
        extras.append(f"window={tuple(o['window'])}")
    if o.get("scale") is not None:
        extras.append(f"scale={o['scale']}")
    return txt + (" " + " ".join(extras) if extras else "")


def _recipe_expr(r: dict[str, Any]) -> str:
    args = ", ".join(
        f"{k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in r["recipe"].items()
    )
    return f"make_case(Recipe({args}))"


def _worst_cases(data, kernels, dtypes, case_dir: str) -> list[str]:
    sev = {"PASS": 0, "FAIL": 1, "FAIL-HARD": 2}
    lines = [
        "| kernel | dtype | verdict | margin | max ULP | bound util. | naive ratio | family (part) "
        "| shape | replay |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    files = data["case_files"]
    for k, dt, rows in _groups(data["results"], kernels, dtypes):
        saved = [r for r in rows if r["key"] in files]
        saved.sort(key=lambda r: (-sev.get(r["status"], 0), -num(r["score"]), r["key"]))
        for r in saved:
            m = r["metrics"]
            cid = files[r["key"]]["case_id"]
            lines.append(
                f"| {k} | {dt} | {r['status']} | {_fmt(r['score'])} "
                f"| {_fmt(m['max_ulp'], nan='NaN')} "
                f"| {_fmt(m['det_util'])} | {_fmt(m['naive_ratio'])} | {r['family']} "
                f"({r['part']}) | {_shape(r)} | `flashcheck replay {cid} --dir {case_dir}` |"
            )
    broken = [r for r in data["results"] if r["status"] in BROKEN]
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
            if (r["kernel"], r["dtype"], r["status"]) in seen:
                continue
            seen.add((r["kernel"], r["dtype"], r["status"]))
            lines.append(f"- **{r['kernel']} {r['dtype']}** {r['status']}: {r['reasons'][0]}  ")
            lines.append(f"  `{_recipe_expr(r)}`")
    return lines


def _fa3_table(data, kernels) -> list[str]:
    rows = [r for r in data["results"] if r["part"] == "fa3" and r["status"] in JUDGED]
    if not rows:
        return ["(no fp16/bf16 outlier cases in this campaign)"]
    dts = [dt for dt in ("fp16", "bf16") if any(r["dtype"] == dt for r in rows)]
    shape = _shape(rows[0])
    lines = [
        f"Inputs: Q, K, V ~ N(0,1) + N(0,100)·Bernoulli(0.001), {shape}, "
        f"{len({r['recipe']['seed'] for r in rows if r['dtype'] == dts[0]})} seeds per dtype. "
        "RMSE of O against the oracle, pooled over all elements. *Correctly rounded* is the "
        "RMSE of the oracle's own output rounded to the format: no kernel can do better.",
        "",
        "| kernel | kind | " + " | ".join(f"RMSE {dt}" for dt in dts) + " |",
        "|---|---|" + "---|" * len(dts),
    ]

    def rmse(grp: list[dict[str, Any]], key: str = "sse") -> float:
        sse = sum(num(r["metrics"][key]) for r in grp)
        n = sum(int(num(r["metrics"]["n_finite"])) for r in grp)
        return math.sqrt(sse / n) if n else float("nan")

    floor = []
    for dt in dts:
        one_per_case = {r["recipe"]["seed"]: r for r in rows if r["dtype"] == dt}
        floor.append(rmse(list(one_per_case.values()), "oracle_rn_sse"))
    lines.append("| correctly rounded | – | " + " | ".join(_fmt(x) for x in floor) + " |")
    for k in kernels:
        grp = [r for r in rows if r["kernel"] == k]
        if not grp:
            continue
        arith = grp[0].get("arithmetic", "flash")  # older results did not record it
        if k.startswith(("naive", "sdpa-math")) or arith == "naive":
            kind = "standard attention"
        else:
            kind = "unknown" if arith == "unknown" else "flash / fused"
        cells = [_fmt(rmse([r for r in grp if r["dtype"] == dt])) for dt in dts]
        lines.append(f"| {k} | {kind} | " + " | ".join(cells) + " |")
    return lines


CLASSES = ("flash", "flash-fa1", "naive", "tf32")


def _contracts(data, kernels) -> list[str]:
    lines = []
    for k in kernels:
        rec = data["contracts"].get(k)
        if rec is None:
            continue
        lines.append(f"- **{k}**: " + "; ".join(rec["lines"]))
    return lines or ["(not recorded: a campaign from before contracts were probed)"]


def _structural_table(data, kernels, dtypes, case_dir: str) -> list[str]:
    rows = data["structural"]
    if not rows:
        return ["(no structural properties in this campaign)"]
    files = data["case_files"]
    lines = [
        "| kernel | dtype | property | PASS | FAIL | raised / hung | skipped | first failure |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, grp in _groups(rows, kernels, dtypes):
        for prop in dict.fromkeys(r["property"] for r in grp):
            mine = [r for r in grp if r["property"] == prop]
            st = Counter(r["status"] for r in mine)
            bad = next((r for r in mine if r["status"] == "FAIL"), None)
            broken = next((r for r in mine if r["status"] in BROKEN), None)
            first = "–"
            if bad is not None:
                first = bad["reasons"][0]
                if bad["key"] in files:
                    first += (
                        f" (`flashcheck replay {files[bad['key']]['case_id']} --dir {case_dir}`)"
                    )
            elif broken is not None:
                first = f"{broken['status']}: {broken['reasons'][0]}"
            fail = f"**{st['FAIL']}**" if st["FAIL"] else "0"
            hung = sum(st[s] for s in BROKEN)
            lines.append(
                f"| {k} | {dt} | {prop} | {st['PASS']} | {fail} | {hung} | {st['SKIP']} | {first} |"
            )
    return lines


def _gradient_table(data, kernels, dtypes, case_dir: str) -> list[str]:
    """Per kernel, dtype and gradient tensor: verdict counts and the largest errors."""
    rows = data["gradients"]
    if not rows:
        return ["(no kernel with a backward in this campaign)"]
    lines = [
        "| kernel | dtype | gradient | cases | PASS | FAIL | FAIL-HARD | raised / hung / bad "
        "shape | skipped | max ULP | max bound util. | max naive ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, dt, grp in _groups(rows, kernels, dtypes):
        st = Counter(r["status"] for r in grp)
        judged = [r for r in grp if r["status"] in JUDGED]
        broken = ", ".join(f"{st[s]} {s}" for s in BROKEN if st[s]) or "0"
        for name, label in (("dq", "dQ"), ("dk", "dK"), ("dv", "dV")):
            per = [r["gradients"][name] for r in judged]
            vs = Counter(g["verdict"] for g in per)
            ulps = [num(g["max_ulp"]) for g in per]
            util = [num(g["det_util"]) for g in per if g["det_util"] is not None]
            ratio = [num(g["naive_ratio"]) for g in per if g["naive_ratio"] is not None]
            fail = f"**{vs['FAIL']}**" if vs["FAIL"] else "0"
            hard = f"**{vs['FAIL-HARD']}**" if vs["FAIL-HARD"] else "0"
            lines.append(
                f"| {k} | {dt} | {label} | {len(per)} | {vs['PASS']} | {fail} | {hard} "
                f"| {broken} | {st['SKIP']} | {_fmt(_max(ulps), nan='NaN') if ulps else '–'} "
                f"| {_fmt(_max(util)) if util else '–'} | {_fmt(_max(ratio)) if ratio else '–'} |"
            )
    files = data["case_files"]
    worst = []
    for k, dt, grp in _groups(rows, kernels, dtypes):
        for r in grp:
            if r["key"] in files:
                cid = files[r["key"]]["case_id"]
                worst.append(
                    f"- **{k} {dt}** {r['status']} ({r['family']}, {_shape(r)}): "
                    f"`flashcheck replay {cid} --dir {case_dir}`"
                )
    if worst:
        lines += ["", "Worst gradient cases, each replayable:", "", *worst]
    return lines


def _class_fit(data, kernels, dtypes) -> list[str]:
    """Bound utilization of each kernel's errors against every arithmetic class."""
    lines = [
        "| kernel | dtype | declared | "
        + " | ".join(f"{c} util. (cases > 1)" for c in CLASSES)
        + " | consistent with |",
        "|---|---|---|" + "---|" * len(CLASSES) + "---|",
    ]
    found = False
    for k, dt, grp in _groups(data["results"], kernels, dtypes):
        judged = [r for r in grp if r["status"] in JUDGED and "class_util" in r]
        if not judged:
            continue
        found = True
        cells, fits = [], []
        for c in CLASSES:
            vals = [r["class_util"].get(c, "absent") for r in judged]
            if all(v == "absent" for v in vals):
                cells.append("n/a")
                continue
            nonfinite = sum(v is None for v in vals)
            finite = [num(v) for v in vals if v not in (None, "absent")]
            over = sum(v > 1 for v in finite) + nonfinite
            top = float("nan") if nonfinite else max(finite, default=0.0)
            cells.append(f"{_fmt(top, nan='NaN')} ({over})")
            if over == 0:
                fits.append(c)
        declared = judged[0].get("arithmetic", "–")
        verdict = ", ".join(fits) if fits else "none: above every class's bound in some case"
        lines.append(f"| {k} | {dt} | {declared} | " + " | ".join(cells) + f" | {verdict} |")
    return lines if found else ["(no judged results with class utilization)"]


def _stopped(data) -> list[str]:
    return [
        f"- **{r['kernel']} {r['dtype']}**: stopped after {r['count']} identical failures "
        f"in a row ({r['reason']}); its remaining cases were not run"
        for r in data["stopped"]
    ]


def _environment(data) -> list[str]:
    lines = []
    sessions = data["sessions"]
    envs = []
    for s in sessions:
        env = {k: v for k, v in s.get("env", {}).items() if k != "argv"}  # argv: how, not what
        if env not in envs:
            envs.append(env)
    for i, env in enumerate(envs):
        if len(envs) > 1:
            lines.append(
                f"Environment {i + 1} of {len(envs)} (the campaign was resumed in a "
                "different environment):"
            )
        lines += ["| | |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in env.items() if k != "argv"]
        lines.append("")
    return lines


def _limitations(data) -> list[str]:
    lines = []
    seen = set()
    for r in data["limitations"]:
        key = (r["kernel"], r["dtype"], r["reason"])
        if key not in seen:
            seen.add(key)
            lines.append(f"- **{r['kernel']}**, {r['dtype']} on {r['device']}: {r['reason']}")
    skips = Counter(
        (r["kernel"], r["reasons"][0]) for r in data["results"] if r["status"] == "SKIP"
    )
    if skips:
        lines += [
            "",
            "Cases outside a kernel's contract (declared or probed; not run, not counted):",
            "",
        ]
        lines += [f"- {k}: {n} × {why}" for (k, why), n in sorted(skips.items())]
    return lines or ["None detected."]


def render_report(
    results_path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    figures: bool = True,
) -> Path:
    """Write ``error-report.md`` (and PNG figures) for the results file; returns its path."""
    data = load(results_path)
    out = Path(out_dir) if out_dir is not None else Path(results_path).parent
    out.mkdir(parents=True, exist_ok=True)
    h = data["header"]
    cfg = h["config"]
    kernels, dtypes = list(cfg["kernels"]), list(cfg["dtypes"])
    case_dir = h.get("case_dir", str(out / "cases"))
    results = data["results"]
    # Every result record counts: a campaign may run only gradient or structural parts.
    every = [*results, *data["structural"], *data["gradients"]]
    st = Counter(r["status"] for r in every)
    figs = []
    if figures:
        from .figures import make_figures

        figs = make_figures(data, out, kernels, dtypes)
    try:
        rel = os.path.relpath(results_path, out)
    except ValueError:  # another drive on Windows
        rel = str(results_path)
    md = [
        f"# flashcheck error report: {cfg['name']}",
        "",
        f"Regenerate every number here with `{h['command']}` "
        f"(campaign preset `{cfg['preset']}`, seed {cfg['seed']}, device {cfg['device']}); "
        f"re-render from the results without re-running: `flashcheck render {results_path}`.",
        f"Raw results: [{Path(rel).name}]({rel}) (one JSON record per kernel and case).",
        "",
        *(
            []
            if data["complete"]
            else [
                f"> **Incomplete campaign**: this report shows the {len(every)} results on file "
                f"so far. Run `{h['command']}` again to resume it (nothing is recomputed).",
                "",
            ]
        ),
        f"**{len(every)} results**: "
        + ", ".join(f"{st[s]} {s}" for s in (*JUDGED, *BROKEN, "SKIP") if st[s])
        + f". Kernels: {', '.join(kernels)}; dtypes: {', '.join(dtypes)} (kernels or dtypes "
        "without results could not run here: see *Limitations*).",
        "",
        "Verdicts (docs/error-bounds.md): FAIL-HARD = an error above the a-priori deterministic "
        "bound, a NaN/Inf where the exact result is finite, or a fully masked row that is not "
        "O = 0 / LSE = −inf; FAIL = above max(2 × the same-precision naive error + 1 ulp, the "
        "probabilistic bound); PASS otherwise. Floored ULP: |ŷ − y| / max(ulp(y), ulp(W)) with "
        "W the row's Σ|p·v|. Kernels of arithmetic class *unknown* are held to the loosest "
        "bound of every class flashcheck knows for the input format (no kernel of a known "
        "precision can exceed it); *Arithmetic classes* below shows which classes' bounds the "
        "measured errors fit. A reason marked *convention difference* departs from flashcheck's "
        "conventions (docs/oracle.md) rather than being a numerical error.",
        "",
        "## Verdicts by kernel and dtype",
        "",
        *_verdict_table(data, kernels, dtypes),
        "",
        "Failure reasons (N: a per-case count; the worst-case table has the numbers):",
        "",
        *_failures(data, kernels, dtypes),
        *(["", *_stopped(data)] if data["stopped"] else []),
        "",
        "## Structural properties",
        "",
        "Each kernel compared with itself: a (batch, head) slice alone vs the batched call, "
        "inputs inside NaN-padded buffers, two runs, permuted keys, NaN inputs, and each option "
        "(causal, window, scale) changing the output where it changes the exact answer. "
        "Bitwise where the kernel declares determinism / batch invariance, else within twice "
        "its bound (docs/properties.md).",
        "",
        *_structural_table(data, kernels, dtypes, case_dir),
        "",
        "## Gradients",
        "",
        "dQ, dK and dV of the kernels with a backward (torch autograd, or a declared backward "
        "function) for an upstream gradient dO drawn from a hash of the inputs, against the "
        "oracle's exact gradients (docs/oracle.md §7): FAIL-HARD above the deterministic bound "
        "of the kernel's backward class (docs/error-bounds.md §11; *unknown*: the loosest) or "
        "NaN/Inf where the exact gradient is finite, FAIL above max(2 × the naive backward's "
        "error + 1 floored ulp, the probabilistic bound). Floored ULP uses each gradient's "
        "floor (dV: Σ_i P|dO|; dQ, dK: |τ|Σ P(|dP| + |D|)|K| or |Q|). Cases: masked rows, "
        "lengths off the block grid, huge logits, ties, windows, two batches of four query "
        "heads on two kv heads.",
        "",
        *_gradient_table(data, kernels, dtypes, case_dir),
        "",
        "## Arithmetic classes",
        "",
        "Largest error / deterministic bound of each class over the judged cases (in brackets: "
        "cases above the bound, NaN/Inf outputs included). A kernel is *consistent with* a "
        "class when no case exceeds that class's bound.",
        "",
        *_class_fit(data, kernels, dtypes),
        "",
        "## Kernel contracts",
        "",
        "What each kernel accepts, declared or found by probing it on tiny inputs; every case "
        "was drawn inside it:",
        "",
        *_contracts(data, kernels),
        "",
    ]
    fig_titles = {
        "error_vs_n": "Error vs sequence length (N(0,1) inputs, one head)",
        "error_vs_logit": "Error vs max |logit| (huge_logits family)",
        "ulp_histogram": "Per-element floored-ULP errors (all judged cases)",
        "bound_utilization": "Deterministic-bound utilization per case",
    }
    for name in figs:
        md += [f"### {fig_titles.get(name, name)}", "", f"![{name}]({name}.png)", ""]
    md += [
        "## Worst cases",
        "",
        "The worst case of each kernel and dtype (by failure margin: the larger of bound "
        "utilization and max ULP / (2·naive + 1); above 1 fails), and up to two more failing "
        "ones. Each replays from its saved case file:",
        "",
        *_worst_cases(data, kernels, dtypes, case_dir),
        "",
        "## FlashAttention-3-style accuracy table",
        "",
        *_fa3_table(data, kernels),
        "",
        "## By input family",
        "",
        *_family_tables(data, kernels, dtypes),
        "## Limitations detected at run time",
        "",
        *_limitations(data),
        "",
        "## Environment",
        "",
        *_environment(data),
    ]
    path = out / "error-report.md"
    tmp = path.with_name(".error-report.md.tmp")
    tmp.write_text("\n".join(md).rstrip() + "\n")
    os.replace(tmp, path)
    return path
