"""``flashcheck bench``: forward and backward speed and memory of attention kernels on one GPU.

Parts (each a list of shapes; every provider runs on the same inputs of a shape):

- ``grid``: the FlashAttention papers' convention: ``N ∈ {1K … 32K}``, ``d ∈ {64, 128, 256}``,
  fp16 and bf16, causal and not, ``B·N = 16384`` tokens (``B = 1`` at 32K) and ``H·d = 2048``;
- ``width``: model width ``H·d ∈ {1024, 2048, 4096, 8192}`` at ``N = 4096``, ``d = 128``, bf16;
- ``memory``: ``B = 1``, 8 heads, ``d = 128``, bf16, ``N ∈ {1K … 32K}``: peak extra memory of a
  call and its wall-clock, where the ``N × N`` score matrix of naive attention shows;
- ``fp32``: fp32 inputs, IEEE fp32 dots against tf32 dots (``triton`` vs ``triton-tf32``).

TFLOP/s count ``4·N²·d`` FLOPs per head (two GEMMs), halved for causal; timing is
:func:`flashcheck.harness.bench.timing.time_cuda`. Each provider's output is checked against the
oracle on sampled rows (:mod:`flashcheck.harness.bench.check`) before its speed counts. Results go
to a JSONL
file one record per (shape, provider) as they are measured; an interrupted run resumes.

Passes (``--pass``): ``fwd`` (the default) times the forward; ``bwd`` the backward alone:
``torch.autograd.grad`` on a graph the forward built before the timing and kept
(``retain_graph``), the convention of the FlashAttention and Triton tutorial benchmarks; in the
same run it also times the forward and forward + backward, so ``fwd+bwd − fwd`` (SPEC 7's
anchors) is recorded beside it. ``fwd+bwd`` times one training step's attention: forward, then
backward. The backward counts ``2.5×`` the forward's FLOPs (five GEMMs to the forward's two),
forward + backward ``3.5×``. Gradients are checked by
:mod:`flashcheck.harness.bench.grad_check` before their speed counts. A shape's key carries its
pass (``…/bwd``), so records of different passes never meet in one ratio.
"""

from __future__ import annotations

import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from ..core.progress import Progress
from ..core.resultlog import ResultLog
from .check import judge_rows, reference, sample_rows, sampled_output
from .grad_check import (
    ORACLE_MAX_N,
    grad_reference,
    judge_grads,
    sampled_grads,
)
from .providers import PROVIDERS
from .timing import copies_for_l2, time_cuda

__all__ = ["FLOP_FACTOR", "PARTS", "PASSES", "BenchOptions", "Shape", "plan", "run_bench"]

TOKENS = 16384
WIDTH = 2048
NS = (1024, 2048, 4096, 8192, 16384, 32768)
HEAD_DIMS = (64, 128, 256)
WIDTHS = (1024, 2048, 4096, 8192)
MEMORY_HEADS = 8
GRID_PROVIDERS = tuple(p for p in PROVIDERS if p != "triton-tf32")  # tf32: fp32 inputs only
FP32_PROVIDERS = ("triton", "triton-tf32", "sdpa-efficient", "sdpa-math", "flex", "naive")
PARTS = ("grid", "width", "memory", "fp32")
PASSES = ("fwd", "bwd", "fwd+bwd")
# FLOPs of a pass in units of the forward's 4·N²·d: the backward runs five GEMMs of the
# forward's size (S = QKᵀ again, dV, dP, dQ, dK) to the forward's two.
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
_ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}
# Materializing providers are skipped where S, its fp32 softmax and P would take more than
# this share of the free device memory.
_MEMORY_SHARE = 0.8


@dataclass(frozen=True)
class Shape:
    part: str
    dtype: str
    b: int
    h: int
    n: int
    d: int
    causal: bool
    pass_: str = "fwd"

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r}: choose from {', '.join(PASSES)}")

    @property
    def key(self) -> str:
        """Unique per shape and pass; forward keys keep their old form (no pass suffix), so
        earlier results files resume and render unchanged."""
        mask = "causal" if self.causal else "full"
        key = f"{self.part}/{self.dtype}/b{self.b}h{self.h}n{self.n}d{self.d}/{mask}"
        return key if self.pass_ == "fwd" else f"{key}/{self.pass_}"

    @property
    def forward_flops(self) -> float:
        """``4·N²·d`` per head (the two GEMMs), halved for causal."""
        return 4.0 * self.b * self.h * self.n * self.n * self.d * (0.5 if self.causal else 1.0)

    @property
    def flops(self) -> float:
        """The FLOPs of this shape's pass: the forward's times :data:`FLOP_FACTOR`."""
        return self.forward_flops * FLOP_FACTOR[self.pass_]

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "dtype": self.dtype,
            "b": self.b,
            "h": self.h,
            "n": self.n,
            "d": self.d,
            "causal": self.causal,
            "pass": self.pass_,
        }


@dataclass
class BenchOptions:
    """What ``flashcheck bench`` runs; ``quick`` shrinks every part to a minutes-long smoke."""

    name: str | None = None
    out: str = "reports/bench"
    parts: tuple[str, ...] = PARTS
    providers: tuple[str, ...] | None = None
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


def plan(
    *,
    parts: tuple[str, ...] = PARTS,
    quick: bool = False,
    providers: tuple[str, ...] | None = None,
    passes: tuple[str, ...] = ("fwd",),
    ns: tuple[int, ...] | None = None,
    head_dims: tuple[int, ...] | None = None,
    dtypes: tuple[str, ...] | None = None,
) -> list[tuple[Shape, tuple[str, ...]]]:
    """The shapes of ``parts``, each with the providers that run on it, in run order: the
    goal shapes (bf16, d = 128) first, so an interrupted run has measured what matters most.

    Each shape appears once per pass of ``passes`` (in that order, pass by pass). ``ns``,
    ``head_dims``, ``dtypes`` keep only the shapes with those values (``None``: all).
    """
    for p in parts:
        if p not in PARTS:
            raise ValueError(f"unknown part {p!r}: choose from {', '.join(PARTS)}")
    unknown = [p for p in providers or () if p not in PROVIDERS]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}: choose from {', '.join(PROVIDERS)}")
    if not passes or any(p not in PASSES for p in passes):
        raise ValueError(
            f"passes must be a non-empty selection of {', '.join(PASSES)}, got {passes!r}"
        )
    if dtypes is not None and any(dt not in _ITEMSIZE for dt in dtypes):
        raise ValueError(f"dtypes must be among {', '.join(_ITEMSIZE)}, got {dtypes!r}")
    for name, vals in (("ns", ns), ("head_dims", head_dims)):
        if vals is not None and any(not isinstance(x, int) or x < 1 for x in vals):
            raise ValueError(f"{name} must be positive ints, got {vals!r}")
    only_n, only_d, only_dt = ns, head_dims, dtypes  # the names below are the grid's own
    ns = (1024, 4096) if quick else NS
    dims = (64, 128) if quick else HEAD_DIMS
    dtypes = ("bf16",) if quick else ("bf16", "fp16")

    def keep(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(p for p in names if providers is None or p in providers)

    out: list[tuple[Shape, tuple[str, ...]]] = []
    if "grid" in parts:
        order = sorted(dims, key=lambda d: (d != 128, d))
        for dt in dtypes:
            for d in order:
                for causal in (False, True):
                    for n in ns:
                        shape = Shape("grid", dt, max(1, TOKENS // n), WIDTH // d, n, d, causal)
                        out.append((shape, keep(GRID_PROVIDERS)))
    if "width" in parts:
        for w in WIDTHS[:2] if quick else WIDTHS:
            for causal in (False, True):
                out.append(
                    (
                        Shape("width", "bf16", TOKENS // 4096, w // 128, 4096, 128, causal),
                        keep(GRID_PROVIDERS),
                    )
                )
    if "memory" in parts:
        for n in ns:
            out.append(
                (Shape("memory", "bf16", 1, MEMORY_HEADS, n, 128, False), keep(GRID_PROVIDERS))
            )
    if "fp32" in parts:
        for d in (64, 128):
            for causal in (False, True):
                for n in (1024,) if quick else (1024, 4096, 16384):
                    out.append(
                        (
                            Shape("fp32", "fp32", max(1, TOKENS // n), WIDTH // d, n, d, causal),
                            keep(FP32_PROVIDERS),
                        )
                    )
    out = [
        (s, p)
        for s, p in out
        if p
        and (only_n is None or s.n in only_n)
        and (only_d is None or s.d in only_d)
        and (only_dt is None or s.dtype in only_dt)
    ]
    return [(replace(s, pass_=ps), p) for ps in passes for s, p in out]


def _inputs(shape: Shape, seed: int, copies: int) -> list[tuple[Any, Any, Any]]:
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[shape.dtype]
    g = torch.Generator(device="cuda").manual_seed(seed)
    size = (shape.b, shape.h, shape.n, shape.d)
    return [
        tuple(torch.randn(size, device="cuda", dtype=dt, generator=g) for _ in range(3))
        for _ in range(copies)
    ]


def _grad_outputs(shape: Shape, seed: int, copies: int) -> list[Any]:
    """The upstream gradients ``dO``, one per input copy, from their own generator so that
    the forward's inputs stay those of a forward-only run."""
    import torch

    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[shape.dtype]
    g = torch.Generator(device="cuda").manual_seed(seed + 1_000_003)
    size = (shape.b, shape.h, shape.n, shape.d)
    return [torch.randn(size, device="cuda", dtype=dt, generator=g) for _ in range(copies)]


def _short(exc: BaseException, caught: list) -> str:
    msg = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]
    reasons = [str(w.message).strip().splitlines()[0] for w in caught if str(w.message).strip()]
    return text + (f" (torch: {reasons[-1][:300]})" if reasons else "")


def _triton_info() -> dict[str, Any]:
    from ...kernels.triton_flash import last_compiled

    kern = last_compiled()
    meta = getattr(kern, "metadata", None)
    return {
        "registers": getattr(kern, "n_regs", None),
        "spills": getattr(kern, "n_spills", None),
        "warps": getattr(meta, "num_warps", None),
        "stages": getattr(meta, "num_stages", None),
        "shared_bytes": getattr(meta, "shared", None),
    }


def _measure(shape: Shape, name: str, sets: list, rows, *, memory: bool) -> dict[str, Any]:
    """First call (compile), sampled output rows, optional peak memory, then the timing."""
    import torch

    prov = PROVIDERS[name]
    rec: dict[str, Any] = {"type": "speed", "key": shape.key, "provider": name, **shape.as_dict()}
    why = prov.unsupported(shape.dtype, shape.d)
    if why:
        return {**rec, "status": "skipped", "reason": why}
    need = prov.score_bytes(shape.b, shape.h, shape.n, _ITEMSIZE[shape.dtype])
    torch.cuda.empty_cache()  # blocks cached by the previous provider count as free
    free, _ = torch.cuda.mem_get_info()
    if need > _MEMORY_SHARE * free:
        return {
            **rec,
            "status": "skipped",
            "reason": f"materializes N×N scores: needs {need / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free",
        }
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = prov.make(*sets[0], shape.causal)
            t0 = time.perf_counter()
            o = fn(*sets[0])
            torch.cuda.synchronize()
            rec["first_call_s"] = time.perf_counter() - t0
            rec["o_rows"] = sampled_output(o, rows)
            del o
            if name.startswith("triton"):
                rec["triton"] = _triton_info()
            if memory:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                o = fn(*sets[0])
                torch.cuda.synchronize()
                rec["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
                del o
            slow = prov.materializes or name == "sdpa-efficient"
            t = time_cuda(fn, sets, warmup=3, reps=10 if slow else 20, min_ms=150.0)
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {**rec, "status": "skipped", "reason": "out of memory: " + _short(exc, [])}
        except Exception as exc:  # a backend that declines the input: record why, go on
            torch.cuda.empty_cache()
            return {**rec, "status": "error", "reason": _short(exc, caught)}
    rec.update(
        status="ok",
        ms=t.median_ms,
        runs=len(t.runs_ms),
        spread=t.spread,
        tflops=shape.flops / t.median_ms / 1e9,
    )
    return rec


def _measure_backward(
    shape: Shape, name: str, sets: list, dos: list, rows, keys, *, memory: bool
) -> dict[str, Any]:
    """First forward + backward (compile), the sampled gradients, optional peak memory of the
    backward, then the timings of the pass (see the module docstring)."""
    import torch

    prov = PROVIDERS[name]
    rec: dict[str, Any] = {"type": "speed", "key": shape.key, "provider": name, **shape.as_dict()}
    why = prov.unsupported(shape.dtype, shape.d, backward=True)
    if why:
        return {**rec, "status": "skipped", "reason": why}
    # Materializing providers keep one graph only: their N × N traffic dwarfs any L2 anyway.
    graphs = 1 if prov.materializes else len(sets)
    need = graphs * prov.score_bytes(
        shape.b, shape.h, shape.n, _ITEMSIZE[shape.dtype], backward=True
    )
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if need > _MEMORY_SHARE * free:
        return {
            **rec,
            "status": "skipped",
            "reason": f"materializes N×N scores and their gradients: needs {need / 2**30:.1f} "
            f"GiB, {free / 2**30:.1f} GiB free",
        }
    leaves = [tuple(x.detach().requires_grad_(True) for x in s) for s in sets[:graphs]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = prov.make_grad(*leaves[0], shape.causal)
            t0 = time.perf_counter()
            o = fn(*leaves[0])
            dq, dk, dv = torch.autograd.grad(o, leaves[0], dos[0])
            torch.cuda.synchronize()
            rec["first_call_s"] = time.perf_counter() - t0
            rec["grads"] = sampled_grads(dq, dk, dv, rows, keys)
            del o, dq, dk, dv
            if memory:
                torch.cuda.synchronize()
                base0 = torch.cuda.memory_allocated()
                o = fn(*leaves[0])
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                rec["saved_bytes"] = base - base0  # O and what autograd keeps for the backward
                torch.cuda.reset_peak_memory_stats()
                g = torch.autograd.grad(o, leaves[0], dos[0])
                torch.cuda.synchronize()
                rec["bwd_peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
                del o, g
            slow = prov.materializes or name == "sdpa-efficient"
            opts = {"warmup": 3, "reps": 10 if slow else 20, "min_ms": 150.0}
            timings = {}
            if shape.pass_ == "bwd":
                timings["fwd"] = time_cuda(fn, leaves, **opts)
                timings["bwd"] = _time_retained(fn, leaves, dos, opts)
            timings["fwd+bwd"] = time_cuda(
                lambda q, k, v, do: torch.autograd.grad(fn(q, k, v), (q, k, v), do),
                [(*x, do) for x, do in zip(leaves, dos, strict=False)],
                **opts,
            )
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {**rec, "status": "skipped", "reason": "out of memory: " + _short(exc, [])}
        except Exception as exc:  # a backend that declines the input: record why, go on
            torch.cuda.empty_cache()
            return {**rec, "status": "error", "reason": _short(exc, caught)}
    rec.update(_pass_figures(shape, timings))
    return rec


def _time_retained(fn, leaves: list, dos: list, opts: dict[str, Any]):
    """The backward alone: one forward per input copy builds a graph outside the timing; each
    timed call is ``torch.autograd.grad`` through it with ``retain_graph=True``."""
    import torch

    outs = [fn(*x) for x in leaves]
    args = [(o, *x, do) for o, x, do in zip(outs, leaves, dos, strict=False)]
    try:
        return time_cuda(
            lambda o, q, k, v, do: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
            args,
            **opts,
        )
    finally:
        del outs, args


def _pass_figures(shape: Shape, timings: dict[str, Any]) -> dict[str, Any]:
    """The record's speed fields: the pass's own timing (``ms``, ``tflops``, ``runs``,
    ``spread``) and, for ``bwd``, the side timings and ``fwd+bwd − fwd``."""
    t = timings[shape.pass_]
    out: dict[str, Any] = {
        "status": "ok",
        "ms": t.median_ms,
        "runs": len(t.runs_ms),
        "spread": t.spread,
        "tflops": shape.flops / t.median_ms / 1e9,
    }
    if shape.pass_ == "bwd":
        fwd, both = timings["fwd"].median_ms, timings["fwd+bwd"].median_ms
        out.update(fwd_ms=fwd, fwdbwd_ms=both, diff_ms=both - fwd)
        out["diff_tflops"] = shape.flops / (both - fwd) / 1e9 if both > fwd else None
    return out


def run_shape(
    shape: Shape, providers: tuple[str, ...], *, seed: int, oracle_max_n: int = ORACLE_MAX_N
) -> list[dict[str, Any]]:
    """Every provider on one shape, then the oracle check of each output (forward) or of each
    provider's gradients (backward passes); one record each."""
    import torch

    per_copy = 3 * shape.b * shape.h * shape.n * shape.d * _ITEMSIZE[shape.dtype]
    sets = _inputs(shape, seed, copies_for_l2(per_copy))
    rows = sample_rows(shape.n, seed=seed)
    if shape.pass_ != "fwd":
        return _run_backward_shape(shape, providers, sets, rows, seed, oracle_max_n)
    recs = [_measure(shape, p, sets, rows, memory=shape.part == "memory") for p in providers]
    if shape.part == "memory":
        for r in recs:
            r["out_bytes"] = shape.b * shape.h * shape.n * shape.d * _ITEMSIZE[shape.dtype]
            r["lse_bytes"] = shape.b * shape.h * shape.n * 4
    t0 = time.perf_counter()
    ref = reference(*sets[0], causal=shape.causal, rows=rows)
    for r in recs:
        if r["status"] == "ok":
            r["check"] = judge_rows(r.pop("o_rows"), ref, PROVIDERS[r["provider"]].arithmetic)
    for r in recs:
        r["check_s"] = time.perf_counter() - t0
    del sets
    torch.cuda.empty_cache()
    return recs


def _run_backward_shape(shape, providers, sets, rows, seed, oracle_max_n):
    import torch

    dos = _grad_outputs(shape, seed, len(sets))
    keys = sample_rows(shape.n, seed=seed + 1)
    memory = shape.part == "memory"
    recs = [_measure_backward(shape, p, sets, dos, rows, keys, memory=memory) for p in providers]
    if memory:
        for r in recs:
            r["grad_bytes"] = 3 * shape.b * shape.h * shape.n * shape.d * _ITEMSIZE[shape.dtype]
    t0 = time.perf_counter()
    if any(r["status"] == "ok" for r in recs):
        try:
            ref = grad_reference(
                *sets[0],
                dos[0],
                causal=shape.causal,
                rows=rows,
                keys=keys,
                oracle_max_n=oracle_max_n,
                seed=seed,
            )
        except Exception as exc:  # e.g. the naive baseline out of memory: nothing scores
            torch.cuda.empty_cache()
            ref, why = None, _short(exc, [])
        for r in recs:
            if r["status"] == "ok":
                cls = PROVIDERS[r["provider"]].backward_arithmetic
                r["check"] = (
                    judge_grads(r.pop("grads"), ref, cls)
                    if ref is not None
                    else {"verdict": "unchecked", "reasons": [f"no reference: {why}"]}
                )
    for r in recs:
        r.pop("grads", None)
        r["check_s"] = time.perf_counter() - t0
    del sets, dos
    torch.cuda.empty_cache()
    return recs


def run_bench(opts: BenchOptions) -> int:
    """Run (or resume) the benchmark and render it; the exit status of ``flashcheck bench``."""
    import torch

    from ..core.environment import environment_record
    from .ceilings import measure_ceilings

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
    items = plan(
        parts=opts.parts,
        quick=opts.quick,
        providers=opts.providers,
        passes=opts.passes,
        ns=opts.ns,
        head_dims=opts.head_dims,
        dtypes=opts.dtypes,
    )
    config: dict[str, Any] = {
        "parts": list(opts.parts),
        "quick": opts.quick,
        "seed": opts.seed,
        "providers": None if opts.providers is None else list(opts.providers),
    }
    # Only what differs from a forward run of the whole grid, so results files written before
    # these options existed still resume.
    if opts.passes != ("fwd",):
        config["passes"] = list(opts.passes)
        config["oracle_max_n"] = opts.oracle_max_n
    for field_name in ("ns", "head_dims", "dtypes"):
        if getattr(opts, field_name) is not None:
            config[field_name] = list(getattr(opts, field_name))
    header = {"tool": "flashcheck bench", "name": name, "config": config}
    path = out_dir / "results.jsonl"
    with ResultLog.open(path, header, fresh=opts.fresh) as log:
        log.append({"type": "session", "env": environment_record("cuda")})
        done = {r["key"] for r in log.records if r.get("type") == "shape-done"}
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
            log.append({"type": "ceilings", **measure_ceilings()})
            for shape, provs in todo:
                for rec in run_shape(shape, provs, seed=opts.seed, oracle_max_n=opts.oracle_max_n):
                    log.append(rec)
                log.append({"type": "shape-done", "key": shape.key})
                prog.advance(cost[shape.key], shape.key)
            log.append({"type": "ceilings", **measure_ceilings()})
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


def _gpu_slug(gpu: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100"``: the report directory of a GPU model."""
    for word in gpu.lower().replace("-", " ").split():
        if any(c.isdigit() for c in word) and any(c.isalpha() for c in word) and "gb" not in word:
            return word
    return "gpu"
