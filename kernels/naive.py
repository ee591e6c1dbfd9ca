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
- ``naive_numpy(..., precision="fp64")`` computes everything in float64 (a fully fp64 variant);
- :func:`naive_numpy_backward` emulates exactly the gradients torch autograd computes through
  :func:`naive_torch` (the naive class's backward: ``dV = Pᵀ·dO``, ``dP = dO·Vᵀ``, the fp32
  softmax backward ``dS = P∘(dP − Σ_j P·dP)``, ``dQ = scale·dS·K``, ``dK = dSᵀ·(scale·q)``, each
  GEMM accumulated in fp32 and stored in the input format; see its docstring for every rounding).
  ``naive_torch`` itself is differentiable: fully masked rows get zero gradients, not NaN.

Known limits: memory is O(Nq·Nk) per head by construction.
This module imports nothing from the harness.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from flashcheck.kernels.recurrence import FORMAT_DTYPES, keep_mask, sequential_dot

__all__ = ["ARITHMETIC", "naive_numpy", "naive_numpy_backward", "naive_torch"]

ARITHMETIC = "naive-same-precision"


def _check(q: Any, k: Any, v: Any, precision: str) -> None:
    if precision not in ("same", "fp64"):
        raise ValueError("precision must be 'same' or 'fp64'")
    din = q.dtype
    if din not in FORMAT_DTYPES.values() or k.dtype != din or v.dtype != din:
        raise ValueError(f"q, k, v must share one of {sorted(FORMAT_DTYPES)}'s dtypes, got {din}")
    if k.shape[:3] != v.shape[:3] or k.shape[3] != q.shape[3] or q.shape[1] % k.shape[1]:
        raise ValueError(f"incompatible shapes q {q.shape}, k {k.shape}, v {v.shape}")


def _softmax(qh, kh, keep, sc, store, acc, cap=None, sink=None):
    """One head's forward up to P: ``(qs, P32, has, m_safe, safe_t, extra)``, P32 in ``acc``.

    With ``cap``: ``s = fl(cap·fl(tanh(fl(s/cap))))`` on the fp32 scores (torch's
    ``cap * torch.tanh(s / cap)``). With ``sink`` (a float32 logit): a last column of the
    softmax that has no value row (gpt-oss's reference: concatenate, softmax, drop it).
    ``extra``: ``(th, p_sink)``, the tanh (or ``None``) and the sink's weight (or ``None``)."""
    qs = (qh.astype(acc) * acc.type(sc)).astype(store)
    s = sequential_dot(qs, kh, acc).astype(store).astype(acc)
    th = None
    if cap is not None:
        th = np.tanh((s / acc.type(cap)).astype(acc).astype(np.float64)).astype(acc)
        s = (acc.type(cap) * th).astype(acc)
    s = np.where(keep, s, acc.type(-np.inf))
    m = s.max(axis=1)
    if sink is not None:
        m = np.maximum(m, acc.type(sink))
    has = m != -np.inf  # NaN/+inf maxima propagate; only fully masked rows are 0
    m_safe = np.where(has, m, acc.type(0))
    e = np.exp((s - m_safe[:, None]).astype(np.float64)).astype(acc)
    total = np.zeros(len(qh), dtype=acc)
    for j in range(kh.shape[0]):
        total = total + e[:, j]
    e_sink = None
    if sink is not None:
        e_sink = np.exp((acc.type(sink) - m_safe).astype(np.float64)).astype(acc)
        total = (total + e_sink).astype(acc)
    safe_t = np.where(has, total, acc.type(1))
    p_sink = None if e_sink is None else (e_sink / safe_t).astype(acc)
    return qs, e / safe_t[:, None], has, m_safe, safe_t, (th, p_sink)


def _options(softcap, sinks, hq):
    """The cap (``None`` when off) and one sink per head (``None`` each without sinks)."""
    if sinks is None:
        return softcap or None, [None] * hq
    sig = np.asarray(sinks, dtype=np.float32)
    if sig.shape != (hq,):
        raise ValueError(f"sinks must hold one float32 logit per query head, shape ({hq},)")
    return softcap or None, [float(x) for x in sig]


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
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Naive attention with the declared same-precision arithmetic (or all-fp64).

    ``precision='same'``: input-format storage of scaled q, S, P and O; fp32 accumulation and
    softmax. ``precision='fp64'``: every step in float64, O returned as float64. Returns
    ``(O, LSE)``; fully masked rows give ``O = 0``, ``LSE = −inf`` (``σ_h`` with sinks).
    ``softcap`` and ``sinks`` as :func:`_softmax` applies them (fp32 on the fp32 scores).
    """
    _check(q, k, v, precision)
    din = q.dtype
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    store = np.dtype(np.float64) if precision == "fp64" else din
    acc = np.dtype(np.float64) if precision == "fp64" else np.dtype(np.float32)
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    m_full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    out = np.zeros((bsz, hq, nq, dv), dtype=store)
    lse = np.full((bsz, hq, nq), -np.inf, dtype=acc)
    rows, cols = np.arange(nq), np.arange(nk)
    cap, sink = _options(softcap, sinks, hq)
    for b in range(bsz):
        for h in range(hq):
            kh, vh = k[b, h // (hq // hk)], v[b, h // (hq // hk)]
            mk = None if m_full is None else m_full[b, h]
            keep = keep_mask(nq, nk, rows, cols, causal, window, mk)
            _, p32, has, m_safe, safe_t, _ = _softmax(
                q[b, h], kh, keep, sc, store, acc, cap, sink[h]
            )
            p = p32.astype(store)
            o = sequential_dot(p, vh.T, acc).astype(store)
            out[b, h] = np.where(has[:, None], o, store.type(0))
            with np.errstate(divide="ignore"):
                lg = np.log(safe_t.astype(np.float64))
            lse[b, h] = np.where(has, (m_safe.astype(np.float64) + lg).astype(acc), -np.inf)
    return out, lse


def naive_numpy_backward(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    do: np.ndarray,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: np.ndarray | None = None,
    scale: float | None = None,
    precision: str = "same",
    softcap: float | None = None,
    sinks: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    """The gradients torch autograd computes through :func:`naive_torch`, emulated exactly.

    ``do``: ``(B, Hq, Nq, dv)`` in the inputs' dtype F. Recomputes the forward as
    :func:`naive_numpy` does (``qs = fl_F(fl32(q·fl32(scale)))``, ``S = fl_F(qs·kᵀ)`` as fp32,
    ``P32`` the fp32 softmax, ``P_F = fl_F(P32)``); then per batch and query head, every dot
    sequential over its inner index in fp32 (each product rounded first):

    - ``dV_h = fl_F(P_Fᵀ·dO)``; ``dP = fl32(fl_F(dO·Vᵀ))`` (the matmul's backward stores F; the
      ``.to(F)`` cast's backward widens), 0 where masked;
    - softmax backward in fp32: ``D_i = Σ_j fl32(P32_ij·dP_ij)`` in order of j,
      ``dS32 = fl32(P32·fl32(dP − D))``, 0 where masked; ``dS_F = fl_F(dS32)`` (the
      ``.float()`` cast's backward);
    - ``dQs = fl_F(dS_F·K)``, ``dK_h = fl_F(dS_Fᵀ·qs)``; ``dq = fl_F(fl32(dQs·fl32(scale)))``
      (the backward of ``q*scale``);
    - GQA/MQA (the backward of ``repeat_interleave``, an expand): ``dK = fl_F(Σ_h dK_h)``,
      ``dV = fl_F(Σ_h dV_h)`` over the group's query heads in order, in fp32, rounded once.

    With ``softcap``: ``dS32 = fl32(fl32(fl32(dS32·cap)·fl32(1 − fl32(th·th)))/cap)`` (the
    backward of ``cap·tanh(s/cap)``) before the cast to F. With ``sinks``: the return gains
    ``dsinks`` ``(Hq,)`` float32, ``dσ_h = Σ fl32(−fl32(P_σ·D_i))`` accumulated in fp32 over
    batch and rows in order (torch's own reduction order may differ in the last bits).
    ``precision='fp64'``: every step in float64 (stores and accumulators), gradients float64.
    Fully masked rows give ``dq = 0`` and contribute nothing. Torch CPU differs from this in
    summation order only: its GEMMs block their fp32 accumulation, its softmax uses a vectorised
    ``exp``, multiplies by ``1/Σ`` and reduces ``D`` lane-wise; so it agrees within a few ulps
    of F, not bitwise.

    Longer than 80 lines: this docstring lists every rounding it emulates, and the loop keeps
    them in the order torch runs them.
    """
    _check(q, k, v, precision)
    din = q.dtype
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    if not isinstance(do, np.ndarray) or do.dtype != din or do.shape != (bsz, hq, nq, dv):
        raise ValueError(
            f"do must be a numpy array of the inputs' dtype {din} and shape (B, Hq, Nq, dv) = "
            f"{(bsz, hq, nq, dv)}, got {getattr(do, 'dtype', '')} {getattr(do, 'shape', '')}"
        )
    store = np.dtype(np.float64) if precision == "fp64" else din
    acc = np.dtype(np.float64) if precision == "fp64" else np.dtype(np.float32)
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    m_full = None if mask is None else np.broadcast_to(mask, (bsz, hq, nq, nk))
    dq = np.zeros((bsz, hq, nq, d), dtype=store)
    dk_acc = np.zeros((bsz, hk, nk, d), dtype=acc)
    dv_acc = np.zeros((bsz, hk, nk, dv), dtype=acc)
    rows, cols = np.arange(nq), np.arange(nk)
    zero = acc.type(0)
    cap, sink = _options(softcap, sinks, hq)
    dsinks = np.zeros(hq, dtype=acc)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(bsz):
            for h in range(hq):
                g = h // (hq // hk)
                kh, vh, doh = k[b, g], v[b, g], do[b, h]
                mk = None if m_full is None else m_full[b, h]
                keep = keep_mask(nq, nk, rows, cols, causal, window, mk)
                qs, p32, _, _, _, (th, p_sink) = _softmax(
                    q[b, h], kh, keep, sc, store, acc, cap, sink[h]
                )
                dvh = sequential_dot(p32.astype(store).T, doh.T, acc).astype(store)
                dp = sequential_dot(doh, vh, acc).astype(store).astype(acc)
                dp = np.where(keep, dp, zero)
                prod = (p32 * dp).astype(acc)
                dsum = np.zeros(nq, dtype=acc)
                for j in range(nk):
                    dsum = dsum + prod[:, j]
                ds32 = np.where(keep, (p32 * (dp - dsum[:, None])).astype(acc), zero)
                if th is not None:
                    grad = (1 - (th * th).astype(acc)).astype(acc)
                    ds32 = ((ds32 * acc.type(cap)).astype(acc) * grad).astype(acc)
                    ds32 = np.where(keep, (ds32 / acc.type(cap)).astype(acc), zero)
                if p_sink is not None:
                    for i in range(nq):
                        dsinks[h] = acc.type(dsinks[h] - (p_sink[i] * dsum[i]).astype(acc))
                dsf = ds32.astype(store)
                dqs = sequential_dot(dsf, kh.T, acc).astype(store)
                dkh = sequential_dot(dsf.T, qs.T, acc).astype(store)
                dq[b, h] = (dqs.astype(acc) * acc.type(sc)).astype(store)
                dk_acc[b, g] = dk_acc[b, g] + dkh.astype(acc)
                dv_acc[b, g] = dv_acc[b, g] + dvh.astype(acc)
    if sinks is not None:
        return (
            dq,
            dk_acc.astype(store),
            dv_acc.astype(store),
            dsinks.astype(np.promote_types(np.float32, acc)),
        )
    return dq, dk_acc.astype(store), dv_acc.astype(store)


def naive_torch(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
) -> tuple[Any, Any]:
    """The same-precision baseline in torch eager ops, on the inputs' device and dtype.

    ``softcap``: ``cap·tanh(s/cap)`` on the fp32 scores; ``sinks`` ``(Hq,)`` float32: a last
    softmax column per head with no value row (differentiable: ``sinks.grad`` is ``dσ``)."""
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
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        sig = torch.as_tensor(sinks, device=q.device).float().reshape(1, hq, 1, 1)
        s = torch.cat([s, sig.expand(bsz, hq, nq, 1)], dim=-1)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.softmax(s, dim=-1)[..., :-1]
        p = torch.where(keep, p, torch.zeros_like(p)).to(q.dtype)
        return torch.matmul(p, vv), lse
    lse = torch.logsumexp(s, dim=-1)
    has = keep.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(has, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(keep, p, torch.zeros_like(p)).to(q.dtype)
    o = torch.matmul(p, vv)
    return o, lse
