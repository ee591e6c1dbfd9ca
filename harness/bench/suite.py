"""``flashcheck bench``: forward and backward speed and memory of attention kernels on one GPU.

Parts (each a list of shapes; every provider runs on the same inputs of a shape):

- ``grid``: the FlashAttention papers' convention: ``N ∈ {1K … 32K}``, ``d ∈ {64, 128, 256}``,
  fp16 and bf16, causal and not, ``B·N = 16384`` tokens (``B = 1`` at 32K) and ``H·d = 2048``;
- ``width``: model width ``H·d ∈ {1024, 2048, 4096, 8192}`` at ``N = 4096``, ``d = 128``, bf16;
- ``memory``: ``B = 1``, 8 heads, ``d = 128``, bf16, ``N ∈ {1K … 32K}``: peak extra memory of a
  call and its wall-clock, where the ``N × N`` score matrix of naive attention shows;
- ``fp32``: fp32 inputs, IEEE fp32 dots against tf32 dots (``triton`` vs ``triton-tf32``).

TFLOP/s count ``4·N²·d`` FLOPs per head (two GEMMs), halved for causal; a shape's providers
are timed in turn (:func:`flashcheck.harness.bench.timing.time_round_robin`; the materializing
ones and SDPA's memory-efficient backend alone, with
:func:`~flashcheck.harness.bench.timing.time_cuda`). Each provider's output is checked against the
oracle on sampled rows (:mod:`flashcheck.harness.bench.check`) before its speed counts. Results go
to a JSONL
file one record per (shape, provider) as they are measured; an interrupted run resumes.

Passes (``--pass``): ``fwd`` (the default) times the forward; ``bwd`` the backward alone:
``torch.autograd.grad`` on a graph the forward built before the timing and kept
(``retain_graph``), the convention of the FlashAttention and Triton tutorial benchmarks; in the
same run it also times the forward and forward + backward, so ``fwd+bwd − fwd`` is recorded
beside it. ``fwd+bwd`` times one training step's attention: forward, then
backward. The backward counts ``2.5×`` the forward's FLOPs (five GEMMs to the forward's two),
forward + backward ``3.5×``. Gradients are checked by
:mod:`flashcheck.harness.bench.grad_check` before their speed counts. A shape's key carries its
pass (``…/bwd``), so records of different passes never meet in one ratio.

A user's kernels (``--kernel MODULE:FUNCTION``, :mod:`flashcheck.harness.bench.kernel_providers`)
run beside the built-ins; the results file's configuration names them, so a resume with other
kernels is refused, and rendering needs only the records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..core.progress import Progress
from ..core.resultlog import ResultLog
from .benchrecords import CeilingsRecord, done_keys
from .grad_check import ORACLE_MAX_N
from .measure import run_shape
from .providers import Provider, provider_table
from .shapes import FLOP_FACTOR, PARTS, PASSES, TOKENS, WIDTH, Shape, plan

__all__ = [
    "FLOP_FACTOR",
    "PARTS",
    "PASSES",
    "TOKENS",
    "WIDTH",
    "BenchOptions",
    "Shape",
    "bench_header",
    "plan",
    "run_bench",
]


@dataclass
class BenchOptions:
    """What ``flashcheck bench`` runs; ``quick`` shrinks every part to a minutes-long smoke."""

    name: str | None = None
    out: str = "reports/bench"
    parts: tuple[str, ...] = PARTS
    providers: tuple[str, ...] | None = None
    kernels: tuple[str, ...] = ()  # --kernel specs, run beside the built-ins
    passes: tuple[str, ...] = ("fwd",)
    ns: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    oracle_max_n: int = ORACLE_MAX_N
    quick: bool = False
    fresh: bool = False
    render: bool = True
    seed: int = 0
    stream: TextIO | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_bench(opts: BenchOptions) -> int:
    """Run (or resume) the benchmark and render it; the exit status of ``flashcheck bench``.

    ``ValueError`` for a selection that cannot run, a ``--kernel`` spec included (checked
    before the GPU is, so a bad spec is reported on any machine)."""
    import torch

    from ..core.environment import environment_record
    from .ceilings import measure_ceilings

    items, table = _selection(opts)
    stream = opts.stream if opts.stream is not None else sys.stderr
    if not torch.cuda.is_available():
        print(
            "flashcheck bench: no CUDA GPU is visible to torch "
            f"({torch.__version__}); the benchmark times GPU kernels. Run it on a machine "
            "with an NVIDIA GPU and a CUDA build of torch.",
            file=stream,
        )
        return 2
    gpu = torch.cuda.get_device_name()
    name = opts.name or _gpu_slug(gpu)
    out_dir = Path(opts.out) / name
    header = bench_header(opts, name)
    path = out_dir / "results.jsonl"
    with ResultLog.open(path, header, fresh=opts.fresh) as log:
        log.append({"type": "session", "env": environment_record("cuda")})
        done = done_keys(log.records)
        todo = [(s, p) for s, p in items if s.key not in done]
        print(
            f"flashcheck bench {name}: {len(items)} shapes ({len(items) - len(todo)} done "
            f"already) on {gpu}; results -> {path}",
            file=stream,
        )
        cost = {s.key: len(p) * (1.0 + s.n / 4096) * FLOP_FACTOR[s.pass_] for s, p in items}
        prog = Progress(
            sum(cost.values()),
            done_cost=sum(cost[k] for k in done if k in cost),
            label="bench ",
            stream=stream,
        )
        try:
            log.append(CeilingsRecord.from_json(measure_ceilings()).to_json())
            for shape, provs in todo:
                recs = run_shape(
                    shape, provs, seed=opts.seed, oracle_max_n=opts.oracle_max_n, table=table
                )
                for rec in recs:
                    log.append(rec.to_json())
                log.append({"type": "shape-done", "key": shape.key})
                prog.advance(cost[shape.key], shape.key)
            log.append(CeilingsRecord.from_json(measure_ceilings()).to_json())
        except KeyboardInterrupt:
            print(
                f"\ninterrupted: results so far are safe in {path}; run the same command "
                "again to resume",
                file=stream,
            )
            return 130
        prog.finish()
        log.append({"type": "complete"})
    if opts.render:
        from .render import render_bench, summary_text

        md = render_bench(path, out_dir)
        print(f"bench report: {md}", file=stream)
        print(summary_text(path))
    return 0


def _selection(
    opts: BenchOptions,
) -> tuple[list[tuple[Shape, tuple[str, ...]]], dict[str, Provider]]:
    """The run's shapes with their providers, and its provider table (the built-ins and the
    ``--kernel`` ones, resolved here: a bad spec raises before anything needs a GPU)."""
    kernels = ()
    if opts.kernels:
        from .kernel_providers import kernel_providers

        kernels = kernel_providers(opts.kernels)
    items = plan(
        parts=opts.parts,
        quick=opts.quick,
        providers=opts.providers,
        passes=opts.passes,
        ns=opts.ns,
        head_dims=opts.head_dims,
        dtypes=opts.dtypes,
        kernels=kernels,
    )
    return items, provider_table(kernels)


def bench_header(opts: BenchOptions, name: str) -> dict[str, Any]:
    """The header record of the results file of run ``name``: its ``config`` identifies the
    run (parts, providers, ``--kernel`` specs, passes, shape filters, seed), and resuming a
    file whose header holds another config is refused."""
    return {"tool": "flashcheck bench", "name": name, "config": _config(opts)}


def _config(opts: BenchOptions) -> dict[str, Any]:
    """What identifies the run in its results file: resuming with another one is refused."""
    config: dict[str, Any] = {
        "parts": list(opts.parts),
        "quick": opts.quick,
        "seed": opts.seed,
        "providers": None if opts.providers is None else list(opts.providers),
    }
    if opts.kernels:  # (absent without, so results files from before --kernel still resume)
        config["kernels"] = list(dict.fromkeys(opts.kernels))
    # Only what differs from a forward run of the whole grid, so results files written before
    # these options existed still resume.
    if opts.passes != ("fwd",):
        config["passes"] = list(opts.passes)
        config["oracle_max_n"] = opts.oracle_max_n
    for field_name in ("ns", "head_dims", "dtypes"):
        if getattr(opts, field_name) is not None:
            config[field_name] = list(getattr(opts, field_name))
    return config


def _gpu_slug(gpu: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``: the report directory of a GPU model."""
    for word in gpu.lower().replace("-", " ").split():
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word) and "gb" not in word:
            return word
    return "gpu"
