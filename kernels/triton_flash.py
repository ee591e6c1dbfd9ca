"""Triton FlashAttention-2 forward kernel: O and LSE, fp16 / bf16 / fp32.

Algorithm (one program per block of ``BLOCK_M`` query rows of one (batch, head); c is
scale·log2 e, one fp32 constant, so exp2 replaces exp and q is not rescaled):

    for each block of BLOCK_N keys in the row block's live key range:
        S   = q·kᵀ                               tl.dot, fp32 accumulation
        S   = −inf where masked                  only in blocks that hold a masked key
        m'  = max(m, rowmax(S));  α = exp2((m − m')·c);  p = exp2((S − m')·c)
        l   = α·l + Σ p
        acc = α·acc + (p rounded to the input dtype)·V        tl.dot, fp32 accumulation
    O = acc / l,  LSE = (m·c + log2 l)·ln 2        (natural log)

m is the running maximum of the unscaled scores (the minimum if c < 0), so the exponent of the
largest score is exactly 0 whatever the compiler fuses (see ``_softmax_step``).

The key range of a row block is split into mask-free blocks (every row keeps every key) and
the blocks on the causal diagonal, the window edges and the ragged key tail; only the latter
build a mask. Both paths evaluate the same expressions, so the split changes no bit (tested).
Causal row blocks are scheduled longest first. On Hopper, large head dims load through TMA
tensor descriptors (4-D, built on the host); launch configurations per head dim are in
``_HOPPER`` (and ``_HOPPER_SHORT`` / ``_HOPPER_MID`` for short / medium key sequences,
``_H100`` where an H100 differs from the H200), chosen by ``benchmarks/tune_hopper.py`` (log
in benchmarks/RESULTS.md).

Arithmetic class "flash" (docs/error-bounds.md): low-precision inputs, fp32 scores, softmax and
accumulators, P rounded to the input format before P·V. fp32 inputs use IEEE fp32 dots unless
``allow_tf32=True``. Masks are bottom-right aligned (``j ≤ i + Nk − Nq``); a row with no kept
key returns ``O = 0``, ``LSE = −inf``. Loads of keys past ``Nk`` and head-dim padding are masked
or zero-filled by TMA, and their scores set to −inf, so no out-of-bounds read reaches the result.

Known limits: forward only; head dims up to 256 (padded to a power of two ≥ 16; dv ≥ 64 with
128-row blocks, a workaround for wrong results and faults measured on H100 with Triton 3.6); no
warp specialisation, so softmax and the two GEMMs of a tile do not overlap as in
FlashAttention-3 / cuDNN: Triton 3.6's automatic pass gives nothing at 8 warps and fails to
compile this kernel at 4 (its TMA store of O, its second key loop); rewritten without them it
compiles, but on an H200 the second consumer warpgroup's rows of O came out wrong
(benchmarks/RESULTS.md). The exact exponent costs one instruction per score
over a fused multiply-add: the Triton tutorial's forward, which fuses it (and overflows near
1e12), is 1–3 % faster at the same tile (d = 128 without a mask) on an H200 (1–15 % on an H100
before the current tables); the fused form with an exact fallback for huge logits was
measured slower here (benchmarks/RESULTS.md). A soft-capped score is bounded by
``cap·log2 e``, so for caps up to ``CAP_FMA_MAX`` the cap's product does enter the exponent
through one fused multiply-add, without a fallback (``_softmax_step``).
Under ``TRITON_INTERPRET=1`` the interpreter's
bf16 ``tl.dot`` is broken upstream (triton-lang/triton#11584): a canary detects it on first
use and bf16 then raises instead of returning garbage.

The file is one self-contained kernel (jit functions, launch configuration, launcher, public
function, in the Triton tutorial's order) and so longer than the project's 450-line guide: the
per-GPU launch tables and the input checks belong with the kernel they configure.
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import triton
import triton.language as tl

__all__ = [
    "ARITHMETIC",
    "CAP_FMA_MAX",
    "TANH_BIG",
    "TANH_SMALL",
    "LaunchConfig",
    "bf16_dot_supported",
    "cap_fma",
    "check_approx_tanh",
    "check_inputs",
    "check_options",
    "flash_attention",
    "last_compiled",
    "launch",
    "launch_config",
    "load_block",
    "option_constants",
    "portable_config",
    "softcap_mode",
    "tanh_approx",
    "tanh_fp32",
    "tanh_of",
    "tma_descriptor",
    "tma_ok",
]

ARITHMETIC = "flash"
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_FLT_MAX = tl.constexpr(3.4028234663852886e38)  # the largest finite fp32


# tanh_fp32's two polynomials, float64 least-squares fits on Chebyshev nodes rounded to fp32:
# tanh(a)/a = P(a²) on 0 ≤ a < 1 (degree 6, P(0) = 1 exactly) and 2/(1 + e) = F(e) on
# 0 ≤ e ≤ e^-2 (degree 4), so that tanh(a) = 1 − e·F(e) with e = exp(−2a) for a ≥ 1. Max
# error over every fp32 argument in [2^-20, 10], against float64 tanh, with exp2 off by up to
# ±2^-22.5 (ex2.approx.f32) and with or without fused multiply-adds: 2.74·2^-24 relative
# below 1, 2.79·2^-24 above; within the 4·2^-24 the bounds assume for tanh
# (docs/error-bounds.md, assumption A3). tests/test_tanh_fp32.py measures it.
TANH_SMALL = (
    1.0, -0.33332955837249756, 0.13326013088226318, -0.0534815713763237, 0.020326776430010796,
    -0.006230201572179794, 0.0010486197425052524,
)  # fmt: skip
TANH_BIG = (
    1.9999998807907104, -1.9999514818191528, 1.9971126317977905, -1.938698649406433,
    1.4474257230758667,
)  # fmt: skip


@triton.jit
def tanh_fp32(x):
    """tanh in fp32 without libdevice (which the interpreter lacks), one MUFU operation per
    argument: ``a·P(a²)`` below ``a = |x| = 1`` (no cancellation near 0) and ``1 − e·F(e)``
    with ``e = exp2(−2a·log2 e) ≤ e^-2`` above (a negative argument: no overflow; e's error
    reaches tanh damped by ``2e/(1+e)² < 0.21``; no division). Both are evaluated for every
    argument, then one selected and given x's sign. ±inf gives ±1, NaN stays NaN. The
    coefficients are :data:`TANH_SMALL` and :data:`TANH_BIG`."""
    a = tl.abs(x)
    z = a * a
    p = 1.0 + z * (-0.33332955837249756 + z * (0.13326013088226318 + z * (
        -0.0534815713763237 + z * (0.020326776430010796 + z * (-0.006230201572179794 + z * (
            0.0010486197425052524))))))  # fmt: skip
    e = tl.math.exp2(a * -2.885390081777927)
    f = 1.9999998807907104 + e * (-1.9999514818191528 + e * (
        1.9971126317977905 + e * (-1.938698649406433 + e * 1.4474257230758667)))  # fmt: skip
    t = tl.where(a < 1.0, a * p, 1.0 - e * f)
    # x's sign bit onto t ≥ 0: one bitwise instruction where a compare and a select were.
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (t.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def tanh_approx(x):
    """tanh by the GPU's ``tanh.approx.f32``: one MUFU operation; its relative error, measured
    over every fp32 argument on an H200, is at most ``2^-16.46`` (benchmarks/RESULTS.md;
    NVIDIA documents a looser figure, other GPU generations are unmeasured). It is the
    tanh of FlashAttention's and FlashInfer's soft-cap. NVIDIA GPUs only: the interpreter has no
    inline assembly (:func:`softcap_mode` falls back to :func:`tanh_fp32` there)."""
    return tl.inline_asm_elementwise(
        "tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1
    )


@triton.jit
def tanh_of(x, SOFTCAP: tl.constexpr):
    """The soft-cap's tanh: :func:`tanh_approx` for ``SOFTCAP == 2``, :func:`tanh_fp32`
    otherwise (:func:`softcap_mode`)."""
    if SOFTCAP == 2:
        t = tanh_approx(x)
    else:
        t = tanh_fp32(x)
    return t


@triton.jit
def _option_logits(
    s, c1, c2, SOFTCAP: tl.constexpr, SINKS: tl.constexpr, CAP_FMA: tl.constexpr
):  # fmt: skip
    """The scores of the options paths, in exp2 units (the softmax step then runs with
    ``qk_scale = 1``): ``tanh(s·c1)·c2`` with ``c1 = scale/cap``, ``c2 = cap·log2 e`` under a
    soft-cap; ``s·c1`` with ``c1 = scale·log2 e`` with sinks alone (the sink is a logit in the
    same units); ``s`` unchanged otherwise (the default path). With ``CAP_FMA`` the soft-cap's
    ``tanh(s·c1)`` comes back without the product by ``c2``: the softmax step fuses it into
    the exponent (``_softmax_step``)."""
    if SOFTCAP:
        s = tanh_of(s * c1, SOFTCAP)
        if not CAP_FMA:
            s = s * c2
    elif SINKS:
        s = s * c1
    return s


@triton.jit
def _softmax_step(
    s, m_i, l_i, keep, qk_scale, MASKED: tl.constexpr, POS_SCALE: tl.constexpr,
    CAP_FMA: tl.constexpr,
):  # fmt: skip
    """One online-softmax update on the scores ``s`` of a key block: returns ``p`` (fp32),
    the rescale factor ``alpha`` of the old accumulator, and the new running extreme and sum.

    ``m_i`` is the running extreme of the unscaled scores (the maximum for c > 0, the minimum
    for c ≤ 0), so the exponent ``(s − m)·c`` is exactly 0 at that score: a subtraction then a
    product, which no compiler contracts. The contracted ``fma(s, c, −round(m·c))`` leaves half
    an ulp of m·c there, which at |m·c| ~ 1e12 is ~2^14: exp2 of it overflowed (measured on an
    H200, benchmarks/RESULTS.md). (One fma per score while |m·c| < 2^14, the exact form beyond,
    was measured slower on an H100 with Triton 3.6: the extra state spills registers; so was
    the fused form everywhere with the row block run again exactly past |m·c| = 2^24, on an
    H200: the second copy of the loops costs registers.)

    ``CAP_FMA`` (a soft-cap whose ``cap·log2 e`` is below ``CAP_FMA_MAX``): ``s`` is
    ``tanh(·)``, ``qk_scale`` is ``c2 = cap·log2 e`` and ``m`` is kept in exp2 units, the
    same bits as the unfused form (``fl(max(t)·c2) = max(fl(t·c2))``: rounding is monotone).
    The exponent is one ``fma(t, c2, −m)``, rounding once where the unfused form rounds
    ``t·c2`` and then the difference. At the row's maximum it leaves ``t·c2 − fl(t·c2)``, the
    product's rounding error, not 0: at most half an ulp of ``|m| < 2^14``, so ``p`` is within
    2^-10 of 1 there. That offset is common to the row's scores, so it cancels in O, and LSE,
    formed from the same ``m``, carries no offset at all. The capped scores are bounded by
    ``cap·log2 e``, which is what makes this safe without the fallback the default path
    would need."""
    # The fused form only with a soft-cap, whose c2 = cap·log2 e > 0.
    tl.static_assert(POS_SCALE or not CAP_FMA)
    if POS_SCALE:
        if MASKED:
            top = tl.max(tl.where(keep, s, float("-inf")), 1)
        else:
            top = tl.max(s, 1)
        if CAP_FMA:
            top = top * qk_scale  # s is tanh(·): m is kept in the scores' exp2 units
        # m starts at −FLT_MAX (_flash_fwd), never −inf, so no score needs a guard: a row that
        # has kept no key yet gets x = (−inf + FLT_MAX)·c = −inf, and the first kept key
        # gets alpha = exp2((−FLT_MAX − m')·c) = 0 for c > 0 (or a number times acc = l = 0).
        # Same bits as guarding −inf per row, five fewer instructions a row and block.
        m_new = tl.maximum(m_i, top)
        if CAP_FMA:
            x = tl.fma(s, qk_scale, -m_new[:, None])
            shift = m_i - m_new
        else:
            x = (s - m_new[:, None]) * qk_scale
            shift = (m_i - m_new) * qk_scale
        if MASKED:
            x = tl.where(keep, x, float("-inf"))
        alpha = tl.math.exp2(shift)
    else:
        # c ≤ 0 (allowed, if unusual): the smallest score gives the largest s·c.
        if MASKED:
            m_new = tl.minimum(m_i, tl.min(tl.where(keep, s, float("inf")), 1))
        else:
            m_new = tl.minimum(m_i, tl.min(s, 1))
        m_safe = tl.where(m_new == float("inf"), 0.0, m_new)
        first = m_i == float("inf")
        # (+inf is kept out of the shift's product even where discarded: c may be 0.)
        m_old = tl.where(first, m_safe, m_i)
        x = (s - m_safe[:, None]) * qk_scale
        if MASKED:
            x = tl.where(keep, x, float("-inf"))
        # Before the first kept key, acc and l are 0 and m is +inf: alpha = 0 (never
        # inf·0 = NaN); an unchanged extreme gives alpha = exp2(0) = 1 exactly.
        alpha = tl.where(first, 0.0, tl.math.exp2((m_old - m_safe) * qk_scale))
    p = tl.math.exp2(x)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def load_block(desc, base, start, cols, offs, s_row, s_col, N, W, TMA: tl.constexpr):
    """Rows ``start .. start + BLOCK`` of one (batch, head) slice of a 4-D tensor (K or V in the
    forward; Q, dO, K or V in the backward), width ``W``, zeros past ``N`` and ``W``.
    ``base``: the slice's pointer, or with ``TMA`` its (batch, head) coordinates
    in the 4-D descriptor ``desc``."""
    if TMA:
        # Rows past N and columns past W come back as zeros (the descriptor's zero padding).
        x = desc.load([base[0], base[1], start, 0])
        x = tl.reshape(x, [x.shape[2], x.shape[3]])
    else:
        ptrs = base + cols[:, None] * s_row + offs[None, :] * s_col
        x = tl.load(ptrs, mask=(cols[:, None] < N) & (offs[None, :] < W), other=0.0)
    return x


@triton.jit
def _accumulate(acc, p, alpha, v, PRECISION: tl.constexpr, ACC_IN_DOT: tl.constexpr):
    if ACC_IN_DOT:
        # The rescaled accumulator enters the tensor-core product as its addend.
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc


@triton.jit
def _key_blocks(
    acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base,
    start_lo, start_hi, rows, offs_n, offs_d, offs_dv,
    skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr, TMA: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    POS_SCALE: tl.constexpr, ACC_IN_DOT: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr, CAP_FMA: tl.constexpr,
):  # fmt: skip
    # With an option qk_scale is 1 (option_constants): a literal lets the compiler drop the
    # exact product by 1 in the softmax step, one instruction per score.
    step = qk_scale
    if SOFTCAP:
        step = 1.0
    if SINKS:
        step = 1.0
    if CAP_FMA:
        step = c2  # the softmax step's fused exponent takes the cap's product
    for start in tl.range(start_lo, start_hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + offs_n
        k = load_block(k_desc, k_base, start, cols, offs_d, skn, skd, NK, D, TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = _option_logits(s, c1, c2, SOFTCAP, SINKS, CAP_FMA)
        keep = None
        if MASKED and not (CAUSAL or WINDOW):
            # Only the key tail: a condition per column.
            keep = (cols[None, :] < NK) & (rows[:, None] >= 0)
        elif MASKED:
            # Each row keeps the columns [first, last]: bounds per row, then one comparison
            # per score (two with a left window).
            last = tl.zeros_like(rows) + (NK - 1)
            if CAUSAL:
                last = tl.minimum(last, rows + off)
            if WINDOW:
                if win_right >= 0:
                    last = tl.minimum(last, rows + off + win_right)
            keep = cols[None, :] <= last[:, None]
            if WINDOW:
                first = tl.zeros_like(rows)
                if win_left >= 0:
                    first = rows + off - win_left
                keep = keep & (cols[None, :] >= first[:, None])
        if MASKED and POS_SCALE and (CAUSAL or WINDOW):
            # Dropped scores become −inf before the step, and (−inf − m)·c = −inf for c > 0:
            # one select per score serves the maximum and the exponent (the same bits as the
            # step's two). Not for the key tail alone: at 256-row tiles that spilled registers.
            s = tl.where(keep, s, float("-inf"))
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, None, step, False, POS_SCALE, CAP_FMA)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, keep, step, MASKED, POS_SCALE, CAP_FMA)
        v = load_block(v_desc, v_base, start, cols, offs_dv, svn, svd, NK, DV, TMA)
        acc = _accumulate(acc, p, alpha, v, PRECISION, ACC_IN_DOT)
    return acc, l_i, m_i


@triton.jit
def _key_blocks_prefetched(
    acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base,
    start_lo, start_hi, offs_n, offs_d, offs_dv,
    skn, skd, svn, svd, NK, D, DV, qk_scale, c1, c2,
    TMA: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    POS_SCALE: tl.constexpr, ACC_IN_DOT: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr, CAP_FMA: tl.constexpr,
):  # fmt: skip
    """The mask-free blocks with QKᵀ of block j + 1 issued before the softmax of block j, so
    that the (asynchronous) tensor-core product can run under the softmax's exp2 and sums.
    Same expressions as :func:`_key_blocks`, so the same bits."""
    step = qk_scale  # as in _key_blocks
    if SOFTCAP:
        step = 1.0
    if SINKS:
        step = 1.0
    if CAP_FMA:
        step = c2  # the softmax step's fused exponent takes the cap's product
    if start_lo < start_hi:
        cols = start_lo + offs_n
        k = load_block(k_desc, k_base, start_lo, cols, offs_d, skn, skd, NK, D, TMA)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        s = _option_logits(s, c1, c2, SOFTCAP, SINKS, CAP_FMA)
        for start in range(start_lo, start_hi, BLOCK_N):
            start = tl.multiple_of(start, BLOCK_N)
            # The last step re-reads its own block rather than one past the range; that
            # product is discarded.
            nxt = tl.where(start + BLOCK_N < start_hi, start + BLOCK_N, start)
            nxt = tl.multiple_of(nxt, BLOCK_N)
            cols_n = nxt + offs_n
            k = load_block(k_desc, k_base, nxt, cols_n, offs_d, skn, skd, NK, D, TMA)
            s_next = tl.dot(q, tl.trans(k), input_precision=PRECISION)
            s_next = _option_logits(s_next, c1, c2, SOFTCAP, SINKS, CAP_FMA)
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, None, step, False, POS_SCALE, CAP_FMA)
            cols = start + offs_n
            v = load_block(v_desc, v_base, start, cols, offs_dv, svn, svd, NK, DV, TMA)
            acc = _accumulate(acc, p, alpha, v, PRECISION, ACC_IN_DOT)
            s = s_next
    return acc, l_i, m_i


@triton.jit
def _flash_fwd(
    Q, K, V, Out, LSE, Sinks,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    slb, slh, slm,
    GROUP, NQ, NK, D, DV,
    qk_scale, win_left, win_right, c1, c2,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr, TMA: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    HEAVY_FIRST: tl.constexpr, SPLIT: tl.constexpr, POS_SCALE: tl.constexpr,
    ACC_IN_DOT: tl.constexpr, PREFETCH: tl.constexpr,
    SOFTCAP: tl.constexpr, SINKS: tl.constexpr, CAP_FMA: tl.constexpr,
):  # fmt: skip
    """One program: a block of BLOCK_M query rows of one (batch, head) against all its keys.

    Longer than 80 lines: the prologue (pointers or TMA descriptors), the key loop in up to
    three ranges (before, on and past the mask's edge) and the epilogue (O and LSE) are one
    compiled program; the key loop itself lives in ``_key_blocks``.
    """
    pid_m = tl.program_id(0)
    if HEAVY_FIRST:
        # Causal row blocks further down see more keys: start those first so the last wave
        # of programs is made of short ones (better balance across SMs).
        pid_m = tl.num_programs(0) - 1 - pid_m
    # Head and batch from the grid's second and third axes, and the query heads per key head
    # (GROUP) from the host, rather than divisions by run-time head counts: about 20
    # instructions each, in every program. GROUP = 1 (no grouping) is specialised by Triton
    # as the constant 1, so h // GROUP costs nothing then.
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    if TMA:
        # Q, K, V and Out are 4-D descriptors (batch, head, row, column) built on the host
        # (launch): nothing to create per program, and the loads need no per-thread address.
        k_base = (b, hk)
        v_base = (b, hk)
        k_desc = K
        v_desc = V
        o_desc = Out
        q = Q.load([b, h, m0, 0])
        q = tl.reshape(q, [BLOCK_M, BLOCK_D])
    else:
        k_base = K + b * skb + hk * skh
        v_base = V + b * svb + hk * svh
        k_desc = None
        v_desc = None
        o_desc = None
        q_ptrs = Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd
        q = tl.load(q_ptrs, mask=(rows[:, None] < NQ) & (offs_d[None, :] < D), other=0.0)

    # The running extreme of the unscaled scores (see _softmax_step): max for c > 0, from
    # −FLT_MAX rather than −inf (the step then needs no guard); min else, from +inf.
    m_i = tl.full([BLOCK_M], -_FLT_MAX if POS_SCALE else float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if SINKS:
        # Every row starts from its head's sink, a first logit with no value row (σ·log2 e,
        # the scores' exp2 units): m = σ', l = exp2(σ' − σ') = 1, acc = 0. A row that keeps
        # no key ends with O = 0 and LSE = σ' · ln 2.
        sink = tl.load(Sinks + h).to(tl.float32) * 1.4426950408889634
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32) + sink
        l_i = l_i + 1.0
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    off = NK - NQ
    # Live key range of this row block: [lo, hi). Blocks outside it are skipped entirely.
    lo = 0
    hi = NK
    # Keys every row of the block keeps: [u_lo, u_hi). Blocks inside it skip the mask.
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
    # Whole blocks on the grid lo, lo + BLOCK_N, ... that lie in [u_lo, u_hi).
    full_lo = tl.minimum(lo + tl.cdiv(tl.maximum(u_lo - lo, 0), BLOCK_N) * BLOCK_N, hi)
    full_hi = lo + (tl.maximum(u_hi - lo, 0) // BLOCK_N) * BLOCK_N
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    if not SPLIT:
        full_lo = hi
        full_hi = hi
    acc, l_i, m_i = _key_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, lo, full_lo, rows, offs_n, offs_d,
        offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2,
        True, CAUSAL, WINDOW, TMA, BLOCK_N, PRECISION, False, POS_SCALE, ACC_IN_DOT,
        SOFTCAP, SINKS, CAP_FMA,
    )  # fmt: skip
    if PREFETCH:
        acc, l_i, m_i = _key_blocks_prefetched(
            acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, full_lo, full_hi, offs_n,
            offs_d, offs_dv, skn, skd, svn, svd, NK, D, DV, qk_scale, c1, c2,
            TMA, BLOCK_N, PRECISION, POS_SCALE, ACC_IN_DOT, SOFTCAP, SINKS, CAP_FMA,
        )  # fmt: skip
    else:
        acc, l_i, m_i = _key_blocks(
            acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, full_lo, full_hi, rows, offs_n,
            offs_d, offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right,
            c1, c2, False, CAUSAL, WINDOW, TMA, BLOCK_N, PRECISION, WARP_SPECIALIZE, POS_SCALE,
            ACC_IN_DOT, SOFTCAP, SINKS, CAP_FMA,
        )  # fmt: skip
    acc, l_i, m_i = _key_blocks(
        acc, l_i, m_i, q, k_desc, v_desc, k_base, v_base, full_hi, hi, rows, offs_n, offs_d,
        offs_dv, skn, skd, svn, svd, NK, D, DV, off, qk_scale, win_left, win_right, c1, c2,
        True, CAUSAL, WINDOW, TMA, BLOCK_N, PRECISION, False, POS_SCALE, ACC_IN_DOT,
        SOFTCAP, SINKS, CAP_FMA,
    )  # fmt: skip
    # l = 0 only for rows that kept no key; a NaN l (NaN input) must reach O, not pass for 0.
    # Such a row's acc is 0 unless a masked V entry was inf or NaN (0·NaN in P·V): selected to
    # 0 before the division, by 1, which gives the same bits as selecting after it. After the
    # division the compiler moved the select past the fp16/bf16 conversion (byte permutes and
    # selects on the packed halves, ~70 instructions a program at 64 × 64).
    has = l_i != 0.0
    out = tl.where(has[:, None], acc, 0.0) / tl.where(has, l_i, 1.0)[:, None]
    lse = tl.where(
        has,
        (tl.where(has, m_i, 0.0) * qk_scale + tl.math.log2(tl.where(has, l_i, 1.0)))
        * 0.6931471805599453,
        float("-inf"),
    )
    if TMA:
        o_desc.store([b, h, m0, 0], tl.reshape(out.to(o_desc.dtype), [1, 1, BLOCK_M, BLOCK_DV]))
    else:
        o_ptrs = Out + b * sob + h * soh + rows[:, None] * som + offs_dv[None, :] * sod
        tl.store(
            o_ptrs,
            out.to(Out.dtype.element_ty),
            mask=(rows[:, None] < NQ) & (offs_dv[None, :] < DV),
        )
    tl.store(LSE + b * slb + h * slh + rows * slm, lse, mask=rows < NQ)


# ---------------------------------------------------------------------------------------------
# Launcher


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_BF16_CANARY: dict[str, bool] = {}


def bf16_dot_supported(torch: Any) -> bool:
    """Run a 16×16 bf16 dot through the kernel once and compare with torch (interpreter only)."""
    if "ok" not in _BF16_CANARY:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        k = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        v = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        o, _ = launch(q, k, v, causal=False, window=None, scale=0.25, allow_tf32=False)
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * 0.25, -1) @ v.float()
        # A correct bf16 result is within a few bf16 ulps (u = 2^-8, |O| < 3) of the fp32
        # reference, ~1e-2; the upstream bug returns values off by O(1). 0.05 separates the two.
        _BF16_CANARY["ok"] = bool(torch.allclose(o.float(), ref, atol=0.05, rtol=0.05))
    return _BF16_CANARY["ok"]


class LaunchConfig(NamedTuple):
    """One launch configuration: tile sizes, warps, pipeline stages, TMA, warp specialisation,
    register cap."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    tma: bool = False
    warp_specialize: bool = False
    dv_floor: int = 0
    split: bool = True  # False: every block through the masked path (for tests and tuning)
    acc_in_dot: bool = True  # the rescaled accumulator is the P·V product's addend
    prefetch: bool = False  # QKᵀ of the next mask-free block issued before this softmax
    # Register cap per thread (PTX .maxnreg), so that two CTAs fit on one SM and the warp
    # scheduler can overlap one CTA's softmax with the other's products. None: the compiler's.
    maxnreg: int | None = None


def portable_config(d: int, dv: int, dtype_bytes: int) -> LaunchConfig:
    """Defaults that fit 100 KiB of shared memory and run on any CUDA GPU Triton supports
    (fp32 at d = 256 needs 32×32 tiles and 2 stages)."""
    if _interpreting():
        # The interpreter's cost is per tile operation: 32×32 tiles run 5× faster than 16×16
        # ones (8 report cases: 1.2 s vs 6.1 s, benchmarks/interpreter_tiles.py) and still
        # cross a key-block edge at the test lengths 33, 63-65 and 127-129.
        return LaunchConfig(32, 32, 4, 1)
    if dtype_bytes == 4 and max(d, dv) > 128:
        return LaunchConfig(32, 32, 4, 2)
    if max(d, dv) > 128 or dtype_bytes == 4:
        return LaunchConfig(64, 32, 4, 2)
    return LaunchConfig(128, 64, 8, 3)


# Hopper (sm_90), fp16 / bf16, by head-dim bucket and causality: measured on one H100 and
# re-checked on an H200 with benchmarks/tune_hopper.py (the log with every candidate is in
# benchmarks/RESULTS.md). 256-row tiles with 16 warps (four warpgroups of 64 rows, 128
# registers a thread) won at d = 128 non-causal; causal, they lost on the diagonal blocks.
_HOPPER: dict[tuple[int, bool], LaunchConfig] = {
    # d <= 64: one warpgroup on 64 x 64 tiles through TMA with two stages at every length. At
    # N = 4K-16K on an H200, timed inside `flashcheck bench` through benchmarks/tile_kernels.py
    # (benchmarks/RESULTS.md, 2026-11-30, ninth session), fp16 and bf16: without a mask 0.95-0.96
    # of the time of 128 x 64 on 8 warps (the former entry); causal 0.98-0.99 of the same tile
    # with three stages (the former entry, itself 1-3 % ahead of 128 x 64 through pointers).
    (64, False): LaunchConfig(64, 64, 4, 2, tma=True),
    (64, True): LaunchConfig(64, 64, 4, 2, tma=True),
    # The Triton tutorial's pick on an H200: it spills a few registers at the masked blocks'
    # loops, yet beat 256 x 64 on 16 warps by 3-10 % at N = 4K-16K in two runs timed in turn
    # (benchmarks/RESULTS.md, 2026-11-29, fourth session).
    (128, False): LaunchConfig(128, 64, 4, 2, tma=True),
    (128, True): LaunchConfig(128, 128, 8, 3, tma=True),
    (256, False): LaunchConfig(128, 64, 8, 2, tma=True),
    (256, True): LaunchConfig(128, 64, 8, 2, tma=True),
}
# Up to _SHORT keys: causal d = 128 on one-warpgroup 64 x 64 tiles through TMA (three stages). (Head
# dims up to 64 take _HOPPER's tile, which ran in 0.95-0.98 of the former short entries' time,
# causal and not, fp16 and bf16, N = 1K-2K.) d = 128 without a mask takes _HOPPER's tile: it ran in
# 0.91-0.92 of the time of the former short entry, 128 x 64 on 8 warps with registers capped at 128
# (on an H200, timed inside `flashcheck bench` through benchmarks/tile_kernels.py,
# benchmarks/RESULTS.md, 2026-11-30; that entry had measured 6 % ahead by benchmarks/tune_hopper.py,
# which times the configurations one after another, a method found biased under the GPU's power
# limit).
_SHORT = 2048
_HOPPER_SHORT: dict[tuple[int, bool], LaunchConfig] = {
    (128, True): LaunchConfig(64, 64, 4, 3, tma=True),
}
# Past _SHORT up to _MID keys: causal d = 128 on the tutorial's one-warpgroup tile, which took
# 0.97-0.99 of 128 x 128 / 8 warps' time at N = 4K-8K on an H200 and 1.03-1.04 at 16K (in
# turn, fp16 and bf16, benchmarks/gpu_tile_race.py, benchmarks/RESULTS.md).
_MID = 8192
_HOPPER_MID: dict[tuple[int, bool], LaunchConfig] = {
    (128, True): LaunchConfig(128, 64, 4, 2, tma=True),
}
# The soft-cap with tanh.approx.f32 at d = 128, keyed by (head-dim bucket, causal, short
# keys): tiles that put several CTAs on an SM (two with registers capped at 128, or 64 x 64
# tiles of one warpgroup through TMA). The tanh's MUFU operation doubles the softmax's load on
# that unit, which one CTA's products then hide under another's. On an H200
# (benchmarks/probe_softcap_configs.py, benchmarks/RESULTS.md) capped / plain went from
# 1.12-1.18 to 1.05-1.07 non-causal at N = 4K-16K with the first, to 1.00-1.01 with the
# second (which loses at N = 1K, 1.12 against 1.01), and from 1.06-1.13 to 0.95-1.00 causal.
_HOPPER_APPROX_CAP: dict[tuple[int, bool, bool], LaunchConfig] = {
    (128, False, True): LaunchConfig(128, 64, 8, 2, maxnreg=128),
    (128, False, False): LaunchConfig(64, 64, 4, 3, tma=True),
    (128, True, True): LaunchConfig(64, 64, 4, 3, tma=True),
    (128, True, False): LaunchConfig(64, 64, 4, 3, tma=True),
}
# Causal entries through TMA (host-built descriptors, 2026-11-26: 64 × 64 tiles, one warpgroup
# a CTA, up to _SHORT keys, +9-13 % at N = 1K; 128 × 128 beyond, +5-7 %; benchmarks/RESULTS.md)
# and what replaces each where the tensors' strides or addresses rule TMA out: the entries they
# replaced, not the same tiles through pointers (64 × 64 / 4 warps through pointers made an
# illegal memory access on an H100, see _H100). Keyed by (head-dim bucket, causal, short keys).
_WITHOUT_TMA: dict[tuple[int, bool, bool], LaunchConfig] = {
    (64, False, True): LaunchConfig(128, 64, 8, 3),
    (64, False, False): LaunchConfig(128, 64, 8, 3),
    (64, True, True): LaunchConfig(128, 64, 4, 3),
    (64, True, False): LaunchConfig(128, 64, 4, 3),
    (128, True, True): LaunchConfig(128, 64, 8, 2, maxnreg=128),
    (128, True, False): LaunchConfig(128, 64, 8, 3),
    (128, False, True): LaunchConfig(128, 64, 8, 2, maxnreg=128),
    (128, False, False): LaunchConfig(128, 64, 8, 2, maxnreg=128),
}
# Where the plain forward (no approximate soft-cap) falls back to another tile than the above.
_WITHOUT_TMA_PLAIN: dict[tuple[int, bool, bool], LaunchConfig] = {
    (128, False, False): LaunchConfig(256, 64, 16, 3),
}


# On an H100 at d = 128 (benchmarks/tune_hopper.py there, benchmarks/RESULTS.md), keyed by (head-dim
# bucket, causal, short keys): non-causal, 256-row tiles want 8 warps, not the H200's 16 (+8 % at N
# = 4K and 16K, +3 % at N = 1K over the H200's entries). At d <= 64 an H100 keeps the entries it was
# measured on before the H200's changed (two stages there were not measured on an H100). Other
# shapes keep the tables above. (64 x 64 tiles with 4 warps and 3 stages through pointers ran short
# causal keys 5 % faster at d = 128, but made an illegal memory access at Nq = 40, Nk = 17, d = 72,
# dv = 24: not used.)
_H100: dict[tuple[int, bool, bool], LaunchConfig] = {
    (64, False, True): LaunchConfig(128, 64, 8, 3),
    (64, False, False): LaunchConfig(128, 64, 8, 3),
    (64, True, True): LaunchConfig(64, 64, 4, 3, tma=True),
    (64, True, False): LaunchConfig(64, 64, 4, 3, tma=True),
    (128, False, False): LaunchConfig(256, 64, 8, 3),
    (128, False, True): LaunchConfig(256, 64, 8, 3),
}


def tma_ok(*tensors: Any) -> bool:
    """TMA descriptors need 16-byte aligned bases and row strides, and contiguous rows."""
    for t in tensors:
        es = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16:
            return False
        if any((st * es) % 16 for st in t.stride()[:-1]):
            return False
    return True


_HOPPER_PICK: dict[tuple, LaunchConfig] = {}


def launch_config(
    q: Any, k: Any, v: Any, *, causal: bool, approx_cap: bool = False
) -> LaunchConfig:
    """The launch configuration :func:`launch` uses for these tensors by default: ``_HOPPER``'s
    entry on sm_90 for fp16/bf16 (``_HOPPER_SHORT``'s up to ``_SHORT`` keys, ``_HOPPER_MID``'s
    up to ``_MID`` on GPUs other than the H100; ``_H100``'s where an H100 has one of its own;
    ``_HOPPER_APPROX_CAP``'s for a soft-cap with the approximate tanh, ``approx_cap``), else
    :func:`portable_config`. What depends only on the device, head dims, dtype, causality and
    the key count's tier is cached, so a call costs a dictionary lookup; the TMA alignment
    check, which depends on the tensors' addresses, runs per call where needed, and where it
    fails ``_WITHOUT_TMA``'s entry (or the same tiles through pointers) is used."""
    d, dv = q.shape[3], v.shape[3]
    if _interpreting() or q.element_size() != 2 or q.device.type != "cuda":
        return portable_config(d, dv, q.element_size())
    short = k.shape[2] <= _SHORT
    mid = not short and k.shape[2] <= _MID
    bucket = 64 if max(d, dv) <= 64 else (128 if max(d, dv) <= 128 else 256)
    key = (q.device.index, d, dv, q.element_size(), bool(causal), short, mid, approx_cap)
    hop = _HOPPER_PICK.get(key)
    if hop is None:
        import torch

        if torch.cuda.get_device_capability(q.device)[0] != 9:
            hop = portable_config(d, dv, q.element_size())
        else:
            h100 = "H100" in torch.cuda.get_device_name(q.device)
            table = _HOPPER_SHORT if short and (bucket, bool(causal)) in _HOPPER_SHORT else _HOPPER
            if mid and not h100 and (bucket, bool(causal)) in _HOPPER_MID:
                table = _HOPPER_MID  # measured on an H200 only
            hop = table[(bucket, bool(causal))]
            if h100:
                hop = _H100.get((bucket, bool(causal), short), hop)
            if approx_cap:
                hop = _HOPPER_APPROX_CAP.get((bucket, bool(causal), short), hop)
        _HOPPER_PICK[key] = hop
    # O is allocated contiguous by launch: its rows are dv elements, 16-byte aligned or not.
    if hop.tma and not (tma_ok(q, k, v) and (dv * q.element_size()) % 16 == 0):
        tkey = (bucket, bool(causal), short)
        fallback = (None if approx_cap else _WITHOUT_TMA_PLAIN.get(tkey)) or _WITHOUT_TMA.get(tkey)
        hop = fallback or hop._replace(tma=False, warp_specialize=False)
    return hop


_LAST_COMPILED: dict[str, Any] = {}


def last_compiled() -> Any:
    """The compiled kernel of the latest launch in this process (``None`` before any): its
    ``n_regs``, ``n_spills`` and ``metadata.shared`` are what tuning and the benchmark report."""
    return _LAST_COMPILED.get("kernel")


def tma_descriptor(t: Any, rows: int, cols: int) -> Any:
    """A TMA descriptor of the 4-D tensor ``t`` with ``rows × cols`` blocks of one (batch,
    head) slice; reads past its rows and columns give zeros."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols])


def option_constants(scale: float, softcap: float | None, sinks: Any) -> tuple[float, float, float]:
    """``(qk_scale, c1, c2)`` of a launch: ``scale·log2 e`` for the default path; with a cap or
    sinks the scores enter the softmax step already in exp2 units (``qk_scale = 1``), made by
    :func:`_option_logits` from ``c1``, ``c2`` (rounded to fp32 when passed)."""
    if softcap:
        return 1.0, scale / softcap, softcap * _LOG2E
    if sinks is not None:
        return 1.0, scale * _LOG2E, 1.0
    return scale * _LOG2E, 1.0, 1.0


# Caps up to this fuse their product into the exponent (_softmax_step's CAP_FMA): the row
# maximum's offset is then at most half an ulp of cap·log2 e < 2^14, 2^-10. A larger cap keeps
# the unfused form, whose exponent is exactly 0 at the maximum.
CAP_FMA_MAX = 8192.0


def cap_fma(softcap: float | None) -> bool:
    """Whether the forward fuses the soft-cap's product by ``cap·log2 e`` into the exponent
    (caps in ``(0, CAP_FMA_MAX]``)."""
    return bool(softcap) and softcap <= CAP_FMA_MAX


def softcap_mode(softcap: float | None, approx_tanh: bool) -> int:
    """The kernels' ``SOFTCAP`` switch: 0 no cap, 1 the cap with :func:`tanh_fp32`, 2 with
    :func:`tanh_approx` (asked for and on a GPU: under the interpreter, 1)."""
    if not softcap:
        return 0
    return 2 if approx_tanh and not _interpreting() else 1


def launch(
    q, k, v, *, causal, window, scale, allow_tf32, config=None, softcap=None, sinks=None,
    approx_tanh=False,
):  # fmt: skip
    """Launch the forward on tensors :func:`flash_attention` has already checked (``window``
    normalised to ``(left, right)`` with -1 for unbounded, ``scale`` a float, ``softcap`` a
    float or ``None``, ``sinks`` a float32 ``(Hq,)`` tensor on the device or ``None``,
    ``approx_tanh`` a bool);
    ``config`` overrides the launch configuration (tuning and probe scripts). Returns
    ``(O, LSE)``."""
    import torch

    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    o = torch.empty((bsz, hq, nq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    mode = softcap_mode(softcap, approx_tanh)
    cfg = launch_config(q, k, v, causal=causal, approx_cap=mode == 2) if config is None else config
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(16, triton.next_power_of_2(dv), cfg.dv_floor)
    if cfg.block_m >= 128:
        # Measured on H100, Triton 3.6: BLOCK_M=128 with a 32-wide P·V tile (dv <= 32) returned
        # wrong values at 8 warps (max abs error 0.033 vs 0.0011, reproducibly, compute-
        # sanitizer memcheck and racecheck clean; benchmarks/probe_block_dv.py) and an illegal
        # memory access at 4 warps (tests/test_triton_flash.py, d=40, dv=24, causal); a
        # 64-wide tile is correct in both (benchmarks/RESULTS.md). Pad dv to 64 there.
        block_dv = max(block_dv, 64)
    tensors = (q, k, v, o)
    if cfg.tma:
        tensors = (
            tma_descriptor(q, cfg.block_m, block_d),
            tma_descriptor(k, cfg.block_n, block_d),
            tma_descriptor(v, cfg.block_n, block_dv),
            tma_descriptor(o, cfg.block_m, block_dv),
        )
    left, right = (-1, -1) if window is None else window
    n_m = triton.cdiv(nq, cfg.block_m)
    grid = (n_m, hq, bsz)
    precision = "tf32" if (allow_tf32 and q.dtype == torch.float32) else "ieee"
    extra = {} if cfg.maxnreg is None or _interpreting() else {"maxnreg": cfg.maxnreg}
    qk_scale, c1, c2 = option_constants(float(scale), softcap, sinks)
    compiled = _flash_fwd[grid](
        *tensors, lse, lse if sinks is None else sinks,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        hq // hk, nq, nk, d, dv,
        qk_scale, left, right, c1, c2,
        CAUSAL=bool(causal), WINDOW=window is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
        PRECISION=precision, TMA=cfg.tma, WARP_SPECIALIZE=cfg.warp_specialize,
        HEAVY_FIRST=bool(causal), SPLIT=cfg.split, POS_SCALE=qk_scale > 0,
        ACC_IN_DOT=cfg.acc_in_dot, PREFETCH=cfg.prefetch and cfg.split,
        SOFTCAP=mode, SINKS=sinks is not None, CAP_FMA=cap_fma(softcap),
        num_warps=cfg.warps, num_stages=cfg.stages, **extra,
    )  # fmt: skip
    _LAST_COMPILED["kernel"] = compiled  # registers / spills / shared memory, for tuning
    return o, lse


def check_inputs(
    q: Any,
    k: Any,
    v: Any,
    *,
    window: tuple[int | None, int | None] | None,
    scale: float | None,
) -> tuple[tuple[int, int] | None, float]:
    """Check the arguments of :func:`flash_attention` (raising ``ValueError`` with the fix, and
    ``NotImplementedError`` for bf16 under a broken interpreter) and normalise them: returns
    ``window`` as ``(left, right)`` with -1 for an unbounded side (or ``None``) and ``scale`` as
    a float (default ``1/sqrt(d)``). The backward (:mod:`.triton_flash_bwd`) shares it.
    """
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(
                f"{name} must be 4-D (batch, heads, seq, head_dim), got {tuple(x.shape)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(
            f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast them to one"
        )
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {q.dtype} is not supported: use float16, bfloat16 or float32")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on the same device")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"tensors are on {q.device}: the Triton kernel needs CUDA, or set TRITON_INTERPRET=1 "
            "before importing triton to run it on CPU (slow); kernels.attention() picks a "
            "fallback for you"
        )
    bsz, hq, nq, d = q.shape
    bk, hk, nk, dk = k.shape
    if (bk, hk, nk) != tuple(v.shape[:3]) or bk != bsz or dk != d:
        raise ValueError(
            f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree: k and v "
            "need q's batch, k needs q's head_dim, and k, v one sequence length"
        )
    if hk == 0 or hq % hk:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hk})")
    if not (1 <= d <= 256 and 1 <= v.shape[3] <= 256):
        raise ValueError(f"head dims must be in [1, 256], got d={d}, dv={v.shape[3]}")
    if nq == 0 or nk == 0:
        raise ValueError("sequence lengths must be >= 1")
    if window is not None:
        left, right = window
        window = (-1 if left is None else int(left), -1 if right is None else int(right))
        if window[0] < -1 or window[1] < -1:
            raise ValueError(f"window sides must be >= 0, -1 or None, got {window}")
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not math.isfinite(sc):
        raise ValueError(f"scale must be finite, got {scale}")
    if q.dtype == torch.bfloat16 and _interpreting() and not bf16_dot_supported(torch):
        raise NotImplementedError(
            "bf16 under TRITON_INTERPRET=1: the interpreter's bf16 tl.dot returns wrong values "
            "(triton-lang/triton#11584, detected by a canary); run bf16 on a GPU"
        )
    return window, sc


def check_options(q: Any, softcap: Any, sinks: Any) -> tuple[float | None, Any]:
    """Check the softmax options of :func:`flash_attention` and normalise them: ``softcap`` a
    finite float > 0 (``None`` or 0: off), ``sinks`` a float32 tensor of one finite logit per
    query head on q's device (``None``: off). Returns ``(softcap or None, sinks)``."""
    import torch

    cap = None
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, int | float):
            raise ValueError(f"softcap must be a float > 0 or None, got {softcap!r}")
        if not math.isfinite(float(softcap)) or softcap < 0:
            raise ValueError(f"softcap must be a finite float > 0 (or None/0: off), got {softcap}")
        cap = float(softcap) or None
    if sinks is not None:
        hq = q.shape[1]
        if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (hq,):
            raise ValueError(
                f"sinks must be a tensor of one logit per query head, shape ({hq},), got "
                f"{type(sinks).__name__} {tuple(getattr(sinks, 'shape', ()))}"
            )
        if sinks.dtype != torch.float32 or sinks.device != q.device:
            raise ValueError(
                f"sinks must be float32 on {q.device} (sinks.float().to(q.device)), got "
                f"{sinks.dtype} on {sinks.device}"
            )
        # Checked on the host only: on a GPU the test is a device sync per call, which cost
        # 1.4-1.7x the kernel's time at N = 1024 (H100, benchmarks/RESULTS.md). A non-finite
        # sink there gives non-finite rows, as it would in the exact formula.
        if sinks.device.type == "cpu" and not bool(torch.isfinite(sinks).all()):
            raise ValueError("sinks must be finite")
    return cap, sinks


def check_approx_tanh(approx_tanh: Any) -> None:
    """``approx_tanh`` must be a bool (it only matters with a soft-cap)."""
    if not isinstance(approx_tanh, bool):
        raise ValueError(
            f"approx_tanh must be True (the GPU's tanh.approx.f32 for the soft-cap) or False "
            f"(an fp32 tanh within 2 ulp, the default), got {approx_tanh!r}"
        )


def flash_attention(
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
    approx_tanh: bool = False,
) -> tuple[Any, Any]:
    """FlashAttention-2 forward: ``O = softmax(scale·QKᵀ + mask)·V`` and ``LSE`` (natural log).

    ``q``: ``(B, Hq, Nq, d)``, ``k``: ``(B, Hk, Nk, d)``, ``v``: ``(B, Hk, Nk, dv)`` torch tensors
    on one CUDA device (or on CPU under ``TRITON_INTERPRET=1``), one dtype among float16,
    bfloat16 and float32, any strides; ``Hq`` a multiple of ``Hk``; ``d, dv ≤ 256``. ``scale``
    defaults to ``1/sqrt(d)``. ``window=(left, right)``: ``None``/``-1`` for unbounded.
    ``softcap=c``: every score ``s = scale·q·k`` becomes ``c·tanh(s/c)`` before masking (tanh
    by :func:`tanh_fp32`, within 2 fp32 ulp; with ``approx_tanh=True`` by the GPU's
    ``tanh.approx.f32``, FlashAttention's choice: faster, relative error at most ``2^-16.46``
    as measured on an H200, so the capped scores are off by up to about ``c·2^-16``; the
    interpreter keeps :func:`tanh_fp32`). ``sinks``: one float32 logit ``σ_h`` per query head,
    a softmax column without a value row (``LSE_i = log(e^σ_h + Σ_j e^s_ij)``; a row that
    keeps no key has ``O = 0``, ``LSE = σ_h``). Both are compile-time branches: without them
    the kernel is the one it was. Returns ``O`` in the input dtype and ``LSE`` in float32.
    """
    window, sc = check_inputs(q, k, v, window=window, scale=scale)
    cap, sinks = check_options(q, softcap, sinks)
    check_approx_tanh(approx_tanh)
    return launch(
        q, k, v, causal=causal, window=window, scale=sc, allow_tf32=allow_tf32, softcap=cap,
        sinks=sinks, approx_tanh=approx_tanh,
    )  # fmt: skip
