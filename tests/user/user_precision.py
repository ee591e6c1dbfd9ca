"""An fp32 attention kernel as a user would write it, outside the flashcheck package, whose two
products run at tf32 precision (what `tl.dot` does by default on NVIDIA GPUs since Ampere),
emulated on the CPU, and the same kernel at full fp32 precision."""

import torch


def _tf32(x):
    """``x`` rounded to nearest (ties to even) to 10 explicit mantissa bits, as fp32; NaN and
    ±inf kept (rounding a NaN's payload by the same arithmetic can carry it to -0.0)."""
    x = x.float().contiguous()
    bits = x.view(torch.int32)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~0x1FFF
    return torch.where(torch.isfinite(x), bits.view(torch.float32), x)


def _attention(q, k, v, causal, scale, rnd):
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    s = (rnd(q) @ rnd(k).transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    i = torch.arange(nq)[:, None]
    keep = (torch.arange(nk)[None, :] <= i + (nk - nq)) if causal else torch.ones(nq, nk) > 0
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), dim=-1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (rnd(p) @ rnd(v)).to(q.dtype)


def tf32_products(q, k, v, *, causal=False, scale=None):
    """fp32 attention whose products Q·Kᵀ and P·V take operands rounded to tf32."""
    return _attention(q, k, v, causal, scale, _tf32)


def fp32_products(q, k, v, *, causal=False, scale=None):
    """The same kernel with fp32 operands: correct at fp32 precision."""
    return _attention(q, k, v, causal, scale, lambda x: x.float())
