"""A-priori forward-error bounds for attention kernels, per output element (docs/error-bounds.md).

Given the inputs (taken as exact), an arithmetic class and the kernel's key-block size,
:func:`error_bounds` returns for every output ``O[b, h, i, c]`` and ``LSE[b, h, i]``:

- a deterministic bound: first order in the unit roundoffs (terms of relative size ``u`` are
  kept, products of two roundoffs are covered by a ``1 + 8u`` safety factor), every other step
  rigorous;
- a probabilistic bound: the accumulation terms ``n·u`` replaced by ``λ·√n·u`` (Higham & Mary
  2019) and the rounding of P by a Hoeffding bound ``λ·u·sqrt(Σ p_j² v_jc²)``; it holds with
  probability ``≥ 1 − 2·exp(−λ²/2)`` per term when rounding errors are independent and
  zero-mean (``λ = 6`` by default: ``3e−8``).

The derivation, term by term, is in ``docs/error-bounds.md``. The bounds are computed in float64
from the exact scores ``s_j = scale·q·k_j`` and weights ``p_j``; their own rounding (~1e−15
relative) is far below the first-order slack.

Arithmetic classes (what a kernel declares):

``naive``
    Standard attention in the input format ``F``: ``scale·q`` stored in F, S = q·kᵀ with fp32
    accumulation stored in F, softmax in fp32, P stored in F, O = P·V with fp32 accumulation
    stored in F (FlashAttention's same-precision test reference; PyTorch eager).
``flash``
    FlashAttention-2: F inputs, fp32 scores, online softmax in fp32 with rescaling, P rounded to
    F for P·V only, one division at the end, O stored in F. With F = fp32 this is the fp32
    recurrence.
``flash-fa1``
    As ``flash`` but the output is renormalised after every key block (FlashAttention-1).
``tf32``
    As ``flash`` with fp32 inputs whose dot operands are truncated to tf32 (10 fraction bits).
``flash-fp8``
    FlashAttention-3's FP8 forward: FP8 inputs with descales, exact products summed in fp32,
    the descales folded into the fp32 softmax constant, P quantized to e4m3 (``flash-fp8-p-e5m2``:
    to e5m2) before P·V, fp32 accumulators, ``O = acc·(1/l)·descale_v`` in fp32 stored once
    in the output format (bf16 unless declared).
``unknown``
    Undeclared arithmetic: the elementwise largest bound of the classes above that are at or
    above the input format's precision (:mod:`~flashcheck.harness.judging.classes`):
    ``naive``, ``flash``, ``flash-fa1`` with any blocking. ``tf32`` applies only when declared.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core.formats import BF16, E4M3, E5M2, FP32, format_of
from ..core.semantics import AttentionProblem, make_problem
from .bound_types import Bounds
from .classes import ARITHMETIC_CLASSES, KNOWN_CLASSES, applicable_classes, floor_classes
from .lse_bound import lse_bound
from .option_terms import cap_scores, with_sink
from .roundoff import (
    FTZ,
    HALF_SUB32,
    LAMBDA,
    RHO_EXP,
    SAFETY,
    TF32_SUB,
    U32,
    U_TF32,
    UA,
    TensorBounds,
    finite,
    gamma,
    records,
    tanh_error,
    weight_growth,
)

__all__ = [
    "ARITHMETIC_CLASSES",
    "KNOWN_CLASSES",
    "LAMBDA",
    "Bounds",
    "TensorBounds",
    "error_bounds",
    "gamma",
    "problem_bounds",
    "weight_growth",
]

_CHUNK = 1 << 22  # elements of the (rows, keys, dv) work tensor per chunk


def error_bounds(
    q: Any,
    k: Any,
    v: Any,
    *,
    arithmetic: str,
    causal: bool = False,
    window: Any = None,
    mask: Any = None,
    scale: float | None = None,
    rows: Any = None,
    key_block: int | None = None,
    lam: float = LAMBDA,
    fp32_only: bool = False,
    softcap: float | None = None,
    sinks: Any = None,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    out_fmt: Any = None,
    tanh: str = "accurate",
) -> Bounds:
    """Deterministic and probabilistic bounds on ``|Ô − O|`` and ``|LSÊ − LSE|``: a :class:`Bounds`.

    Args:
        q, k, v, causal, window, mask, scale, softcap, sinks: the attention problem, as for
            :func:`flashcheck.harness.oracle.evaluate.oracle` (inputs in fp16, bf16 or fp32; values
            exact).
        arithmetic: one of :data:`ARITHMETIC_CLASSES`; ``"unknown"`` gives the loosest bound
            of the classes at or above the input format's precision (``key_block`` is then
            ignored).
        rows: query rows to bound (default: all).
        key_block: the kernel's key-block size, which sets the depth of its sums
            (``block + number of blocks``); ``None`` assumes the worst case over all blocks.
        lam: the ``λ`` of the probabilistic bounds (> 0).
        fp32_only: bound only the fp32 part of a flash kernel's error: leave out the rounding
            of P and of the output into the input format (for comparing two implementations
            of the same arithmetic, which share those roundings).
        descale_q, descale_k, descale_v: FP8 inputs' descales (as the oracle takes them);
            ``out_fmt`` the format an FP8 kernel stores O in (default bf16).
        tanh: the soft-cap's tanh: ``"accurate"`` (within 2 fp32 ulp) or ``"approx"`` (the GPU's
            ``tanh.approx.f32``, relative error up to ``2^-16`` as measured on an H200).
    """
    problem = make_problem(
        q,
        k,
        v,
        causal=causal,
        window=window,
        mask=mask,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
        descale_q=descale_q,
        descale_k=descale_k,
        descale_v=descale_v,
    )
    return problem_bounds(
        problem,
        arithmetic=arithmetic,
        rows=rows,
        key_block=key_block,
        lam=lam,
        fp32_only=fp32_only,
        out_fmt=out_fmt,
        tanh=tanh,
    )


def problem_bounds(
    problem: AttentionProblem,
    *,
    arithmetic: str,
    rows: Any = None,
    key_block: int | None = None,
    lam: float = LAMBDA,
    fp32_only: bool = False,
    out_fmt: Any = None,
    tanh: str = "accurate",
) -> Bounds:
    """:func:`error_bounds` of a validated problem (a case's ``problem``): the same arrays,
    without converting the inputs again. ``out_fmt``: the output format of an FP8 problem's
    kernel (default bf16; other problems store O in their input format)."""
    if arithmetic not in ARITHMETIC_CLASSES:
        raise ValueError(f"arithmetic must be one of {ARITHMETIC_CLASSES}, got {arithmetic!r}")
    if not (isinstance(lam, int | float) and lam > 0):
        raise ValueError(f"lam must be a positive number, got {lam!r}")
    if key_block is not None and (not isinstance(key_block, int) or key_block < 1):
        raise ValueError(f"key_block must be a positive int or None, got {key_block!r}")
    fmt = problem.fmt if problem.fp8 is None else problem.fp8.fmt  # names the classes
    store = fmt if problem.fp8 is None else (BF16 if out_fmt is None else format_of(out_fmt))
    rho = tanh_error(tanh)
    if arithmetic == "unknown":
        opts = {"rows": rows, "lam": lam, "fp32_only": fp32_only, "out_fmt": out_fmt, "tanh": tanh}
        parts = {
            c: problem_bounds(problem, arithmetic=c, **opts) for c in applicable_classes(fmt.name)
        }
        each = [parts[c] for c in floor_classes(fmt.name)]
        tensors = {n: TensorBounds.loosest([b[n] for b in each]) for n in ("o", "lse")}
        rescales = np.maximum.reduce([b.rescales for b in each])
        return Bounds("unknown", fmt, float(lam), None, tensors, rescales, parts=parts)
    if arithmetic not in applicable_classes(fmt.name):
        raise ValueError(f"the {arithmetic} class does not apply to {fmt.name} inputs")
    bsz, hq, _, nq, nk, d, dv = problem.shape
    row_idx = np.arange(nq) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
    tau = 1.0 / math.sqrt(d) if problem.scale is None else problem.scale
    shape_o = (bsz, hq, row_idx.size, dv)
    out = {
        "o_det": np.zeros(shape_o),
        "o_prob": np.zeros(shape_o),
        "lse_det": np.zeros(shape_o[:3]),
        "lse_prob": np.zeros(shape_o[:3]),
        "rescales": np.zeros(shape_o[:3], dtype=np.int64),
    }
    for b in range(bsz):
        for h in range(hq):
            kvh = problem.kv_head(h)
            keep = problem.keep(b, h, row_idx)
            kk = finite(problem.k[b, kvh])
            vv = finite(problem.v[b, kvh])
            qr = finite(problem.q[b, h][row_idx])
            opts = None
            if problem.has_options:
                sink = None if problem.sinks is None else float(problem.sinks[h])
                opts = (problem.softcap, sink, rho)
                if sink is not None:
                    kk, vv, keep = with_sink(kk, vv, keep)
            step = max(1, _CHUNK // max(1, nk * dv))
            for r0 in range(0, row_idx.size, step):
                sl = slice(r0, r0 + step)
                res = _rows(
                    qr[sl],
                    kk,
                    vv,
                    keep[sl],
                    tau,
                    (fmt, store),
                    arithmetic,
                    key_block,
                    lam,
                    fp32_only,
                    opts,
                )
                for name, val in res.items():
                    out[name][b, h, sl] = val
    tensors = {n: TensorBounds(out[f"{n}_det"], out[f"{n}_prob"]) for n in ("o", "lse")}
    return Bounds(arithmetic, fmt, float(lam), key_block, tensors, out["rescales"])


def _rows(q, k, v, keep, tau, fmts, arith: str, key_block, lam, fp32_only=False, opts=None):
    """Bounds for a chunk of rows of one (batch, head), all float64 (over 80 lines: the terms of
    docs/error-bounds.md in order, each reusing the arrays before it). ``opts``: ``(softcap,
    sink, tanh's relative error)`` of :mod:`.option_terms` (with a sink, ``k``, ``v``, ``keep``
    hold its slot first).
    ``fmts``: the input format and the output's; the FP8 classes round P to e4m3 (e5m2)."""
    fmt, store = fmts
    fp8 = arith.startswith("flash-fp8")
    if fp8:  # P's format; the descales add two roundings to c and two to the final scaling
        fmt = E5M2 if arith == "flash-fp8-p-e5m2" else E4M3
    n_c = 3 if fp8 else 1
    r_n, nk = keep.shape
    d = q.shape[1]
    up = fmt.u
    naive = arith == "naive"
    has = keep.any(axis=1)
    n_keep = keep.sum(axis=1).astype(np.float64)

    s = tau * (q @ k.T)
    a = abs(tau) * (np.abs(q) @ np.abs(k).T)
    extra = 0.0
    if opts is not None:
        s, a, extra = cap_scores(
            s, a, cap=opts[0], sink=opts[1], u_store=up if naive else 0.0, rho=opts[2]
        )
    s = np.where(keep, s, -np.inf)
    m = np.where(has, s.max(axis=1, initial=-np.inf), 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(keep, np.exp(s - m[:, None]), 0.0)
    ell = np.where(has, e.sum(axis=1), 1.0)
    p = e / ell[:, None]
    s0 = np.where(keep, s, 0.0)
    span = np.where(has, m - np.where(keep, s, np.inf).min(axis=1, initial=np.inf), 0.0)
    gap = np.where(keep, m[:, None] - s0, 0.0)  # s_j − m ≤ 0, as a magnitude

    # Depth of the kernel's sums over keys: block + number of blocks (any blocking if unknown).
    if key_block is None:
        depth = n_keep + 1
        n_blocks = n_keep
    else:
        n_blocks = np.full(r_n, math.ceil(nk / key_block) + 1.0)
        depth = np.minimum(n_keep, key_block) + n_blocks
    # Products of two fp16/bf16 values are exact in fp32; fp32 × fp32 products round once more.
    prod = 1 if fmt.p * 2 > FP32.p else 0

    # --- per-key logit perturbations (nats), deterministic and probabilistic parts ----------
    a_dot = a * (1 + (up + 2 * U32 if naive else 0.0))
    dot_det = gamma(d + prod, UA) * a_dot
    dot_prob = np.minimum(lam * math.sqrt(d + prod) * UA * a_dot, dot_det)
    common = n_c * U32 * gap  # scale constant's roundings: a relative error common to all keys
    if naive:
        # scale·q rounded to fp32 then stored in F; S stored in F (subnormal S: half a spacing)
        stored = up * np.abs(s0) + fmt.min_subnormal / 2
        if opts is not None and opts[1] is not None:
            # The sink's slot is the fp32 logit σ itself, never stored in F (the naive class
            # concatenates it to the fp32 scores): charging it u_F·|σ| shifted every weight
            # of a row the sink dominates, a bf16 dσ bound 4-5× what the class allows.
            stored[:, 0] = 0.0
        local = (up + 2 * U32) * a + stored
        local = local + U32 * gap + RHO_EXP + extra  # fp32 s − m and exp; the options' own
        n_resc = np.zeros(r_n)
        resc = np.zeros(r_n)
    else:
        if arith == "tf32":
            qk_abs = abs(tau) * TF32_SUB * (np.abs(q).sum(1)[:, None] + np.abs(k).sum(1)[None, :])
            local0 = 2 * U_TF32 * a + qk_abs
        else:
            local0 = 0.0
        local = local0 + U32 * np.abs(s0) + U32 * gap + RHO_EXP + extra  # s·c, t − m, exp2
        tol = 2 * (dot_det + local + common + 8 * U32 * np.abs(s0)).max(axis=1, initial=0.0)
        n_resc = np.maximum(
            records(s, keep, tol[:, None]), records(s[:, ::-1], keep[:, ::-1], tol[:, None])
        ).astype(np.float64)
        n_resc = np.maximum(n_resc - 1, 0)  # the first key sets m; only later increases rescale
        # Each rescale: exp2 error plus the rounding of m_prev − m_new (these telescope to span).
        resc = n_resc * RHO_EXP + U32 * span
    delta_det = np.where(keep, dot_det + local + common + resc[:, None], 0.0)
    delta_prob = np.where(keep, dot_prob + local + common + resc[:, None], 0.0)

    with np.errstate(invalid="ignore", divide="ignore"):
        log_p = np.where(keep, s - m[:, None] - np.log(ell)[:, None], -np.inf)
    o_det, o_prob = _o_bounds(
        p,
        log_p,
        e,
        v,
        keep,
        delta_det,
        delta_prob,
        (fmt, store, n_c),
        arith,
        depth,
        n_blocks,
        n_resc,
        n_keep,
        lam,
        fp32_only,
    )
    lse = np.where(has, m + np.log(ell), -np.inf)
    lse_det = lse_bound(p, delta_det + n_c * U32 * np.abs(s0), lse, ell, depth, U32, n_keep)
    lse_prob = lse_bound(
        p,
        delta_prob + n_c * U32 * np.abs(s0),
        lse,
        ell,
        np.minimum(np.sqrt(depth) * lam, depth),
        U32,
        n_keep,
    )
    zero = ~has
    o_det[zero] = o_prob[zero] = 0.0
    lse_det[zero] = lse_prob[zero] = 0.0
    return {
        "o_det": o_det,
        "o_prob": o_prob,
        "lse_det": lse_det,
        "lse_prob": lse_prob,
        "rescales": n_resc.astype(np.int64),
    }


def _o_bounds(
    p,
    log_p,
    e,
    v,
    keep,
    delta_det,
    delta_prob,
    fmts,
    arith,
    depth,
    n_blocks,
    n_resc,
    n_keep,
    lam,
    fp32_only=False,
):
    """O's two bounds from the logit perturbations (over 80 lines: the O bound's terms of
    docs/error-bounds.md in order, so that each reads against its line there). ``fmts``: P's
    format, O's, and the number of fp32 roundings of the final scaling (3 for FP8)."""
    fmt, store, n_final = fmts
    up = fmt.u
    store_u, store_sub = store.u, store.min_subnormal / 2
    naive = arith == "naive"
    o = p @ v  # (R, dv)
    w = p @ np.abs(v)
    vmax = np.where(keep[:, :, None], np.abs(v)[None], 0.0).max(axis=1)  # (R, dv)
    dev = np.abs(v[None, :, :] - o[:, None, :])  # |v_jc − o_c|, (R, Nk, dv)
    r_c = np.where(keep[:, :, None], dev, 0.0).max(axis=1)
    sigma = np.sqrt((p * p) @ (v * v))

    def logit_term(delta):
        # Exact perturbation: |o' − o| ≤ e^{δ̄} Σ_j p_j (e^{δ_j} − 1)|v_jc − o_c|, and o' is a
        # convex combination of the v_j, so never more than max_j |v_jc − o_c|.
        dbar = (p * delta).sum(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            lt = np.einsum("rj,rjc->rc", weight_growth(p, log_p, delta), dev)
            lt = lt * np.exp(dbar)[:, None]
        return np.minimum(np.nan_to_num(lt, nan=np.inf), r_c)

    def grow(delta):
        # Perturbed weights p'_j ≤ p_j·e^{δ_j + δ̄}: bounds on W' = Σ p'|v| and |o'|.
        dmax = np.where(keep, delta, 0.0).max(axis=1, initial=0.0)
        dbar = (p * delta).sum(axis=1)
        with np.errstate(over="ignore"):
            f = np.exp(np.minimum(dmax + dbar, 700.0))
        return np.minimum(w * f[:, None], vmax), f

    # Rounding of P into F: relative u_F; where P may be subnormal in F, half a subnormal
    # spacing absolute. Flash rounds p̃ = e^{s−m_running} ≥ e^{s−m}; naive rounds p itself.
    p_round = e if not naive else p
    sub = keep & (p_round * np.exp(-delta_det) < fmt.min_normal)
    sub_abs = (np.where(sub, fmt.min_subnormal / 2, 0.0) + np.where(keep, FTZ, 0.0)) @ np.abs(v)
    if not naive:
        sub_abs = sub_abs / np.maximum(e.sum(axis=1), 1.0)[:, None]

    pv_under = (n_keep * 2.0**-150 / (np.maximum(e.sum(axis=1), 1.0) if not naive else 1.0))[
        :, None
    ]
    # tf32 subnormal operands in P·V: P's error times |v|, V's error times the weights (≤ 1).
    tf32_abs = TF32_SUB * (1 + (np.where(keep, 1.0, 0.0) @ np.abs(v))) * 1.01
    if fp32_only:
        up = 0.0 if fmt.p < FP32.p else U32
        store_u, store_sub = U32, FTZ / 2
        sub_abs = np.where(keep, FTZ, 0.0) @ np.abs(v)
    results = []
    for delta, det in ((delta_det, True), (delta_prob, False)):
        lt = logit_term(delta)
        w_plus, f = grow(delta)
        o_plus = np.abs(o) + lt
        acc_n = depth + (0 if fmt.p * 2 > FP32.p else 1)
        if det:
            g_pv = gamma(acc_n, UA)[:, None]
            g_l = gamma(depth if not naive else n_keep + 1, U32)[:, None]
            p_term = up * w_plus
            tf = 2 * U_TF32 * w_plus + tf32_abs if arith == "tf32" else 0.0
        else:
            # Each probabilistic term is capped by its deterministic one (λ√n > n for n < λ²).
            n_l = depth if not naive else n_keep + 1
            g_pv = np.minimum(lam * np.sqrt(acc_n) * UA, gamma(acc_n, UA))[:, None]
            g_l = np.minimum(lam * np.sqrt(n_l) * U32, gamma(n_l, U32))[:, None]
            hoeff = np.minimum(lam * sigma * f[:, None], w_plus)
            p_term = up * hoeff
            tf = 2 * U_TF32 * hoeff + tf32_abs if arith == "tf32" else 0
        total = lt + p_term + sub_abs + tf
        total = total + g_pv * (1 + up) * w_plus  # P·V accumulation in fp32
        # Products below fp32's normal range round on the fixed subnormal grid: an absolute
        # error of at most 2^-150 each (relative bounds miss it; measured on subnormal V).
        total = total + pv_under
        total = total + g_l * o_plus  # the denominator's sum (fp32, positive terms)
        if naive:
            total = total + U32 * o_plus  # p = e / Σe
        else:
            total = total + n_resc[:, None] * U32 * (w_plus + o_plus)  # acc·α and l·α
            total = total + n_final * U32 * o_plus  # acc / l (FP8: acc·fl(fl(1/l)·descale_v))
            # Below fp32's normal range those steps round on the fixed subnormal grid: an
            # absolute 2^-150 each, in output units (l >= 1), which no relative term covers
            # (found by the report campaign: FA1 on subnormal fp32 V, docs/error-bounds.md).
            steps = n_resc + n_final
            if arith == "flash-fa1":
                total = total + (3 * n_blocks[:, None] + 1) * U32 * (w_plus + o_plus)
                steps = steps + 3 * n_blocks + 1
            total = total + steps[:, None] * HALF_SUB32
        total = total + store_u * (o_plus + total) + store_sub  # store O in F
        results.append(total * (1 + SAFETY * store_u))
    return results
