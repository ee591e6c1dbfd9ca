"""Triton FP8 attention forward for Hopper: e4m3 Q, K, V with FlashAttention-3 descales.

The exact inputs are ``Q = q·descale_q``, ``K = k·descale_k``, ``V = v·descale_v`` with q, k, v
in ``float8_e4m3fn`` and one fp32 descale per (batch, kv-head). Algorithm (FA2 tiling, one
program per block of ``BLOCK_M`` query rows of one (batch, head); ``c = descale_q·descale_k ·
(scale·log2 e)``, two fp32 products made once per program, so exp2 replaces exp):

    for each block of BLOCK_N keys in the row block's live key range:
        S   = q·kᵀ                        fp8 × fp8 tensor-core product, fp32 accumulator
        S   = −inf where masked           only in blocks on the causal diagonal / ragged tail
        m'  = max(m, rowmax(S));  α = exp2((m − m')·c);  p = exp2((S − m')·c)     (fp32)
        l   = α·l + Σ p                   (the fp32 p, before quantization, as FA3)
        acc = α·acc + e4m3(p)·v           p rounded to nearest even in e4m3 (p ∈ [0, 1]);
                                          fp8 × fp8 product, fp32 accumulator
    O = acc · (descale_v / l)  rounded once to out_dtype;   LSE = (m·c + log2 l)·ln 2  (fp32)

Arithmetic class "flash-fp8": products of two e4m3 values are exact in fp32, so the scores
differ from the exact ones only by the accumulation (see below) and the fp32 rounding of c;
the online softmax is fp32; P·V sees P in e4m3 (relative error up to 2^-4 per weight, the
dominant term) and V exactly; descale_v meets the fp32 accumulator once, at the end. Masks are
bottom-right aligned (``j ≤ i + Nk − Nq``); a row with no kept key returns ``O = 0``,
``LSE = −inf``.

V's layout: Hopper's fp8 tensor-core product (wgmma) takes both operands K-major; for P·V the
reduction runs over keys, so a V with its head dim contiguous (the natural ``(B, H, N, dv)``)
is transposed on chip for every block: 237 TFLOP/s against 654 with a key-contiguous V on an
H100 (Triton 3.6, d = 128, N = 4K). Decision: the public layout stays ``(B, H, N, d)`` (as the
dense kernel and FA3), and :func:`flash_attention_fp8` copies a V whose key axis is not
contiguous through :func:`key_contiguous` on CUDA: with the copy 650 TFLOP/s at N = 4K (520 at
1K, 704 at 16K; causal 289 / 526 / 673) against 673 (576 / 681; causal 352 / 557 / 715) for a
V passed key-contiguous, which an FP8 KV cache written once and read often should store.

Accumulation, measured on an H100: Triton's fp8 ``tl.dot`` on sm_90 never promotes the tensor
cores' running sum to fp32 (``max_num_imprecise_acc`` default), and that sum keeps about 13
bits: a K = 4096 product was off by 3807·2^-24·Σ|a·b| (77.6 with a promotion every 32 products,
0.2 for torch's fp32 matmul). Here S sums d products and P·V one key block into the rescaled
accumulator, so the class's "fp32 accumulation" holds only up to that: the kernel's RMSE
against the exact result stayed within 0.2 % of the class emulation's (P's e4m3 rounding
dominates), its distance to the emulation 8-29 % of that error. ``Fp8Config.chunk = 32``
halves that distance and costs 46 % of the speed (not the default); ``acc_in_dot=False``
(running sum by fp32 adds) changed little. Bounds for this kernel must allow the accumulator.

Under ``TRITON_INTERPRET=1`` the interpreter's fp32 → fp8 and fp32 → bf16 casts round wrongly
(ties away from zero, no carry when the mantissa overflows: 126.2 → 64 in e4m3;
triton-lang/triton#8322, fix proposed in triton-lang/triton#11897), so there P and bf16 outputs
are first rounded to nearest even in fp32 arithmetic (``_round_e4m3``, ``_round_bf16``) and the
cast only re-encodes exact values; on a GPU the hardware cast (round to nearest even) does it.
Its fp8 ``tl.dot`` is exact (it widens e4m3 to fp16 and multiplies in fp32).

Known limits: forward only; head dims up to 256 (padded to a power of two ≥ 32); e4m3 only
(no e5m2 inputs); causal or no mask (no sliding window, soft-cap or sinks); no per-block
descales or Hadamard rotation (FA3's accuracy options); descales must be ≥ 0 (a negative or NaN
product ``descale_q·descale_k`` gives NaN rows rather than a silently wrong softmax; the values
are not checked on the host, which would cost a device synchronisation); ``scale`` ≥ 0;
no warp specialisation or ping-pong scheduling (FA3's overlap of softmax and products).
"""

from __future__ import annotations

import math
import os
from typing import Any, NamedTuple

import triton
import triton.language as tl

__all__ = [
    "ARITHMETIC",
    "Fp8Config",
    "flash_attention_fp8",
    "fp8_launch_config",
    "key_contiguous",
    "launch_fp8",
]

ARITHMETIC = "flash-fp8"
_LOG2E = 1.4426950408889634


@triton.jit
def _round_e4m3(p):
    """p ∈ [0, 448] rounded to nearest even in e4m3, in fp32 arithmetic: adding then taking
    away ``2^23·u`` (u the e4m3 spacing at p: ``2^(e−3)`` in binade e ≥ −6, ``2^-9`` below)
    rounds p to a multiple of u by the fp32 adder's own round-to-nearest-even."""
    bits = p.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 121)  # 121 = −6 + 127: e4m3's subnormal spacing
    big = ((e + 20) << 23).to(tl.float32, bitcast=True)  # 2^(e − 127 − 3 + 23)
    return (p + big) - big


@triton.jit
def _round_bf16(x):
    """Finite fp32 x rounded to nearest even in bf16 (kept in fp32): integer rounding of the
    low 16 bits."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot(a, b, acc, CHUNK: tl.constexpr):
    """``a·b + acc`` on the tensor cores. Hopper's fp8 products add into their accumulator
    with fewer than fp32's bits; ``CHUNK > 0`` makes Triton move the sum into a separate fp32
    accumulator every ``CHUNK`` products (``max_num_imprecise_acc``), 0 leaves Triton's default
    (no promotion on sm_90)."""
    if CHUNK > 0:
        return tl.dot(a, b, acc, max_num_imprecise_acc=CHUNK)
    return tl.dot(a, b, acc)


@triton.jit
def _load_block(base, cols, offs, s_row, s_col, N, W):
    """Rows ``cols`` of K or V (width ``W``), zeros past ``N`` and ``W``."""
    ptrs = base + cols[:, None] * s_row + offs[None, :] * s_col
    return tl.load(ptrs, mask=(cols[:, None] < N) & (offs[None, :] < W), other=0.0)


@triton.jit
def _key_blocks(
    acc, l_i, m_i, q, k_base, v_base, start_lo, start_hi, rows, offs_n, offs_d, offs_dv,
    skn, skd, svn, svd, NK, D, DV, off, c,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
    EXACT_CAST: tl.constexpr, CHUNK: tl.constexpr, ACC_IN_DOT: tl.constexpr,
):  # fmt: skip
    """The online softmax over key blocks ``[start_lo, start_hi)`` (see the module docstring).
    ``m_i`` is the running maximum of the unscaled scores, so the exponent of the largest
    score is exactly 0 (a subtraction then a product: nothing for a compiler to contract)."""
    for start in range(start_lo, start_hi, BLOCK_N):
        start = tl.multiple_of(start, BLOCK_N)
        cols = start + offs_n
        k = _load_block(k_base, cols, offs_d, skn, skd, NK, D)
        s = _dot(q, tl.trans(k), None, CHUNK)
        if MASKED:
            keep = (cols[None, :] < NK) & (rows[:, None] >= 0)
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None] + off)
            m_new = tl.maximum(m_i, tl.max(tl.where(keep, s, float("-inf")), 1))
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row with no kept key yet has m = −inf: shift by 0 so x is −inf, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        x = (s - m_safe[:, None]) * c
        if MASKED:
            x = tl.where(keep, x, float("-inf"))
        first = m_i == float("-inf")
        # Before the first kept key acc = l = 0: alpha = 0, never exp2(±inf·0) = NaN.
        alpha = tl.where(first, 0.0, tl.math.exp2((tl.where(first, m_safe, m_i) - m_safe) * c))
        p = tl.math.exp2(x)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_block(v_base, cols, offs_dv, svn, svd, NK, DV)
        if EXACT_CAST:
            p = _round_e4m3(p)
        if ACC_IN_DOT:
            acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], CHUNK)
        else:
            # Each block's product starts from 0; the running sum is kept by fp32 adds.
            acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, None, CHUNK)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_fp8_fwd(
    Q, K, V, Out, LSE, DQ, DK, DV_,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
    sob, soh, som, sod, slb, slh, slm,
    sdqb, sdqh, sdkb, sdkh, sdvb, sdvh,
    H, H_KV, NQ, NK, D, DV, scale_log2e,
    HAS_DQ: tl.constexpr, HAS_DK: tl.constexpr, HAS_DV: tl.constexpr,
    CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    EXACT_CAST: tl.constexpr, OUT_BF16: tl.constexpr, CHUNK: tl.constexpr,
    ACC_IN_DOT: tl.constexpr,
):  # fmt: skip
    """One program: BLOCK_M query rows of one (batch, head) against their live keys: the
    mask-free blocks first, then the causal diagonal and the ragged key tail (masked)."""
    pid_m = tl.program_id(0)
    if CAUSAL:
        # Row blocks further down see more keys: start them first (shorter last wave).
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // (H // H_KV)
    # c = (descale_q·descale_k)·(scale·log2 e), fp32; descale_v waits for the epilogue.
    c = scale_log2e
    dq_dk = 1.0
    if HAS_DQ:
        dq_dk = tl.load(DQ + b * sdqb + hk * sdqh)
    if HAS_DK:
        dq_dk = dq_dk * tl.load(DK + b * sdkb + hk * sdkh)
    c = dq_dk * c
    m0 = pid_m * BLOCK_M
    rows = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    q_ptrs = Q + b * sqb + h * sqh + rows[:, None] * sqm + offs_d[None, :] * sqd
    q = tl.load(q_ptrs, mask=(rows[:, None] < NQ) & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    off = NK - NQ
    hi = NK
    free_hi = NK  # keys [0, free_hi) are kept by every row of the block
    if CAUSAL:
        hi = tl.maximum(tl.minimum(hi, m0 + BLOCK_M + off), 0)
        free_hi = tl.maximum(tl.minimum(free_hi, m0 + off + 1), 0)
    full_hi = tl.minimum((free_hi // BLOCK_N) * BLOCK_N, hi)
    acc, l_i, m_i = _key_blocks(
        acc, l_i, m_i, q, k_base, v_base, 0, full_hi, rows, offs_n, offs_d, offs_dv,
        skn, skd, svn, svd, NK, D, DV, off, c, False, CAUSAL, BLOCK_N, EXACT_CAST, CHUNK,
        ACC_IN_DOT,
    )  # fmt: skip
    acc, l_i, m_i = _key_blocks(
        acc, l_i, m_i, q, k_base, v_base, full_hi, hi, rows, offs_n, offs_d, offs_dv,
        skn, skd, svn, svd, NK, D, DV, off, c, True, CAUSAL, BLOCK_N, EXACT_CAST, CHUNK,
        ACC_IN_DOT,
    )  # fmt: skip
    dv = 1.0
    if HAS_DV:
        dv = tl.load(DV_ + b * sdvb + hk * sdvh)
    # l = 0 only for rows that kept no key; a NaN l (NaN input) must reach O, not pass for 0.
    has = l_i != 0.0
    inv = dv / tl.where(has, l_i, 1.0)
    out = tl.where(has[:, None], acc * inv[:, None], 0.0)
    log2_sum = tl.where(has, m_i, 0.0) * c + tl.math.log2(tl.where(has, l_i, 1.0))
    lse = tl.where(has, log2_sum * 0.6931471805599453, float("-inf"))
    # A negative (or NaN) c breaks the max-based softmax: poison the rows instead.
    ok = c >= 0.0
    out = tl.where(ok, out, float("nan"))
    lse = tl.where(ok, lse, float("nan"))
    if EXACT_CAST and OUT_BF16:
        out = _round_bf16(out)
    o_ptrs = Out + b * sob + h * soh + rows[:, None] * som + offs_dv[None, :] * sod
    tl.store(
        o_ptrs, out.to(Out.dtype.element_ty), mask=(rows[:, None] < NQ) & (offs_dv[None, :] < DV)
    )
    tl.store(LSE + b * slb + h * slh + rows * slm, lse, mask=rows < NQ)


@triton.jit
def _key_major(X, Y, H, N, W, sxb, sxh, sxn, sxd, BLOCK: tl.constexpr):
    """Y[b, h] = X[b, h]ᵀ: a (B, H, N, W) tensor copied to a contiguous (B, H, W, N) one, tile
    by tile (the transpose goes through shared memory, so both sides stay coalesced)."""
    pid_bh = tl.program_id(2)
    rn = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    rw = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    src = X + (pid_bh // H) * sxb + (pid_bh % H) * sxh + rn[:, None] * sxn + rw[None, :] * sxd
    x = tl.load(src, mask=(rn[:, None] < N) & (rw[None, :] < W))
    dst = Y + pid_bh.to(tl.int64) * W * N + rw[:, None] * N + rn[None, :]
    tl.store(dst, tl.trans(x), mask=(rw[:, None] < W) & (rn[None, :] < N))


# ---------------------------------------------------------------------------------------------
# Launcher


def key_contiguous(v: Any) -> Any:
    """``v`` (B, H, N, dv) as a view of a contiguous (B, H, dv, N) tensor: same values, the key
    axis contiguous (what the fp8 P·V product wants on Hopper). One read and one write of V."""
    import torch

    bsz, h, n, w = v.shape
    out = torch.empty((bsz, h, w, n), dtype=v.dtype, device=v.device)
    grid = (triton.cdiv(n, 64), triton.cdiv(w, 64), bsz * h)
    _key_major[grid](v, out, h, n, w, *v.stride(), BLOCK=64, num_warps=4)
    return out.transpose(-1, -2)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


class Fp8Config(NamedTuple):
    """One launch configuration: tile sizes, warps, pipeline stages; ``exact_cast`` rounds P
    (and bf16 outputs) in fp32 arithmetic before the cast (the interpreter's default, whose
    own casts round wrongly; a GPU gives the same bits either way)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    exact_cast: bool = False
    chunk: int = 0  # fp32 promotion of the tensor-core sums every `chunk` products (0: none)
    acc_in_dot: bool = True  # the rescaled accumulator is the P·V product's addend


# Hopper, by head-dim bucket and causality (fp8 tensor-core products want key blocks of a
# multiple of 32): the d = 128 entries won the sweep of benchmarks/fp8_check.py on an H100
# (N = 4K, key-contiguous V: 679 TFLOP/s non-causal, 571 causal; 128×128 tiles with 8 warps
# were 2 % behind non-causal, 256-row tiles 6 % or more); d = 64 and 256 copy them (untuned).
_HOPPER: dict[tuple[int, bool], Fp8Config] = {
    (64, False): Fp8Config(128, 64, 4, 3),
    (64, True): Fp8Config(128, 128, 8, 3),
    (128, False): Fp8Config(128, 64, 4, 3),
    (128, True): Fp8Config(128, 128, 8, 3),
    (256, False): Fp8Config(128, 64, 8, 2),
    (256, True): Fp8Config(128, 64, 8, 2),
}


def fp8_launch_config(q: Any, v: Any, *, causal: bool) -> Fp8Config:
    """The default configuration for these tensors: 32×32 tiles under the interpreter (its cost
    is per tile operation), the Hopper table on sm_90, 64×64 tiles with 4 warps elsewhere."""
    if _interpreting() or q.device.type != "cuda":
        return Fp8Config(32, 32, 4, 1, exact_cast=True)
    import torch

    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return Fp8Config(64, 64, 4, 2)
    d = max(q.shape[3], v.shape[3])
    bucket = 64 if d <= 64 else (128 if d <= 128 else 256)
    return _HOPPER[(bucket, bool(causal))]


def launch_fp8(q, k, v, descales, *, causal, scale, out_dtype, config=None):
    """Launch on arguments :func:`flash_attention_fp8` has checked (``descales`` a triple of
    fp32 ``(B, Hk)`` tensors or ``None``); ``config`` overrides the launch configuration
    (tuning). Returns ``(O, LSE)``."""
    import torch

    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    o = torch.empty((bsz, hq, nq, dv), dtype=out_dtype, device=q.device)
    lse = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    cfg = fp8_launch_config(q, v, causal=causal) if config is None else config
    ptrs, strides = [], []
    for t in descales:
        ptrs.append(lse if t is None else t)
        strides.extend((0, 0) if t is None else t.stride())
    grid = (triton.cdiv(nq, cfg.block_m), bsz * hq)
    _flash_fp8_fwd[grid](
        q, k, v, o, lse, *ptrs,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(), *lse.stride(), *strides,
        hq, hk, nq, nk, d, dv, float(scale) * _LOG2E,
        HAS_DQ=descales[0] is not None, HAS_DK=descales[1] is not None,
        HAS_DV=descales[2] is not None, CAUSAL=bool(causal),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_D=max(32, triton.next_power_of_2(d)), BLOCK_DV=max(32, triton.next_power_of_2(dv)),
        EXACT_CAST=cfg.exact_cast, OUT_BF16=out_dtype == torch.bfloat16, CHUNK=cfg.chunk,
        ACC_IN_DOT=cfg.acc_in_dot,
        num_warps=cfg.warps, num_stages=cfg.stages,
    )  # fmt: skip
    return o, lse


def _check_descale(name: str, t: Any, bsz: int, hk: int, device: Any) -> None:
    import torch

    if t is None:
        return
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != (bsz, hk):
        raise ValueError(
            f"{name} must be a float32 tensor of shape (batch, kv_heads) = ({bsz}, {hk}), got "
            f"{type(t).__name__} {tuple(getattr(t, 'shape', ()))}; a scalar descale s is "
            f"torch.full(({bsz}, {hk}), s)"
        )
    if t.dtype != torch.float32 or t.device != device:
        raise ValueError(
            f"{name} must be float32 on {device} ({name}.float().to(q.device)), got {t.dtype} on "
            f"{t.device}"
        )


def _check(q, k, v, scale, out_dtype) -> float:
    import torch

    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            raise ValueError(f"{name} must be a 4-D torch.Tensor (batch, heads, seq, head_dim)")
        if x.dtype != torch.float8_e4m3fn:
            raise ValueError(
                f"{name} is {x.dtype}: quantize it to torch.float8_e4m3fn with a descale "
                f"(x8 = (x / s).to(torch.float8_e4m3fn), descale = s)"
            )
    if not (q.device == k.device == v.device):
        raise ValueError("q, k and v must be on the same device")
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"tensors are on {q.device}: the kernel needs CUDA, or TRITON_INTERPRET=1 set "
            "before importing triton to run it on the CPU (slow)"
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
    if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"out_dtype must be torch.bfloat16, float16 or float32, got {out_dtype}")
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if not (math.isfinite(sc) and sc >= 0):
        raise ValueError(f"scale must be finite and >= 0 (default 1/sqrt(d)), got {scale}")
    return sc


def flash_attention_fp8(
    q: Any,
    k: Any,
    v: Any,
    *,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    causal: bool = False,
    scale: float | None = None,
    out_dtype: Any = None,
    return_lse: bool = False,
) -> Any:
    """FP8 forward: ``O = softmax(scale·(q·dq)(k·dk)ᵀ + mask)·(v·dv)`` (and ``LSE``).

    ``q``: ``(B, Hq, Nq, d)``, ``k``: ``(B, Hk, Nk, d)``, ``v``: ``(B, Hk, Nk, dv)``, all
    ``torch.float8_e4m3fn`` on one CUDA device (or the CPU under ``TRITON_INTERPRET=1``), any
    strides (a key-contiguous V skips an on-chip transpose on Hopper); ``Hq`` a multiple of
    ``Hk``; ``d, dv ≤ 256``. ``descale_q/k/v``: float32 ``(B, Hk)`` tensors on that device,
    ``≥ 0`` (``None``: 1); query head h uses kv-head ``h // (Hq/Hk)``'s descale_q, as in
    FlashAttention-3. ``scale`` (≥ 0) defaults to ``1/sqrt(d)``. The arithmetic is the
    "flash-fp8" class of the module docstring. Returns ``O`` in ``out_dtype`` (default
    bfloat16), or ``(O, LSE)`` with the natural-log LSE in float32 if ``return_lse``.
    """
    import torch

    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    sc = _check(q, k, v, scale, out_dtype)
    bsz, hk = k.shape[0], k.shape[1]
    for name, t in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v)):
        _check_descale(name, t, bsz, hk, q.device)
    if q.device.type == "cuda" and v.stride(2) != 1 and v.shape[2] > 1:
        # Key-contiguous V for the K-major fp8 P·V product: one pass over V (up to 18 % of the
        # time on an H100, most at N = 1K) against a 2.7x slower on-chip transpose.
        v = key_contiguous(v)
    o, lse = launch_fp8(
        q, k, v, (descale_q, descale_k, descale_v), causal=causal, scale=sc, out_dtype=out_dtype
    )
    return (o, lse) if return_lse else o
