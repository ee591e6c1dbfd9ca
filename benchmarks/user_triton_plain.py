"""A plain Triton attention kernel as a user might write it, for the precision floor's GPU check
(benchmarks/gpu_precision_floor.sh): one program per (batch, head), the whole score matrix in
one tile, ``tl.dot`` at its default input precision. For fp32 inputs that default is tf32 on
every NVIDIA GPU since Ampere, so the products carry 10-bit mantissas, which nothing in the
source says.

Known limits: up to 128 queries and keys and head dims up to 128 (one tile); no windows, no
explicit masks. It is not part of flashcheck; the package never imports it.
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _attention(
    Q, K, V, Out,
    sqb, sqh, sqm, sqd,
    skb, skh, skn, skd,
    svb, svh, svn, svd,
    sob, soh, som, sod,
    H, GROUP, NQ, NK, D, DV, scale,
    CAUSAL: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    hk = h // GROUP
    rm = tl.arange(0, BM)
    rn = tl.arange(0, BN)
    rd = tl.arange(0, BD)
    rdv = tl.arange(0, BDV)
    q = tl.load(
        Q + b * sqb + h * sqh + rm[:, None] * sqm + rd[None, :] * sqd,
        mask=(rm[:, None] < NQ) & (rd[None, :] < D),
        other=0.0,
    )
    k = tl.load(
        K + b * skb + hk * skh + rn[:, None] * skn + rd[None, :] * skd,
        mask=(rn[:, None] < NK) & (rd[None, :] < D),
        other=0.0,
    )
    v = tl.load(
        V + b * svb + hk * svh + rn[:, None] * svn + rdv[None, :] * svd,
        mask=(rn[:, None] < NK) & (rdv[None, :] < DV),
        other=0.0,
    )
    s = tl.dot(q, tl.trans(k)) * scale  # the default precision: tf32 for fp32 inputs
    keep = (rn[None, :] < NK) & (rm[:, None] >= 0)
    if CAUSAL:
        keep = keep & (rn[None, :] <= rm[:, None] + NK - NQ)
    s = tl.where(keep, s, float("-inf"))
    m = tl.max(s, 1)
    m = tl.where(m == float("-inf"), 0.0, m)
    p = tl.exp(s - m[:, None])
    den = tl.sum(p, 1)
    o = tl.dot(p.to(v.dtype), v) / tl.where(den == 0.0, 1.0, den)[:, None]
    o = tl.where((den > 0.0)[:, None], o, 0.0)
    tl.store(
        Out + b * sob + h * soh + rm[:, None] * som + rdv[None, :] * sod,
        o.to(Out.dtype.element_ty),
        mask=(rm[:, None] < NQ) & (rdv[None, :] < DV),
    )


def attn(q, k, v, *, causal=False, scale=None):
    """``softmax(scale·q·kᵀ)·v`` for ``(B, H, N, d)`` CUDA tensors, up to 128 queries, keys and
    head dims."""
    b, h, nq, d = q.shape
    hk, nk, dv = k.shape[1], k.shape[2], v.shape[3]
    if max(nq, nk, d, dv) > 128:
        raise ValueError("this kernel takes up to 128 queries, keys and head dims")
    scale = 1 / math.sqrt(d) if scale is None else float(scale)
    o = torch.empty((b, h, nq, dv), dtype=q.dtype, device=q.device)

    def tile(n):
        return max(16, triton.next_power_of_2(n))

    _attention[(b * h,)](
        q, k, v, o, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        h, h // hk, nq, nk, d, dv, scale,
        CAUSAL=bool(causal), BM=tile(nq), BN=tile(nk), BD=tile(d), BDV=tile(dv),
    )  # fmt: skip
    return o
