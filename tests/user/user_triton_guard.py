"""A user's Triton flash forward (from a new-user trial) whose epilogue writes
``where(l > 0, acc / l, 0)``: meant for rows that keep no key, it also turns every row a NaN
input reaches into zeros. Only a case whose NaN rows carry no ±inf input shows the bug
(benchmarks/RESULTS.md, "A user's second trial"). fp16, head dims 16/32/64, no GQA, dv == d.
Run it with TRITON_INTERPRET=1 on a CPU."""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd(Q, K, V, Out, sm, NQ, NK, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
         CAUSAL: tl.constexpr):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    rows = offs_m[:, None] < NQ
    q = tl.load(Q + bh * NQ * D + offs_m[:, None] * D + offs_d[None, :], mask=rows, other=0.0)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, D), tl.float32)
    for start in range(0, NK, BN):
        offs_n = start + tl.arange(0, BN)
        cols = offs_n[:, None] < NK
        at = bh * NK * D + offs_n[:, None] * D + offs_d[None, :]
        kk = tl.load(K + at, mask=cols, other=0.0)
        vv = tl.load(V + at, mask=cols, other=0.0)
        s = tl.dot(q, tl.trans(kk)).to(tl.float32) * sm
        valid = offs_n[None, :] < NK
        if CAUSAL:
            valid = valid & (offs_n[None, :] <= offs_m[:, None] + (NK - NQ))
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vv)
        m_i = m_new
    o = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)  # the bug: NaN > 0 is false
    out = Out + bh * NQ * D + offs_m[:, None] * D + offs_d[None, :]
    tl.store(out, o.to(tl.float16), mask=rows)


def flash(q, k, v, *, causal=False, scale=None):
    b, h, nq, d = q.shape
    nk = k.shape[2]
    if q.dtype != torch.float16 or v.shape[-1] != d or k.shape[1] != h or d not in (16, 32, 64):
        raise NotImplementedError("fp16, d in {16,32,64}, no GQA, dv == d")
    sm = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = (t.contiguous() for t in (q, k, v))
    o = torch.empty_like(q)
    grid = (triton.cdiv(nq, 16), b * h)
    _fwd[grid](q, k, v, o, sm, nq, nk, D=d, BM=16, BN=16, CAUSAL=bool(causal))
    return o
