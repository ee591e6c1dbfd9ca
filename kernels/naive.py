"""Standard attention that materialises S and P: the same-precision baselines.

Algorithm (per batch and head; masks as in :mod:`flashcheck.kernels.recurrence`):

    S = (scale·q) kᵀ,   P = softmax(S),   O = P V,   LSE = m + log Σ exp(S − m)

Two implementations of the *same* arithmetic, the one FlashAttention's own tests use as the
"same-precision" reference (``out_pt``): the scale is applied to q in the input format, the
two GEMMs accumulate in fp32 and store S and O in the input format, and softmax runs in fp32 and
stores P in the input format before P·V.

- :func:`naive_numpy` emulates it exactly (sequential fp32 accumulation, every store rounded
  to nearest-even), so its error is reproducible on any machine;
- :func:`naive_torch` runs it with torch eager ops on any device (its GEMM accumulation order is
  the library's);
- ``naive_numpy(..., precision="fp64")`` computes everything in float64 (a fully fp64 variant).

Known limits: memory is O(Nq·Nk) per head by construction; forward only.
This module imports nothing from the harness.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from flashcheck.kernels.recurrence import FORMAT_DTYPES, keep_mask, sequential_dot

__all__ = ["ARITHMETIC", "naive_numpy", "naive_torch"]

ARITHMETIC = "naive-same-precision"


def naive_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    precision: str = "same",
) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention with the declared same-precision arithmetic (or all-fp64).

    ``precision='same'``: input-format storage of scaled q, S, P and O; fp32 accumulation and
    softmax. ``precision='fp64'``: every step in float64, O returned as float64. Returns
    ``(O, LSE)``; fully masked rows give ``O = 0``, ``LSE = −inf``.
    """
    if precision not in ("same", "fp64"):
        raise ValueError("precision must be 'same' or 'fp64'")
    din = q.dtype
    if din not in FORMAT_DTYPES.values() or k.dtype != din or v.dtype != din:
        raise ValueError(f"q, k, v must share one of {sorted(FORMAT_DTYPES)}'s dtypes, got {din}")
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    if k.shape[:3] != v.shape[:3] or k.shape[3] != d or hq % hk:
        raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")
    store = np.dtype(np.float64) if precision == "fp64" else din
    acc = np.dtype(np.float64) if precision == "fp64" else np.dtype(np.float32)
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    m_full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    out = np.zeros((bsz, hq, nq, dv), dtype=store)
    lse = np.full((bsz, hq, nq), -np.inf, dtype=acc)
    rows, cols = np.arange(nq), np.arange(nk)
    for b in range(bsz):
        for h in range(hq):
            kh, vh = k[b, h // (hq // hk)], v[b, h // (hq // hk)]
            mk = None if m_full is None else m_full[b, h]
            keep = keep_mask(nq, nk, rows, cols, causal, window, mk)
            qs = (q[b, h].astype(acc) * acc.type(sc)).astype(store)
            s = sequential_dot(qs, kh, acc).astype(store).astype(acc)
            s = np.where(keep, s, acc.type(-np.inf))
            m = s.max(axis=1)
            has = m != -np.inf  # NaN/+inf maxima propagate; only fully masked rows are 0
            m_safe = np.where(has, m, acc.type(0))
            e = np.exp((s - m_safe[:, None]).astype(np.float64)).astype(acc)
            total = np.zeros(nq, dtype=acc)
            for j in range(nk):
                total = total + e[:, j]
            safe_t = np.where(has, total, acc.type(1))
            p = (e / safe_t[:, None]).astype(store)
            o = sequential_dot(p, vh.T, acc).astype(store)
            out[b, h] = np.where(has[:, None], o, store.type(0))
            with np.errstate(divide="ignore"):
                lg = np.log(safe_t.astype(np.float64))
            lse[b, h] = np.where(has, (m_safe.astype(np.float64) + lg).astype(acc), -np.inf)
    return out, lse


def naive_torch(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
) -> tuple[Any, Any]:
    """The same-precision baseline in torch eager ops, on the inputs' device and dtype."""
    import torch

    bsz, hq, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    if hq % hk:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hk})")
    rep = hq // hk
    kk = k.repeat_interleave(rep, dim=1)
    vv = v.repeat_interleave(rep, dim=1)
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    s = torch.matmul(q * sc, kk.transpose(-1, -2)).float()
    m = None
    if mask is not None:
        m = np.broadcast_to(torch.as_tensor(mask).cpu().numpy(), (bsz, hq, nq, nk))
    keep_np = np.stack([
        np.stack([keep_mask(nq, nk, np.arange(nq), np.arange(nk), causal, window,
                        None if m is None else m[b, h]) for h in range(hq)])
        for b in range(bsz)
    ])  # fmt: skip
    keep = torch.from_numpy(keep_np).to(q.device)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    has = keep.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(has, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(keep, p, torch.zeros_like(p)).to(q.dtype)
    o = torch.matmul(p, vv)
    return o, lse
