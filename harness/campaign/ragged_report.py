"""``flashcheck report --kernel SPEC`` for kernels of a ragged layout or split-KV merges.

The same command, folder layout (``results.jsonl``, ``cases/``, ``error-report.md``) and exit
statuses as the dense campaign (:mod:`flashcheck.harness.campaign.report`): 0 when the gate
found nothing, 1 when it found something, 2 for a usage error. What runs is
:class:`~.ragged_campaign.RaggedCampaign`; its results file names the part ``ragged`` in its
configuration, so ``flashcheck render`` renders it with
:func:`~.ragged_render.render_ragged_report`. Rerunning the same command resumes an
interrupted campaign. The references are computed on ``--workers`` processes (or Ray tasks,
``--executor ray``; in this process with ``--no-isolate``). Options that shape the dense
campaign's plan (``--budget``, ``--part``, ``--palette``) are refused for ragged kernels.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from ..adapters.adapter import Kernel
from ..adapters.call_limit import CallLimit, limit_calls
from ..adapters.palette import DEFAULT_PALETTE
from ..adapters.probe import resolved
from ..checks.batch_invariance import NOT_BATCH_INVARIANT, NOT_GATED
from ..core.environment import environment_record
from ..core.resultlog import ResultLog
from ..core.status import Status
from .executor import Executor, LocalExecutor
from .gates import GATES
from .kernel_sources import ENV_KEY as SOURCES_KEY
from .kernel_sources import check_results_file, checked_digests
from .logrecords import (
    CampaignConfig,
    CompleteRecord,
    ContractRecord,
    Header,
    LimitationRecord,
    SessionRecord,
)
from .ragged_campaign import RaggedCampaign
from .ragged_records import RAGGED_PART, RaggedResult, RaggedResults, parse_ragged
from .records import gist
from .report import ReportOptions, default_name
from .runner import PRESETS
from .selection import check_dtypes, kernel_device, resolve_ragged_kernels

__all__ = ["ragged_findings", "ragged_summary", "run_ragged_report"]


def _refuse_dense_options(opts: ReportOptions) -> None:
    unsupported = [
        (opts.budget is not None, "--budget (the ragged campaign takes seconds on a CPU)"),
        (bool(opts.parts), "--part (its parts are the dense campaign's)"),
        (opts.palette != DEFAULT_PALETTE, "--palette"),
    ]
    refused = [what for on, what in unsupported if on]
    if refused:
        raise ValueError(
            f"{'; '.join(refused)}: not supported for kernels of ragged layouts yet; run the "
            "command without it"
        )


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # the numpy kernels need no torch
        return False


def _command(opts: ReportOptions, cfg: CampaignConfig) -> str:
    """The command that reproduces (and resumes) the campaign."""
    parts = ["flashcheck report", f"--name {cfg.name} --preset {cfg.preset} --seed {cfg.seed}"]
    if opts.device:
        parts.append(f"--device {cfg.device}")
    if tuple(opts.dtypes) != ("fp16", "bf16", "fp32"):
        parts += [f"--dtype {d}" for d in cfg.dtypes]
    parts += [f"--kernel {k}" for k in cfg.kernels]
    if opts.out != "reports":
        parts.append(f"--out {opts.out}")
    return " ".join(parts)


def _setup(opts: ReportOptions) -> tuple[Header, dict[str, Kernel], dict[str, str], Path]:
    if opts.fail_on not in GATES:
        raise ValueError(f"fail_on must be one of {sorted(GATES)}, got {opts.fail_on!r}")
    _refuse_dense_options(opts)
    device = opts.device or ("cuda" if _has_cuda() else "cpu")
    if device == "cuda" and not _has_cuda():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    preset = opts.preset or ("gpu" if device == "cuda" else "cpu")
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: choose from {sorted(PRESETS)}")
    dtypes = check_dtypes(opts.dtypes)
    declared = resolve_ragged_kernels(opts.kernels)
    if opts.arithmetic is not None:
        declared = {
            s: k
            if k.arithmetic != "unknown" or k.op == "combine"
            else replace(k, arithmetic=opts.arithmetic)
            for s, k in declared.items()
        }
    name = opts.name or default_name(device, opts.kernels)
    config = CampaignConfig(
        name, preset, opts.seed, tuple(declared), dtypes, device, parts=(RAGGED_PART,)
    )
    out_dir = Path(opts.out) / name
    header = Header(config, _command(opts, config), str(out_dir / "cases"))
    devices = {s: kernel_device(k, device) for s, k in declared.items()}
    return header, declared, devices, out_dir


def _probe(declared: dict[str, Kernel], devices: dict[str, str], dtypes, echo) -> dict:
    adapters = {}
    for spec, kern in declared.items():
        if devices[spec] == "cuda" and not _has_cuda():
            raise ValueError(
                f"{spec} cannot run here: it runs on {', '.join(kern.devices)} and torch sees "
                "no CUDA device"
            )
        if "dtypes" in kern.pending:
            kern = replace(kern, dtypes=tuple(dt for dt in kern.dtypes if dt in dtypes))
        if kern.pending:
            echo(f"probing the contract of {spec} on {devices[spec]} ...")
        adapters[spec] = resolved(kern, devices[spec])
        if kern.pending:
            for line in adapters[spec].contract_lines():
                echo(f"  {line}")
        why = [adapters[spec].unavailable(dt, devices[spec]) for dt in dtypes]
        if all(why) and adapters[spec].dtypes:
            # Asked for by name and impossible here: a usage error, not a finding.
            raise ValueError(f"{spec} cannot run here: {why[0]}")
    return adapters


def _log_contracts(log: ResultLog, adapters: dict, devices: dict, dtypes) -> None:
    """A contract record per kernel, and limitation records for what cannot run here."""
    seen = {(d.get("type"), d.get("kernel"), d.get("dtype"), d.get("reason")) for d in log.records}
    for spec, adapter in adapters.items():
        rec = ContractRecord(spec, tuple(adapter.contract_lines()))
        if ("contract", spec, None, None) not in seen:
            log.append(rec.to_json())
        no_run = not adapter.dtypes and bool(adapter.unsupported)
        for dt in dtypes:
            why = adapter.unsupported[0][1] if no_run else adapter.unavailable(dt, devices[spec])
            if why and ("limitation", spec, dt, why) not in seen:
                log.append(LimitationRecord(spec, dt, why, devices[spec], no_run=no_run).to_json())


@contextmanager
def _reference_pool(opts: ReportOptions, device: str) -> Iterator[Executor | None]:
    """The processes the references are computed on (``--workers`` local processes, or Ray
    tasks with ``--executor ray``); ``None`` with ``--no-isolate``: everything in this
    process. Closed at once on Ctrl-C."""
    if not opts.isolate:
        yield None
        return
    if opts.executor == "ray":
        from .ray_executor import RayExecutor

        pool: Executor = RayExecutor(address=opts.address, device=device, kernels=False)
    elif opts.executor == "local":
        pool = LocalExecutor(workers=opts.workers, device=device, kernels=False)
    else:
        raise ValueError(f"executor must be 'local' or 'ray', got {opts.executor!r}")
    with pool:
        yield pool


def run_ragged_report(opts: ReportOptions, *, echo=print) -> int:
    """Run the ragged campaign ``opts`` describes, render it; returns the exit status."""
    header, declared, devices, out_dir = _setup(opts)
    cfg = header.config
    # The kernels run in this process: each call under --timeout (--no-isolate: none).
    limit = CallLimit(opts.timeout) if opts.isolate else None
    results_path = out_dir / "results.jsonl"
    # A clash with another campaign's results is said before the probe, not after it.
    ResultLog.check_resumable(results_path, header.to_json(), fresh=opts.fresh)
    check_results_file(results_path, declared, fresh=opts.fresh)
    with limit_calls(limit):
        adapters = _probe(declared, devices, cfg.dtypes, echo)
    try:
        with (
            ResultLog.open(results_path, header.to_json(), fresh=opts.fresh) as log,
            _reference_pool(opts, cfg.device) as pool,
        ):
            env = environment_record(cfg.device)
            env[SOURCES_KEY] = checked_digests(log, declared)
            log.append(SessionRecord(env).to_json())
            _log_contracts(log, adapters, devices, cfg.dtypes)
            where = "in this process" if pool is None else f"on {pool.workers} processes"
            each = "no time limit" if limit is None else f"each call stopped at {opts.timeout:g} s"
            echo(
                f"flashcheck report {cfg.name}: ragged layouts, preset {cfg.preset}, seed "
                f"{cfg.seed}, device {cfg.device}; kernels {', '.join(adapters)} (run in this "
                f"process, one call at a time, {each}; references {where}); results -> "
                f"{results_path}"
            )
            camp = RaggedCampaign(
                log,
                adapters,
                devices,
                cfg.dtypes,
                cfg.seed,
                cfg.preset,
                out_dir / "cases",
                echo,
                executor=pool,
            )
            stuck = None if limit is None else replace(limit, on_stuck=camp.stuck)
            with limit_calls(stuck):
                done = camp.run()
            log.append(CompleteRecord(done).to_json())
            data = parse_ragged(log.records)
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: the results so far are safe in {results_path}; run the same "
            "command again to resume",
            file=sys.stderr,
        )
        return 130
    for line in ragged_summary(data, str(out_dir / "cases")):
        echo(line)
    if opts.render:
        from .ragged_render import render_ragged_report

        echo(f"report: {render_ragged_report(results_path, out_dir)}")
    found = ragged_findings(data, opts.fail_on)
    if found:
        echo(f"exit status 1 (gate --fail-on {opts.fail_on}):")
        for line in found:
            echo(f"  - {line}")
    return int(bool(found))


def _gated(r: RaggedResult, least: int) -> str | None:
    if r.check not in ("accuracy", "gradients"):
        if r.status.broken:  # a property whose kernel call hung
            return f"{r.check} {r.status}"
        return f"{r.check} failed" if r.status == Status.FAIL else None
    if r.status.severity >= least:
        return f"{r.check} {r.status}"
    return None


def _short(text: str, n: int = 320) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def ragged_findings(data: RaggedResults, fail_on: str) -> list[str]:
    """What the gate ``fail_on`` finds, one line per kernel, dtype and kind of failure, with
    its first reason (which names the sequence); empty when the gate passes. Every gate but
    ``never`` counts a failed property and a kernel that could not run at all."""
    least = GATES[fail_on]
    if least is None:
        return []
    count: Counter = Counter()
    first: dict[tuple[str, str, str], str] = {}
    for r in data.results:
        what = _gated(r, least)
        if what is not None:
            key = (r.kernel, r.dtype, what)
            count[key] += 1
            first.setdefault(key, f"{r.family}: {r.reasons[0]}" if r.reasons else r.family)
    lines = [
        f"{r.kernel} {r.dtype}: could not run at all ({r.reason})"
        for r in data.limitations
        if r.no_run
    ]
    for (k, dt, what), n in count.items():
        lines.append(
            f"{what}: {k} {dt} ({n} case{'s' * (n > 1)}), e.g. {_short(first[k, dt, what])}"
        )
    return lines


def ragged_summary(data: RaggedResults, case_dir: str) -> list[str]:
    """Per kernel and dtype: the accuracy verdicts, the properties, batch invariance as
    measured, the most frequent failures and the replay command of one failing case."""
    groups: dict[tuple[str, str], list[RaggedResult]] = {}
    for r in data.results:
        groups.setdefault((r.kernel, r.dtype), []).append(r)
    lines = [
        f"{r.kernel} {r.dtype}: could not run at all: {r.reason}"
        for r in data.limitations
        if r.no_run
    ]
    for (k, dt), rows in groups.items():
        acc = Counter(r.status for r in rows if r.check == "accuracy")
        grads = Counter(r.status for r in rows if r.check == "gradients")
        props = [r for r in rows if r.check not in ("accuracy", "gradients") and r.status.counted]
        pfail = sum(r.status == Status.FAIL for r in props)
        line = f"{k} {dt}: accuracy {', '.join(f'{n} {s}' for s, n in sorted(acc.items()))}"
        if grads:
            line += f"; gradients {', '.join(f'{n} {s}' for s, n in sorted(grads.items()))}"
        if props:
            line += f"; properties: {len(props)} checks, {pfail} failed"
        lines.append(line)
        lines += _examples(rows, case_dir)
    return lines


def _examples(rows: Sequence[RaggedResult], case_dir: str) -> list[str]:
    bad = [r for r in rows if r.status.severity > 0 or r.status == Status.FAIL]
    kinds: dict[tuple[str, str, str], list[RaggedResult]] = {}
    for r in bad:
        if r.reasons:
            kinds.setdefault((r.check, str(r.status), gist(r.reasons[0])), []).append(r)
    out = []
    ranked = sorted(kinds.values(), key=len, reverse=True)
    for group in ranked[:3]:
        # The first, as the gate's line at the end quotes (it read "8 fully masked rows"
        # here and "16" there for the same kind of failure).
        r = group[0]
        fams = Counter(x.family for x in group)
        where = ", ".join(f"{f} x{n}" if n > 1 else f for f, n in fams.most_common())
        out.append(f"    {len(group)} x {r.check} {r.status} ({where}): {_short(r.reasons[0])}")
    if len(ranked) > 3:
        rest = sum(len(g) for g in ranked[3:])
        out.append(f"    ... {rest} more of {len(ranked) - 3} other kinds (the report lists each)")
    invariance = [r for r in rows if r.check == "batch-invariance" and r.status == Status.PASS]
    varies = [r for r in invariance if r.reasons and r.reasons[0].startswith("not batch")]
    if varies:
        diff = varies[0].reasons[0].removeprefix(NOT_BATCH_INVARIANT)
        out.append(f"    batch-invariant: {NOT_GATED}{_short(diff)}")
    worst = next((r for r in bad if r.case_id), None)
    if worst is not None:
        out.append(f"    replay: flashcheck replay {worst.case_id} --dir {case_dir}")
    return out
