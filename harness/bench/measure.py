"""Measuring one shape on every provider: the first call (compile), the sampled output rows or
gradients for the oracle check, optional peak memory, then the timing; one record each
(:func:`run_shape`). See :mod:`flashcheck.harness.bench.suite` for the method."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .benchrecords import SpeedRecord
from .check import judge_rows, reference, sample_rows, sampled_output
from .grad_check import ORACLE_MAX_N, grad_reference, judge_grads, sampled_grads
from .providers import PROVIDERS, Provider, bench_sinks
from .shapes import ITEMSIZE, Shape
from .timing import Timing, copies_for_l2, time_cuda, time_round_robin

__all__ = ["MEMORY_SHARE", "run_shape"]

# Materializing providers are skipped where S, its fp32 softmax and P would take more than
# this share of the free device memory.
MEMORY_SHARE = 0.8


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


def _slow(prov: Provider) -> bool:
    """Timed alone, with fewer runs: the materializing providers (their N × N scores) and
    SDPA's memory-efficient backend."""
    return prov.materializes or prov.name == "sdpa-efficient"


def _prepare(
    shape: Shape, prov: Provider, sets: list, rows, *, memory: bool
) -> tuple[dict[str, Any], Callable[..., Any] | None]:
    """First call (compile), sampled output rows, optional peak memory: the record so far and
    the call to time (``None`` where the provider was skipped or raised)."""
    import torch

    name = prov.name
    rec: dict[str, Any] = {"type": "speed", "key": shape.key, "provider": name, **shape.as_dict()}
    why = prov.unsupported(shape.dtype, shape.d, causal=shape.causal)
    if why:
        return {**rec, "status": "skipped", "reason": why}, None
    need = prov.score_bytes(shape.b, shape.h, shape.n, ITEMSIZE[shape.dtype])
    torch.cuda.empty_cache()  # blocks cached by the previous provider count as free
    free, _ = torch.cuda.mem_get_info()
    if need > MEMORY_SHARE * free:
        reason = (
            f"materializes N×N scores: needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
        )
        return {**rec, "status": "skipped", "reason": reason}, None
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
            if name.startswith("triton") and prov.kernel_spec is None:  # this project's kernel
                rec["triton"] = _triton_info()
            if memory:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                o = fn(*sets[0])
                torch.cuda.synchronize()
                rec["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
                del o
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {**rec, "status": "skipped", "reason": "out of memory: " + _short(exc, [])}, None
        except Exception as exc:  # a backend that declines the input: record why, go on
            torch.cuda.empty_cache()
            return {**rec, "status": "error", "reason": _short(exc, caught)}, None
    return rec, fn


@dataclass(frozen=True)
class _Failed:
    """A timing that raised: the status and reason its record gets."""

    status: str
    reason: str


Timer = Callable[[list[int]], dict[str, list[Timing]]]


def _time_together(recs: list[dict[str, Any]], timer: Timer) -> dict[int, dict[str, Timing]]:
    """``timer(indices)`` times the providers of ``recs`` at those indices together: each pass's
    timings, one per index. Where that raises, each is timed alone, and a record whose own
    timing raises gets its error or out-of-memory status. Returns the timed indices' timings
    by pass."""
    import torch

    def attempt(idx: list[int]) -> dict[int, dict[str, Timing]] | _Failed:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                by_pass = timer(idx)
            except torch.OutOfMemoryError as exc:
                torch.cuda.empty_cache()
                return _Failed("skipped", "out of memory: " + _short(exc, []))
            except Exception as exc:  # a backend that declines the input: record why, go on
                torch.cuda.empty_cache()
                return _Failed("error", _short(exc, caught))
        return {i: {p: ts[j] for p, ts in by_pass.items()} for j, i in enumerate(idx)}

    if not recs:
        return {}
    everyone = list(range(len(recs)))
    got = attempt(everyone)
    if not isinstance(got, _Failed):
        return got
    out: dict[int, dict[str, Timing]] = {}
    for i in everyone:
        one = attempt([i]) if len(recs) > 1 else got
        if isinstance(one, _Failed):
            recs[i].update(status=one.status, reason=one.reason)
            recs[i].pop("o_rows", None)
            recs[i].pop("grads", None)
        else:
            out.update(one)
            recs[i]["timing"] = "alone"
    return out


def _timed(calls: list, *, slow: bool) -> list[Timing]:
    """The timings of ``calls`` (``(fn, inputs)`` each): fast providers in turn, round after
    round; slow ones one after the other, each alone, with fewer runs."""
    opts = {"warmup": 3, "reps": 10 if slow else 20, "min_ms": 150.0}
    if slow:
        return [time_cuda(fn, inputs, **opts) for fn, inputs in calls]
    return time_round_robin(calls, **opts)


def _forward_timer(fns: list, sets: list, *, slow: bool) -> Timer:
    return lambda idx: {"fwd": _timed([(fns[i], sets) for i in idx], slow=slow)}


def _time_all(
    shape: Shape,
    prepared: list,
    is_slow: Callable[[dict[str, Any]], bool],
    timer_for: Callable[[list, bool], Timer],
) -> None:
    """Times every prepared provider (``(record, what to time)``; nothing to time: ``None``)
    and writes its figures into its record: the fast ones together, then the slow ones
    (``timer_for(what to time, slow)`` builds each group's :data:`Timer`)."""
    for slow in (False, True):
        group = [(r, c) for r, c in prepared if c is not None and is_slow(r) == slow]
        recs = [r for r, _ in group]
        for i, by_pass in _time_together(recs, timer_for([c for _, c in group], slow)).items():
            recs[i].update(_pass_figures(shape, by_pass))
            recs[i].setdefault("timing", "alone" if slow or len(recs) == 1 else "in turn")


def _prepare_backward(
    shape: Shape, prov: Provider, sets: list, dos: list, rows, keys, *, memory: bool
) -> tuple[dict[str, Any], tuple[Callable[..., Any], list] | None]:
    """First forward + backward (compile), the sampled gradients, optional peak memory of the
    backward: the record so far and what to time, the differentiable call and its input
    leaves (``None`` where the provider was skipped or raised)."""
    import torch

    name = prov.name
    rec: dict[str, Any] = {"type": "speed", "key": shape.key, "provider": name, **shape.as_dict()}
    why = prov.unsupported(shape.dtype, shape.d, causal=shape.causal, backward=True)
    if why:
        return {**rec, "status": "skipped", "reason": why}, None
    # Materializing providers keep one graph only: their N × N traffic dwarfs any L2 anyway.
    graphs = 1 if prov.materializes else len(sets)
    need = graphs * prov.score_bytes(
        shape.b, shape.h, shape.n, ITEMSIZE[shape.dtype], backward=True
    )
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    if need > MEMORY_SHARE * free:
        return {
            **rec,
            "status": "skipped",
            "reason": f"materializes N×N scores and their gradients: needs {need / 2**30:.1f} "
            f"GiB, {free / 2**30:.1f} GiB free",
        }, None
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
        except torch.OutOfMemoryError as exc:
            torch.cuda.empty_cache()
            return {**rec, "status": "skipped", "reason": "out of memory: " + _short(exc, [])}, None
        except Exception as exc:  # a backend that declines the input: record why, go on
            torch.cuda.empty_cache()
            return {**rec, "status": "error", "reason": _short(exc, caught)}, None
    return rec, (fn, leaves)


def _backward_timer(ctxs: list, dos: list, pass_: str, *, slow: bool) -> Timer:
    """The backward pass's timings (``bwd``: the forward, the backward alone on retained graphs,
    forward + backward; ``fwd+bwd``: the last only): fast providers in turn, round after
    round, slow ones each alone."""
    import torch

    def step(fn):
        return lambda q, k, v, do: torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    def run(idx: list[int]) -> dict[str, list[Timing]]:
        out: dict[str, list[Timing]] = {}
        if pass_ == "bwd":
            out["fwd"] = _timed([(ctxs[i][0], ctxs[i][1]) for i in idx], slow=slow)
            # One forward per input copy builds each graph outside the timing; each timed
            # call is ``torch.autograd.grad`` through it with ``retain_graph=True``.
            retained = [
                [(ctxs[i][0](*x), *x, do) for x, do in zip(ctxs[i][1], dos, strict=False)]
                for i in idx
            ]
            try:
                out["bwd"] = _timed([(_grad_retained, args) for args in retained], slow=slow)
            finally:
                del retained
        out["fwd+bwd"] = _timed(
            [
                (step(ctxs[i][0]), [(*x, do) for x, do in zip(ctxs[i][1], dos, strict=False)])
                for i in idx
            ],
            slow=slow,
        )
        return out

    return run


def _grad_retained(o, q, k, v, do):
    import torch

    return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


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


def _options(prov: Any, inputs: tuple) -> dict[str, Any]:
    """The oracle's ``softcap=``/``sinks=`` for a provider's options on ``inputs``."""
    q, k, _ = inputs
    sinks = bench_sinks(q.shape[1], k.shape[2], q.device) if prov.sinks else None
    return {"softcap": prov.softcap, "sinks": sinks}


def run_shape(
    shape: Shape,
    providers: tuple[str, ...],
    *,
    seed: int,
    oracle_max_n: int = ORACLE_MAX_N,
    table: Mapping[str, Provider] | None = None,
) -> list[SpeedRecord]:
    """Every provider on one shape, then the oracle check of each output (forward) or of each
    provider's gradients (backward passes); one record each. ``table``: the providers by name
    (default :data:`~flashcheck.harness.bench.providers.PROVIDERS`; a run with a user's kernels
    passes :func:`~flashcheck.harness.bench.providers.provider_table`'s)."""
    import torch

    table = PROVIDERS if table is None else table
    missing = [p for p in providers if p not in table]
    if missing:
        raise ValueError(f"providers {missing} are not in the table: choose from {list(table)}")

    per_copy = 3 * shape.b * shape.h * shape.n * shape.d * ITEMSIZE[shape.dtype]
    sets = _inputs(shape, seed, copies_for_l2(per_copy))
    rows = sample_rows(shape.n, seed=seed)
    if shape.pass_ != "fwd":
        provs = [table[p] for p in providers]
        recs = _run_backward_shape(shape, provs, sets, rows, seed, oracle_max_n)
        return [SpeedRecord.from_json(r) for r in recs]
    memory = shape.part == "memory"
    prepared = [_prepare(shape, table[p], sets, rows, memory=memory) for p in providers]
    _time_all(
        shape,
        prepared,
        lambda r: _slow(table[r["provider"]]),
        lambda fns, slow, sets=sets: _forward_timer(fns, sets, slow=slow),
    )
    recs = [r for r, _ in prepared]
    del prepared
    if shape.part == "memory":
        for r in recs:
            r["out_bytes"] = shape.b * shape.h * shape.n * shape.d * ITEMSIZE[shape.dtype]
            r["lse_bytes"] = shape.b * shape.h * shape.n * 4
    t0 = time.perf_counter()
    refs: dict[tuple, Any] = {}  # one oracle reference per set of softmax options
    for r in recs:
        if r["status"] == "ok":
            prov = table[r["provider"]]
            if prov.options not in refs:
                refs[prov.options] = reference(
                    *sets[0], causal=shape.causal, rows=rows, **_options(prov, sets[0])
                )
            r["check"] = judge_rows(r.pop("o_rows"), refs[prov.options], prov.arithmetic, prov.tanh)
    for r in recs:
        r["check_s"] = time.perf_counter() - t0
    del sets
    torch.cuda.empty_cache()
    return [SpeedRecord.from_json(r) for r in recs]


def _run_backward_shape(shape, providers, sets, rows, seed, oracle_max_n):
    import torch

    dos = _grad_outputs(shape, seed, len(sets))
    keys = sample_rows(shape.n, seed=seed + 1)
    memory = shape.part == "memory"
    prepared = [
        _prepare_backward(shape, p, sets, dos, rows, keys, memory=memory) for p in providers
    ]
    by_name = {p.name: p for p in providers}
    _time_all(
        shape,
        prepared,
        lambda r: _slow(by_name[r["provider"]]),
        lambda ctxs, slow, dos=dos: _backward_timer(ctxs, dos, shape.pass_, slow=slow),
    )
    recs = [r for r, _ in prepared]
    del prepared
    if memory:
        for r in recs:
            r["grad_bytes"] = 3 * shape.b * shape.h * shape.n * shape.d * ITEMSIZE[shape.dtype]
    t0 = time.perf_counter()
    refs: dict[tuple, Any] = {}  # one reference (or why there is none) per set of options
    for r in recs:
        if r["status"] != "ok":
            continue
        prov = by_name[r["provider"]]
        if prov.options not in refs:
            try:
                refs[prov.options] = grad_reference(
                    *sets[0],
                    dos[0],
                    causal=shape.causal,
                    rows=rows,
                    keys=keys,
                    oracle_max_n=oracle_max_n,
                    seed=seed,
                    **_options(prov, sets[0]),
                )
            except Exception as exc:  # e.g. the naive baseline out of memory: nothing scores
                torch.cuda.empty_cache()
                refs[prov.options] = _short(exc, [])
        ref = refs[prov.options]
        r["check"] = (
            judge_grads(r.pop("grads"), ref, prov.backward_arithmetic, prov.tanh)
            if not isinstance(ref, str)
            else {"verdict": "unchecked", "reasons": [f"no reference: {ref}"]}
        )
    for r in recs:
        r.pop("grads", None)
        r["check_s"] = time.perf_counter() - t0
    del sets, dos
    torch.cuda.empty_cache()
    return recs
