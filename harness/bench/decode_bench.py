"""``flashcheck bench --decode``: latency and bandwidth of paged decode attention on one GPU.

For each shape of :data:`~.decode_shapes.DECODE_SHAPES` one paged batch is drawn
(:func:`~.decode_providers.make_batch`) and every provider of
:data:`~.decode_providers.DECODE_PROVIDERS` runs on it: a first call (compilation), the oracle
check of its output on sampled sequences (:func:`check_sequences`: the first and the last
sequence, query heads 0 and Hq−1, every query row, judged by
:func:`flashcheck.harness.bench.check.judge_rows`), then the timing
(:func:`time_flushed_in_turn`: CUDA events after warm-up, the shape's providers taken in turn
round after round, the L2 cache overwritten before each run, the median).
The device copy bandwidth is measured before and after the shapes. Records go to
``<out>/<name>/results.jsonl`` as they are measured (a rerun resumes); ``bench-decode.md``
is rendered from them (:mod:`~.decode_report`).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from ..core.resultlog import ResultLog
from .check import judge_rows, reference, sample_rows, sampled_output
from .decode_providers import DECODE_PROVIDERS, PagedBatch, make_batch
from .decode_report import CopyCeiling, DecodeRecord, SequenceCheck, render_decode
from .decode_shapes import DECODE_SHAPES, QUICK_SHAPES, DecodeShape, kv_bytes, lengths_of
from .timing import Timing

__all__ = [
    "ARITHMETIC",
    "DecodeOptions",
    "check_sequences",
    "run_decode_bench",
    "time_flushed",
    "time_flushed_in_turn",
]

FLUSH_BYTES = 256 * 2**20  # five times an H100's L2 (50 MiB): nothing of the last run survives

# The bounds each provider's outputs are judged with ("unknown": the loosest class).
ARITHMETIC = {"triton-decode-paged": "flash", "sdpa": "unknown", "flex-paged": "unknown"}


@dataclass
class DecodeOptions:
    """What ``flashcheck bench --decode`` runs; ``quick``: two small shapes (a smoke test)."""

    name: str | None = None
    out: str = "reports/bench"
    providers: tuple[str, ...] | None = None
    quick: bool = False
    fresh: bool = False
    render: bool = True
    seed: int = 0
    stream: TextIO | None = None

    def shapes(self) -> tuple[DecodeShape, ...]:
        return QUICK_SHAPES if self.quick else DECODE_SHAPES

    def chosen(self) -> tuple[str, ...]:
        """The providers to run, in :data:`DECODE_PROVIDERS`' order; unknown names raise."""
        if self.providers is None:
            return tuple(DECODE_PROVIDERS)
        unknown = sorted(set(self.providers) - set(DECODE_PROVIDERS))
        if unknown:
            raise ValueError(
                f"unknown decode provider(s) {', '.join(unknown)}: choose from "
                f"{', '.join(DECODE_PROVIDERS)}"
            )
        return tuple(p for p in DECODE_PROVIDERS if p in self.providers)


def _dense_pair(batch: PagedBatch, o: Any, b: int) -> tuple[Any, Any, Any, Any]:
    """Sequence ``b`` as a dense two-head problem: query heads 0 and Hq−1 (on key/value heads
    0 and Hk−1), ``(1, 2, N, d)`` each, and the provider's output of those heads."""
    import torch

    page = batch.k_cache.shape[1]
    n = batch.lengths[b]
    hq, hk = batch.q.shape[2], batch.k_cache.shape[2]
    owned = batch.block_table[b, : -(-n // page)].long()
    kv = []
    for cache in (batch.k_cache, batch.v_cache):
        rows = cache[owned].reshape(-1, *cache.shape[2:])[:n]  # (n, Hk, d)
        kv.append(rows[:, [0, hk - 1]].transpose(0, 1)[None].contiguous())
    heads = [0, hq - 1]
    q = batch.q[b][:, heads].transpose(0, 1)[None].contiguous()
    out = o[b][:, heads].transpose(0, 1)[None]
    return q, kv[0], kv[1], torch.as_tensor(out)


def check_sequences(batch: PagedBatch, o: Any, arithmetic: str) -> tuple[SequenceCheck, ...]:
    """The oracle verdicts of the first and the last sequence (module docstring)."""
    picked = sorted({0, len(batch.lengths) - 1})
    checks = []
    for b in picked:
        q, k, v, out = _dense_pair(batch, o, b)
        rows = sample_rows(q.shape[2])
        ref = reference(q, k, v, causal=batch.causal, rows=rows)
        res = judge_rows(sampled_output(out, rows), ref, arithmetic)
        checks.append(
            SequenceCheck(
                b,
                batch.lengths[b],
                str(res["verdict"]),
                float(res["max_ulp"]),
                None if res["det_util"] is None else float(res["det_util"]),
                tuple(res["reasons"])[:3],
            )
        )
    return tuple(checks)


def time_flushed(fn: Any, *, warmup: int = 10, reps: int = 30, min_ms: float = 100.0) -> Timing:
    """Median-of-runs GPU time of ``fn()`` with CUDA events, the L2 cache overwritten before
    each run (a decode step's K/V is read once: a cache that still holds the previous run's
    keys would credit the kernel with bandwidth it does not have); ``reps`` is raised, up to
    200, until the timed runs add up to about ``min_ms``."""
    import torch

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    flush.zero_()
    a.record()
    fn()
    z.record()
    torch.cuda.synchronize()
    n = int(min(200, max(reps, math.ceil(min_ms / max(a.elapsed_time(z), 1e-3)))))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(n)
    ]
    for a, z in events:
        flush.zero_()
        a.record()
        fn()
        z.record()
    torch.cuda.synchronize()
    return Timing(tuple(a.elapsed_time(z) for a, z in events))


def time_flushed_in_turn(
    fns: list[Any], *, warmup: int = 10, reps: int = 30, min_ms: float = 100.0
) -> list[Timing]:
    """:func:`time_flushed` for several providers of one shape at once: their calls taken in
    turn, round after round (:func:`~.timing.time_round_robin`), the L2 cache overwritten
    before each, so that every provider runs at the clocks of the same moments."""
    import torch

    from .timing import time_round_robin

    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    calls = [(fn, [()]) for fn in fns]
    return time_round_robin(calls, warmup=warmup, reps=reps, min_ms=min_ms, before=flush.zero_)


def _error(base: DecodeRecord, exc: Exception) -> DecodeRecord:
    """``base`` as a provider that raised: status ``error``, the exception's first line."""
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
    return replace(base, status="error", reason=text[:300])


def _prepare(batch: PagedBatch, provider: str, base: DecodeRecord) -> tuple[DecodeRecord, Any]:
    """The provider's first call (its compilation) and the oracle check of its output: the
    record so far and the function to time (``None`` if it raised)."""
    try:
        fn = DECODE_PROVIDERS[provider](batch)
        checks = check_sequences(batch, fn(), ARITHMETIC[provider])
    except Exception as exc:  # a provider that cannot run this shape is reported, not fatal
        return _error(base, exc), None
    bad = [c for c in checks if c.verdict != "PASS"]
    failed = f"sequence {bad[0].sequence}: {bad[0].verdict}" if bad else ""
    status, reason = ("failed", failed) if bad else ("ok", "")
    rec = replace(base, note=getattr(fn, "note", ""), status=status, reason=reason)
    return replace(rec, checks=checks), fn


def _timed(
    recs: list[DecodeRecord], fns: list[Any], timer=time_flushed_in_turn, alone=time_flushed
):
    """``recs`` with the times of ``fns`` (``None`` where the provider raised): the runnable
    ones timed in turn; if that raises, each alone, and one that still raises is an error."""
    idx = [i for i, fn in enumerate(fns) if fn is not None]
    out = list(recs)
    try:
        times = dict(zip(idx, timer([fns[i] for i in idx]), strict=True)) if idx else {}
        how = "in turn" if len(idx) > 1 else "alone"
    except Exception:  # one provider's failure must not cost the others their times
        times, how = {}, "alone"
        for i in idx:
            try:
                times[i] = alone(fns[i])
            except Exception as exc:
                out[i] = _error(recs[i], exc)
    for i, t in times.items():
        out[i] = replace(recs[i], median_us=t.median_ms * 1e3, spread=t.spread, timing=how)
    return out


def _copy_ceiling() -> CopyCeiling:
    import torch

    from .timing import time_cuda

    x = torch.empty(2**28, device="cuda", dtype=torch.float32).uniform_()
    y = torch.empty_like(x)
    t = time_cuda(lambda src, dst: dst.copy_(src), [(x, y)], warmup=3, reps=20)
    del x, y
    torch.cuda.empty_cache()
    return CopyCeiling(2.0 * 2**30 / t.median_ms / 1e9)


def run_decode_bench(opts: DecodeOptions) -> int:
    """Run (or resume) the decode benchmark and render it; the exit status of
    ``flashcheck bench --decode`` (0 done, 2 no GPU or bad options, 130 interrupted)."""
    import torch

    from ..core.environment import environment_record

    stream = opts.stream if opts.stream is not None else sys.stderr
    if not torch.cuda.is_available():
        print(
            "flashcheck bench --decode: no CUDA GPU is visible to torch "
            f"({torch.__version__}); the decode benchmark times GPU kernels. Run it on a "
            "machine with an NVIDIA GPU and a CUDA build of torch.",
            file=stream,
        )
        return 2
    providers = opts.chosen()
    name = opts.name or "decode"
    path = Path(opts.out) / name / "results.jsonl"
    config = {"quick": opts.quick, "seed": opts.seed, "providers": list(providers)}
    header = {"tool": "flashcheck bench --decode", "name": name, "config": config}
    with ResultLog.open(path, header, fresh=opts.fresh) as log:
        log.append({"type": "session", "env": environment_record("cuda")})
        done = {(r["shape"], r["provider"]) for r in log.records if r.get("type") == "decode"}
        print(f"flashcheck bench --decode: results -> {path}", file=stream)
        try:
            log.append(_copy_ceiling().to_json())
            for shape in opts.shapes():
                _run_shape(shape, providers, opts.seed, log, done, stream)
            log.append(_copy_ceiling().to_json())
        except KeyboardInterrupt:
            print(f"\ninterrupted: results so far are in {path}; rerun to resume", file=stream)
            return 130
    if opts.render:
        print(f"decode bench report: {render_decode(path)}", file=stream)
    return 0


def _run_shape(shape, providers, seed, log, done, stream) -> None:
    import torch

    todo = [p for p in providers if (shape.key, p) not in done]
    if not todo:
        return
    lengths = lengths_of(shape, seed=seed)
    opts = {"nq": shape.nq, "hq": shape.hq, "hk": shape.hk, "d": shape.d, "page": shape.page}
    batch = make_batch(lengths, dtype=shape.dtype, causal=shape.causal, seed=seed, **opts)
    base = DecodeRecord(shape.key, "", "error", kv_bytes(shape, lengths), sum(lengths))
    prepared = [_prepare(batch, p, replace(base, provider=p)) for p in todo]
    recs = _timed([r for r, _ in prepared], [fn for _, fn in prepared])
    for rec in recs:
        log.append(rec.to_json())
        gbs = f"{rec.gbs:.0f} GB/s" if rec.gbs else rec.reason
        print(f"  {shape.key} {rec.provider}: {rec.status} {gbs}", file=stream)
    del batch
    torch.cuda.empty_cache()
