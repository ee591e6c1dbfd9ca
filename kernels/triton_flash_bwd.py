"""Triton FlashAttention-2 backward kernel: dQ, dK, dV, fp16 / bf16 / fp32.

Algorithm (Dao 2023, Algorithm 2; c = scale·log2 e as one fp32 constant, lse2 = LSE·log2 e in
fp32, so P is recomputed with exp2 from the forward's natural-log LSE):

    preprocess, per query row:   D_i = Σ_c dO_ic·O_ic           fp32, from the rounded O
    dK/dV kernel, one program per block of BLOCK_N keys of one (batch, kv head):
        for each query head of the kv head's group, for each live block of BLOCK_M rows:
            Sᵀ  = k·qᵀ                                     tl.dot, fp32 accumulation
            Pᵀ  = exp2(Sᵀ·c − lse2)                        0 where masked or LSE = −inf
            dV += (Pᵀ rounded to the input dtype)·dO       fp32 accumulator
            dPᵀ = v·dOᵀ,  dSᵀ = Pᵀ∘(dPᵀ − D)               fp32
            dK += (dSᵀ rounded to the input dtype)·q       fp32 accumulator
            dQ += (dSᵀ rounded)ᵀ·k       fp32 atomic add (deterministic=False only)
        dK *= scale;  after the kernel: dQ = (fp32 dQ · scale) rounded to the input dtype
    dQ kernel (deterministic=True, the default, instead of the atomic add), one program per block of
    BLOCK_M query rows of one (batch, q head):
        for each live block of BLOCK_N keys: S, P, dP, dS as above (same expressions);
            dQ += (dS rounded to the input dtype)·k        fp32 accumulator
        dQ *= scale

Two algorithms for dQ, the same arithmetic class and bound (an fp32 sum of the same rounded
``dS·k`` terms, scaled and rounded once). ``deterministic=True``, the default, runs the second
kernel, which recomputes S and dP (7 block products in all) and sums dQ in a fixed order: bitwise
reproducible. ``deterministic=False`` is FlashAttention-2's one-kernel design: S and dP once per
(key block, row block), 5 block products, each key block's share of dQ added into an fp32 buffer
with atomic adds, whose order on a GPU depends on scheduling, so dQ is not bitwise reproducible
run to run. Despite the fewer products it measured slower on an H100 (bf16, d = 64 and 128,
N = 1K-16K: 0.65-0.85x the two-kernel path's speed): the atomic adds of one fp32 dQ tile per
block pair cost about what the second kernel's products do, and they are not overlapped with
the products here. Hence the default, unlike FlashAttention's.

This is the arithmetic of ``kernels/recurrence.py``'s ``online_attention_backward`` with the flash
policy (backward class "flash", docs/error-bounds.md §11): q and k enter the dots unscaled, the
scale goes into c for P and onto the fp32 accumulators at the end. GQA/MQA: the dK/dV program sums
its whole group of query heads in its own accumulators, so dK and dV use no atomics and are
bitwise reproducible on both paths. As in the forward, each key (query) range splits into blocks
every row keeps, which skip the mask, and blocks on the causal diagonal, the window edges or the
ragged tail, which build one; both evaluate the same expressions (a test checks no bit moves).

Masks are the forward's: bottom-right causal (``j ≤ i + Nk − Nq``), sliding window
``(left, right)``. A row with ``LSE = −inf`` (it kept no key) has its lse2 replaced by +inf,
so ``Sᵀ·c − lse2 = −inf`` and P = 0 exactly: exp2(−inf − (−inf)) = NaN never happens, the row
gets dQ = 0 and adds nothing to dK, dV. A NaN LSE is left alone and propagates. Loads past
``Nq``, ``Nk`` and the head dims are masked to zero; padded keys are masked out of dQ (their P
could overflow for very negative LSE), and padded rows and keys of dK, dV are never stored.

Known limits: no LSE gradient (LSE is an output of the forward only); no dropout, no explicit
boolean mask; P is recomputed from fp32 scores and LSE, each rounded by about 2^-24 of its
size, so past ``|scale·q·k| ~ 2^26`` P's exponent is off by units (the harness registers the
backward with a score limit for that reason); tiles are tuned for fp16/bf16 on an H200
(``backward_config``), not for fp32 or other GPUs; on an sm_90 GPU at 64 < d <= 128 the loops'
loads go through TMA descriptors (``BackwardConfig.tma``) where the tensors' rows are 16-byte
aligned, through pointers elsewhere (other tiles, the same bits); no warp specialisation; past
d = 128 the dK/dV kernel runs twice, once per output (``BackwardConfig.kv_apart``), which
recomputes P, and there dQ always comes from the dQ kernel (the fused program's tile did not fit
an H100's shared memory); D is read by both kernels, so O(Nq) extra fp32 memory per head, plus
the fp32 dQ buffer (``B·Hq·Nq·d``) on the atomic path; the fused program reuses the two-kernel
path's dK/dV tiles, tuned without its extra product and atomics. Under
``TRITON_INTERPRET=1`` bf16 raises ``NotImplementedError`` like the forward
(triton-lang/triton#11584, detected by the forward's canary).

The file is one self-contained kernel (jit functions, launcher, autograd function, in the
Triton tutorial's order) and so longer than the project's 450-line guide: its three programs
share their mask and tile logic and are launched together.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from flashcheck.kernels.triton_flash import (
    check_approx_tanh,
    check_inputs,
    check_options,
    launch,
    load_block,
    option_constants,
    softcap_mode,
    tanh_of,
    tma_descriptor,
    tma_ok,
)

__all__ = [
    "ARITHMETIC",
    "BackwardConfig",
    "FlashAttentionFunction",
    "backward_config",
    "flash_attention_backward",
    "flash_attention_differentiable",
    "launch_backward",
]

ARITHMETIC = "flash"
_LOG2E = 1.4426950408889634


@triton.jit
def _bwd_preprocess(
    Out, DO, Delta, LSE, Sinks, Terms,
    sob, soh, som, sod,
    sdob, sdoh, sdom, sdod,
    sdb, sdh, sdm,
    slb, slh, slm,
    NQ, DV,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr, SINKS: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    inside = (rows[:, None] < NQ) & (offs_dv[None, :] < DV)
    o = tl.load(
        Out + b * sob + h * soh + rows[:, None] * som + offs_dv[None, :] * sod,
        mask=inside,
        other=0.0,
    )
    do = tl.load(
        DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_dv[None, :] * sdod,
        mask=inside,
        other=0.0,
    )
    # D from the O the forward wrote (rounded to the input dtype), as FA2 defines it.
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(Delta + b * sdb + h * sdh + rows * sdm, delta, mask=rows < NQ)
    if SINKS:
        # The sink's weight P_iσ = exp2(σ' − lse2) (recomputed as P is) times D_i: the row's
        # term of dσ_h = −Σ_i P_iσ·D_i, summed by the launcher.
        lse = tl.load(LSE + b * slb + h * slh + rows * slm, mask=rows < NQ, other=0.0)
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634
        p_sink = tl.math.exp2(sink - lse * 1.4426950408889634)
        tl.store(Terms + b * sdb + h * sdh + rows * sdm, p_sink * delta, mask=rows < NQ)


@triton.jit
def _slice(X, b, h, sxb, sxh, TMA: tl.constexpr):
    """The (batch ``b``, head ``h``) slice of ``X`` as :func:`load_block` takes it, with ``X``
    itself as its ``desc``: with ``TMA``, ``X`` is a 4-D descriptor (batch, head, row, column)
    built on the host, and the slice is its coordinates (no per-thread addresses in the loops:
    registers that the one-warpgroup tiles would spill); without, ``X`` is a pointer and the
    slice its base (``desc`` is then unused)."""
    if TMA:
        base = (b, h)
    else:
        base = X + b * sxb + h * sxh
    return base


@triton.jit
def _dkdv_rows(
    dk, dv, k, v, q_desc, do_desc, q_base, do_base, lse_base, delta_base, dq_base,
    start_lo, start_hi, cols, offs_m, offs_d, offs_dv,
    sqm, sqd, sdom, sdod, slm, sdm, sdqm, sdqd, NQ, NK, D, DV, off, qk_scale, win_left, win_right,
    c1, c2,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, PRECISION: tl.constexpr, OUT_K: tl.constexpr, OUT_V: tl.constexpr,
    SOFTCAP: tl.constexpr, DQ_ATOMIC: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    for start in range(start_lo, start_hi, BLOCK_M):
        start = tl.multiple_of(start, BLOCK_M)
        rows = start + offs_m
        q = load_block(q_desc, q_base, start, rows, offs_d, sqm, sqd, NQ, D, TMA)
        do = load_block(do_desc, do_base, start, rows, offs_dv, sdom, sdod, NQ, DV, TMA)
        # Padded rows read LSE = −inf, which the guard below turns into P = 0.
        lse = tl.load(lse_base + rows * slm, mask=rows < NQ, other=float("-inf"))
        # A row that kept no key: +inf makes S·c − lse2 = −inf (P = 0), never −inf − (−inf).
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        st = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        if SOFTCAP:
            # The forward's capped logit tanh(s·c1)·c2 (exp2 units), and the slope 1 − tanh²
            # that dS passes through to the raw score.
            th = tanh_of(st * c1, SOFTCAP)
            x = th * c2 - lse2[None, :]
        else:
            x = st * qk_scale - lse2[None, :]
        if MASKED:
            keep = (cols[:, None] < NK) & (rows[None, :] < NQ)
            if CAUSAL:
                keep = keep & (cols[:, None] <= rows[None, :] + off)
            if WINDOW:
                if win_left >= 0:
                    keep = keep & (cols[:, None] >= rows[None, :] + off - win_left)
                if win_right >= 0:
                    keep = keep & (cols[:, None] <= rows[None, :] + off + win_right)
            x = tl.where(keep, x, float("-inf"))
        pt = tl.math.exp2(x)
        if OUT_V:
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
        if OUT_K:
            if SOFTCAP:
                # P·(1 − tanh²) before dP: tanh dies here rather than living across the dP
                # product. On an sm_90 compile (benchmarks/bwd_registers.py, 64 × 128 tile, 8
                # warps) the spill stack fell from 216 to 96 bytes; plain spills 72 there.
                pt = pt * (1.0 - th * th)
            delta = tl.load(delta_base + rows * sdm, mask=rows < NQ, other=0.0)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
            if DQ_ATOMIC:
                # The fused path: this key block's share of dQ, dSᵀ rounded as the dQ kernel
                # rounds dS, times k, added to an fp32 buffer every key block of these rows
                # adds to. The adds arrive in no fixed order on a GPU, so dQ's last bits vary
                # from run to run; scaling and rounding happen once, after the last add.
                dq = tl.dot(tl.trans(dst.to(k.dtype)), k, input_precision=PRECISION)
                # Relaxed: no other memory access depends on the order of these adds, and the
                # default (acq_rel) fences each one.
                tl.atomic_add(
                    dq_base + rows[:, None] * sdqm + offs_d[None, :] * sdqd,
                    dq,
                    mask=(rows[:, None] < NQ) & (offs_d[None, :] < D),
                    sem="relaxed",
                )
    return dk, dv


@triton.jit
def _bwd_dkdv(
    Q, K, V, DO, LSE, Delta, DK, DV_, DQ,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod,
    slb, slh, slm,
    sdb, sdh, sdm,
    sdkb, sdkh, sdkn, sdkd,
    sdvb, sdvh, sdvn, sdvd,
    sdqb, sdqh, sdqm, sdqd,
    GROUP, NQ, NK, D, DV,
    sm_scale, qk_scale, win_left, win_right, c1, c2,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr, SPLIT: tl.constexpr, OUT_K: tl.constexpr, OUT_V: tl.constexpr,
    SOFTCAP: tl.constexpr, DQ_ATOMIC: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One program: dK and dV of BLOCK_N keys of one key/value head, over every query row of
    its group of query heads.

    Longer than 80 lines: loading the key block, the query loop of each head in up to three
    ranges (rows that skip the mask, the diagonal or window edge, the rest) and the scaled
    stores are one compiled program; the query loop itself lives in ``_dkdv_rows``.
    """
    pid_n = tl.program_id(0)
    # Key head and batch from the grid's second and third axes (as the forward): no integer
    # division by a run-time head count, and no bound B·H ≤ 65,535 of one grid axis.
    hk = tl.program_id(1)
    b = tl.program_id(2)
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k = tl.load(
        K + b * skb + hk * skh + cols[:, None] * skn + offs_d[None, :] * skd,
        mask=(cols[:, None] < NK) & (offs_d[None, :] < D),
        other=0.0,
    )
    v = None
    if OUT_K:
        v = tl.load(
            V + b * svb + hk * svh + cols[:, None] * svn + offs_dv[None, :] * svd,
            mask=(cols[:, None] < NK) & (offs_dv[None, :] < DV),
            other=0.0,
        )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    off = NK - NQ
    n_last = n0 + BLOCK_N - 1
    # Rows that keep some key of this block: [lo, hi). Row i keeps key j iff j <= i + off
    # (causal), j >= i + off - left and j <= i + off + right (window).
    lo = 0
    hi = NQ
    # Rows that keep every key of the block: [f_lo, f_hi). Their blocks skip the mask.
    f_lo = 0
    f_hi = NQ
    if CAUSAL:
        lo = tl.maximum(lo, n0 - off)
        f_lo = tl.maximum(f_lo, n_last - off)
    if WINDOW:
        if win_right >= 0:
            lo = tl.maximum(lo, n0 - off - win_right)
            f_lo = tl.maximum(f_lo, n_last - off - win_right)
        if win_left >= 0:
            hi = tl.minimum(hi, n_last - off + win_left + 1)
            f_hi = tl.minimum(f_hi, n0 - off + win_left + 1)
    lo = (tl.maximum(lo, 0) // BLOCK_M) * BLOCK_M
    hi = tl.maximum(hi, lo)
    # Whole row blocks on the grid lo, lo + BLOCK_M, ... inside [f_lo, f_hi); the ragged last
    # row block and a ragged key block take the masked path.
    full_lo = tl.minimum(lo + tl.cdiv(tl.maximum(f_lo - lo, 0), BLOCK_M) * BLOCK_M, hi)
    full_hi = lo + (tl.maximum(f_hi - lo, 0) // BLOCK_M) * BLOCK_M
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    full_hi = tl.where(n_last >= NK, full_lo, full_hi)
    if not SPLIT:
        full_lo = hi
        full_hi = hi
    for hh in range(0, GROUP):
        # The query heads of this kv head's group: h = hk·G, ..., hk·G + G − 1.
        h = hk * GROUP + hh
        q_base = _slice(Q, b, h, sqb, sqh, TMA)
        do_base = _slice(DO, b, h, sdob, sdoh, TMA)
        lse_base = LSE + b * slb + h * slh
        delta_base = Delta + b * sdb + h * sdh
        dq_base = DQ + b * sdqb + h * sdqh
        dk, dv = _dkdv_rows(
            dk, dv, k, v, Q, DO, q_base, do_base, lse_base, delta_base, dq_base, lo,
            full_lo, cols, offs_m, offs_d, offs_dv, sqm, sqd, sdom, sdod, slm, sdm, sdqm, sdqd, NQ,
            NK, D, DV, off, qk_scale, win_left, win_right, c1, c2, True, CAUSAL, WINDOW, BLOCK_M,
            PRECISION, OUT_K, OUT_V, SOFTCAP, DQ_ATOMIC, TMA,
        )  # fmt: skip
        dk, dv = _dkdv_rows(
            dk, dv, k, v, Q, DO, q_base, do_base, lse_base, delta_base, dq_base, full_lo,
            full_hi, cols, offs_m, offs_d, offs_dv, sqm, sqd, sdom, sdod, slm, sdm, sdqm, sdqd, NQ,
            NK, D, DV, off, qk_scale, win_left, win_right, c1, c2, False, CAUSAL, WINDOW, BLOCK_M,
            PRECISION, OUT_K, OUT_V, SOFTCAP, DQ_ATOMIC, TMA,
        )  # fmt: skip
        dk, dv = _dkdv_rows(
            dk, dv, k, v, Q, DO, q_base, do_base, lse_base, delta_base, dq_base, full_hi,
            hi, cols, offs_m, offs_d, offs_dv, sqm, sqd, sdom, sdod, slm, sdm, sdqm, sdqd, NQ, NK,
            D, DV, off, qk_scale, win_left, win_right, c1, c2, True, CAUSAL, WINDOW, BLOCK_M,
            PRECISION, OUT_K, OUT_V, SOFTCAP, DQ_ATOMIC, TMA,
        )  # fmt: skip
    if OUT_K:
        dk = dk * sm_scale
        out_k = (cols[:, None] < NK) & (offs_d[None, :] < D)
        tl.store(
            DK + b * sdkb + hk * sdkh + cols[:, None] * sdkn + offs_d[None, :] * sdkd,
            dk.to(DK.dtype.element_ty),
            mask=out_k,
        )
    if OUT_V:
        out_v = (cols[:, None] < NK) & (offs_dv[None, :] < DV)
        tl.store(
            DV_ + b * sdvb + hk * sdvh + cols[:, None] * sdvn + offs_dv[None, :] * sdvd,
            dv.to(DV_.dtype.element_ty),
            mask=out_v,
        )


@triton.jit
def _dq_keys(
    dq, q, do, lse2, delta, k_desc, v_desc, k_base, v_base, start_lo, start_hi, rows, offs_n,
    offs_d, offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, SOFTCAP: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    for start in range(start_lo, start_hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + offs_n
        k = load_block(k_desc, k_base, start, cols, offs_d, skn, skd, NK, D, TMA)
        v = load_block(v_desc, v_base, start, cols, offs_dv, svn, svd, NK, DV, TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:  # as in _dkdv_rows
            th = tanh_of(s * c1, SOFTCAP)
            x = th * c2 - lse2[:, None]
        else:
            x = s * qk_scale - lse2[:, None]
        if MASKED:
            # Padded keys must be masked here: their score is 0 and exp2(0 − lse2) overflows
            # when LSE is very negative, and inf·0 in dS·k would be NaN.
            # 2-D from the start (as in the forward; the row term is always true): Triton 3.6
            # rejects a tensor whose shape changes inside the run-time `if win_left >= 0` below.
            keep = (cols[None, :] < NK) & (rows[:, None] >= 0)
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + off)
            if WINDOW:
                if win_left >= 0:
                    keep = keep & (cols[None, :] >= rows[:, None] + off - win_left)
                if win_right >= 0:
                    keep = keep & (cols[None, :] <= rows[:, None] + off + win_right)
            x = tl.where(keep, x, float("-inf"))
        p = tl.math.exp2(x)
        if SOFTCAP:  # as in _dkdv_rows: P·(1 − tanh²) first
            p = p * (1.0 - th * th)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


@triton.jit
def _bwd_dq(
    Q, K, V, DO, LSE, Delta, DQ,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sdob, sdoh, sdom, sdod,
    slb, slh, slm,
    sdb, sdh, sdm,
    sdqb, sdqh, sdqm, sdqd,
    GROUP, NQ, NK, D, DV,
    sm_scale, qk_scale, win_left, win_right, c1, c2,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr, SPLIT: tl.constexpr, SOFTCAP: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q = tl.load(
        Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd,
        mask=(rows[:, None] < NQ) & (offs_d[None, :] < D),
        other=0.0,
    )
    do = tl.load(
        DO + b * sdob + h * sdoh + rows[:, None] * sdom + offs_dv[None, :] * sdod,
        mask=(rows[:, None] < NQ) & (offs_dv[None, :] < DV),
        other=0.0,
    )
    lse = tl.load(LSE + b * slb + h * slh + rows * slm, mask=rows < NQ, other=float("-inf"))
    delta = tl.load(Delta + b * sdb + h * sdh + rows * sdm, mask=rows < NQ, other=0.0)
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    k_base = _slice(K, b, hk, skb, skh, TMA)
    v_base = _slice(V, b, hk, svb, svh, TMA)
    off = NK - NQ
    # The forward's key ranges: live keys [lo, hi), keys every row keeps [u_lo, u_hi).
    lo = 0
    hi = NK
    u_lo = 0
    u_hi = NK
    if CAUSAL:
        hi = tl.minimum(hi, m0 + BLOCK_M + off)
        u_hi = tl.minimum(u_hi, m0 + off + 1)
    if WINDOW:
        if win_right >= 0:
            hi = tl.minimum(hi, m0 + BLOCK_M + off + win_right)
            u_hi = tl.minimum(u_hi, m0 + off + win_right + 1)
        if win_left >= 0:
            lo = tl.maximum(0, m0 + off - win_left)
            lo = (lo // BLOCK_N) * BLOCK_N
            u_lo = tl.maximum(u_lo, m0 + BLOCK_M - 1 + off - win_left)
    hi = tl.maximum(hi, lo)
    full_lo = tl.minimum(lo + tl.cdiv(tl.maximum(u_lo - lo, 0), BLOCK_N) * BLOCK_N, hi)
    full_hi = lo + (tl.maximum(u_hi - lo, 0) // BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    if not SPLIT:
        full_lo = hi
        full_hi = hi
    dq = _dq_keys(
        dq, q, do, lse2, delta, K, V, k_base, v_base, lo, full_lo, rows, offs_n, offs_d,
        offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2, True,
        CAUSAL, WINDOW, BLOCK_N, PRECISION, SOFTCAP, TMA,
    )  # fmt: skip
    dq = _dq_keys(
        dq, q, do, lse2, delta, K, V, k_base, v_base, full_lo, full_hi, rows, offs_n,
        offs_d, offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2,
        False, CAUSAL, WINDOW, BLOCK_N, PRECISION, SOFTCAP, TMA,
    )  # fmt: skip
    dq = _dq_keys(
        dq, q, do, lse2, delta, K, V, k_base, v_base, full_hi, hi, rows, offs_n, offs_d,
        offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2, True,
        CAUSAL, WINDOW, BLOCK_N, PRECISION, SOFTCAP, TMA,
    )  # fmt: skip
    dq = dq * sm_scale
    tl.store(
        DQ + b * sdqb + h * sdqh + rows[:, None] * sdqm + offs_d[None, :] * sdqd,
        dq.to(DQ.dtype.element_ty),
        mask=(rows[:, None] < NQ) & (offs_d[None, :] < D),
    )


# ---------------------------------------------------------------------------------------------
# Launcher


class BackwardConfig(NamedTuple):
    """Tiles of the backward: ``block_m`` query rows and ``block_n`` keys, warps and pipeline
    stages of the dK/dV kernel (a program owns ``block_n`` keys and steps over rows), and of
    the dQ kernel where the ``dq_*`` fields are set (a program owns ``dq_block_m`` rows and
    steps over keys; 0: as dK/dV). ``split=False`` sends every block through the masked path
    (tests). ``tma``: on an sm_90 GPU and under the interpreter, the loads inside
    both kernels' loops (Q and dO rows in dK/dV, K and V keys in dQ) go through host-built TMA
    descriptors where the tensors allow it (16-byte aligned rows), through pointers otherwise;
    the same values either way.
    ``maxnreg`` / ``dq_maxnreg``: a cap on the registers a thread of the dK/dV / dQ kernel (on a
    GPU; ``None``: the compiler's choice), so that more programs share an SM. ``tma`` with a
    2-stage dQ kernel is refused (it faulted on an H200; see :func:`check_config`)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    split: bool = True
    dq_block_m: int = 0
    dq_block_n: int = 0
    dq_warps: int = 0
    dq_stages: int = 0
    kv_apart: bool = False
    tma: bool = False
    maxnreg: int | None = None
    dq_maxnreg: int | None = None

    def for_dq(self) -> tuple[int, int, int, int]:
        """``(block_m, block_n, warps, stages)`` of the dQ kernel."""
        return (
            self.dq_block_m or self.block_m,
            self.dq_block_n or self.block_n,
            self.dq_warps or self.warps,
            self.dq_stages or self.stages,
        )


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_SM90: dict[int, bool] = {}


def _tma_usable(q: Any, k: Any, v: Any, do: Any) -> bool:
    """Whether the loops' loads may go through TMA descriptors: tensors :func:`tma_ok` accepts,
    on a CUDA GPU of compute capability 9 (Hopper) or under the interpreter (which reads a
    descriptor's blocks as the GPU does, zeros past its edges; only a config that asks for
    them uses them there, so the CPU tests can compare both loads)."""
    if _interpreting():
        return tma_ok(q, k, v, do)
    if q.device.type != "cuda":
        return False
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    if index not in _SM90:
        # Hopper only: the tiles that ask for descriptors were measured there (an H200), and
        # other generations' shared memory differs.
        _SM90[index] = torch.cuda.get_device_capability(index)[0] == 9
    return _SM90[index] and tma_ok(q, k, v, do)


def backward_config(
    d: int,
    dv: int,
    dtype_bytes: int,
    *,
    approx_cap: bool = False,
    causal: bool = True,
    fused: bool = False,
    tma: bool = False,
) -> BackwardConfig:
    """Tiles for head dims ``d``, ``dv`` and an input of ``dtype_bytes`` (``approx_cap``: a
    soft-cap with the approximate tanh; ``causal``; ``fused``: dQ by atomic adds inside the
    dK/dV program; ``tma``: the loops' loads may go through TMA descriptors, an sm_90 GPU
    and aligned tensors). The dK/dV program keeps two fp32 accumulators of ``block_n × d`` in
    registers besides its k and v tiles, so fp32 gets small tiles (not tuned)."""
    if _interpreting():
        # The interpreter's cost is per tile operation; 32-wide tiles still cross block edges
        # at the test lengths 17, 33 and 65.
        return BackwardConfig(32, 32, 4, 1)
    if dtype_bytes == 4:
        return BackwardConfig(32, 32, 4, 1)
    # 16-bit inputs: chosen by benchmarks/tune_backward.py on an H200 (bf16, N = 4096, log in
    # benchmarks/RESULTS.md): dK/dV owns a wide key tile and steps over narrow row blocks, dQ
    # the transpose. Past d = 128 the two fp32 accumulators of one dK/dV program do not fit
    # a 128-key tile; dK and dV apart (one accumulator each) ran 1.4x faster than together
    # despite recomputing P twice.
    if max(d, dv) > 128:
        return BackwardConfig(32, 128, 8, 3, True, 128, 32, 8, 3, kv_apart=True)
    if max(d, dv) > 64 and tma and not fused:
        # Loads through TMA free the registers that per-thread addresses held: dK/dV on one
        # warpgroup of 64 keys × 64 rows then spills 6-24 registers (38-42 through pointers),
        # and two programs fit an SM (255 registers × 128 threads, 97 KiB of shared memory),
        # one's softmax able to run under the other's products. On an
        # H200 (bf16, d = 128, N = 4K, benchmarks/gpu_softcap_bwd_split.py --dkdv, --dq with
        # a fifth field 1) that dK/dV took 0.89x / 0.86x the pointer tiles' time plain (non-
        # causal / causal) and 0.84x / 0.92x soft-capped; dQ at 128 × 64 on two warpgroups
        # 0.94x / 0.92x and 0.96x / 0.94x. The same bits (each key's sums in the same order).
        return BackwardConfig(64, 64, 4, 2, True, 128, 64, 8, 3, tma=True)
    if max(d, dv) > 64 and approx_cap:
        # The capped dQ program: 128 rows × 64 keys on two warpgroups spill nothing; on an H200
        # (bf16, d = 128, N = 4K, benchmarks/gpu_softcap_bwd_split.py --dq) its dQ kernel took
        # 0.98x / 0.99x the time of 64 × 32 on one warpgroup (non-causal / causal), which took
        # 0.93x / 0.70x that of plain's spilling 128 × 32, the same bits (dQ's key blocks sum in
        # one order). Without a mask, dK/dV as plain's 128-key tile since P·(1 − tanh²) is
        # formed before dP (8 spills, was 38): 0.97x / 0.95x the 64-key tile's time at N = 4K /
        # 16K; causal that tile lost (1.05-1.15x); the atomic path's was not measured.
        if causal or fused:
            return BackwardConfig(32, 64, 4, 3, True, 128, 64, 8, 3)
        return BackwardConfig(64, 128, 8, 3, True, 128, 64, 8, 3)
    if max(d, dv) > 64 and not (causal or fused):
        # Without a mask, 128-key dK/dV programs of two warpgroups: on an H200 (bf16, d = 128,
        # benchmarks/gpu_softcap_bwd_split.py --dkdv) the dK/dV kernel took 0.98x / 0.89x /
        # 0.91x the time of the 64-key, one-warpgroup tile at N = 1K / 4K / 16K, the same bits.
        # Causal it lost at N = 1K (1.11x); the atomic path's extra tile was not tried there.
        return BackwardConfig(64, 128, 8, 3, True, 128, 32, 4, 3)
    if max(d, dv) > 64:
        return BackwardConfig(32, 64, 4, 3, True, 128, 32, 4, 3)
    return BackwardConfig(32, 128, 4, 3, True, 64, 64, 4, 3)


def _scaled_dq(acc: torch.Tensor, sm_scale: float, dtype: torch.dtype) -> torch.Tensor:
    """The fused path's dQ from its fp32 sum: the dQ kernel's two roundings, fl32(sum·scale)
    (torch multiplies an fp32 tensor by the scale rounded to fp32, as the kernel does), then
    the input dtype."""
    return (acc * sm_scale).to(dtype)


def check_config(cfg: BackwardConfig, *, fused: bool) -> None:
    """Refuse a ``cfg`` known to fault (``fused``: dQ by atomic adds, no dQ kernel): with
    ``tma`` and the mask split, a 2-stage dQ kernel. On an H200 with Triton 3.6 that kernel
    stopped the process ("unspecified launch failure", the CUDA context lost) at 64 x 32 and
    64 x 64 tiles without a mask, and ran with one masked loop (``split=False``), causal, or at
    1 or 3 stages (benchmarks/gpu_dq_stages_fault.py, benchmarks/RESULTS.md). Refused on every
    machine, so that a config means the same everywhere."""
    if cfg.tma and cfg.split and not fused and cfg.for_dq()[3] == 2:
        raise ValueError(
            "BackwardConfig with tma=True and a 2-stage dQ kernel (dq_stages, or stages when "
            "dq_stages is 0) is refused: its descriptor loads faulted on a Hopper GPU; "
            "pass dq_stages=1 or 3, or tma=False"
        )


def launch_backward(
    q, k, v, o, lse, do, *, causal, window, scale, allow_tf32, config=None, softcap=None,
    sinks=None, deterministic=True, approx_tanh=False,
):  # fmt: skip
    """Launch the backward on tensors :func:`flash_attention_backward` has already checked
    (``window`` as ``(left, right)`` with -1 for unbounded, ``scale`` a float, ``softcap`` and
    ``sinks`` as :func:`~flashcheck.kernels.triton_flash.check_options` returns them);
    ``config`` overrides the tiles; ``deterministic`` as for :func:`flash_attention_backward`.
    Returns ``(dQ, dK, dV)`` in the input dtype, and ``dσ`` (float32 ``(Hq,)``) after them with
    sinks."""
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    # dO in one layout for every caller: Triton compiles a variant per stride alignment, and on
    # an H200 at d = 40 an expanded dO (stride 0, the gradient of O.sum()) gave a dQ differing
    # in some elements from the one of the same values contiguous (benchmarks/RESULTS.md). One
    # copy of dO, when it is not contiguous, makes the gradients independent of its layout.
    do = do.contiguous()
    mode = softcap_mode(softcap, approx_tanh)
    usable = _tma_usable(q, k, v, do)
    if config is None:
        # A window counts as causal here: its tiles were not measured apart.
        masked = bool(causal) or window is not None
        cfg = backward_config(
            d, dv, q.element_size(), approx_cap=mode == 2, causal=masked,
            fused=not deterministic, tma=usable,
        )  # fmt: skip
    else:
        cfg = config
    # Past d = 128 (kv_apart) the fused program's tile does not fit a GPU's shared memory, so
    # dQ comes from the dQ kernel there whatever `deterministic` says.
    fused = not deterministic and not cfg.kv_apart
    check_config(cfg, fused=fused)
    if fused:
        dq = torch.zeros((bsz, hq, nq, d), dtype=torch.float32, device=q.device)
    else:
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dvv = torch.empty_like(v, memory_format=torch.contiguous_format)
    delta = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(16, triton.next_power_of_2(dv))
    left, right = (-1, -1) if window is None else window
    precision = "tf32" if (allow_tf32 and q.dtype == torch.float32) else "ieee"
    sm_scale = float(scale)
    qk_scale = sm_scale * _LOG2E
    # Sinks alone leave P's recomputation as it is (the LSE holds the sink); a cap makes it
    # tanh(s·c1)·c2 − lse2.
    _, c1, c2 = option_constants(sm_scale, softcap, None)
    opts = {"CAUSAL": bool(causal), "WINDOW": window is not None, "BLOCK_M": cfg.block_m,
            "BLOCK_N": cfg.block_n, "BLOCK_D": block_d, "BLOCK_DV": block_dv,
            "PRECISION": precision, "SPLIT": cfg.split, "num_warps": cfg.warps,
            "num_stages": cfg.stages, "SOFTCAP": mode}  # fmt: skip
    # A register cap is a compile option of the GPU backends; the interpreter has none.
    cap_kv = {} if cfg.maxnreg is None or _interpreting() else {"maxnreg": cfg.maxnreg}
    cap_q = {} if cfg.dq_maxnreg is None or _interpreting() else {"maxnreg": cfg.dq_maxnreg}
    dq_m, dq_n, dq_warps, dq_stages = cfg.for_dq()
    terms = torch.empty_like(delta) if sinks is not None else delta
    _bwd_preprocess[(triton.cdiv(nq, dq_m), hq, bsz)](
        o, do, delta, lse, delta if sinks is None else sinks, terms,
        *o.stride(), *do.stride(), *delta.stride(), *lse.stride(), nq, dv,
        BLOCK_M=dq_m, BLOCK_DV=block_dv, SINKS=sinks is not None, num_warps=dq_warps,
    )  # fmt: skip
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *delta.stride())
    tma = cfg.tma and usable
    q_in, do_in = q, do
    if tma:
        q_in = tma_descriptor(q, cfg.block_m, block_d)
        do_in = tma_descriptor(do, cfg.block_m, block_dv)
    for out_k, out_v in ((True, False), (False, True)) if cfg.kv_apart else ((True, True),):
        _bwd_dkdv[(triton.cdiv(nk, cfg.block_n), hk, bsz)](
            q_in, k, v, do_in, lse, delta, dk, dvv, dq, *common, *dk.stride(), *dvv.stride(),
            *dq.stride(), hq // hk, nq, nk, d, dv, sm_scale, qk_scale, left, right, c1, c2,
            **opts, **cap_kv, OUT_K=out_k, OUT_V=out_v, DQ_ATOMIC=fused, TMA=tma,
        )  # fmt: skip
    if fused:
        dq = _scaled_dq(dq, sm_scale, q.dtype)
    else:
        opts.update(BLOCK_M=dq_m, BLOCK_N=dq_n, num_warps=dq_warps, num_stages=dq_stages)
        k_in, v_in = k, v
        if tma:
            k_in = tma_descriptor(k, dq_n, block_d)
            v_in = tma_descriptor(v, dq_n, block_dv)
        _bwd_dq[(triton.cdiv(nq, dq_m), hq, bsz)](
            q, k_in, v_in, do, lse, delta, dq, *common, *dq.stride(),
            hq // hk, nq, nk, d, dv, sm_scale, qk_scale, left, right, c1, c2, **opts, **cap_q,
            TMA=tma,
        )  # fmt: skip
    if sinks is None:
        return dq, dk, dvv
    # dσ_h = −Σ_{b,i} P_iσ·D_i: an fp32 sum of the rows' terms (torch's, deterministic for a
    # given shape).
    return dq, dk, dvv, -terms.sum(dim=(0, 2))


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    lse: Any,
    do: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    allow_tf32: bool = False,
    softcap: float | None = None,
    sinks: Any = None,
    deterministic: bool = True,
    approx_tanh: bool = False,
) -> tuple[Any, ...]:
    """FlashAttention-2 backward of ``O = softmax(scale·QKᵀ + mask)·V`` for the upstream ``dO``.

    With ``P`` the softmax, ``D_i = Σ_c dO_ic·O_ic`` and ``dS = P∘(dO·Vᵀ − D)``:
    ``dV = Pᵀ·dO``, ``dQ = scale·dS·K``, ``dK = scale·dSᵀ·Q`` (dK, dV summed over each kv head's
    group of query heads). ``q``, ``k``, ``v``, ``causal``, ``window``, ``scale`` and
    ``allow_tf32`` as for :func:`flashcheck.kernels.triton_flash.flash_attention`; ``o`` and
    ``lse``: what that forward returned for them (``o`` ``(B, Hq, Nq, dv)`` in the input dtype,
    ``lse`` float32 ``(B, Hq, Nq)``, natural log, −inf for rows that keep no key); ``do``: the
    gradient of the loss with respect to ``o`` (its shape and dtype), any strides (copied
    contiguous first if it is not, so its layout changes no bit of the result). Returns
    ``(dQ, dK, dV)`` in the input dtype, contiguous, shaped like ``q``, ``k``, ``v``. Rows that
    keep no key get ``dQ = 0`` and add nothing to ``dK``, ``dV``.

    ``softcap`` and ``sinks`` as for the forward (and the same as given to it): with a cap,
    ``dS`` is multiplied by the slope ``1 − tanh²(s/c)`` (tanh recomputed, by the forward's
    tanh: pass the forward's ``approx_tanh``); with sinks, the
    result gains ``dσ_h = −Σ_{b,i} exp(σ_h − LSE_i)·D_i`` (float32, ``(Hq,)``) after dV.

    ``deterministic=True`` (the default): a second kernel recomputes S and dP per row block and
    sums dQ in a fixed order; repeated calls are bitwise identical. ``deterministic=False``
    (FlashAttention's default, slower here: see the module docstring): dQ = scale·Σ_blocks dS·K is
    summed inside the dK/dV kernel with fp32 atomic adds, one per (key block, row block), then
    scaled and rounded once: S and dP are computed once per block pair (5 block products, not
    7), at the cost of an fp32 ``B·Hq·Nq·d`` buffer. On a GPU the adds land in a run-dependent
    order, so dQ's last bits may differ between identical calls; its error bound does not (an
    fp32 sum of the same terms). Past d = 128 dQ comes from the second kernel either way.
    dK, dV are bitwise reproducible on both.
    """
    if not isinstance(deterministic, bool):
        raise ValueError(
            "deterministic must be True (bitwise reproducible dQ, a second kernel; the default) or "
            f"False (dQ by atomic adds), got {deterministic!r}"
        )
    window, sc = check_inputs(q, k, v, window=window, scale=scale)
    cap, sinks = check_options(q, softcap, sinks)
    check_approx_tanh(approx_tanh)
    bsz, hq, nq, _ = q.shape
    dv = v.shape[3]
    for name, x in (("o", o), ("do", do)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != (bsz, hq, nq, dv) or x.dtype != q.dtype:
            raise ValueError(
                f"{name} must have shape (B, Hq, Nq, dv) = {(bsz, hq, nq, dv)} and dtype "
                f"{q.dtype} (the forward's output), got {tuple(x.shape)} {x.dtype}"
            )
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (bsz, hq, nq):
        raise ValueError(
            f"lse must be the forward's LSE tensor of shape (B, Hq, Nq) = {(bsz, hq, nq)}, got "
            f"{type(lse).__name__} {tuple(getattr(lse, 'shape', ()))}"
        )
    if lse.dtype != torch.float32:
        raise ValueError(
            f"lse must be float32 (as flash_attention returns it), got {lse.dtype}; a rounded "
            "LSE would shift every recomputed P"
        )
    if not (o.device == do.device == lse.device == q.device):
        raise ValueError("o, lse and do must be on the device of q, k, v")
    return launch_backward(
        q, k, v, o, lse, do, causal=causal, window=window, scale=sc, allow_tf32=allow_tf32,
        softcap=cap, sinks=sinks, deterministic=deterministic, approx_tanh=approx_tanh,
    )  # fmt: skip


class FlashAttentionFunction(torch.autograd.Function):
    """``O`` of the Triton forward as a differentiable torch operation: the forward saves ``O``
    and ``LSE`` (O(N·d) memory), the backward runs :func:`flash_attention_backward`."""

    @staticmethod
    def forward(
        ctx, q, k, v, causal, window, scale, allow_tf32, softcap=None, sinks=None,
        deterministic=True, approx_tanh=False,
    ):  # fmt: skip
        window, sc = check_inputs(q, k, v, window=window, scale=scale)
        cap, sinks = check_options(q, softcap, sinks)
        check_approx_tanh(approx_tanh)
        opts = {"causal": causal, "window": window, "scale": sc, "allow_tf32": allow_tf32}
        opts.update(softcap=cap, approx_tanh=approx_tanh)
        o, lse = launch(q, k, v, **opts, sinks=sinks)
        ctx.save_for_backward(q, k, v, o, lse, sinks)
        ctx.opts = {**opts, "deterministic": deterministic}
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse, sinks = ctx.saved_tensors
        grads = launch_backward(q, k, v, o, lse, do, **ctx.opts, sinks=sinks)
        dsinks = grads[3] if sinks is not None else None
        return *grads[:3], None, None, None, None, None, dsinks, None, None


def flash_attention_differentiable(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    allow_tf32: bool = False,
    softcap: float | None = None,
    sinks: Any = None,
    deterministic: bool = True,
    approx_tanh: bool = False,
) -> Any:
    """``O`` of :func:`flashcheck.kernels.triton_flash.flash_attention` (same arguments), with
    gradients to ``q``, ``k``, ``v`` (and ``sinks``) through :func:`flash_attention_backward`
    (``deterministic`` as there; ``approx_tanh`` for both passes)."""
    if not isinstance(deterministic, bool):
        raise ValueError(
            "deterministic must be True (bitwise reproducible dQ, the default) or False (dQ by "
            f"atomic adds), got {deterministic!r}"
        )
    return FlashAttentionFunction.apply(
        q, k, v, causal, window, scale, allow_tf32, softcap, sinks, deterministic, approx_tanh
    )
