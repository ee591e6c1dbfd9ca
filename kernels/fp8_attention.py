"""Pure-numpy FP8 attention that performs exactly FlashAttention-3's FP8 forward arithmetic.

The flash-fp8 class, per batch ``b``, query head ``h`` (key/value head ``g``) and key block::

    S      = q8·k8ᵀ                 products exact in fp32 (≤ 4+4 significant bits), summed in
                                    fp32 sequentially over d
    c      = fl(fl(fl(scale·log2 e)·descale_q)·descale_k)     one constant per (b, h)
    t      = fl(S·c)
    m_new  = max(m, rowmax t),  α = exp2(fl(m − m_new)),  p = exp2(fl(t − m_new))   (fp32)
    l      = fl(α·l + Σ_j p_j)      from the unquantized p
    P8     = RN_e4m3(p)             p ∈ [0, 1]: weights below 2^-10 flush to zero
    acc    = fl(α·acc + P8·v8)      products exact, fp32 accumulation sequential over keys
    O      = RN_out(fl(acc·fl(fl(1/l)·descale_v)))              one rounding into the output
    LSE    = fl(fl(m + log2 l)·ln 2)                             natural log, fp32

``exp2`` is evaluated in float64 and rounded to fp32. Options that plant the bugs the harness
must catch: ``p_format="e5m2"`` (P quantized to e5m2), ``accum="fp16"``/``"bf16"`` (P·V
accumulated below fp32) and ``double_descale`` (a descale of q, k or v applied twice).
:func:`naive_fp8_attention` is the FP8 baseline of FlashAttention-3's Table 3: standard
attention on the same inputs, the softmax normalised in fp32 before P (now ``p/l``, so more of
it flushes) is quantized to e4m3. This module imports nothing from the harness.
"""

from __future__ import annotations

import math
from typing import Any

import ml_dtypes
import numpy as np

__all__ = ["FP8_DTYPES", "flash_fp8_attention", "naive_fp8_attention", "round_fp8"]

FP8_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
_ACCUM = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}
_OUT = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16, "fp32": np.float32}
_F32 = np.float32


def round_fp8(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` (float32) rounded to nearest-even in ``fmt``, saturating at ±448 for e4m3, as
    float32. The float32 → fp8 conversion of ml_dtypes rounds once (float32 is its source)."""
    y = np.asarray(x, dtype=np.float32)
    if fmt == "e4m3":
        y = np.clip(y, -448.0, 448.0)  # e4m3fn has no inf: the cast saturates
    return y.astype(FP8_DTYPES[fmt]).astype(np.float32)


def _descale(d: Any, shape: tuple[int, int]) -> np.ndarray:
    if d is None:
        return np.ones(shape, dtype=np.float32)
    arr = np.asarray(d.detach().cpu().numpy() if hasattr(d, "detach") else d)
    return arr.astype(np.float32).reshape(shape)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch float8 tensor: through its bits
        import torch

        arr = x.detach().cpu().contiguous()
        fmt = "e4m3" if arr.dtype == torch.float8_e4m3fn else "e5m2"
        return arr.view(torch.uint8).numpy().view(FP8_DTYPES[fmt])
    return np.asarray(x)


def flash_fp8_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    causal: bool = False,
    scale: float | None = None,
    block_k: int = 64,
    p_format: str = "e4m3",
    accum: str = "fp32",
    out: str = "bf16",
    double_descale: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(O, LSE)`` of FP8 ``q (B, Hq, Nq, d)``, ``k (B, Hk, Nk, d)``, ``v (B, Hk, Nk, dv)``
    (numpy float8 arrays or torch float8 tensors) with descales ``(B, Hk)`` (default 1), by
    the module docstring's arithmetic. Causal masks are aligned bottom-right. ``O`` is a
    numpy array of ``out``'s dtype, ``LSE`` float32 ``(B, Hq, Nq)``."""
    if p_format not in FP8_DTYPES or accum not in _ACCUM or out not in _OUT:
        raise ValueError("p_format: e4m3|e5m2; accum: fp32|fp16|bf16; out: bf16|fp16|fp32")
    if double_descale not in (None, "q", "k", "v"):
        raise ValueError("double_descale must be None, 'q', 'k' or 'v'")
    q8, k8, v8 = (_to_numpy(x).astype(np.float32) for x in (q, k, v))
    bsz, hq, nq, d = q8.shape
    hk = k8.shape[1]
    ds = {
        n: _descale(x, (bsz, hk))
        for n, x in zip("qkv", (descale_q, descale_k, descale_v), strict=True)
    }
    if double_descale is not None:  # the planted bug: the factor applied a second time
        ds[double_descale] = (ds[double_descale] * ds[double_descale]).astype(_F32)
    tau = 1.0 / math.sqrt(d) if scale is None else float(scale)
    c0 = _F32(tau * (1.0 / math.log(2.0)))
    o = np.zeros((bsz, hq, nq, v8.shape[3]), dtype=_OUT[out])
    lse = np.zeros((bsz, hq, nq), dtype=_F32)
    for b in range(bsz):
        for h in range(hq):
            g = h // (hq // hk)
            c = _F32(_F32(c0 * ds["q"][b, g]) * ds["k"][b, g])
            acc, ell, m = _head(q8[b, h], k8[b, g], v8[b, g], c, causal, block_k, p_format, accum)
            with np.errstate(divide="ignore", invalid="ignore"):
                inv = _F32(1.0) / ell
            fac = (inv * ds["v"][b, g]).astype(_F32)
            res = (acc * fac[:, None]).astype(_F32)
            res[ell == 0] = 0.0  # a row that keeps no key: O = 0, LSE = -inf
            o[b, h] = res.astype(_OUT[out])
            with np.errstate(divide="ignore"):
                log2l = np.log2(ell.astype(np.float64)).astype(_F32)
            lse[b, h] = np.where(ell > 0, (m + log2l) * _F32(math.log(2.0)), -np.inf)
    return o, lse


def _head(q, k, v, c, causal, block_k, p_format, accum):
    """One head's unnormalised ``acc``, row sums ``l`` and running max ``m`` (fp32)."""
    nq, nk = q.shape[0], k.shape[0]
    adt = _ACCUM[accum]
    acc = np.zeros((nq, v.shape[1]), dtype=adt)
    ell = np.zeros(nq, dtype=_F32)
    m = np.full(nq, -np.inf, dtype=_F32)
    rows = np.arange(nq)[:, None]
    for j0 in range(0, nk, block_k):
        kb, vb = k[j0 : j0 + block_k], v[j0 : j0 + block_k]
        s = np.zeros((nq, kb.shape[0]), dtype=_F32)
        for t in range(q.shape[1]):  # sequential over d; the products are exact in fp32
            s = s + q[:, t, None] * kb[None, :, t]
        t_ = (s * c).astype(_F32)
        if causal:
            t_ = np.where(np.arange(j0, j0 + kb.shape[0])[None] <= rows + nk - nq, t_, -np.inf)
        m_new = np.maximum(m, t_.max(axis=1)).astype(_F32)
        live = np.isfinite(m_new)
        with np.errstate(invalid="ignore"):
            alpha = np.where(live, np.exp2((m - m_new).astype(np.float64)), 0.0).astype(_F32)
            p = np.where(live[:, None], np.exp2((t_ - m_new[:, None]).astype(np.float64)), 0.0)
        p = p.astype(_F32)
        p8 = round_fp8(p, p_format)
        part = np.zeros(nq, dtype=_F32)
        for j in range(p.shape[1]):
            part = part + p[:, j]
        ell = (alpha * ell + part).astype(_F32)
        acc = (acc.astype(_F32) * alpha[:, None]).astype(adt)
        for j in range(p.shape[1]):  # P8·V: exact products, sequential accumulation
            acc = (acc + (p8[:, j, None] * vb[None, j]).astype(adt)).astype(adt)
        m = np.where(live, m_new, m)
    return acc.astype(_F32), ell, m


def naive_fp8_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
    causal: bool = False,
    scale: float | None = None,
) -> np.ndarray:
    """Standard FP8 attention: ``S = q8·k8ᵀ`` (fp32, sequential over d) times
    ``fl(fl(scale·descale_q)·descale_k)``, softmax in fp32 (``p = e/l``), ``P8 = RN_e4m3(p)``,
    ``O = RN_bf16(fl(P8·v8)·descale_v)`` with fp32 accumulation over the keys in order."""
    q8, k8, v8 = (_to_numpy(x).astype(np.float32) for x in (q, k, v))
    bsz, hq, nq, d = q8.shape
    hk, nk = k8.shape[1], k8.shape[2]
    ds = {
        n: _descale(x, (bsz, hk))
        for n, x in zip("qkv", (descale_q, descale_k, descale_v), strict=True)
    }
    tau = _F32(1.0 / math.sqrt(d) if scale is None else scale)
    o = np.zeros((bsz, hq, nq, v8.shape[3]), dtype=ml_dtypes.bfloat16)
    keep = np.arange(nk)[None, :] <= np.arange(nq)[:, None] + nk - nq if causal else True
    for b in range(bsz):
        for h in range(hq):
            g = h // (hq // hk)
            s = np.zeros((nq, nk), dtype=_F32)
            for t in range(d):
                s = s + q8[b, h][:, t, None] * k8[b, g][None, :, t]
            s = np.where(keep, s * _F32(_F32(tau * ds["q"][b, g]) * ds["k"][b, g]), -np.inf)
            with np.errstate(invalid="ignore", divide="ignore"):
                e = np.exp((s - s.max(axis=1, keepdims=True)).astype(np.float64)).astype(_F32)
                p8 = round_fp8(e / e.sum(axis=1, keepdims=True, dtype=_F32), "e4m3")
            acc = np.zeros((nq, v8.shape[3]), dtype=_F32)
            for j in range(nk):
                acc = acc + p8[:, j, None] * v8[b, g][None, j]
            o[b, h] = np.nan_to_num(acc * ds["v"][b, g]).astype(ml_dtypes.bfloat16)
    return o
