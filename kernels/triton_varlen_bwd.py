"""Triton FlashAttention-2 backward in the varlen layout: dQ, dK, dV per packed sequence.

The backward of :func:`flashcheck.kernels.triton_varlen.flash_attn_varlen` (same layout and
masks), with ``c = scale·log2 e`` one fp32 constant and ``lse2 = LSE·log2 e`` so P is recomputed
with exp2 from the forward's natural-log LSE (the dense backward's arithmetic,
``kernels/triton_flash_bwd.py``, backward class "flash", docs/error-bounds.md):

    preprocess, per query row and head:   D_i = Σ_c dO_ic·O_ic      fp32, from the rounded O
    dK/dV: one program per (block of BLOCK_N keys, kv head, sequence):
        for each query head of the group, for each live block of BLOCK_M rows of the sequence:
            Sᵀ  = k·qᵀ;   Pᵀ = exp2(Sᵀ·c − lse2)            0 where masked or LSE = −inf
            dV += (Pᵀ rounded to the input dtype)·dO        fp32
            dSᵀ = Pᵀ∘(v·dOᵀ − D);   dK += (dSᵀ rounded)·q    fp32
        dK *= scale
    dQ: one program per (block of BLOCK_M rows, q head, sequence):
        for each live block of BLOCK_N keys of the sequence: S, P, dS as above;
            dQ += (dS rounded to the input dtype)·k         fp32;    dQ *= scale

Each program reads only its own sequence's rows (every load masked to them), so dK, dV of a
sequence are sums over that sequence's queries alone, and GQA's group sum stays inside one
program: no atomics, bitwise deterministic. A row with ``LSE = −inf`` (it kept no key) gets
lse2 = +inf, so P = 0 exactly: dQ = 0 and nothing added to dK, dV. Keys of a sequence with no
query rows get dK = dV = 0; a sequence with no keys gives its rows dQ = 0. The outputs are
allocated zeroed, so a row no program owns (none, for valid prefix sums) is 0, not garbage.

Known limits: those of the forward (no soft-cap, sinks, dropout; every block builds its mask;
untuned tiles); no LSE gradient (LSE is an output of the forward only); P is recomputed from
fp32 scores and LSE, each rounded by about 2^-24 of its size, so past ``|scale·q·k| ~ 2^26``
P's exponent is off by units (registered with the dense backward's score limit). The grids
are sized by ``max_seqlen_q``, ``max_seqlen_k``. bf16 under ``TRITON_INTERPRET=1`` raises as
the forward does.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from flashcheck.kernels.triton_varlen import check_varlen, interpreting, launch_varlen

__all__ = [
    "FlashAttnVarlenFunction",
    "backward_tiles",
    "flash_attn_varlen_backward",
    "flash_attn_varlen_differentiable",
    "launch_varlen_backward",
]

_LOG2E = 1.4426950408889634


@triton.jit
def _varlen_delta(
    Out, DO, Delta, CuQ, som, soh, sod, sdom, sdoh, sdod, sdh, sdm, DV,
    BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    q0 = tl.load(CuQ + b)
    nq = tl.load(CuQ + b + 1) - q0
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    inside = (rows[:, None] < nq) & (offs_dv[None, :] < DV)
    pr = (q0 + rows)[:, None]
    o = tl.load(Out + pr * som + h * soh + offs_dv[None, :] * sod, mask=inside, other=0.0)
    do = tl.load(DO + pr * sdom + h * sdoh + offs_dv[None, :] * sdod, mask=inside, other=0.0)
    # D from the O the forward wrote (rounded to the input dtype), as FA2 defines it.
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(Delta + h * sdh + (q0 + rows) * sdm, delta, mask=rows < nq)


@triton.jit
def _keep(rows, cols, nq, nk, off, win_left, win_right, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """The mask of one sequence's tile, bottom-right aligned: ``rows`` and ``cols`` come in
    already shaped ``(M, 1)``, ``(1, N)`` or transposed, so the dK/dV program gets its
    (keys × rows) mask directly rather than through a transpose of booleans."""
    keep = (rows < nq) & (cols < nk)
    if CAUSAL:
        keep = keep & (cols <= rows + off)
    if WINDOW:
        if win_left >= 0:
            keep = keep & (cols >= rows + off - win_left)
        if win_right >= 0:
            keep = keep & (cols <= rows + off + win_right)
    return keep


@triton.jit
def _varlen_dkdv(
    Q, K, V, DO, LSE, Delta, DK, DV_, CuQ, CuK,
    sqm, sqh, sqd, skn, skh, skd, svn, svh, svd, sdom, sdoh, sdod, slh, slm, sdh, sdm,
    sdkn, sdkh, sdkd, sdvn, sdvh, sdvd,
    GROUP, D, DV, sm_scale, qk_scale, win_left, win_right,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dK and dV of BLOCK_N keys of one kv head of one sequence, over its group's rows."""
    pid_n = tl.program_id(0)
    hk = tl.program_id(1)
    b = tl.program_id(2)
    q0 = tl.load(CuQ + b)
    nq = tl.load(CuQ + b + 1) - q0
    k0 = tl.load(CuK + b)
    nk = tl.load(CuK + b + 1) - k0
    n0 = pid_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_k = cols < nk
    kr = (k0 + cols)[:, None]
    k = tl.load(K + kr * skn + hk * skh + offs_d[None, :] * skd,
                mask=in_k[:, None] & (offs_d[None, :] < D), other=0.0)  # fmt: skip
    v = tl.load(V + kr * svn + hk * svh + offs_dv[None, :] * svd,
                mask=in_k[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    off = nk - nq
    # Rows that keep some key of this block: row i keeps key j iff j <= i + off (causal),
    # i + off - left <= j <= i + off + right (window).
    lo = 0
    hi = nq
    if CAUSAL:
        lo = tl.maximum(lo, n0 - off)
    if WINDOW:
        if win_right >= 0:
            lo = tl.maximum(lo, n0 - off - win_right)
        if win_left >= 0:
            hi = tl.minimum(hi, n0 + BLOCK_N - 1 - off + win_left + 1)
    lo = (tl.maximum(lo, 0) // BLOCK_M) * BLOCK_M
    hi = tl.where(n0 < nk, tl.maximum(hi, lo), lo)
    for hh in range(0, GROUP):
        h = hk * GROUP + hh
        for start in range(lo, hi, BLOCK_M):
            rows = start + offs_m
            in_q = rows < nq
            qr = (q0 + rows)[:, None]
            q = tl.load(Q + qr * sqm + h * sqh + offs_d[None, :] * sqd,
                        mask=in_q[:, None] & (offs_d[None, :] < D), other=0.0)  # fmt: skip
            do = tl.load(DO + qr * sdom + h * sdoh + offs_dv[None, :] * sdod,
                         mask=in_q[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
            lse = tl.load(LSE + h * slh + (q0 + rows) * slm, mask=in_q, other=float("-inf"))
            # A row that kept no key: +inf makes S·c − lse2 = −inf (P = 0), never −inf − (−inf).
            lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
            delta = tl.load(Delta + h * sdh + (q0 + rows) * sdm, mask=in_q, other=0.0)
            st = tl.dot(k, tl.trans(q), input_precision=PRECISION)
            keep = _keep(
                rows[None, :], cols[:, None], nq, nk, off, win_left, win_right, CAUSAL, WINDOW
            )
            pt = tl.math.exp2(tl.where(keep, st * qk_scale - lse2[None, :], float("-inf")))
            dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
            dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    dk = dk * sm_scale
    tl.store(DK + (k0 + cols)[:, None] * sdkn + hk * sdkh + offs_d[None, :] * sdkd,
             dk.to(DK.dtype.element_ty), mask=in_k[:, None] & (offs_d[None, :] < D))  # fmt: skip
    tl.store(DV_ + (k0 + cols)[:, None] * sdvn + hk * sdvh + offs_dv[None, :] * sdvd,
             dv.to(DV_.dtype.element_ty), mask=in_k[:, None] & (offs_dv[None, :] < DV))  # fmt: skip


@triton.jit
def _varlen_dq(
    Q, K, V, DO, LSE, Delta, DQ, CuQ, CuK,
    sqm, sqh, sqd, skn, skh, skd, svn, svh, svd, sdom, sdoh, sdod, slh, slm, sdh, sdm,
    sdqm, sdqh, sdqd,
    GROUP, D, DV, sm_scale, qk_scale, win_left, win_right,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """dQ of BLOCK_M query rows of one head of one sequence, over its keys."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2)
    hk = h // GROUP
    q0 = tl.load(CuQ + b)
    nq = tl.load(CuQ + b + 1) - q0
    k0 = tl.load(CuK + b)
    nk = tl.load(CuK + b + 1) - k0
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    in_q = rows < nq
    qr = (q0 + rows)[:, None]
    q = tl.load(Q + qr * sqm + h * sqh + offs_d[None, :] * sqd,
                mask=in_q[:, None] & (offs_d[None, :] < D), other=0.0)  # fmt: skip
    do = tl.load(DO + qr * sdom + h * sdoh + offs_dv[None, :] * sdod,
                 mask=in_q[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
    lse = tl.load(LSE + h * slh + (q0 + rows) * slm, mask=in_q, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(Delta + h * sdh + (q0 + rows) * sdm, mask=in_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    off = nk - nq
    lo = 0
    hi = nk
    if CAUSAL:
        hi = tl.minimum(hi, m0 + BLOCK_M + off)
    if WINDOW:
        if win_right >= 0:
            hi = tl.minimum(hi, m0 + BLOCK_M + off + win_right)
        if win_left >= 0:
            lo = (tl.maximum(0, m0 + off - win_left) // BLOCK_N) * BLOCK_N
    hi = tl.where(m0 < nq, tl.maximum(hi, lo), lo)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        in_k = cols < nk
        kr = (k0 + cols)[:, None]
        k = tl.load(K + kr * skn + hk * skh + offs_d[None, :] * skd,
                    mask=in_k[:, None] & (offs_d[None, :] < D), other=0.0)  # fmt: skip
        v = tl.load(V + kr * svn + hk * svh + offs_dv[None, :] * svd,
                    mask=in_k[:, None] & (offs_dv[None, :] < DV), other=0.0)  # fmt: skip
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        # Keys past the sequence are masked too: their score is 0 and exp2(0 − lse2) overflows
        # for a very negative LSE (inf·0 = NaN in dS·k).
        keep = _keep(rows[:, None], cols[None, :], nq, nk, off, win_left, win_right, CAUSAL, WINDOW)
        p = tl.math.exp2(tl.where(keep, s * qk_scale - lse2[:, None], float("-inf")))
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + qr * sdqm + h * sdqh + offs_d[None, :] * sdqd,
             dq.to(DQ.dtype.element_ty), mask=in_q[:, None] & (offs_d[None, :] < D))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Launcher


def backward_tiles(dtype_bytes: int, d: int, dv: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, warps, stages)`` of the three backward programs: the dK/dV program
    keeps two fp32 accumulators of ``BLOCK_N × d`` besides its k and v tiles, so the tiles are
    narrower than the forward's (the dense backward's sizes, not tuned for varlen)."""
    if interpreting():
        return 32, 32, 4, 1
    if dtype_bytes == 4 or max(d, dv) > 128:
        return 32, 32, 4, 1
    if max(d, dv) > 64:
        return 32, 64, 4, 2
    return 64, 64, 4, 2


def launch_varlen_backward(q, k, v, o, lse, do, cu_q, cu_k, max_q, max_k, *, causal, window, scale):
    """Launch the three backward programs on checked arguments (as :func:`launch_varlen`
    takes them, plus the forward's ``o``, ``lse`` and the upstream ``do``). Returns
    ``(dQ, dK, dV)``, contiguous, in the input dtype."""
    total_q, hq, d = q.shape
    hk, dv = v.shape[1], v.shape[2]
    dq = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=k.dtype, device=q.device)
    dvv = torch.zeros(v.shape, dtype=v.dtype, device=q.device)
    batch = cu_q.numel() - 1
    if batch == 0 or total_q == 0 or k.shape[0] == 0:
        return dq, dk, dvv
    delta = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    bm, bn, warps, stages = backward_tiles(q.element_size(), d, dv)
    block_d, block_dv = max(16, triton.next_power_of_2(d)), max(16, triton.next_power_of_2(dv))
    left, right = (-1, -1) if window is None else window
    consts = {"CAUSAL": bool(causal), "WINDOW": window is not None, "BLOCK_M": bm,
              "BLOCK_N": bn, "BLOCK_D": block_d, "BLOCK_DV": block_dv, "PRECISION": "ieee",
              "num_warps": warps, "num_stages": stages}  # fmt: skip
    if max_q > 0:
        _varlen_delta[(triton.cdiv(max_q, bm), hq, batch)](
            o, do, delta, cu_q, *o.stride(), *do.stride(), *delta.stride(), dv,
            BLOCK_M=bm, BLOCK_DV=block_dv,
        )  # fmt: skip
    common = (*q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *delta.stride())
    scalars = (hq // hk, d, dv, float(scale), float(scale) * _LOG2E, left, right)
    if max_k > 0:
        _varlen_dkdv[(triton.cdiv(max_k, bn), hk, batch)](
            q, k, v, do, lse, delta, dk, dvv, cu_q, cu_k, *common, *dk.stride(), *dvv.stride(),
            *scalars, **consts,
        )  # fmt: skip
    if max_q > 0:
        _varlen_dq[(triton.cdiv(max_q, bm), hq, batch)](
            q, k, v, do, lse, delta, dq, cu_q, cu_k, *common, *dq.stride(), *scalars, **consts,
        )  # fmt: skip
    return dq, dk, dvv


def flash_attn_varlen_backward(
    q: Any,
    k: Any,
    v: Any,
    o: Any,
    lse: Any,
    do: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
) -> tuple[Any, Any, Any]:
    """Gradients of each packed sequence's attention for the upstream ``dO``: with ``P`` the
    sequence's softmax, ``D_i = Σ_c dO_ic·O_ic`` and ``dS = P∘(dO·Vᵀ − D)``: ``dV = Pᵀ·dO``,
    ``dQ = scale·dS·K``, ``dK = scale·dSᵀ·Q``, dK and dV summed over each kv head's group of
    query heads and over the sequence's own query rows only.

    ``q`` ... ``max_seqlen_k``, ``causal``, ``window``, ``scale``: as given to
    :func:`~flashcheck.kernels.triton_varlen.flash_attn_varlen`; ``o`` ``(total_q, Hq, dv)``
    and ``lse`` float32 ``(Hq, total_q)``: what it returned; ``do``: ``o``'s shape and dtype,
    any strides. Returns ``(dQ, dK, dV)`` shaped like ``q``, ``k``, ``v``, in their dtype.
    """
    cu_q, cu_k, window, sc = check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window=window, scale=scale
    )
    want = (q.shape[0], q.shape[1], v.shape[2])
    for name, x in (("o", o), ("do", do)):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != want or x.dtype != q.dtype:
            raise ValueError(
                f"{name} must be a tensor of shape (total_q, Hq, dv) = {want} and dtype "
                f"{q.dtype} (the forward's O), got {type(x).__name__} "
                f"{tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', '')}"
            )
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (q.shape[1], q.shape[0]):
        raise ValueError(
            f"lse must be the forward's float32 LSE of shape (Hq, total_q) = "
            f"{(q.shape[1], q.shape[0])}, got {tuple(getattr(lse, 'shape', ()))}"
        )
    if lse.dtype != torch.float32:
        raise ValueError(f"lse must be float32 (a rounded LSE shifts every P), got {lse.dtype}")
    if not (o.device == do.device == lse.device == q.device):
        raise ValueError("o, lse and do must be on the device of q, k, v")
    return launch_varlen_backward(
        q, k, v, o, lse, do, cu_q, cu_k, int(max_seqlen_q), int(max_seqlen_k),
        causal=causal, window=window, scale=sc,
    )  # fmt: skip


class FlashAttnVarlenFunction(torch.autograd.Function):
    """``O`` of the varlen forward as a differentiable torch operation: the forward saves ``O``
    and ``LSE``, the backward runs :func:`launch_varlen_backward` (``LSE`` is returned too,
    without a gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, window, scale):
        cu_q, cu_k, window, sc = check_varlen(
            q, k, v, cu_q, cu_k, max_q, max_k, window=window, scale=scale
        )
        o, lse = launch_varlen(q, k, v, cu_q, cu_k, int(max_q), causal=causal, window=window,
                               scale=sc)  # fmt: skip
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.opts = {"causal": causal, "window": window, "scale": sc}
        ctx.lengths = (int(max_q), int(max_k))
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        if do is None:  # only LSE was used downstream: O contributes nothing
            do = torch.zeros_like(o)
        grads = launch_varlen_backward(q, k, v, o, lse, do, cu_q, cu_k, *ctx.lengths, **ctx.opts)
        return *grads, None, None, None, None, None, None, None


def flash_attn_varlen_differentiable(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
) -> tuple[Any, Any]:
    """``(O, LSE)`` of :func:`~flashcheck.kernels.triton_varlen.flash_attn_varlen` (same
    arguments), with gradients of ``O`` to ``q``, ``k``, ``v`` through
    :func:`launch_varlen_backward` (``LSE`` carries none)."""
    return FlashAttnVarlenFunction.apply(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window, scale
    )
