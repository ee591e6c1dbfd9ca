"""Varlen kernels with a backward, as a user would write them outside the flashcheck package.

``varlen_autograd``: a correct fp32 torch forward per sequence, differentiated by torch
autograd (``backward="autograd"``). ``varlen_bwd_neighbour_row``: the same forward with a
backward function whose dK and dV sum over one query row past the sequence's end (the first
row of the next sequence), the off-by-one a dK/dV program's row loop makes when it runs to
``cu_seqlens_q[b + 1] + 1``; its dQ is right. ``varlen_bwd_skips_keyless``: dQ left as
allocated (uninitialised) for the rows of a sequence with no keys.
"""

import torch

import flashcheck


def _attend(q, k, v, causal, scale):
    """fp32 attention of one sequence, ``q (Nq, Hq, d)``, ``k``/``v`` ``(Nk, Hk, ·)`` with
    GQA; causal bottom-right aligned."""
    nq, hq, d = q.shape
    nk, hk, _ = v.shape
    rep = hq // hk
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(rep, 1).transpose(0, 1)
    vf = v.float().repeat_interleave(rep, 1).transpose(0, 1)
    s = (qf @ kf.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    keep = torch.ones(nq, nk, dtype=torch.bool)
    if causal:
        keep = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
    # A row that keeps no key gets O = 0 (and no gradient), not softmax's NaN.
    has = keep.any(-1, keepdim=True)
    s = s.masked_fill(~keep, float("-inf")).masked_fill(~has, 0.0)
    return ((torch.softmax(s, dim=-1) * has) @ vf).transpose(0, 1).to(q.dtype)


def _varlen_autograd(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False, scale=None
):
    parts = []
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        parts.append(_attend(q[q0:q1], k[k0:k1], v[k0:k1], causal, scale))
    return torch.cat(parts, 0)


def _grads(q, k, v, do, causal, scale):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    with torch.enable_grad():
        o = _attend(q, k, v, causal, scale)
        return torch.autograd.grad(o, (q, k, v), do)


def _bwd_skips_keyless(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, do, *, causal=False, scale=None
):
    # The bug: dQ is allocated uninitialised (7.0 stands for what memory held) and a sequence
    # with no keys is skipped, so its rows keep it.
    dq, dk, dv = torch.full_like(q, 7.0), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        if k1 > k0:
            g = _grads(q[q0:q1], k[k0:k1], v[k0:k1], do[q0:q1], causal, scale)
            dq[q0:q1], dk[k0:k1], dv[k0:k1] = g
    return dq, dk, dv


def _bwd_neighbour_row(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    do,
    *,
    causal=False,
    scale=None,
):
    dq, dk, dv = (torch.zeros_like(x) for x in (q, k, v))
    for b in range(cu_seqlens_q.numel() - 1):
        q0, q1 = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1])
        k0, k1 = int(cu_seqlens_k[b]), int(cu_seqlens_k[b + 1])
        ks, vs = k[k0:k1], v[k0:k1]
        dq[q0:q1] = _grads(q[q0:q1], ks, vs, do[q0:q1], causal, scale)[0]
        # The bug: dK and dV take the next sequence's first query row as well.
        end = min(q1 + 1, q.shape[0])
        _, dk[k0:k1], dv[k0:k1] = _grads(q[q0:end], ks, vs, do[q0:end], causal, scale)
    return dq, dk, dv


varlen_autograd = flashcheck.kernel(
    _varlen_autograd,
    name="user_varlen_grads:varlen_autograd",
    layout="varlen",
    backward="autograd",
)
varlen_bwd_neighbour_row = flashcheck.kernel(
    _varlen_autograd,
    name="user_varlen_grads:varlen_bwd_neighbour_row",
    layout="varlen",
    backward=_bwd_neighbour_row,
)
varlen_bwd_skips_keyless = flashcheck.kernel(
    _varlen_autograd,
    name="user_varlen_grads:varlen_bwd_skips_keyless",
    layout="varlen",
    backward=_bwd_skips_keyless,
)
