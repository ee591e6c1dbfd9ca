"""Triton FlashAttention-2 forward in FlashAttention's varlen layout (packed sequences).

Layout (``flash_attn_varlen_func``): ``q (total_q, Hq, d)``, ``k (total_k, Hk, d)``,
``v (total_k, Hk, dv)``; sequence ``b`` owns query rows ``cu_seqlens_q[b] : cu_seqlens_q[b+1]``
and key rows ``cu_seqlens_k[b] : cu_seqlens_k[b+1]``. Returns ``O (total_q, Hq, dv)`` in the
input dtype and ``LSE (Hq, total_q)`` in fp32 (natural log).

Algorithm: one program per (block of ``BLOCK_M`` query rows, query head, sequence); the grid's
first axis covers ``max_seqlen_q`` and a program whose rows all lie past its sequence's end
loops over no key and stores nothing. Within a sequence the loop is the dense kernel's
(``kernels/triton_flash.py``), with ``c = scale·log2 e`` one fp32 constant so exp2 replaces exp:

    for each block of BLOCK_N keys of the sequence in the row block's live key range:
        S   = q·kᵀ                                tl.dot, fp32 accumulation
        S   = −inf where masked (causal, window, keys past the sequence's end)
        m'  = max(m, rowmax(S));  α = exp2((m − m')·c);  p = exp2((S − m')·c)
        l   = α·l + Σ p
        acc = α·acc + (p rounded to the input dtype)·V        fp32 accumulation
    O = acc / l,  LSE = (m·c + log2 l)·ln 2

Masks are aligned to each sequence's bottom-right corner (``j ≤ i + Nk_b − Nq_b``). A row that
keeps no key (a sequence with no keys, or a mask that removes every key) gets ``O = 0`` and
``LSE = −inf``; a sequence with no query rows writes nothing. Every load is masked to the
sequence's own rows, so no other sequence's keys (nor anything past ``total_k``) reach a
result. Arithmetic class "flash" (docs/error-bounds.md): fp16 / bf16 / fp32 inputs, fp32
scores, softmax and accumulators, P rounded to the input format before P·V; fp32 dots in IEEE
fp32 (no tf32). GQA / MQA: query head ``h`` reads key/value head ``h // (Hq / Hk)``.

Known limits: every key block builds its mask (the dense kernel's mask-free fast path, TMA,
prefetching and per-GPU tile tables are left out, so it is slower than the dense kernel on
long sequences); no soft-capping, no sinks, no dropout, no ALiBi; head dims up to 256 (padded
to a power of two ≥ 16). The grid is sized by ``max_seqlen_q``: a batch with one long sequence
launches mostly empty programs. Under ``TRITON_INTERPRET=1`` the interpreter's bf16 ``tl.dot``
is broken upstream (triton-lang/triton#11584): a canary detects it and bf16 then raises
``NotImplementedError`` instead of returning garbage. The backward is in
:mod:`flashcheck.kernels.triton_varlen_bwd`.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

import triton
import triton.language as tl

__all__ = [
    "ARITHMETIC",
    "bf16_dot_supported",
    "check_varlen",
    "flash_attn_varlen",
    "interpreting",
    "launch_varlen",
    "tiles",
]

ARITHMETIC = "flash"
_LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(s, m_i, l_i, keep, qk_scale, POS_SCALE: tl.constexpr):
    """One online-softmax update on the masked scores ``s`` of a key block: ``p`` (fp32), the
    rescale ``alpha`` of the old accumulator, the new running extreme and sum.

    ``m_i`` is the running extreme of the unscaled scores (the maximum for c > 0, the minimum
    for c ≤ 0), so the exponent ``(s − m)·c`` is exactly 0 at that score: a subtraction then a
    product, which no compiler contracts into an fma that would leave half an ulp of ``m·c``
    (the dense kernel's reason, measured there)."""
    if POS_SCALE:
        m_new = tl.maximum(m_i, tl.max(tl.where(keep, s, float("-inf")), 1))
        # A row that has kept no key yet has m = −inf: shift by 0 so x is −inf, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        first = m_i == float("-inf")
    else:
        m_new = tl.minimum(m_i, tl.min(tl.where(keep, s, float("inf")), 1))
        m_safe = tl.where(m_new == float("inf"), 0.0, m_new)
        first = m_i == float("inf")
    x = tl.where(keep, (s - m_safe[:, None]) * qk_scale, float("-inf"))
    # Before the first kept key acc and l are 0: alpha = 0, never ±inf·0 = NaN.
    shift = (tl.where(first, m_safe, m_i) - m_safe) * qk_scale
    alpha = tl.where(first, 0.0, tl.math.exp2(shift))
    p = tl.math.exp2(x)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_i


@triton.jit
def _keep(rows, cols, in_k, off, win_left, win_right, CAUSAL: tl.constexpr, WINDOW: tl.constexpr):
    """The (rows × keys) mask of one sequence's tile: keys inside the sequence, bottom-right
    causal (``j ≤ i + off``), the window ``i + off − left ≤ j ≤ i + off + right``."""
    # 2-D from the start (the row term is always true): Triton 3.6 rejects a tensor whose
    # shape changes inside a run-time `if` (the dense kernel's finding).
    keep = in_k[None, :] & (rows[:, None] >= 0)
    if CAUSAL:
        keep = keep & (cols[None, :] <= rows[:, None] + off)
    if WINDOW:
        if win_left >= 0:
            keep = keep & (cols[None, :] >= rows[:, None] + off - win_left)
        if win_right >= 0:
            keep = keep & (cols[None, :] <= rows[:, None] + off + win_right)
    return keep


@triton.jit
def _varlen_fwd(
    Q, K, V, Out, LSE, CuQ, CuK,
    sqm, sqh, sqd, skn, skh, skd, svn, svh, svd, som, soh, sod, slh, slm,
    GROUP, D, DV, qk_scale, win_left, win_right,
    CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    PRECISION: tl.constexpr, POS_SCALE: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M query rows of one head of one sequence against its keys."""
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
    q = tl.load(
        Q + (q0 + rows)[:, None] * sqm + h * sqh + offs_d[None, :] * sqd,
        mask=in_q[:, None] & (offs_d[None, :] < D),
        other=0.0,
    )
    m_i = tl.full([BLOCK_M], float("-inf") if POS_SCALE else float("inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    off = nk - nq
    # Live key range of the row block, [lo, hi); none for a block past the sequence's end.
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
    k_base = K + k0 * skn + hk * skh
    v_base = V + k0 * svn + hk * svh
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        in_k = cols < nk
        k = tl.load(
            k_base + cols[:, None] * skn + offs_d[None, :] * skd,
            mask=in_k[:, None] & (offs_d[None, :] < D),
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        keep = _keep(rows, cols, in_k, off, win_left, win_right, CAUSAL, WINDOW)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, keep, qk_scale, POS_SCALE)
        v = tl.load(
            v_base + cols[:, None] * svn + offs_dv[None, :] * svd,
            mask=in_k[:, None] & (offs_dv[None, :] < DV),
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    # l = 0 only for rows that kept no key; a NaN l (NaN input) must reach O, not pass for 0.
    has = l_i != 0.0
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)
    lse = tl.where(
        has,
        (tl.where(has, m_i, 0.0) * qk_scale + tl.math.log2(tl.where(has, l_i, 1.0)))
        * 0.6931471805599453,
        float("-inf"),
    )
    tl.store(
        Out + (q0 + rows)[:, None] * som + h * soh + offs_dv[None, :] * sod,
        out.to(Out.dtype.element_ty),
        mask=in_q[:, None] & (offs_dv[None, :] < DV),
    )
    tl.store(LSE + h * slh + (q0 + rows) * slm, lse, mask=in_q)


# ---------------------------------------------------------------------------------------------
# Launcher


def interpreting() -> bool:
    """Whether Triton runs its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def tiles(dtype_bytes: int, d: int, dv: int) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, warps, stages)``: 32×32 under the interpreter (its cost is per
    tile operation; 32 still crosses a block edge at the test lengths), portable defaults that
    fit 100 KiB of shared memory on a GPU (not tuned)."""
    if interpreting():
        return 32, 32, 4, 1
    if dtype_bytes == 4 and max(d, dv) > 128:
        return 32, 32, 4, 2
    if dtype_bytes == 4 or max(d, dv) > 128:
        return 64, 32, 4, 2
    return 128, 64, 8, 2


def launch_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, *, causal, window, scale):
    """Launch the forward on arguments :func:`check_varlen` has accepted (``window`` as
    ``(left, right)`` with -1 unbounded, ``scale`` a float, ``cu_q``, ``cu_k`` int32 on the
    device). Returns ``(O, LSE)``."""
    import torch

    total_q, hq, d = q.shape
    hk, dv = v.shape[1], v.shape[2]
    o = torch.empty((total_q, hq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((hq, total_q), dtype=torch.float32, device=q.device)
    batch = cu_q.numel() - 1
    if total_q == 0 or batch == 0 or max_seqlen_q == 0:
        return o, lse
    if k.shape[0] == 0:  # no sequence has a key (and an empty k has no address to launch with)
        return o.zero_(), lse.fill_(float("-inf"))
    bm, bn, warps, stages = tiles(q.element_size(), d, dv)
    block_dv = max(16, triton.next_power_of_2(dv))
    if bm >= 128:
        # The dense kernel's measurement (H100, Triton 3.6): 128-row tiles with a P·V tile
        # narrower than 64 gave wrong values at 8 warps; a 64-wide one is correct.
        block_dv = max(block_dv, 64)
    left, right = (-1, -1) if window is None else window
    qk_scale = float(scale) * _LOG2E
    _varlen_fwd[(triton.cdiv(max_seqlen_q, bm), hq, batch)](
        q, k, v, o, lse, cu_q, cu_k,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(),
        hq // hk, d, dv, qk_scale, left, right,
        CAUSAL=bool(causal), WINDOW=window is not None, BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_DV=block_dv,
        PRECISION="ieee", POS_SCALE=qk_scale > 0, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return o, lse


_BF16_CANARY: dict[str, bool] = {}


def bf16_dot_supported(torch: Any) -> bool:
    """Run a 16×16 bf16 dot through the kernel once and compare with torch (interpreter only):
    a correct bf16 result is within ~1e-2 of fp32 here, the upstream bug is off by O(1)."""
    if "ok" not in _BF16_CANARY:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(16, 1, 16, generator=g).to(torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0, 16], dtype=torch.int32)
        o, _ = launch_varlen(q, k, v, cu, cu, 16, causal=False, window=None, scale=0.25)
        s = (q[:, 0].float() @ k[:, 0].float().T) * 0.25
        ref = torch.softmax(s, -1) @ v[:, 0].float()
        _BF16_CANARY["ok"] = bool(torch.allclose(o[:, 0].float(), ref, atol=0.05, rtol=0.05))
    return _BF16_CANARY["ok"]


def _check_tensors(q: Any, k: Any, v: Any, torch: Any) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            raise ValueError(
                f"{name} must be a 3-D torch.Tensor (total, heads, head_dim), got "
                f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); cast to one")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"dtype {q.dtype} is not supported: use float16, bfloat16 or float32")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on the same device")
    if q.device.type != "cuda" and not interpreting():
        raise ValueError(
            f"tensors are on {q.device}: the Triton kernel needs CUDA, or set TRITON_INTERPRET=1 "
            "before importing triton to run it on CPU (slow)"
        )
    if k.shape[:2] != v.shape[:2] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree: k and "
            "v need one total_k and one head count, k needs q's head_dim"
        )
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
    if not (1 <= q.shape[2] <= 256 and 1 <= v.shape[2] <= 256):
        raise ValueError(f"head dims must be in [1, 256], got d={q.shape[2]}, dv={v.shape[2]}")


def _check_cu(cu: Any, name: str, total: int, device: Any, torch: Any) -> Any:
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be a 1-D int32 tensor of B+1 prefix sums")
    if cu.dtype != torch.int32:
        raise ValueError(f"{name} must be int32 ({name}.to(torch.int32)), got {cu.dtype}")
    host = cu.cpu()
    if int(host[0]) != 0 or int(host[-1]) != total or bool((host[1:] < host[:-1]).any()):
        raise ValueError(
            f"{name} must rise from 0 to the packed length {total} without decreasing, got "
            f"{host.tolist()}: build it as [0] + cumsum(lengths)"
        )
    return cu.to(device).contiguous()


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, window, scale):
    """Check the arguments of :func:`flash_attn_varlen` (``ValueError`` with the fix;
    ``NotImplementedError`` for bf16 under a broken interpreter) and normalise them: returns
    ``(cu_q, cu_k, window, scale)`` with the prefix sums int32 on q's device, ``window`` as
    ``(left, right)`` with -1 unbounded (or ``None``) and ``scale`` a float (``1/sqrt(d)``
    by default). The backward shares it."""
    import torch

    _check_tensors(q, k, v, torch)
    cu_q = _check_cu(cu_seqlens_q, "cu_seqlens_q", q.shape[0], q.device, torch)
    cu_k = _check_cu(cu_seqlens_k, "cu_seqlens_k", k.shape[0], q.device, torch)
    if cu_q.numel() != cu_k.numel():
        raise ValueError("cu_seqlens_q and cu_seqlens_k must both hold B+1 entries")
    for name, cu, given in (("q", cu_q, max_seqlen_q), ("k", cu_k, max_seqlen_k)):
        longest = int((cu[1:] - cu[:-1]).max()) if cu.numel() > 1 else 0
        if isinstance(given, bool) or not isinstance(given, numbers.Integral) or given < longest:
            raise ValueError(
                f"max_seqlen_{name} must be an int >= the longest sequence ({longest}), got "
                f"{given!r}"
            )
    if window is not None:
        left, right = window
        window = (-1 if left is None else int(left), -1 if right is None else int(right))
        if window[0] < -1 or window[1] < -1:
            raise ValueError(f"window sides must be >= 0, -1 or None, got {window}")
    sc = 1.0 / math.sqrt(q.shape[2]) if scale is None else float(scale)
    if not math.isfinite(sc):
        raise ValueError(f"scale must be finite, got {scale}")
    if q.dtype == torch.bfloat16 and interpreting() and not bf16_dot_supported(torch):
        raise NotImplementedError(
            "bf16 under TRITON_INTERPRET=1: the interpreter's bf16 tl.dot returns wrong values "
            "(triton-lang/triton#11584, detected by a canary); run bf16 on a GPU"
        )
    return cu_q, cu_k, window, sc


def flash_attn_varlen(
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
    """Attention of each packed sequence: for sequence ``b`` with query rows ``I_b`` and keys
    ``J_b`` (module docstring), ``O[I_b, h] = softmax(scale·Q[I_b, h]·K[J_b, h']ᵀ + mask_b)·
    V[J_b, h']`` with ``h' = h // (Hq / Hk)`` and ``LSE[h, i] = log Σ_{j kept} exp(scale·q_i·k_j)``.

    ``q (total_q, Hq, d)``, ``k (total_k, Hk, d)``, ``v (total_k, Hk, dv)``: torch tensors of
    one dtype (float16, bfloat16, float32) on one CUDA device (or CPU under
    ``TRITON_INTERPRET=1``), any strides; ``cu_seqlens_q``, ``cu_seqlens_k``: int32 ``(B+1,)``
    prefix sums from 0 to ``total_q``, ``total_k``; ``max_seqlen_q``, ``max_seqlen_k``: ints at
    least the longest sequence (they size the grid). ``causal``: bottom-right aligned per
    sequence; ``window=(left, right)`` with ``None``/``-1`` unbounded; ``scale`` defaults to
    ``1/sqrt(d)``. Returns ``(O, LSE)``: ``O (total_q, Hq, dv)`` in the input dtype, ``LSE
    (Hq, total_q)`` float32; rows that keep no key have ``O = 0``, ``LSE = −inf``.
    """
    cu_q, cu_k, window, sc = check_varlen(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window=window, scale=scale
    )
    return launch_varlen(q, k, v, cu_q, cu_k, max_seqlen_q, causal=causal, window=window, scale=sc)
