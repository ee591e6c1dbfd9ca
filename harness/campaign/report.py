"""``flashcheck report``: run (or resume) a campaign, save its worst cases, render the report.

Layout of ``<out>/<name>/``: ``results.jsonl`` (every result, appended as it is produced),
``cases/`` (case files of the worst and failing cases, for ``flashcheck replay``),
``error-report.md`` and its PNG figures.

Exit status (for CI gating, chosen with ``fail_on``): 0 when the gate found nothing; 1 when it
found something; 2 for a usage error; 130 when interrupted (re-run to resume). Gates:
``fail-hard`` (default: FAIL-HARD verdicts, wrong-shape outputs, a kernel that raised or hung
inside its contract, a failed structural property, a kernel stopped after repeated identical
failures or one that could not run at all), ``fail`` (also FAIL), ``never``.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ..adapters.adapter import Kernel
from ..adapters.palette import DEFAULT_PALETTE
from ..adapters.probe import resolved
from ..adapters.worker import KernelRef
from ..core.environment import environment_record
from ..core.resultlog import ResultLog
from .budget import Budget
from .executor import Executor, LocalExecutor
from .gates import GATES, gate_findings
from .kernel_sources import ENV_KEY as SOURCES_KEY
from .kernel_sources import check_results_file, checked_digests
from .logrecords import (
    CampaignConfig,
    CompleteRecord,
    ContractRecord,
    Header,
    LimitationRecord,
    SessionRecord,
    load,
    parse_records,
)
from .phases import PhaseClock, measure
from .plan import PARTS
from .runner import PRESETS, STREAK, Campaign
from .selection import check_dtypes, default_kernels, kernel_device, resolve_kernels
from .stopping import sigint_held
from .summary import terminal_summary

__all__ = [
    "ReportOptions",
    "default_name",
    "run_report",
    "terminal_summary",
]


@dataclass(frozen=True)
class ReportOptions:
    name: str | None = None
    preset: str | None = None
    seed: int = 0
    kernels: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ("fp16", "bf16", "fp32")
    device: str | None = None
    out: str = "reports"
    timeout: float = 300.0
    isolate: bool = True
    fresh: bool = False
    render: bool = True
    fail_on: str = "fail-hard"
    streak: int = STREAK
    arithmetic: str | None = None
    nan_inputs: str | None = None  # the NaN policy of --kernel functions declaring none
    workers: int | None = None  # reference processes (default: one per core)
    kernel_workers: int | None = None  # isolated kernel workers (default: one per GPU or core)
    executor: str = "local"  # or "ray"
    address: str | None = None  # the Ray cluster (default: start one on this machine)
    parts: tuple[str, ...] = ()  # campaign parts to run (default: every one, plan.PARTS)
    palette: int = DEFAULT_PALETTE  # compile keys per dtype of kernels that compile per shape
    budget: float | None = None  # seconds: stop cleanly then, the work that finds bugs first
    started: float | None = None  # when the budget starts (time.monotonic()); None: now
    # Record the phase timeline (a ``phases`` record, and its table printed last).
    profile_phases: bool = False


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # torch is optional for the oracle alone
        return False


def default_name(device: str, kernels: Sequence[str] = ()) -> str:
    """The report's folder name: made from the kernel specs when they are given (``mypkg.attn
    :forward`` → ``mypkg.attn-forward``), else the machine: ``cpu`` or the GPU's model in lower
    case (``h100``, ``h200``, ...)."""
    if kernels:
        name = "+".join(re.sub(r"[^A-Za-z0-9_.+-]+", "-", k).strip("-") for k in kernels)
        return name if len(name) <= 80 else name[:64] + f"+{len(kernels)}-kernels"
    if device != "cuda":
        return "cpu"
    import torch

    m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", torch.cuda.get_device_name())
    return m.group(1).lower() if m else "gpu"


def _command(opts: ReportOptions, name: str, preset: str, device: str, kernels) -> str:
    parts = ["flashcheck report", f"--name {name}", f"--preset {preset}", f"--seed {opts.seed}"]
    if device != ("cuda" if _has_cuda() else "cpu"):
        parts.append(f"--device {device}")
    if tuple(opts.dtypes) != ("fp16", "bf16", "fp32"):
        parts += [f"--dtype {d}" for d in opts.dtypes]
    if opts.kernels:
        parts += [f"--kernel {k}" for k in kernels]
    if opts.out != "reports":
        parts.append(f"--out {opts.out}")
    if opts.parts:
        parts += [f"--part {x}" for x in opts.parts]
    if opts.palette != DEFAULT_PALETTE:
        parts.append(f"--palette {opts.palette}")
    return " ".join(parts)


def make_executor(opts: ReportOptions, device: str) -> Executor:
    """The executor ``opts`` asks for: local processes, or a Ray cluster."""
    if opts.executor == "ray":
        from .ray_executor import RayExecutor

        return RayExecutor(
            address=opts.address,
            device=device,
            timeout=opts.timeout,
            kernel_workers=opts.kernel_workers,
        )
    if opts.executor != "local":
        raise ValueError(f"executor must be 'local' or 'ray', got {opts.executor!r}")
    return LocalExecutor(
        workers=opts.workers,
        kernel_workers=opts.kernel_workers,
        device=device,
        timeout=opts.timeout,
        isolate=opts.isolate,
    )


@dataclass(frozen=True)
class _Setup:
    """A campaign checked and configured, before anything runs."""

    header: Header
    declared: dict[str, Kernel]  # spec → the kernel as declared (probing may complete it)
    devices: dict[str, str]  # spec → the device it runs on
    out_dir: Path

    @property
    def results_path(self) -> Path:
        return self.out_dir / "results.jsonl"

    @property
    def case_dir(self) -> Path:
        return self.out_dir / "cases"


def _setup(opts: ReportOptions) -> _Setup:
    """Check ``opts`` (``ValueError`` says how to fix them) and build the campaign's header."""
    if opts.fail_on not in GATES:
        raise ValueError(f"fail_on must be one of {sorted(GATES)}, got {opts.fail_on!r}")
    device = opts.device or ("cuda" if _has_cuda() else "cpu")
    if device == "cuda" and not _has_cuda():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    preset_name = opts.preset or ("gpu" if device == "cuda" else "cpu")
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}: choose from {sorted(PRESETS)}")
    dtypes = check_dtypes(opts.dtypes)
    declared = resolve_kernels(list(opts.kernels) or default_kernels())
    if opts.arithmetic is not None:
        declared = {
            s: k if k.arithmetic != "unknown" else replace(k, arithmetic=opts.arithmetic)
            for s, k in declared.items()
        }
    if opts.nan_inputs is not None:
        declared = {
            s: k if k.nan_inputs != "propagate" else replace(k, nan_inputs=opts.nan_inputs)
            for s, k in declared.items()
        }
    unknown = [x for x in opts.parts if x not in PARTS]
    if unknown:
        raise ValueError(f"unknown campaign part(s) {unknown}: choose from {list(PARTS)}")
    name = opts.name or default_name(device, opts.kernels)
    config = CampaignConfig(
        name=name,
        preset=preset_name,
        seed=opts.seed,
        kernels=tuple(declared),
        dtypes=dtypes,
        device=device,
        # (None when every part runs, so older results files still resume)
        parts=tuple(x for x in PARTS if x in opts.parts) if opts.parts else None,
        palette=None if opts.palette == DEFAULT_PALETTE else opts.palette,
    )
    out_dir = Path(opts.out) / name
    header = Header(
        config,
        _command(opts, name, preset_name, device, list(declared)),
        str(out_dir / "cases"),
    )
    devices = {s: kernel_device(a, device) for s, a in declared.items()}
    return _Setup(header, declared, devices, out_dir)


def _probe(executor: Executor, setup: _Setup, opts: ReportOptions, echo) -> dict[str, Kernel]:
    """Each kernel's contract, completed by probing it where it was not declared."""
    devices, dtypes = setup.devices, setup.header.config.dtypes
    adapters = {}
    for spec, kern in setup.declared.items():
        if "dtypes" in kern.pending:  # only the dtypes this campaign runs are worth probing
            kern = replace(kern, dtypes=tuple(dt for dt in kern.dtypes if dt in dtypes))
        if kern.pending:
            echo(f"probing the contract of {spec} on {devices[spec]} ...")
        runner = executor.runner(KernelRef.of(kern, spec), devices[spec])
        adapters[spec] = resolved(kern, devices[spec], runner)
        if kern.pending:
            for line in adapters[spec].contract_lines():
                echo(f"  {line}")
    for spec in opts.kernels:
        why = [adapters[spec].unavailable(dt, devices[spec]) for dt in dtypes]
        if all(why) and adapters[spec].dtypes:
            # Asked for by name and impossible here (not a failure of the kernel): a usage
            # error, found before any results file is made.
            raise ValueError(f"{spec} cannot run here: {why[0]}")
    return adapters


def _campaign(
    log: ResultLog,
    setup: _Setup,
    adapters: dict[str, Kernel],
    executor: Executor,
    opts: ReportOptions,
    echo,
    progress_stream,
    budget: Budget,
) -> None:
    """Run (or resume) the campaign into ``log`` and save its worst cases; a run its
    ``budget`` stopped early says what it covered instead of completing."""
    cfg, devices = setup.header.config, setup.devices
    env = environment_record(cfg.device)
    env[SOURCES_KEY] = checked_digests(log, setup.declared)
    log.append(SessionRecord(env).to_json())
    _log_contracts(log, adapters, devices, cfg.dtypes)
    runnable = [
        s
        for s, a in adapters.items()
        if any(a.unavailable(dt, devices[s]) is None for dt in cfg.dtypes)
    ]
    echo(
        f"flashcheck report {cfg.name}: preset {cfg.preset}, seed {cfg.seed}, "
        f"device {cfg.device}; kernels {', '.join(runnable) or '(none can run here)'}"
        f"; results -> {setup.results_path}"
    )
    camp = Campaign(
        log,
        replace(PRESETS[cfg.preset], palette=cfg.palette or DEFAULT_PALETTE),
        cfg.seed,
        adapters,
        devices,
        cfg.dtypes,
        executor,
        setup.case_dir,
        echo=echo,
        progress_stream=progress_stream,
        streak=opts.streak,
        parts=cfg.parts or PARTS,
        budget=budget,
    )
    camp.run()
    with measure(executor.clock, "case files"):
        camp.save_worst()
    covered = camp.coverage()
    if covered is None:
        log.append(CompleteRecord(len(camp.results())).to_json())
        if budget.seconds is not None:
            echo(f"finished within the budget: {budget.used()}")
    else:
        log.append(covered.to_json())
        echo(f"stopped at the budget: {covered.text()}")


def run_report(opts: ReportOptions, *, echo=print, progress_stream=None) -> int:
    """Run the campaign described by ``opts`` and render it; returns the exit status."""
    # From the start (the process's, as the command line passes it): probing counts too.
    budget = Budget(opts.budget, started=opts.started or time.monotonic())
    if opts.budget is not None and opts.budget <= 0:
        raise ValueError(f"budget must be a positive number of seconds, got {opts.budget!r}")
    clock = None
    if opts.profile_phases:
        # The run starts with the process when the command line gave its start.
        clock = PhaseClock(origin=time.time() - (time.monotonic() - budget.started))
        clock.add("start-up", clock.origin, time.time())
    # The workers start first: their imports overlap the set-up (resolving the kernels).
    with measure(clock, "worker start"):
        executor = make_executor(opts, opts.device or ("cuda" if _has_cuda() else "cpu"))
    sizes = {"workers": executor.workers, "kernel_workers": executor.kernel_workers}
    executor.clock = clock
    setup = None
    try:
        try:
            with measure(clock, "set-up"):
                setup = _setup(opts)
            results_path = setup.results_path
            # A clash with another campaign's results is said before the probe, not after it.
            ResultLog.check_resumable(results_path, setup.header.to_json(), fresh=opts.fresh)
            check_results_file(results_path, setup.declared, fresh=opts.fresh)
            with measure(clock, "probing"):
                adapters = _probe(executor, setup, opts, echo)
            with ResultLog.open(results_path, setup.header.to_json(), fresh=opts.fresh) as log:
                _campaign(log, setup, adapters, executor, opts, echo, progress_stream, budget)
                records = parse_records(log.records)
        except BaseException as exc:
            _close(executor, clock, interrupted=isinstance(exc, KeyboardInterrupt))
            raise
    except KeyboardInterrupt:
        # A second SIGINT (`timeout -s INT` signals the process, then its group) must not
        # cut the message that says where the results are.
        with sigint_held():
            done = ""
            if setup is not None and setup.results_path.exists():
                results_path = setup.results_path
                done = len(load(results_path).every_result)
                done = f"{done} results are safe in {results_path}; "
            print(f"\ninterrupted: {done}run the same command again to resume", file=sys.stderr)
        return 130
    # Local workers stop (each process tears down torch) while the report is rendered.
    closing = threading.Thread(target=_close, args=(executor, clock), name="flashcheck-close")
    if isinstance(executor, LocalExecutor):
        closing.start()
    else:  # (a Ray cluster is left from the thread that joined it)
        closing.run()
    try:
        for line in terminal_summary(records, str(setup.case_dir)):
            echo(line)
        if opts.render:
            from .figures import figures_unavailable
            from .render import render_report

            with measure(clock, "rendering"):
                path = render_report(results_path, setup.out_dir)
            echo(f"report: {path}")
            if (why := figures_unavailable()) is not None:
                echo(f"  (figures left out: {why})")
    finally:
        if closing.ident is not None:
            closing.join()
    found = gate_findings(records, opts.fail_on)
    if found:
        echo(f"exit status 1 (gate --fail-on {opts.fail_on}):")
        for line in found:
            echo(f"  - {line}")
    if clock is not None:
        timeline = clock.timeline(**sizes)
        with ResultLog.open(results_path, setup.header.to_json()) as log:
            log.append(timeline.to_json())
        echo("phase timeline (seconds from the process's start):")
        for line in timeline.table():
            echo(line)
    return int(bool(found))


def _close(executor: Executor, clock: PhaseClock | None, *, interrupted: bool = False) -> None:
    with measure(clock, "shut-down"):
        executor.close(interrupted=interrupted)


def _log_contracts(log: ResultLog, adapters: dict, devices: dict, dtypes) -> None:
    """One ``contract`` record per kernel, and ``limitation`` records for what cannot run
    here (``no_run``: the kernel ran on no probe input, a failure of the kernel)."""
    records = parse_records(log.records)
    known = {(r.kernel, r.dtype, r.reason) for r in records if isinstance(r, LimitationRecord)}
    contracts = {r.kernel: r for r in records if isinstance(r, ContractRecord)}
    for spec, adapter in adapters.items():
        rec = ContractRecord(spec, tuple(adapter.contract_lines()))
        if contracts.get(spec) != rec:
            log.append(rec.to_json())
        no_run = not adapter.dtypes and adapter.unsupported
        for dt in dtypes:
            why = adapter.unavailable(dt, devices[spec])
            if no_run:
                why = adapter.unsupported[0][1]
            if why and (spec, dt, why) not in known:
                lim = LimitationRecord(spec, dt, why, devices[spec], no_run=bool(no_run))
                log.append(lim.to_json())
