"""Triton FlashAttention-2 forward kernel: O and LSE, fp16 / bf16 / fp32.

Algorithm (one program per block of ``BLOCK_M`` query rows of one (batch, head)):

    for each block of BLOCK_N keys in the row block's live key range:
        S   = q·kᵀ                       tl.dot, fp32 accumulation
        t   = S · (scale·log2 e)          one fp32 constant: exp2 replaces exp, q is not rescaled
        t   = −inf where masked           causal / window / tail keys beyond Nk
        m'  = max(m, rowmax t);  α = exp2(m − m');  p = exp2(t − m')
        l   = α·l + Σ p
        acc = α·acc + (p rounded to the input dtype)·V        tl.dot, fp32 accumulation
    O = acc / l,  LSE = (m + log2 l)·ln 2        (natural log)

Arithmetic class "flash" (SPEC 3.4): low-precision inputs, fp32 scores, softmax and accumulators,
P rounded to the input format before P·V. fp32 inputs use IEEE fp32 dots unless
``allow_tf32=True``. Masks are bottom-right aligned (``j ≤ i + Nk − Nq``); a row with no kept
key returns ``O = 0``, ``LSE = −inf``. Loads of keys past ``Nk`` and head-dim padding are masked
(``other=0``) and their scores set to −inf, so no out-of-bounds read reaches the result.

Known limits: head dims up to 256 (padded to a power of two ≥ 16; dv ≥ 64 in the 8-warp
configuration, a workaround for wrong results measured on H100 with Triton 3.6); forward only;
this is the
portable path (no TMA / warp specialisation yet: see the GPU performance issue). Under
``TRITON_INTERPRET=1`` the interpreter's bf16 ``tl.dot`` is broken upstream
(triton-lang/triton#11584): a canary detects it on first use and bf16 then raises instead of
returning garbage.
"""

from __future__ import annotations

import math
import os
from typing import Any

import triton
import triton.language as tl

__all__ = ["ARITHMETIC", "flash_attention"]

ARITHMETIC = "flash"
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


@triton.jit
def _flash_fwd(
    Q, K, V, Out, LSE,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    slb, slh, slm,
    H, H_KV, NQ, NK, D, DV,
    qk_scale, win_left, win_right,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // H_KV)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(rows[:, None] < NQ) & (offs_d[None, :] < D), other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    off = NK - NQ
    # Live key range of this row block: [lo, hi). Blocks outside it are skipped entirely.
    lo = 0
    hi = NK
    if CAUSAL:
        hi = tl.minimum(hi, (pid_m + 1) * BLOCK_M + off)
    if WINDOW:
        if win_right >= 0:
            hi = tl.minimum(hi, (pid_m + 1) * BLOCK_M + off + win_right)
        if win_left >= 0:
            lo = tl.maximum(0, pid_m * BLOCK_M + off - win_left)
            lo = (lo // BLOCK_N) * BLOCK_N
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        k_ptrs = k_base + cols[:, None] * skn + offs_d[None, :] * skd
        k = tl.load(k_ptrs, mask=(cols[:, None] < NK) & (offs_d[None, :] < D), other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        t = s * qk_scale
        keep = (cols[None, :] < NK) & (rows[:, None] >= 0)
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None] + off)
        if WINDOW:
            if win_left >= 0:
                keep = keep & (cols[None, :] >= rows[:, None] + off - win_left)
            if win_right >= 0:
                keep = keep & (cols[None, :] <= rows[:, None] + off + win_right)
        t = tl.where(keep, t, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(t, 1))
        # A row that has kept no key yet has m = −inf: shift by 0 so exp2 sees −inf, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(t - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = v_base + cols[:, None] * svn + offs_dv[None, :] * svd
        v = tl.load(v_ptrs, mask=(cols[:, None] < NK) & (offs_dv[None, :] < DV), other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    # l = 0 only for rows that kept no key; a NaN l (NaN input) must reach O, not pass for 0.
    has = l_i != 0.0
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    out = tl.where(has[:, None], out, 0.0)
    lse = tl.where(has, (m_i + tl.math.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))  # fmt: skip
    o_ptrs = Out + b * sob + h * soh + rows[:, None] * som + offs_dv[None, :] * sod
    tl.store(
        o_ptrs, out.to(Out.dtype.element_ty), mask=(rows[:, None] < NQ) & (offs_dv[None, :] < DV)
    )
    tl.store(LSE + b * slb + h * slh + rows * slm, lse, mask=rows < NQ)


# ---------------------------------------------------------------------------------------------
# Launcher


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


_BF16_CANARY: dict[str, bool] = {}


def _bf16_dot_works(torch: Any) -> bool:
    """Run a 16×16 bf16 dot through the kernel once and compare with torch (interpreter only)."""
    if "ok" not in _BF16_CANARY:
        g = torch.Generator().manual_seed(0)
        q = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        k = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        v = torch.randn(1, 1, 16, 16, generator=g).to(torch.bfloat16)
        o, _ = _launch(q, k, v, causal=False, window=None, scale=0.25, allow_tf32=False)
        ref = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * 0.25, -1) @ v.float()
        # A correct bf16 result is within a few bf16 ulps (u = 2^-8, |O| < 3) of the fp32
        # reference, ~1e-2; the upstream bug returns values off by O(1). 0.05 separates the two.
        _BF16_CANARY["ok"] = bool(torch.allclose(o.float(), ref, atol=0.05, rtol=0.05))
    return _BF16_CANARY["ok"]


def _blocks(d: int, dv: int, dtype_bytes: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages): portable defaults that fit Hopper's 227 KiB of
    shared memory (fp32 at d = 256 needs 32×32 tiles and 2 stages)."""
    if _interpreting():
        return 16, 16, 4, 1
    if dtype_bytes == 4 and max(d, dv) > 128:
        return 32, 32, 4, 2
    if max(d, dv) > 128 or dtype_bytes == 4:
        return 64, 32, 4, 2
    return 128, 64, 8, 3


def _launch(q, k, v, *, causal, window, scale, allow_tf32, config=None):
    import torch

    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    o = torch.empty((bsz, hq, nq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    bm, bn, warps, stages = _blocks(d, dv, q.element_size())
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(16, triton.next_power_of_2(dv))
    if warps == 8:
        # Measured on H100, Triton 3.6: BLOCK_M=128, 8 warps and a 32-wide P·V tile (dv <= 32)
        # returned wrong values (max abs error 0.033 vs 0.0011), reproducibly, with
        # compute-sanitizer memcheck and racecheck clean; a 64-wide tile is correct
        # (benchmarks/probe_block_dv.py, benchmarks/RESULTS.md). Pad dv to 64 there.
        block_dv = max(block_dv, 64)
    if config is not None:  # (BLOCK_M, BLOCK_N, warps, stages, BLOCK_DV floor): for probes
        bm, bn, warps, stages, dv_floor = config
        block_dv = max(block_dv, dv_floor)
    left, right = (-1, -1) if window is None else window
    grid = (triton.cdiv(nq, bm), bsz * hq)
    precision = "tf32" if (allow_tf32 and q.dtype == torch.float32) else "ieee"
    _flash_fwd[grid](
        q, k, v, o, lse,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        hq, hk, nq, nk, d, dv,
        float(scale) * _LOG2E, left, right,
        CAUSAL=bool(causal), WINDOW=window is not None,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, BLOCK_DV=block_dv,
        PRECISION=precision, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return o, lse


def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    scale: float | None = None,
    allow_tf32: bool = False,
) -> tuple[Any, Any]:
    """FlashAttention-2 forward: ``O = softmax(scale·QKᵀ + mask)·V`` and ``LSE`` (natural log).

    ``q``: ``(B, Hq, Nq, d)``, ``k``: ``(B, Hk, Nk, d)``, ``v``: ``(B, Hk, Nk, dv)`` torch tensors
    on one CUDA device (or on CPU under ``TRITON_INTERPRET=1``), one dtype among float16,
    bfloat16 and float32, any strides; ``Hq`` a multiple of ``Hk``; ``d, dv ≤ 256``. ``scale``
    defaults to ``1/sqrt(d)``. ``window=(left, right)``: ``None``/``-1`` for unbounded.
    Returns ``O`` in the input dtype and ``LSE`` in float32.
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
    if q.dtype == torch.bfloat16 and _interpreting() and not _bf16_dot_works(torch):
        raise NotImplementedError(
            "bf16 under TRITON_INTERPRET=1: the interpreter's bf16 tl.dot returns wrong values "
            "(triton-lang/triton#11584, detected by a canary); run bf16 on a GPU"
        )
    return _launch(q, k, v, causal=causal, window=window, scale=sc, allow_tf32=allow_tf32)
