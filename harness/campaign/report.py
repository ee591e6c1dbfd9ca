"""``flashcheck report``: run (or resume) a campaign, save its worst cases, render the report.

Layout of ``<out>/<name>/``: ``results.jsonl`` (every result, appended as it is produced),
``cases/`` (case files of the worst and failing cases, for ``flashcheck replay``),
``error-report.md`` and its PNG figures.

Exit status (for CI gating, chosen with ``fail_on``): 0 when nothing at or above the gate was
found; 1 when something was; 2 for a usage error; 130 when interrupted (re-run to resume).
Gates: ``fail-hard`` (default: FAIL-HARD verdicts and wrong-shape outputs), ``fail`` (also FAIL),
``error`` (also kernels that raised or timed out), ``never``.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashcheck.harness.adapters.isolation import KernelWorker
from flashcheck.harness.campaign.runner import (
    PRESETS,
    Campaign,
    check_dtypes,
    default_kernels,
    kernel_device,
    resolve_kernels,
)
from flashcheck.harness.core.environment import environment_record
from flashcheck.harness.core.resultlog import ResultLog

__all__ = ["GATES", "ReportOptions", "default_name", "gate_exit_code", "run_report"]

GATES = {
    "fail-hard": ("FAIL-HARD", "BAD-OUTPUT"),
    "fail": ("FAIL", "FAIL-HARD", "BAD-OUTPUT"),
    "error": ("FAIL", "FAIL-HARD", "BAD-OUTPUT", "ERROR", "TIMEOUT"),
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


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a dependency
        return False


def default_name(device: str) -> str:
    """``cpu``, or the GPU's model in lower case (``h100``, ``h200``, ``a100``...)."""
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
    return " ".join(parts)


def gate_exit_code(results: Sequence[dict[str, Any]], fail_on: str) -> int:
    """1 if any result's status is in the gate ``fail_on``, else 0."""
    gate = GATES[fail_on]
    return int(any(r["status"] in gate for r in results))


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
    adapters = resolve_kernels(specs)
    devices = {s: kernel_device(a, device) for s, a in adapters.items()}
    name = opts.name or default_name(device)
    out_dir = Path(opts.out) / name
    case_dir = out_dir / "cases"
    config = {"name": name, "preset": preset_name, "seed": opts.seed, "kernels": list(adapters),
              "dtypes": list(dtypes), "device": device}  # fmt: skip
    header = {"type": "header", "config": config,
              "command": _command(opts, name, preset_name, device, list(adapters)),
              "case_dir": str(case_dir)}  # fmt: skip
    results_path = out_dir / "results.jsonl"
    with ResultLog.open(results_path, header, fresh=opts.fresh) as log:
        log.append({"type": "session", "env": environment_record(device)})
        known = {(r["kernel"], r["dtype"], r["reason"]) for r in log.records
                 if r.get("type") == "limitation"}  # fmt: skip
        for spec, adapter in adapters.items():
            for dt in dtypes:
                why = adapter.unavailable(dt, devices[spec])
                if why and (spec, dt, why) not in known:
                    log.append({"type": "limitation", "kernel": spec, "dtype": dt,
                                "device": devices[spec], "reason": why})  # fmt: skip
        runnable = [s for s, a in adapters.items()
                    if any(a.unavailable(dt, devices[s]) is None for dt in dtypes)]  # fmt: skip
        echo(f"flashcheck report {name}: preset {preset_name}, seed {opts.seed}, device "
             f"{device}; kernels {', '.join(runnable) or '(none can run here)'}; results -> "
             f"{results_path}")  # fmt: skip
        with KernelWorker(timeout=opts.timeout, isolate=opts.isolate) as worker:
            camp = Campaign(
                log, PRESETS[preset_name], opts.seed, adapters, devices, dtypes, worker,
                case_dir, echo=echo, progress_stream=progress_stream,
            )  # fmt: skip
            try:
                camp.run()
                camp.save_worst()
                log.append({"type": "complete", "results": len(camp.results())})
            except KeyboardInterrupt:
                n = len(camp.results())
                print(f"\ninterrupted: {n} results are safe in {results_path}; run the same "
                      "command again to resume", file=sys.stderr)  # fmt: skip
                return 130
            results = camp.results()
    counts = Counter(r["status"] for r in results)
    echo("results: " + ", ".join(f"{counts[s]} {s}" for s in sorted(counts)))
    if opts.render:
        from flashcheck.harness.campaign.render import render_report

        path = render_report(results_path, out_dir)
        echo(f"report: {path}")
    code = gate_exit_code(results, opts.fail_on)
    if code:
        gate = ", ".join(GATES[opts.fail_on])
        echo(f"exit status 1: found {gate} results (gate --fail-on {opts.fail_on})")
    return code
