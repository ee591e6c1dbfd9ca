"""Pure-numpy online-softmax attention that performs exactly the arithmetic it declares.

Algorithm (per batch, head and block of query rows; key blocks of ``block_k`` columns):

    t      = S·c            S = q·kᵀ in the score format, c = scale (or scale·log2 e for exp2)
    m_new  = max(m, rowmax t)
    α      = E(m − m_new),  p = E(t − m_new)        E = exp or exp2, in the accumulator format
    l      = α·l + Σ_j p_j
    FA2:   acc = α·acc + P·V                          P = p rounded to the P format
           O   = acc / l  once at the end
    FA1:   O   = (α·l_old·O + P·V) / l               normalised after every block (the seeds'
                                                      eq. 14, FlashAttention v1)
    LSE    = (m + log l)/c' with c' = 1 (exp) or log2 e (exp2), i.e. natural log

Backward (:func:`online_attention_backward`, FlashAttention-2's Algorithm 2; the flash
backward class). Given the forward's rounded ``O``, its natural-log ``LSE`` and ``dO``:

    D_i    = Σ_c fl(dO_ic·O_ic)                      sequential over c, accumulator format
    lse'   = fl(LSE·fl(log2 e)) for exp2, LSE for exp
    for each key block j (outer), each query head of its kv head's group (in order), each
    query block i (inner):
        t  = fl(S·c),  P = E(fl(t − lse'))           S, c as in the forward; P = 0 exactly
                                                      where masked or where LSE = −inf
        dV_j += fl_p(P)ᵀ·dO                           block product sequential over the rows,
                                                      then one add into the accumulator
        dP  = dO·V_jᵀ                                 sequential over c
        dS  = fl(P·fl(dP − D))                        P unrounded (accumulator format)
        dK_j += fl_p(dS)ᵀ·q,   dQ_i += fl_p(dS)·k_j   dQ over key blocks in order
    dQ = fl_out(fl(dQacc·fl(scale))),  dK = fl_out(fl(dKacc·fl(scale))),  dV = fl_out(dVacc)

All accumulators (dQ, dK, dV; fp32 in the flash policy) are in the accumulator format; q and k
enter unscaled and the scale is applied once at the end (in the exponent for P via ``c``).
fl_p rounds to the P format, fl_out to the output format (the input's by default).

``block_k = 1`` is Milakov & Gimelshein's scalar online normaliser. Every intermediate is a
numpy array of its declared dtype, so each elementwise operation rounds to nearest-even in that
format (float16 and bfloat16 operations compute in float32 and round once, which is correctly
rounded because 24 ≥ 2p + 2). Dot products accumulate sequentially over their inner index in
the declared format, each product rounded first (products of fp16/bf16 values are exact in fp32).
``exp``/``exp2`` are evaluated in float64 and rounded to the accumulator format (within
0.5 ulp + 2^−53 relative of the exact value). Known limits: this is a reference, not a fast
kernel (Python loops over key blocks and head dims); no dropout; the backward takes the
saved ``O`` and ``LSE`` as given (it does not recompute or check them) and has no LSE gradient.

This module imports nothing from the harness.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .arith import (
    ARITHMETIC,
    FORMAT_DTYPES,
    LOG2E,
    PrecisionPolicy,
    exp_in,
    keep_mask,
    rowsum,
    sequential_dot,
    tanh_in,
)

__all__ = [
    "ARITHMETIC",
    "FORMAT_DTYPES",
    "PrecisionPolicy",
    "keep_mask",
    "online_attention",
    "online_attention_backward",
    "sequential_dot",
]


def online_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    policy: PrecisionPolicy,
    variant: str = "fa2",
    block_q: int = 16,
    block_k: int = 16,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Online-softmax attention ``softmax(scale·QKᵀ + mask)·V`` and LSE (natural log).

    ``q``: ``(B, Hq, Nq, d)``, ``k``: ``(B, Hk, Nk, d)``, ``v``: ``(B, Hk, Nk, dv)`` numpy arrays
    already in ``policy.input``'s dtype; ``Hq`` a multiple of ``Hk`` (GQA/MQA). Masks are
    aligned bottom-right (``j ≤ i + Nk − Nq`` for causal); ``window=(left, right)`` with
    ``None``/``-1`` unbounded; ``mask`` boolean, broadcastable to ``(B, Hq, Nq, Nk)``, True =
    keep. A row that keeps no key gives ``O = 0``, ``LSE = −inf``. Returns ``O`` in the output
    format (default: the input's) and ``LSE`` in the accumulator format.

    ``softcap = cap > 0`` (FlashAttention's arithmetic): ``t = fl(tanh(fl(S·c1))·c2)`` with
    ``c1 = fl_score(scale/cap)`` and ``c2 = fl_score(cap·log2 e)`` (``cap`` with ``exp``), tanh
    evaluated in float64 and rounded to the accumulator format. ``sinks``: ``(Hq,)`` float32
    logits; each row starts its recurrence from the sink, ``m = fl(σ_h·log2 e)`` (``σ_h`` with
    ``exp``), ``l = 1``, ``acc = 0``, so a row that keeps no key gives ``O = 0``, ``LSE ≈ σ_h``.

    Longer than 80 lines: this docstring states the arithmetic of every option, and the call
    of the row-block step names each of its arguments.
    """
    if variant not in ("fa1", "fa2"):
        raise ValueError(f"variant must be 'fa1' or 'fa2', got {variant!r}")
    if block_q < 1 or block_k < 1:
        raise ValueError("block_q and block_k must be >= 1 (block_k=1 is the scalar recurrence)")
    din = FORMAT_DTYPES[policy.input]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, np.ndarray) or x.dtype != din or x.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-D numpy array of dtype {din} (policy.input), "
                f"got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}"
            )
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    if k.shape[:3] != v.shape[:3] or k.shape[3] != d or k.shape[0] != bsz or hq % hk:
        raise ValueError(
            f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}: need matching batch, "
            "head_dim of q and k, equal k/v lengths and Hq a multiple of Hk"
        )
    ds, da, dp = FORMAT_DTYPES[policy.score], FORMAT_DTYPES[policy.accum], FORMAT_DTYPES[policy.p]
    dout = FORMAT_DTYPES[policy.output or policy.input]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    c = ds.type(sc * LOG2E) if policy.exp == "exp2" else ds.type(sc)
    opts = _softmax_options(sc, softcap, sinks, hq, policy)
    m_full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    out = np.zeros((bsz, hq, nq, dv), dtype=dout)
    lse = np.full((bsz, hq, nq), -np.inf, dtype=da)
    for b in range(bsz):
        for h in range(hq):
            kh, vh = k[b, h // (hq // hk)], v[b, h // (hq // hk)]
            mk = None if m_full is None else m_full[b, h]
            for r0 in range(0, nq, block_q):
                rows = np.arange(r0, min(r0 + block_q, nq))
                o_blk, l_blk = _rows(
                    q[b, h, rows],
                    kh,
                    vh,
                    rows,
                    nq,
                    c,
                    policy,
                    variant,
                    block_k,
                    causal,
                    window,
                    mk,
                    ds,
                    da,
                    dp,
                    None if opts is None else (opts[0], opts[1], opts[2][h]),
                )
                out[b, h, rows] = o_blk.astype(dout)
                lse[b, h, rows] = l_blk
    return out, lse


def _softmax_options(sc, softcap, sinks, hq, policy):
    """``(c1, c2, sink')`` of the options (``None`` without either): the cap's constants in the
    score format (``None`` without a cap) and each head's sink in exponent units, accum format."""
    if not softcap and sinks is None:
        return None
    ds, da = FORMAT_DTYPES[policy.score], FORMAT_DTYPES[policy.accum]
    flavour = LOG2E if policy.exp == "exp2" else 1.0
    c1 = c2 = None
    if softcap:
        c1, c2 = ds.type(sc / softcap), ds.type(softcap * flavour)
    sink = [None] * hq
    if sinks is not None:
        sig = np.asarray(sinks, dtype=np.float32)
        if sig.shape != (hq,):
            raise ValueError(f"sinks must hold one float32 logit per query head, shape ({hq},)")
        sink = [(sig[h].astype(da) * da.type(flavour)).astype(da) for h in range(hq)]
    return c1, c2, sink


def _scores(qb, kb, c, opts, ds, da):
    """``t = fl(S·c)``, or with a cap ``fl(tanh(fl(S·c1))·c2)``, and the tanh (``None``
    without a cap): the recurrence's logits in exponent units."""
    s = sequential_dot(qb, kb, ds)
    if opts is None or opts[0] is None:
        return (s * c).astype(da), None
    th = tanh_in((s * opts[0]).astype(da), da)
    return (th * opts[1]).astype(da), th


def _rows(qb, kh, vh, rows, nq, c, policy, variant, block_k, causal, window, mk, ds, da, dp, opts):
    nk, dv = vh.shape
    r = len(rows)
    m = np.full(r, -np.inf, dtype=da)
    l_sum = np.zeros(r, dtype=da)
    if opts is not None and opts[2] is not None:  # the sink starts every row: e^{σ−σ} = 1
        m = np.full(r, opts[2], dtype=da)
        l_sum = np.ones(r, dtype=da)
    acc = np.zeros((r, dv), dtype=da)
    for c0 in range(0, nk, block_k):
        cols = np.arange(c0, min(c0 + block_k, nk))
        keep = keep_mask(nq, nk, rows, cols, causal, window, mk)
        t, _ = _scores(qb, kh[cols], c, opts, ds, da)
        t = np.where(keep, t, da.type(-np.inf))
        m_new = np.maximum(m, t.max(axis=1))
        # Rows that have kept at least one key so far. A NaN max (a NaN score) counts as live,
        # so the NaN propagates instead of the row passing for fully masked.
        live = m_new != -np.inf
        m_safe = np.where(live, m_new, da.type(0))
        alpha = np.where(live, exp_in((m - m_safe).astype(da), policy.exp, da), da.type(1))
        p = np.where(keep, exp_in((t - m_safe[:, None]).astype(da), policy.exp, da), da.type(0))
        l_old = l_sum
        l_sum = (alpha * l_sum + rowsum(p, da)).astype(da)
        pv = sequential_dot(p.astype(dp), vh[cols].T, da)
        if variant == "fa2":
            acc = (alpha[:, None] * acc + pv).astype(da)
        else:
            safe_l = np.where(l_sum == 0, da.type(1), l_sum)
            acc = (((alpha * l_old)[:, None] * acc + pv) / safe_l[:, None]).astype(da)
        m = m_new
    has = l_sum != 0  # 0 only for rows that kept no key; NaN stays NaN
    if variant == "fa2":
        out = np.where(has[:, None], acc / np.where(has, l_sum, da.type(1))[:, None], da.type(0))
    else:
        out = np.where(has[:, None], acc, da.type(0))
    with np.errstate(divide="ignore"):
        log_l = np.where(has, np.log(np.where(has, l_sum, 1).astype(np.float64)), -np.inf)
    if policy.exp == "exp2":
        lse = ((m.astype(np.float64) + log_l / math.log(2)) * math.log(2)).astype(da)
    else:
        lse = (m.astype(np.float64) + log_l).astype(da)
    return out.astype(da), np.where(has, lse, da.type(-np.inf))


def online_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    lse: Any,
    do: Any,
    *,
    policy: PrecisionPolicy,
    block_q: int = 16,
    block_k: int = 16,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """FlashAttention-2's backward (Dao 2023, Algorithm 2) with the declared arithmetic.

    ``q``, ``k``, ``v`` as in :func:`online_attention`; ``o`` and ``do``: ``(B, Hq, Nq, dv)`` in
    the output format (``policy.output``, default the input's: the dtype of the forward's
    rounded ``O``), the forward's output and the upstream gradient; ``lse``:
    ``(B, Hq, Nq)`` natural-log LSE in ``policy.accum``'s dtype, ``−inf`` for rows that keep no
    key. Returns ``(dq, dk, dv)`` in the output format (default: the input's).

    Arithmetic (da = accumulator format, fl = round to da, fl_p to ``policy.p``, fl_out to the
    output format; every dot accumulates sequentially in da, each product rounded first):

    1. ``D_i = Σ_c fl(dO_ic·O_ic)`` in order of c, from the given ``o``.
    2. ``c = fl_score(scale·log2 e)`` and ``lse'_i = fl(LSE_i·fl(log2 e))`` with ``exp2``;
       ``c = fl_score(scale)``, ``lse' = LSE`` with ``exp``. Per (key block, query block):
       ``S = q·kᵀ`` in the score format, ``t = fl(S·c)``, ``P = E(fl(t − lse'))`` (E evaluated
       in float64, rounded to da). Masked entries and rows with ``LSE = −inf`` get ``P = 0``
       exactly (a NaN LSE counts as live, so the NaN propagates).
    3. Loops: key blocks of ``block_k`` (outer); for the kv head of the block, its query heads
       ``h = g·(Hq/Hk) …`` in order; query blocks of ``block_q`` rows (inner). With ``r`` the
       block's rows and ``j`` its keys:
       ``dVacc_j = fl(dVacc_j + Σ_r fl_p(P)ᵀ·dO)`` (the block product accumulated over r, then
       one add); ``dP = Σ_c dO·V_jᵀ``; ``dS = fl(P·fl(dP − D))``;
       ``dKacc_j = fl(dKacc_j + Σ_r fl_p(dS)ᵀ·q)``; ``dQacc_i = fl(dQacc_i + Σ_j fl_p(dS)·k_j)``
       (dQacc over key blocks in order). One dK and one dV accumulator per key block, shared by
       all query heads of the group (GQA/MQA).
    4. ``dQ = fl_out(fl(dQacc·fl(scale)))``, ``dK = fl_out(fl(dKacc·fl(scale)))``,
       ``dV = fl_out(dVacc)``: q and k enter the dots unscaled; the scale is applied once here.

    A row that keeps no key contributes nothing and gets ``dQ = 0``. NaN/Inf inputs propagate
    (IEEE results, no warnings). ``scale`` defaults to ``1/√d``.

    ``softcap``: ``t`` as in :func:`online_attention`'s cap, and ``dS = fl(fl(P·fl(dP − D))·g)``
    with ``g = fl(1 − fl(th·th))`` from the recomputed ``th = tanh(fl(S·c1))``. ``sinks``: the
    result gains ``dsinks`` ``(Hq,)`` (float32; float64 with fp64 accumulators),
    ``dσ_h = fl(dσ_h − fl(E(fl(σ' − lse'_i))·D_i))`` sequentially over batch and rows
    (``σ' = fl(σ_h·log2 e)`` with ``exp2``): the return is ``(dq, dk, dv, dsinks)``.

    Longer than 80 lines: the loop nest stays in one function so that the order of its
    roundings reads top to bottom, as the kernel it emulates runs them.
    """
    m_full = _check_backward_args(q, k, v, o, lse, do, policy, block_q, block_k, mask)
    bsz, hq, nq, d = q.shape
    hk, nk, dv = v.shape[1:]
    dout = FORMAT_DTYPES[policy.output or policy.input]
    ds, da, dp = FORMAT_DTYPES[policy.score], FORMAT_DTYPES[policy.accum], FORMAT_DTYPES[policy.p]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    c = ds.type(sc * LOG2E) if policy.exp == "exp2" else ds.type(sc)
    opts = _softmax_options(sc, softcap, sinks, hq, policy)
    sc_a = da.type(sc)
    group = hq // hk
    dq_acc = np.zeros((bsz, hq, nq, d), dtype=da)
    dk = np.zeros((bsz, hk, nk, d), dtype=dout)
    dvv = np.zeros((bsz, hk, nk, dv), dtype=dout)
    with np.errstate(invalid="ignore", over="ignore"):
        lse_e = (lse * da.type(LOG2E)).astype(da) if policy.exp == "exp2" else lse
        prod = (do.astype(da) * o.astype(da)).astype(da)
        dsum = np.zeros((bsz, hq, nq), dtype=da)
        for t in range(dv):
            dsum = dsum + prod[..., t]
        for b in range(bsz):
            for g in range(hk):
                for c0 in range(0, nk, block_k):
                    cols = np.arange(c0, min(c0 + block_k, nk))
                    dk_acc = np.zeros((len(cols), d), dtype=da)
                    dv_acc = np.zeros((len(cols), dv), dtype=da)
                    for h in range(g * group, (g + 1) * group):
                        mk = None if m_full is None else m_full[b, h]
                        for r0 in range(0, nq, block_q):
                            rows = np.arange(r0, min(r0 + block_q, nq))
                            keep = keep_mask(nq, nk, rows, cols, causal, window, mk)
                            dk_acc, dv_acc, dq_blk = _bwd_block(
                                q[b, h, rows],
                                k[b, g, cols],
                                v[b, g, cols],
                                do[b, h, rows],
                                lse_e[b, h, rows],
                                dsum[b, h, rows],
                                keep,
                                dk_acc,
                                dv_acc,
                                c,
                                policy,
                                ds,
                                da,
                                dp,
                                opts,
                            )
                            dq_acc[b, h, rows] = (dq_acc[b, h, rows] + dq_blk).astype(da)
                    dk[b, g, cols] = (dk_acc * sc_a).astype(da).astype(dout)
                    dvv[b, g, cols] = dv_acc.astype(dout)
        dq = (dq_acc * sc_a).astype(da).astype(dout)
        if opts is None or sinks is None:
            return dq, dk, dvv
        dsinks = np.zeros(hq, dtype=da)
        for b in range(bsz):
            for h in range(hq):
                p_sink = exp_in((opts[2][h] - lse_e[b, h]).astype(da), policy.exp, da)
                terms = (p_sink * dsum[b, h]).astype(da)
                for i in range(nq):
                    dsinks[h] = da.type(dsinks[h] - terms[i])
    return dq, dk, dvv, dsinks.astype(np.promote_types(np.float32, da))


def _check_backward_args(q, k, v, o, lse, do, policy, block_q, block_k, mask):
    """Argument checks of :func:`online_attention_backward`, with messages that say what each
    array must be; returns the mask broadcast to ``(B, Hq, Nq, Nk)`` (or ``None``)."""
    if block_q < 1 or block_k < 1:
        raise ValueError("block_q and block_k must be >= 1 (block_k=1 is the scalar recurrence)")
    din = FORMAT_DTYPES[policy.input]
    dout = FORMAT_DTYPES[policy.output or policy.input]
    for name, x, want, role in (
        ("q", q, din, "policy.input"),
        ("k", k, din, "policy.input"),
        ("v", v, din, "policy.input"),
        ("o", o, dout, "the forward's output format"),
        ("do", do, dout, "the forward's output format"),
    ):
        if not isinstance(x, np.ndarray) or x.dtype != want or x.ndim != 4:
            raise ValueError(
                f"{name} must be a 4-D numpy array of dtype {want} ({role}), "
                f"got {type(x).__name__} {getattr(x, 'dtype', '')} {getattr(x, 'shape', '')}"
            )
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    if k.shape[:3] != v.shape[:3] or k.shape[3] != d or k.shape[0] != bsz or hq % hk:
        raise ValueError(
            f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}: need matching batch, "
            "head_dim of q and k, equal k/v lengths and Hq a multiple of Hk"
        )
    if o.shape != (bsz, hq, nq, dv) or do.shape != o.shape:
        raise ValueError(
            f"o {o.shape} and do {do.shape} must both have shape (B, Hq, Nq, dv) = "
            f"{(bsz, hq, nq, dv)}: the forward's output and its upstream gradient"
        )
    da = FORMAT_DTYPES[policy.accum]
    if not isinstance(lse, np.ndarray) or lse.dtype != da or lse.shape != (bsz, hq, nq):
        raise ValueError(
            f"lse must be a numpy array of dtype {da} (policy.accum) and shape {(bsz, hq, nq)} "
            f"(the forward's natural-log LSE), got {type(lse).__name__} "
            f"{getattr(lse, 'dtype', '')} {getattr(lse, 'shape', '')}"
        )
    try:
        m_full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    except ValueError as e:
        raise ValueError(
            f"mask of shape {np.shape(mask)} must broadcast to (B, Hq, Nq, Nk) = "
            f"{(bsz, hq, nq, nk)}"
        ) from e
    return m_full


def _bwd_block(qb, kb, vb, dob, lse_b, dsum_b, keep, dk_acc, dv_acc, c, policy, ds, da, dp, opts):
    t, th = _scores(qb, kb, c, opts, ds, da)
    live = lse_b != -np.inf  # rows that kept a key; a NaN LSE counts as live and propagates
    keep = keep & live[:, None]
    x = np.where(keep, (t - np.where(live, lse_b, da.type(0))[:, None]).astype(da), -np.inf)
    p = exp_in(x.astype(da), policy.exp, da)  # exactly 0 where masked: E(−inf) = 0
    dv_acc = (dv_acc + sequential_dot(p.astype(dp).T, dob.T, da)).astype(da)
    dpm = sequential_dot(dob, vb, da)
    dsc = (p * (dpm - dsum_b[:, None]).astype(da)).astype(da)
    if th is not None:  # through the cap: d(c·tanh(s/c))/ds = 1 − tanh²
        dsc = (dsc * (da.type(1) - (th * th).astype(da)).astype(da)).astype(da)
    dsp = dsc.astype(dp)
    dk_acc = (dk_acc + sequential_dot(dsp.T, qb.T, da)).astype(da)
    return dk_acc, dv_acc, sequential_dot(dsp, kb.T, da)
