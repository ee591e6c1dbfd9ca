"""``flashcheck report --kernel SPEC`` for FP8 kernels (``e4m3``/``e5m2`` among their dtypes).

Same command, folder (``reports/<name>/error-report.md``, ``results.jsonl``, ``cases/``) and
exit statuses as the dense campaign: 0 when nothing failed, 1 when a case failed, 2 for a usage
error. For each kernel and each of its FP8 dtypes, every family of
:mod:`flashcheck.harness.cases.fp8_families` at a few seeds (causal and not, where the kernel
takes ``causal``) is judged by the accuracy check (the flash-fp8 class's bounds, or the class
the kernel declares); a failing case is saved and its replay command printed. The report adds
FlashAttention-3's Table 3 (:mod:`.fp8_table`) over every kernel named, 16-bit ones included
(those get no campaign here: run their own report). The kernels run in this process; the contract
is the declared one (no probe): declare an FP8 kernel with ``flashcheck.kernel(fn,
dtypes=("e4m3",), ...)``. Each case is written to ``results.jsonl`` as it is judged, with a
progress line on stderr; an interrupted run resumes from the same command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from ..adapters.adapter import Kernel
from ..adapters.call_limit import CallLimit, KernelHung, limit_calls
from ..adapters.fp8_contract import check_signature, fp8_kernels
from ..adapters.registry import resolve
from ..cases.case import Case
from ..cases.fp8_families import FP8_FAMILIES, Fp8Recipe, make_fp8_case
from ..cases.store import save_case
from ..checks.accuracy import check_case
from ..core.progress import Progress
from ..core.resultlog import ResultLog
from ..core.status import Status
from .fp8_table import MAX_ROWS, TABLE3_PAPER, Table3Row, table3_rows
from .report import ReportOptions, default_name

__all__ = ["Fp8Result", "fp8_run", "run_fp8_report"]

# Per preset: seeds per family, (Nq, Nk, d) of the families and N of Table 3.
_SIZES = {
    "smoke": (1, (8, 40, 16), 128),
    "cpu": (2, (16, 80, 64), 256),
    "gpu": (4, (64, 300, 128), 4096),
}


@dataclass(frozen=True)
class Fp8Result:
    """One FP8 case judged: kernel, dtype, family, seed, causal, status and why."""

    kernel: str
    dtype: str
    family: str
    seed: int
    causal: bool
    status: str
    det_util: float | None
    reasons: tuple[str, ...]
    case_id: str | None


def fp8_run(specs: Sequence[str]) -> bool:
    """Whether ``specs`` name an FP8 kernel: then the report is the FP8 campaign, and the
    16-bit kernels named beside it appear in its Table 3 only."""
    return any(fp8_kernels(resolve(s)) for s in specs)


def _recipes(adapter: Kernel, dtype: str, preset: str, seed: int) -> list[Fp8Recipe]:
    seeds, (nq, nk, d), _ = _SIZES[preset]
    d = min(d, adapter.max_head_dim)
    if adapter.head_dims is not None:
        d = min(adapter.head_dims, key=lambda x: abs(x - d))
    hq, hk = (2, 1) if adapter.gqa else (1, 1)
    takes_causal = adapter.options is None or "causal" in adapter.options
    out = []
    for family in FP8_FAMILIES:
        long = family == "fp8_uniform_long"
        for s in range(seeds):
            causal = bool(s % 2) and takes_causal and not long
            shape = dict(nq=2, nk=1024) if long else dict(nq=nq, nk=nk)
            if not adapter.unequal_lengths and not long:
                shape["nq"] = nk
            out.append(
                Fp8Recipe(family, dtype, 1, hq, hk, d=d, causal=causal, seed=seed + s, **shape)
            )
    return out


def _judge(adapter: Kernel, case: Case, device: str, case_dir: Path, spec: str) -> Fp8Result:
    rec = case.params["recipe"]
    head = (spec, case.dtype, case.family, rec["seed"], case.causal)
    why = adapter.supports(case, device)
    if why is not None:
        return Fp8Result(*head, str(Status.NOT_APPLICABLE), None, (why,), None)
    before = {n: np.array(x, copy=True) for n, x in _inputs(case).items()}
    _ = case.problem  # the exact inputs, taken before the kernel can touch them
    try:
        res = check_case(adapter, case, device=device)
    except Exception as err:  # a kernel that raises on an input inside its contract
        status, util, reasons = Status.ERROR, None, (f"{type(err).__name__}: {err}",)
        verdict = {"verdict": str(status), "reasons": list(reasons)}
    except KernelHung as err:  # stopped by the time limit (--timeout)
        status, util, reasons = Status.TIMEOUT, None, (str(err),)
        verdict = {"verdict": str(status), "reasons": list(reasons)}
    else:
        v = res.verdict
        status, util, reasons = v.verdict, v.det_util, tuple(v.reasons)
        verdict = v.as_dict()
    changed = [n for n, x in _inputs(case).items() if not np.array_equal(x, before[n])]
    if changed:  # integrity: a numpy kernel is handed the case's own arrays
        status = Status.FAIL_HARD
        reasons = (f"FAIL-HARD: the kernel modified its input(s) {', '.join(changed)}", *reasons)
        verdict = {"verdict": str(status), "reasons": list(reasons)}
    cid = None
    if status.failed:
        cid = _save(spec, rec, device, verdict, case_dir)
    return Fp8Result(*head, str(status), util, reasons, cid)


def _save(spec: str, rec: dict, device: str, verdict: dict, case_dir: Path) -> str | None:
    """Save the case of ``rec`` as drawn (whatever the kernel did to its inputs)."""
    ctx = {"property": "accuracy", "campaign": "fp8"}
    pristine = make_fp8_case(Fp8Recipe(**rec))
    return save_case(
        pristine, kernel=spec, device=device, verdict=verdict, context=ctx, directory=case_dir
    )


def _inputs(case: Case) -> dict[str, np.ndarray]:
    return {"q": case.bits("q"), "k": case.bits("k"), "v": case.bits("v"), **case.descales}


def run_fp8_report(opts: ReportOptions, *, echo=print) -> int:
    """Run the FP8 campaign of ``opts.kernels`` and write its report (module docstring)."""
    import torch

    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    preset = opts.preset or ("gpu" if device == "cuda" else "cpu")
    if preset not in _SIZES:
        raise ValueError(f"the FP8 campaign takes --preset {'/'.join(_SIZES)}, got {preset!r}")
    folder = Path(opts.out) / (opts.name or default_name(device, opts.kernels))
    case_dir = folder / "cases"
    folder.mkdir(parents=True, exist_ok=True)
    adapters = {s: resolve(s) for s in opts.kernels}
    for spec, adapter in adapters.items():
        if fp8_kernels(adapter):
            check_signature(spec, adapter)
    if opts.arithmetic is not None:  # --arithmetic: for the kernels that declare none
        adapters = {
            s: replace(a, arithmetic=opts.arithmetic) if a.arithmetic == "unknown" else a
            for s, a in adapters.items()
        }
    work = [
        (spec, adapter, recipe)
        for spec, adapter in adapters.items()
        for dtype in fp8_kernels(adapter)
        for recipe in _recipes(adapter, dtype, preset, opts.seed)
    ]
    header = {
        "tool": "flashcheck report (FP8)",
        "config": {
            "kernels": list(adapters),
            "preset": preset,
            "seed": opts.seed,
            "device": device,
            "arithmetic": opts.arithmetic,
        },
    }
    # Each case is written as it is judged: an interrupted run keeps them, and the same
    # command resumes after the last one. The kernels run in this process, each call under
    # --timeout (none with --no-isolate); a call the limit cannot stop is recorded by `stuck`
    # before the process ends, so that the resumed run does not call it again.
    current: list[tuple[str, Fp8Recipe]] = []
    with (
        ResultLog.open(folder / "results.jsonl", header, fresh=opts.fresh) as log,
        limit_calls(_limit(opts, log, current, device, case_dir)),
    ):
        done = {_key(r): r for r in _logged(log)}
        prog = Progress(len(work), done_cost=sum(_wkey(w) in done for w in work), label="report ")
        for spec, adapter, recipe in work:
            if _wkey((spec, adapter, recipe)) in done:
                continue
            note = f"{spec} {recipe.fmt} {recipe.family}/{recipe.seed}"
            prog.advance(0, note)
            current[:] = [(spec, recipe)]
            r = _judge(adapter, make_fp8_case(recipe), device, case_dir, spec)
            current.clear()
            log.append({"type": RESULT_TYPE, **asdict(r)})
            done[_key(r)] = r
            prog.advance(1, note)
            if Status(r.status).failed:
                why = "; ".join([*r.reasons[:1], *(x for x in r.reasons if "consistent" in x)])
                echo(f"{r.status} {spec} {r.dtype} {r.family} seed={r.seed}: {why}")
                echo(f"  replay: flashcheck replay {r.case_id} --dir {case_dir}")
        prog.finish()
    results = [done[_wkey(w)] for w in work]
    n = _SIZES[preset][2]
    with limit_calls(CallLimit(opts.timeout) if opts.isolate else None):
        table = table3_rows(adapters, n=n, device=device, seed=opts.seed)
    (folder / "error-report.md").write_text(_render(results, table, n, preset))
    failed = [r for r in results if Status(r.status).failed]
    echo(f"FP8 campaign: {len(results)} cases, {len(failed)} failed; report: {folder}")
    return 1 if failed else 0


def _limit(opts: ReportOptions, log: ResultLog, current: list, device: str, case_dir: Path):
    """The campaign's limit on kernel calls (``None`` with ``--no-isolate``); its ``on_stuck``
    writes the case in ``current`` as ``TIMEOUT`` and saves it."""
    if not opts.isolate:
        return None

    def stuck(what: str, _case: object) -> None:
        if not current:
            return
        spec, recipe = current[0]
        why = f"{what} did not return, and could not be interrupted: the campaign stopped here"
        rec = asdict(recipe)
        cid = _save(spec, rec, device, {"verdict": str(Status.TIMEOUT), "reasons": [why]}, case_dir)
        head = (spec, recipe.fmt, recipe.family, recipe.seed, recipe.causal)
        log.append({"type": RESULT_TYPE, **asdict(Fp8Result(*head, "TIMEOUT", None, (why,), cid))})

    return CallLimit(opts.timeout, on_stuck=stuck)


RESULT_TYPE = "fp8-result"


def _key(r: Fp8Result) -> tuple:
    return (r.kernel, r.dtype, r.family, r.seed, r.causal)


def _wkey(item: tuple) -> tuple:
    spec, _, recipe = item
    return (spec, recipe.fmt, recipe.family, recipe.seed, recipe.causal)


def _logged(log: ResultLog) -> list[Fp8Result]:
    """The results a resumed run has on file already."""
    out = []
    for d in log.records:
        if d.get("type") == RESULT_TYPE:
            fields = {k: v for k, v in d.items() if k != "type"}
            out.append(Fp8Result(**{**fields, "reasons": tuple(fields["reasons"])}))
    return out


def _render(results: list[Fp8Result], table: list, n: int, preset: str) -> str:
    lines = [
        "# FP8 error report",
        "",
        f"Preset {preset}. Every case is judged against the exact result of its FP8 inputs "
        "times their descales, by the flash-fp8 class's bounds (docs/error-bounds.md, "
        "section 14).",
        "",
        "| kernel | dtype | family | seed | causal | status | det. utilization | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        util = "" if r.det_util is None else f"{r.det_util:.3g}"
        why = r.reasons[0].replace("|", "\\|")[:160] if r.reasons else ""
        lines.append(
            f"| {r.kernel} | {r.dtype} | {r.family} | {r.seed} | {r.causal} | {r.status} "
            f"| {util} | {why} |"
        )
    lines += [
        "",
        "## FP8: FlashAttention-3's Table 3",
        "",
        f"RMSE against the exact result on N(0,1) + N(0,100)·Bernoulli(0.001) inputs, N = {n}, "
        f"d = 128 (the paper: N = 4096), over {min(n, MAX_ROWS)} evenly spaced query rows. "
        "*vs exact* is against the exact attention of the "
        "unquantized (fp32) inputs, as the paper measures (input quantization included); "
        "*vs own inputs* against the exact attention of the inputs the kernel was given.",
        "",
        "| kernel | inputs | RMSE vs exact | RMSE vs own inputs | note |",
        "|---|---|---|---|---|",
    ]
    lines += [_table3_line(r) for r in table]
    lines += ["", "The paper's figures (N = 4096, d = 128):", ""]
    lines += [f"- {what}: {val:.2g}" for what, val in TABLE3_PAPER]
    return "\n".join(lines) + "\n"


def _table3_line(r: Table3Row) -> str:
    if r.vs_exact is None or r.vs_own is None:
        return f"| {r.kernel} | {r.dtype} | – | – | {r.error.replace('|', '/')[:160]} |"
    return f"| {r.kernel} | {r.dtype} | {r.vs_exact:.3g} | {r.vs_own:.3g} | |"
