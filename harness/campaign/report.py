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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..adapters.probe import resolved
from ..adapters.worker import KernelRef
from ..core.environment import environment_record
from ..core.resultlog import ResultLog, num, read_records
from .executor import Executor, LocalExecutor
from .plan import PARTS
from .records import SEVERITY, gist
from .runner import (
    PRESETS,
    STREAK,
    Campaign,
    check_dtypes,
    default_kernels,
    kernel_device,
    resolve_kernels,
)

__all__ = [
    "GATES",
    "ReportOptions",
    "default_name",
    "gate_exit_code",
    "gate_findings",
    "run_report",
    "terminal_summary",
]

GATES = {
    "fail-hard": ("FAIL-HARD", "BAD-OUTPUT", "ERROR", "TIMEOUT"),
    "fail": ("FAIL", "FAIL-HARD", "BAD-OUTPUT", "ERROR", "TIMEOUT"),
    "never": (),
}


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
    workers: int | None = None  # reference processes (default: one per core)
    kernel_workers: int | None = None  # isolated kernel workers (default: one per GPU or core)
    executor: str = "local"  # or "ray"
    address: str | None = None  # the Ray cluster (default: start one on this machine)
    parts: tuple[str, ...] = ()  # campaign parts to run (default: every one, plan.PARTS)


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
    return " ".join(parts)


def gate_findings(records: Sequence[dict[str, Any]], fail_on: str) -> list[str]:
    """What the gate ``fail_on`` finds in a campaign's records, one line per kernel, dtype and
    kind (empty: the gate passes). Beyond the statuses of :data:`GATES`, every gate but
    ``never`` counts a failed structural property, a kernel stopped after repeated identical
    failures, and a kernel that could not run at all."""
    if fail_on == "never":
        return []
    gate = GATES[fail_on]
    found: Counter = Counter()
    for r in records:
        kind = r.get("type")
        if kind == "result":
            structural = r.get("part") == "structural"
            what = f"gradients {r['status']}" if r.get("part") == "gradients" else r["status"]
            if structural and r["status"] == "FAIL":
                found[(r["kernel"], r["dtype"], f"structural property {r['property']} failed")] += 1
            elif r["status"] in gate and not (structural and r["status"] == "FAIL"):
                found[(r["kernel"], r["dtype"], what)] += 1
        elif kind == "stopped":
            found[(r["kernel"], r["dtype"], f"stopped after {r['count']} x {r['reason']}")] += 1
        elif kind == "limitation" and r.get("no_run"):
            found[(r["kernel"], r["dtype"], f"could not run at all ({r['reason']})")] += 1
    return [
        f"{n} {what}: {k} {dt}" if n > 1 else f"{what}: {k} {dt}"
        for (k, dt, what), n in found.items()
    ]


def gate_exit_code(records: Sequence[dict[str, Any]], fail_on: str) -> int:
    """1 if the gate ``fail_on`` finds anything (:func:`gate_findings`), else 0."""
    return int(bool(gate_findings(records, fail_on)))


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


def run_report(opts: ReportOptions, *, echo=print, progress_stream=None) -> int:
    """Run the campaign described by ``opts`` and render it; returns the exit status."""
    if opts.fail_on not in GATES:
        raise ValueError(f"fail_on must be one of {sorted(GATES)}, got {opts.fail_on!r}")
    device = opts.device or ("cuda" if _has_cuda() else "cpu")
    if device == "cuda" and not _has_cuda():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    preset_name = opts.preset or ("gpu" if device == "cuda" else "cpu")
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}: choose from {sorted(PRESETS)}")
    dtypes = check_dtypes(opts.dtypes)
    specs = list(opts.kernels) or default_kernels()
    declared = resolve_kernels(specs)
    if opts.arithmetic is not None:
        declared = {
            s: k if k.arithmetic != "unknown" else replace(k, arithmetic=opts.arithmetic)
            for s, k in declared.items()
        }
    devices = {s: kernel_device(a, device) for s, a in declared.items()}
    name = opts.name or default_name(device, opts.kernels)
    out_dir = Path(opts.out) / name
    case_dir = out_dir / "cases"
    config = {
        "name": name,
        "preset": preset_name,
        "seed": opts.seed,
        "kernels": list(declared),
        "dtypes": list(dtypes),
        "device": device,
    }
    unknown = [x for x in opts.parts if x not in PARTS]
    if unknown:
        raise ValueError(f"unknown campaign part(s) {unknown}: choose from {list(PARTS)}")
    if opts.parts:  # (absent when every part runs, so older results files still resume)
        config["parts"] = [x for x in PARTS if x in opts.parts]
    header = {
        "type": "header",
        "config": config,
        "command": _command(opts, name, preset_name, device, list(declared)),
        "case_dir": str(case_dir),
    }
    results_path = out_dir / "results.jsonl"
    try:
        with make_executor(opts, device) as executor:
            adapters = {}
            for spec, kern in declared.items():
                if kern.pending:
                    echo(f"probing the contract of {spec} on {devices[spec]} ...")
                runner = executor.runner(KernelRef.of(kern, spec), devices[spec])
                adapters[spec] = resolved(kern, devices[spec], runner)
            for spec in opts.kernels:
                why = [adapters[spec].unavailable(dt, devices[spec]) for dt in dtypes]
                if all(why) and adapters[spec].dtypes:
                    # Asked for by name and impossible here (not a failure of the kernel): a
                    # usage error, found before any results file is made.
                    raise ValueError(f"{spec} cannot run here: {why[0]}")
            with ResultLog.open(results_path, header, fresh=opts.fresh) as log:
                log.append({"type": "session", "env": environment_record(device)})
                _log_contracts(log, adapters, devices, dtypes)
                runnable = [
                    s
                    for s, a in adapters.items()
                    if any(a.unavailable(dt, devices[s]) is None for dt in dtypes)
                ]
                echo(
                    f"flashcheck report {name}: preset {preset_name}, seed {opts.seed}, "
                    f"device {device}; kernels {', '.join(runnable) or '(none can run here)'}"
                    f"; results -> {results_path}"
                )
                camp = Campaign(
                    log,
                    PRESETS[preset_name],
                    opts.seed,
                    adapters,
                    devices,
                    dtypes,
                    executor,
                    case_dir,
                    echo=echo,
                    progress_stream=progress_stream,
                    streak=opts.streak,
                    parts=tuple(config.get("parts", PARTS)),
                )
                camp.run()
                camp.save_worst()
                log.append({"type": "complete", "results": len(camp.results())})
                records = list(log.records)
    except KeyboardInterrupt:
        done = ""
        if results_path.exists():
            done = sum(1 for r in read_records(results_path) if r.get("type") == "result")
            done = f"{done} results are safe in {results_path}; "
        print(f"\ninterrupted: {done}run the same command again to resume", file=sys.stderr)
        return 130
    for line in terminal_summary(records, str(case_dir)):
        echo(line)
    if opts.render:
        from .render import render_report

        path = render_report(results_path, out_dir)
        echo(f"report: {path}")
    found = gate_findings(records, opts.fail_on)
    if found:
        echo(f"exit status 1 (gate --fail-on {opts.fail_on}):")
        for line in found:
            echo(f"  - {line}")
    return int(bool(found))


def _log_contracts(log: ResultLog, adapters: dict, devices: dict, dtypes) -> None:
    """One ``contract`` record per kernel, and ``limitation`` records for what cannot run
    here (``no_run``: the kernel ran on no probe input, a failure of the kernel)."""
    known = {
        (r["kernel"], r["dtype"], r["reason"]) for r in log.records if r.get("type") == "limitation"
    }
    contracts = {r["kernel"]: r for r in log.records if r.get("type") == "contract"}
    for spec, adapter in adapters.items():
        rec = {"type": "contract", "kernel": spec, "lines": adapter.contract_lines()}
        if {k: v for k, v in contracts.get(spec, {}).items()} != rec:
            log.append(rec)
        no_run = not adapter.dtypes and adapter.unsupported
        for dt in dtypes:
            why = adapter.unavailable(dt, devices[spec])
            if no_run:
                why = adapter.unsupported[0][1]
            if why and (spec, dt, why) not in known:
                log.append(
                    {
                        "type": "limitation",
                        "kernel": spec,
                        "dtype": dt,
                        "reason": why,
                        "device": devices[spec],
                        "no_run": bool(no_run),
                    }
                )


def terminal_summary(records: Sequence[dict[str, Any]], case_dir: str) -> list[str]:
    """What the terminal shows at the end: per kernel and dtype the verdict counts, the most
    frequent reasons and the replay command of the worst case."""
    results = [r for r in records if r.get("type") == "result"]
    files = {r["key"]: r["case_id"] for r in records if r.get("type") == "case-file"}
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["kernel"], r["dtype"]), []).append(r)
    lines = []
    for r in records:
        if r.get("type") == "limitation" and r.get("no_run"):
            lines.append(f"{r['kernel']} {r['dtype']}: could not run at all: {r['reason']}")
    for (k, dt), rows in groups.items():
        acc = Counter(r["status"] for r in rows if r["part"] not in ("structural", "gradients"))
        struct = Counter(r["status"] for r in rows if r["part"] == "structural")
        grad = Counter(r["status"] for r in rows if r["part"] == "gradients")
        counts = ", ".join(f"{n} {s}" for s, n in sorted(acc.items()))
        sfail = struct.get("FAIL", 0)
        ran = sum(struct.values()) - struct.get("SKIP", 0)
        segments = [counts] if counts else []
        if struct:
            segments.append(f"structural: {ran} checks, {sfail} failed")
        if grad:
            segments.append("gradients: " + ", ".join(f"{n} {s}" for s, n in sorted(grad.items())))
        lines.append(f"{k} {dt}: {'; '.join(segments)}")
        bad = [r for r in rows if r["status"] not in ("PASS", "SKIP")]
        reasons = Counter(gist(why) for r in bad for why in r["reasons"][:1])
        example = {gist(why): why for r in reversed(bad) for why in r["reasons"][:1]}
        for why, n in reasons.most_common(3):
            lines.append(f"    {n} result{'s' if n > 1 else ''}, e.g. {example[why]}")
        worst = sorted(
            (r for r in rows if r["key"] in files),
            key=lambda r: (-SEVERITY.get(r["status"], 0), -num(r["score"])),
        )
        if worst and worst[0]["status"] != "PASS":
            cid = files[worst[0]["key"]]
            lines.append(f"    worst: flashcheck replay {cid} --dir {case_dir}")
    for r in records:
        if r.get("type") == "stopped":
            lines.append(
                f"{r['kernel']} {r['dtype']}: stopped after {r['count']} identical "
                f"failures ({r['reason']})"
            )
    return lines
