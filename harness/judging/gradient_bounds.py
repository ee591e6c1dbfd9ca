"""A-priori error bounds for the gradients dQ, dK, dV of attention kernels
(docs/error-bounds.md §11).

Given exact inputs ``q, k, v, dO`` and an arithmetic class, :func:`gradient_bounds` returns for
every element of ``dQ (B, Hq, Nq, d)``, ``dK (B, Hk, Nk, d)`` and ``dV (B, Hk, Nk, dv)`` an
absolute bound on the error of a kernel of that class, the final rounding into the input format
F included:

- a deterministic bound: first order in the unit roundoffs (products of two roundoffs are
  covered by a ``1 + 8u_F`` factor), every other step rigorous in the IEEE model plus the
  hardware assumptions A1 (fp32 accumulation charged the chopping bound ``2·u32`` per step) and
  A2 (fp32 ``exp2`` within 2 ulp) of ``docs/error-bounds.md``;
- a probabilistic bound: accumulation constants ``n·u`` replaced by ``λ·√n·u`` and the
  roundings of P and dS into F by Hoeffding bounds (each term fails with probability at most
  ``2·exp(−λ²/2)`` when rounding errors are independent and zero-mean).

The derivation, term by term, is section 11 of ``docs/error-bounds.md``. Everything is computed
in float64 from the exact scores, weights ``P``, ``dP = dO·Vᵀ``, ``D = Σ_j P·dP`` and
``dS = P∘(dP − D)``; their own error (~1e−16 relative) is far below the slack.

Arithmetic classes (what a kernel declares for its backward):

``naive``
    Autograd of the same-precision naive forward (``kernels/naive.py``): S stored in F, P in
    fp32 (kept for the backward) and rounded to F for P·V; ``dV = fl_F(P_Fᵀ·dO)``,
    ``dP = fl_F(dO·Vᵀ)``, ``dS = fl_F(P32∘(dP − rowsum(P32∘dP)))`` in fp32, ``dQ`` and ``dK``
    from dS_F by fp32-accumulated GEMMs stored in F, the scale applied last to dQ; GQA: per-head
    dK, dV in F, summed over the group in F.
``flash``
    FlashAttention-2's backward: P recomputed in fp32 from the forward's fp32 LSE through exp2,
    ``D = Σ_c dO·O`` from the forward's output rounded to F, P and dS rounded to F before their
    GEMMs, fp32 accumulators (one per group of query heads for dK, dV), the scale applied to
    the fp32 accumulators at the end. The forward is bounded by :func:`error_bounds` with
    ``arithmetic="flash"`` (any key blocking).
``flash-fa1``
    The same backward after an FA1 forward (per-block renormalisation): only O's bound differs.
``tf32``
    As ``flash`` with fp32 inputs whose GEMM operands are truncated to tf32 (10 fraction bits).
``unknown``
    The elementwise largest bound of the classes above at or above F's precision (any
    blocking; the precision floor of :mod:`~flashcheck.harness.judging.classes`): ``tf32``
    applies only when declared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import Format
from ..core.semantics import AttentionProblem, as_exact_array, make_problem
from .bounds import problem_bounds
from .classes import applicable_classes, floor_classes
from .gradient_terms import Context, Sums, chunk_bounds, finish_sums
from .option_terms import SinkTerms, sink_keep, with_sink
from .roundoff import LAMBDA, SAFETY, TensorBounds, finite, tanh_error

__all__ = [
    "GRADIENTS",
    "GRADIENT_CLASSES",
    "GradientBounds",
    "gradient_bounds",
    "problem_gradient_bounds",
]

GRADIENT_CLASSES = ("naive", "flash", "flash-fa1", "tf32", "unknown")
GRADIENTS = ("dq", "dk", "dv")
_CHUNK = 1 << 19  # elements of one (rows, keys) work matrix per chunk


@dataclass
class GradientBounds:
    """Absolute error bounds, a :class:`TensorBounds` per gradient: ``dq`` ``(B, Hq, Nq, d)``,
    ``dk`` ``(B, Hk, Nk, d)``, ``dv`` ``(B, Hk, Nk, dv)`` (``bounds["dq"].det``) and, for a
    problem with sinks, ``dsinks`` ``(Hq,)``.

    A query row that keeps no key has dQ bound 0 (the exact result is 0 and every class returns
    exactly 0); a key that no query row of its group keeps has dK, dV bound 0.
    ``parts``: for class ``unknown``, the bounds of every class that applies to the input
    format; the envelope is the largest of those at or above the precision floor.
    """

    arithmetic: str
    fmt: Format
    lam: float
    tensors: dict[str, TensorBounds]
    parts: dict[str, GradientBounds] = field(default_factory=dict)

    def __getitem__(self, name: str) -> TensorBounds:
        return self.tensors[name]

    @property
    def dq(self) -> TensorBounds:
        return self.tensors["dq"]

    @property
    def dk(self) -> TensorBounds:
        return self.tensors["dk"]

    @property
    def dv(self) -> TensorBounds:
        return self.tensors["dv"]


def gradient_bounds(
    q: Any,
    k: Any,
    v: Any,
    do: Any,
    *,
    arithmetic: str,
    causal: bool = False,
    window: Any = None,
    mask: Any = None,
    scale: float | None = None,
    key_block: int | None = None,
    query_block: int | None = None,
    lam: float = LAMBDA,
    softcap: float | None = None,
    sinks: Any = None,
    tanh: str = "accurate",
) -> GradientBounds:
    """Deterministic and probabilistic bounds on ``|dQ̂ − dQ|``, ``|dK̂ − dK|``, ``|dV̂ − dV|``
    (and ``|dσ̂ − dσ|`` with sinks).

    Args:
        q, k, v, causal, window, mask, scale, softcap, sinks: the attention problem, as for
            :func:`flashcheck.harness.judging.bounds.error_bounds` (fp16, bf16 or fp32; exact).
        do: the upstream gradient ``dO``, shape ``(B, Hq, Nq, dv)``, in the format of q.
        arithmetic: one of :data:`GRADIENT_CLASSES` (``key_block``/``query_block`` are ignored
            for ``"unknown"`` and ``"naive"``).
        key_block, query_block: the backward's block sizes, which set the depth of its fp32
            sums (dQ sums over keys, dK and dV over query rows); ``None``: any blocking.
        lam: the ``λ`` of the probabilistic bounds (> 0).
        tanh: the soft-cap's tanh, as for :func:`~flashcheck.harness.judging.bounds.error_bounds`.

    Returns:
        :class:`GradientBounds`.
    """
    problem = make_problem(
        q, k, v, causal=causal, window=window, mask=mask, scale=scale, softcap=softcap, sinks=sinks
    )
    return problem_gradient_bounds(
        problem,
        do,
        arithmetic=arithmetic,
        key_block=key_block,
        query_block=query_block,
        lam=lam,
        tanh=tanh,
    )


def problem_gradient_bounds(
    problem: AttentionProblem,
    do: Any,
    *,
    arithmetic: str,
    key_block: int | None = None,
    query_block: int | None = None,
    lam: float = LAMBDA,
    tanh: str = "accurate",
) -> GradientBounds:
    """:func:`gradient_bounds` of an already validated problem (a case's
    :attr:`~flashcheck.harness.cases.case.Case.problem`): the same arrays, without converting
    ``q``, ``k``, ``v`` again."""
    if arithmetic not in GRADIENT_CLASSES:
        raise ValueError(f"arithmetic must be one of {GRADIENT_CLASSES}, got {arithmetic!r}")
    if not (isinstance(lam, int | float) and lam > 0):
        raise ValueError(f"lam must be a positive number, got {lam!r}")
    for name, blk in (("key_block", key_block), ("query_block", query_block)):
        if blk is not None and (not isinstance(blk, int) or blk < 1):
            raise ValueError(f"{name} must be a positive int or None, got {blk!r}")
    fmt = problem.fmt
    dout, fdo = as_exact_array(do, "do")
    bsz, hq, _, nq, _, _, dv = problem.shape
    if fdo != fmt:
        raise TypeError(f"do must be in the inputs' format {fmt.name}, got {fdo.name}")
    if dout.shape != (bsz, hq, nq, dv):
        raise ValueError(
            f"do must have shape (B, Hq, Nq, dv) = {(bsz, hq, nq, dv)}, got {dout.shape}"
        )
    if arithmetic == "unknown":
        parts = {
            c: problem_gradient_bounds(problem, do, arithmetic=c, lam=lam, tanh=tanh)
            for c in applicable_classes(fmt.name)
        }
        each = [parts[c] for c in floor_classes(fmt.name)]
        top = {n: TensorBounds.loosest([b[n] for b in each]) for n in each[0].tensors}
        return GradientBounds("unknown", fmt, float(lam), top, parts=parts)
    if arithmetic not in applicable_classes(fmt.name):
        raise ValueError(f"the {arithmetic} class does not apply to {fmt.name} inputs")
    naive = arithmetic == "naive"
    fwd = None
    if not naive:
        # The forward that produced O and LSE, with any key blocking (its own block size is
        # not the backward's).
        with np.errstate(over="ignore", invalid="ignore"):  # inf bounds for huge logits
            fwd = problem_bounds(problem, arithmetic=arithmetic, lam=lam, tanh=tanh)
    return _bounds(problem, dout, arithmetic, fwd, (key_block, query_block), lam, tanh_error(tanh))


def _bounds(problem, dout, arithmetic, fwd, blocks, lam, rho) -> GradientBounds:
    """The bounds of one known class, kv head by kv head, in chunks of query rows (over 80
    lines: one loop nest whose per-kv-head sums every query head of the group adds to)."""
    fmt = problem.fmt
    bsz, hq, hk, nq, nk, d, dv = problem.shape
    naive = arithmetic == "naive"
    tau = 1.0 / math.sqrt(d) if problem.scale is None else problem.scale
    key_block, query_block = blocks
    ctx = Context(
        fmt,
        arithmetic,
        tau,
        lam,
        None if naive else key_block,
        None if naive else query_block,
        d,
        dv,
        rho,
    )
    out = {
        "dq_det": np.zeros((bsz, hq, nq, d)),
        "dq_prob": np.zeros((bsz, hq, nq, d)),
        "dk_det": np.zeros((bsz, hk, nk, d)),
        "dk_prob": np.zeros((bsz, hk, nk, d)),
        "dv_det": np.zeros((bsz, hk, nk, dv)),
        "dv_prob": np.zeros((bsz, hk, nk, dv)),
    }
    group = hq // hk
    step = max(1, _CHUNK // max(1, nk))
    rows = np.arange(nq)
    slot = int(problem.sinks is not None)  # a sink's slot comes first (option_terms)
    sinks = [SinkTerms() for _ in range(hq)]
    for b in range(bsz):
        for g in range(hk):
            kk = finite(problem.k[b, g])
            vv = finite(problem.v[b, g])
            if slot:
                kk, vv, _ = with_sink(kk, vv, np.zeros((0, nk), dtype=bool))
            sums_k: list[Sums] = []  # per query head (naive) or one for the group (flash)
            sums_v: list[Sums] = []
            for h in range(g * group, (g + 1) * group):
                if naive or not sums_k:
                    sums_k.append(Sums(nk + slot, d))
                    sums_v.append(Sums(nk + slot, dv))
                keep_all = problem.keep(b, h, rows)
                opts = None
                if problem.has_options:
                    sink = float(problem.sinks[h]) if slot else None
                    opts = (problem.softcap, sink, sinks[h])
                    keep_all = sink_keep(keep_all) if slot else keep_all
                qh = finite(problem.q[b, h])
                doh = finite(dout[b, h])
                for r0 in range(0, nq, step):
                    sl = slice(r0, r0 + step)
                    fw = None
                    if fwd is not None:
                        o, lse = fwd.o, fwd.lse
                        fw = (
                            o.det[b, h, sl],
                            o.prob[b, h, sl],
                            lse.det[b, h, sl],
                            lse.prob[b, h, sl],
                        )
                    with np.errstate(over="ignore", invalid="ignore"):
                        dq = chunk_bounds(
                            ctx,
                            qh[sl],
                            kk,
                            vv,
                            doh[sl],
                            keep_all[sl],
                            fw,
                            sums_k[-1],
                            sums_v[-1],
                            opts,
                        )
                    out["dq_det"][b, h, sl], out["dq_prob"][b, h, sl] = dq
            n_heads = group if not naive else 1
            for sums, key, mult in ((sums_k, "dk", tau), (sums_v, "dv", 1.0)):
                with np.errstate(over="ignore", invalid="ignore"):
                    det, prob = finish_sums(ctx, sums, mult if not naive else 1.0, n_heads, nq)
                out[f"{key}_det"][b, g], out[f"{key}_prob"][b, g] = det[slot:], prob[slot:]
    tensors = {n: TensorBounds(out[f"{n}_det"], out[f"{n}_prob"]) for n in GRADIENTS}
    if slot:
        safety = 1 + SAFETY * fmt.u
        det, prob = ([t.bound(x, ctx.acc) * safety for t in sinks] for x in (True, False))
        tensors["dsinks"] = TensorBounds(np.array(det), np.minimum(np.array(prob), det))
    return GradientBounds(arithmetic, fmt, float(lam), tensors)
