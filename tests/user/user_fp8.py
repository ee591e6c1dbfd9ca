"""FP8 attention kernels as a user would write them (torch, FlashAttention-3's signature), outside
the flashcheck package. The tests copy this file into an empty folder and run the installed
``flashcheck report --kernel user_fp8:NAME`` on it: correct kernels and real bug classes."""

import torch

import flashcheck


def _fp8_attention(q, k, v, causal, descale_q, descale_k, descale_v, p_dtype, v_twice=False):
    """Flash-style FP8 attention in one block: fp32 scores of the FP8 values, the descales in
    the softmax constant, P = exp(s - max) quantized to ``p_dtype``, l from the fp32 P."""
    b, hq, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    rep = hq // hk
    ones = torch.ones(b, hk, device=q.device)
    dq, dk, dv = (ones if x is None else x.float() for x in (descale_q, descale_k, descale_v))
    scale = d**-0.5 * (dq * dk).repeat_interleave(rep, 1)[..., None, None]
    kf = k.float().repeat_interleave(rep, 1)
    vf = v.float().repeat_interleave(rep, 1)
    s = (q.float() @ kf.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    ell = p.sum(-1, keepdim=True)
    o = (p.to(p_dtype).float() @ vf) / ell
    out_scale = dv.repeat_interleave(rep, 1)[..., None, None]
    if v_twice:  # the bug: descale_v applied in the epilogue and again by the caller's wrapper
        out_scale = out_scale * out_scale
    return (o * out_scale).to(torch.bfloat16)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def good(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Correct: P quantized to e4m3 before P·V, fp32 everywhere else."""
    return _fp8_attention(q, k, v, causal, descale_q, descale_k, descale_v, torch.float8_e4m3fn)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def p_e5m2(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Bug: P quantized to e5m2 (one fraction bit fewer than e4m3)."""
    return _fp8_attention(q, k, v, causal, descale_q, descale_k, descale_v, torch.float8_e5m2)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def descale_twice(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Bug: descale_v applied twice."""
    args = (q, k, v, causal, descale_q, descale_k, descale_v, torch.float8_e4m3fn)
    return _fp8_attention(*args, v_twice=True)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def hangs_when_long(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Bug: loops for ever past 100 keys (Table 3's sequence and the long family)."""
    while k.shape[2] > 100:
        pass
    return _fp8_attention(q, k, v, causal, descale_q, descale_k, descale_v, torch.float8_e4m3fn)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",), api="numpy")
def scales_v_in_place(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Bug: halves V in place after use (a numpy kernel is handed the caller's array)."""
    import numpy as np

    t = [torch.from_numpy(x.view(np.uint8)).view(torch.float8_e4m3fn) for x in (q, k, v)]
    d = [None if x is None else torch.from_numpy(x) for x in (descale_q, descale_k, descale_v)]
    out = good.fn(*t, causal=causal, descale_q=d[0], descale_k=d[1], descale_v=d[2])
    v[...] = (v.astype(np.float32) * 0.5).astype(v.dtype)
    return out


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def docs_style(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Correct, written to docs/api.md: it uses all three descales as given, never None."""
    d = (descale_q.float(), descale_k.float(), descale_v.float())
    return _fp8_attention(q, k, v, causal, *d, torch.float8_e4m3fn)


@flashcheck.kernel(dtypes=("e4m3",), masks=("causal",))
def ignores_descales(q, k, v, *, causal=False, descale_q=None, descale_k=None, descale_v=None):
    """Bug: takes the descales but never applies them (a user's kernel, O and LSE)."""
    hq, hk = q.shape[1], k.shape[1]
    kf = k.float().repeat_interleave(hq // hk, 1)
    vf = v.float().repeat_interleave(hq // hk, 1)
    s = q.float() @ kf.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        nq, nk = s.shape[-2:]
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vf).to(torch.bfloat16), torch.logsumexp(s, -1)


def no_descales(q, k, v, *, causal=False):
    """Bug: an FP8 kernel without FlashAttention-3's descale keywords."""
    return good.fn(q, k, v, causal=causal)


no_descales = flashcheck.kernel(no_descales, dtypes=("e4m3",), masks=("causal",))
