"""Reference arithmetic for benchmarks/fp8_check.py (torch, on the GPU): FA3-style per-head
e4m3 quantization, float64 attention of exact inputs, and the flash-fp8 class emulation."""

from __future__ import annotations

import torch

E4M3 = torch.float8_e4m3fn
LOG2E = 1.4426950408889634


def quantize(x: torch.Tensor, hk_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(batch, head) e4m3 quantization: descale = amax/448, x8 = e4m3(x / descale)."""
    amax = x.abs().amax(dim=(2, 3)).float().clamp_min(1e-12)
    ds = amax / 448.0
    return (x / ds[:, :, None, None]).to(E4M3), ds.contiguous()


def exact(q, k, v, *, causal, scale, lse=False):
    """float64 attention of exact inputs (B, H, N, d), GQA by repeating kv-heads; with
    ``lse=True`` also the natural-log LSE (−inf for rows that keep no key)."""
    g = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(g, 1) for t in (k, v))
    s = (q.double() @ k.transpose(-1, -2)) * scale
    if causal:
        nq, nk = s.shape[-2:]
        i = torch.arange(nq, device=s.device)[:, None]
        j = torch.arange(nk, device=s.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    o = torch.nan_to_num(torch.softmax(s, -1) @ v, nan=0.0)
    return (o, torch.logsumexp(s, -1)) if lse else o


def emulate(q8, k8, v8, ds, *, causal, scale, block_n, p_dtype=E4M3):
    """The flash-fp8 class in torch, all rows at once, key blocks of ``block_n`` (fully masked
    blocks of a row change no bit, so the row blocks of the kernel need no emulating)."""
    dq, dk, dv = ds
    g = q8.shape[1] // k8.shape[1]
    q = q8.float()
    k, v = (t.float().repeat_interleave(g, 1) for t in (k8, v8))

    def rep(t):
        return t.repeat_interleave(g, 1)[:, :, None, None]

    c = (rep(dq) * rep(dk)) * torch.tensor(scale * LOG2E, dtype=torch.float32)
    b, h, nq, _ = q.shape
    nk = k.shape[2]
    m = torch.full((b, h, nq, 1), float("-inf"), device=q.device)
    ell = torch.zeros_like(m)
    acc = torch.zeros(b, h, nq, v.shape[-1], device=q.device)
    rows = torch.arange(nq, device=q.device)[:, None]
    for start in range(0, nk, block_n):
        kb, vb = k[:, :, start : start + block_n], v[:, :, start : start + block_n]
        s = q @ kb.transpose(-1, -2)
        keep = torch.ones_like(s, dtype=torch.bool)
        if causal:
            cols = torch.arange(start, start + kb.shape[2], device=q.device)[None, :]
            keep = (cols <= rows + nk - nq).expand_as(s)
        m_new = torch.maximum(m, s.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True))
        m_safe = torch.where(m_new == float("-inf"), 0.0, m_new)
        x = ((s - m_safe) * c).masked_fill(~keep, float("-inf"))
        first = m == float("-inf")
        alpha = torch.where(first, 0.0, torch.exp2((torch.where(first, m_safe, m) - m_safe) * c))
        p = torch.exp2(x)
        ell = ell * alpha + p.sum(-1, keepdim=True)
        acc = (p.to(p_dtype).float() @ vb) + acc * alpha
        m = m_new
    has = ell != 0
    return torch.where(has, acc * (rep(dv) / torch.where(has, ell, 1.0)), 0.0)
