"""Rendering a campaign's results file into ``error-report.md`` (with
:mod:`flashcheck.harness.campaign.figures` PNGs).

The renderer reads nothing but the results file: a report can be re-rendered (after a change to
this module, or on another machine) without re-running a single kernel. The tables are in
:mod:`flashcheck.harness.campaign.tables` (forward accuracy) and
:mod:`flashcheck.harness.campaign.sections` (everything else); docs/report.md defines their
columns.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from ..core.status import Status
from .glossary import glossary_markdown
from .logrecords import ResultsFile, load
from .option_sections import OPTIONS_TEXT, options_lines
from .ragged_records import is_ragged_campaign
from .ragged_render import render_ragged_report
from .sections import (
    batch_invariance_lines,
    class_fit,
    contracts,
    environment,
    fit_lines,
    gradient_table,
    limitations,
    stopped,
    structural_table,
)
from .tables import (
    BROKEN,
    JUDGED,
    fa3_table,
    failures,
    family_tables,
    verdict_table,
    worst_cases,
)

__all__ = ["load", "render_report"]

_VERDICTS = (
    "Verdicts (docs/error-bounds.md): FAIL-HARD = an error above the a-priori deterministic "
    "bound, a NaN/Inf where the exact result is finite, or a fully masked row that is not "
    "O = 0 / LSE = −inf; FAIL = above max(2 × the same-precision naive error + 1 ulp, the "
    "probabilistic bound); PASS otherwise. Floored ULP: |ŷ − y| / max(ulp(y), ulp(W)) with "
    "W the row's Σ|p·v|. Kernels of arithmetic class *unknown* are held to the loosest "
    "bound of the classes at or above their input format's precision (the precision floor: "
    "tf32 products count for fp32 inputs only when declared; errors that fit only tf32 are "
    "FAIL-HARD with that reason); the list under the table and *Arithmetic classes* below "
    "show which classes' bounds the measured errors fit. A reason marked *convention "
    "difference* departs from flashcheck's conventions (docs/oracle.md) rather than being a "
    "numerical error."
)
_STRUCTURAL = (
    "Each kernel compared with itself: a (batch, head) slice alone vs the batched call, "
    "inputs inside NaN-padded buffers, two runs, permuted keys, NaN inputs, and each option "
    "(causal, window, scale, and a soft-cap and sinks for kernels that take them) changing "
    "the output where it changes the exact answer; "
    "integrity: inputs (and dO) bitwise unchanged by a call, a returned result bitwise "
    "unchanged by the next call; the backward with dO strided and expanded (stride 0) "
    "against the same dO contiguous. "
    "Bitwise where the kernel declares determinism / batch invariance, else within twice "
    "its bound (docs/properties.md)."
)
_BATCH = (
    "Whether each kernel's outputs for a sequence are bitwise the same computed alone and "
    "inside batches of 2, 3 and 5 sequences (what makes batched inference deterministic). "
    "Measured for every kernel that takes several sequences per call; a difference fails the "
    "gate only for a kernel that declares itself batch-invariant."
)
_GRADIENTS = (
    "dQ, dK and dV of the kernels with a backward (torch autograd, or a declared backward "
    "function) for an upstream gradient dO drawn from a hash of the inputs, against the "
    "oracle's exact gradients (docs/oracle.md §7): FAIL-HARD above the deterministic bound "
    "of the kernel's backward class (docs/error-bounds.md §11; *unknown*: the loosest) or "
    "NaN/Inf where the exact gradient is finite, FAIL above max(2 × the naive backward's "
    "error + 1 floored ulp, the probabilistic bound). Floored ULP uses each gradient's "
    "floor (dV: Σ_i P|dO|; dQ, dK: |τ|Σ P(|dP| + |D|)|K| or |Q|). Cases: masked rows, "
    "lengths off the block grid, huge logits, ties, windows, two batches of four query "
    "heads on two kv heads. Kernels that take soft-capping or sinks also run the *options* "
    "part's cases (their shapes say `softcap c` / `sinks`), forward and backward, with the "
    "sink gradient dσ judged as its own row."
)
_CLASSES = (
    "Largest error / deterministic bound of each class over the judged cases (in brackets: "
    "cases above the bound, NaN/Inf outputs included). A kernel is *consistent with* a "
    "class when no case exceeds that class's bound."
)
_WORST = (
    "The worst case of each kernel and dtype (by failure margin: the larger of bound "
    "utilization and max ULP / (2·naive + 1); above 1 fails), and up to two more failing "
    "ones. Each replays from its saved case file:"
)
_FIGURE_TITLES = {
    "error_vs_n": "Error vs sequence length (N(0,1) inputs, one head)",
    "error_vs_logit": "Error vs max |logit| (huge_logits family)",
    "ulp_histogram": "Per-element floored-ULP errors (all judged cases)",
    "bound_utilization": "Deterministic-bound utilization per case",
}


def _intro(data: ResultsFile, results_path: str | os.PathLike, out: Path) -> list[str]:
    """The title, how to regenerate the report, and the count of every status."""
    h = data.header
    cfg = h.config
    try:
        rel = os.path.relpath(results_path, out)
    except ValueError:  # another drive on Windows
        rel = str(results_path)
    # Every result record counts: a campaign may run only gradient or structural parts.
    every = data.every_result
    incomplete = [
        f"> **Incomplete campaign**: this report shows the {len(every)} results on file "
        f"so far. Run `{h.command}` again to resume it (nothing is recomputed).",
        "",
    ]
    return [
        f"# flashcheck error report: {cfg.name}",
        "",
        f"Regenerate every number here with `{h.command}` "
        f"(campaign preset `{cfg.preset}`, seed {cfg.seed}, device {cfg.device}); "
        f"re-render from the results without re-running: `flashcheck render {results_path}`.",
        f"Raw results: [{Path(rel).name}]({rel}) (one JSON record per kernel and case).",
        "",
        *([] if data.complete or data.coverage else incomplete),
        *(
            [f"> **Stopped at its time budget**: {data.coverage.text()}", ""]
            if data.coverage is not None
            else []
        ),
        f"**{len(every)} results**: "
        + (
            "; ".join(
                f"{what} {len(rows)} ({_counted(rows)})"
                for what, rows in (
                    ("accuracy", data.results),
                    ("structural", data.structural),
                    ("gradients", data.gradients),
                )
                if rows
            )
            or "none"
        )
        + f". Kernels: {', '.join(cfg.kernels)}; dtypes: {', '.join(cfg.dtypes)} (kernels or "
        "dtypes without results could not run here: see *Limitations*).",
        "",
        _VERDICTS,
        "",
        "<details><summary>Glossary: the words of this report</summary>",
        "",
        *glossary_markdown(),
        "",
        "</details>",
        "",
    ]


def _counted(rows) -> str:
    """``"12 PASS, 1 FAIL-HARD"``: the statuses of ``rows`` in the tables' order."""
    st = Counter(r.status for r in rows)
    return ", ".join(f"{st[s]} {s}" for s in (*JUDGED, *BROKEN, Status.SKIP) if st[s])


def _body(data: ResultsFile, case_dir: str) -> list[str]:
    """Verdicts, failure reasons, structural properties, gradients, classes and contracts."""
    kernels, dtypes = data.header.config.kernels, data.header.config.dtypes
    fits = fit_lines(data, kernels, dtypes)
    fits_intro = ["", "Arithmetic classes whose deterministic bound every judged case fits:", ""]
    return [
        "## Verdicts by kernel and dtype",
        "",
        *verdict_table(data, kernels, dtypes),
        *(fits_intro if fits else []),
        *fits,
        "",
        "Failure reasons (N: a per-case count; the worst-case table has the numbers):",
        "",
        *failures(data, kernels, dtypes),
        *(["", *stopped(data)] if data.stopped else []),
        "",
        "## Structural properties",
        "",
        _STRUCTURAL,
        "",
        *structural_table(data, kernels, dtypes, case_dir),
        "",
        "## Batch invariance",
        "",
        _BATCH,
        "",
        *batch_invariance_lines(data, kernels, dtypes),
        "",
        "## Gradients",
        "",
        _GRADIENTS,
        "",
        *gradient_table(data, kernels, dtypes, case_dir),
        "",
        "## Soft-capping and sinks",
        "",
        OPTIONS_TEXT,
        "",
        *options_lines(data, kernels, dtypes, case_dir),
        "",
        "## Arithmetic classes",
        "",
        _CLASSES,
        "",
        *class_fit(data, kernels, dtypes),
        "",
        "## Kernel contracts",
        "",
        "What each kernel accepts, declared or found by probing it on tiny inputs; every case "
        "was drawn inside it:",
        "",
        *contracts(data, kernels),
        "",
    ]


def _tail(data: ResultsFile, case_dir: str) -> list[str]:
    """Worst cases, the FlashAttention-3 table, per-family tables, limitations, environment."""
    kernels, dtypes = data.header.config.kernels, data.header.config.dtypes
    return [
        "## Worst cases",
        "",
        _WORST,
        "",
        *worst_cases(data, kernels, dtypes, case_dir),
        "",
        "## FlashAttention-3-style accuracy table",
        "",
        *fa3_table(data, kernels),
        "",
        "## By input family",
        "",
        *family_tables(data, kernels, dtypes),
        "## Limitations detected at run time",
        "",
        *limitations(data),
        "",
        "## Environment",
        "",
        *environment(data),
    ]


def render_report(
    results_path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    figures: bool = True,
) -> Path:
    """Write ``error-report.md`` (and PNG figures) for the results file; returns its path."""
    data = load(results_path)
    out = Path(out_dir) if out_dir is not None else Path(results_path).parent
    if is_ragged_campaign(data.header):
        return render_ragged_report(results_path, out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = data.header.config
    case_dir = data.header.case_dir or str(out / "cases")
    figs: list[str] = []
    left_out = None
    if figures:
        from .figures import figures_unavailable, make_figures

        left_out = figures_unavailable()
        if left_out is None:
            figs = make_figures(data, out, list(cfg.kernels), list(cfg.dtypes))
    md = [*_intro(data, results_path, out), *_body(data, case_dir)]
    if left_out is not None:
        md += [f"*Figures left out: {left_out}.*", ""]
    for name in figs:
        md += [f"### {_FIGURE_TITLES.get(name, name)}", "", f"![{name}]({name}.png)", ""]
    md += _tail(data, case_dir)
    path = out / "error-report.md"
    tmp = path.with_name(".error-report.md.tmp")
    tmp.write_text("\n".join(md).rstrip() + "\n")
    os.replace(tmp, path)
    return path
