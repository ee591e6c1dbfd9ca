"""Attention kernels with soft-capping and sinks, as a user would write them outside the package.

``correct`` is an fp32 textbook forward (torch autograd gives its gradients, the sinks' included);
``manual`` is the same forward with a hand-written backward. The others carry one real bug
each: the cap applied to the unscaled dot product (FlashAttention PR #2402's class), the cap
ignored (SGLang #33915's class), the sink multiplied by the softmax scale, a sink gradient
with the wrong sign, and the cap's slope left out of the backward.
"""

from functools import partial

import torch

import flashcheck


def _logits(q, k, *, causal, scale, softcap, bug=None):
    """Scores with the cap, masked; and the keep mask."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    tau = d**-0.5 if scale is None else scale
    dots = q.float() @ k.float().transpose(-1, -2)
    if softcap and bug == "cap_unscaled":
        s = softcap * torch.tanh(dots / softcap) * tau
    elif softcap and bug != "cap_ignored":
        s = softcap * torch.tanh(dots * tau / softcap)
    else:
        s = dots * tau
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    keep = (j <= i + (nk - nq)) if causal else torch.ones(nq, nk, dtype=torch.bool, device=q.device)
    return s.masked_fill(~keep, float("-inf")), keep, tau


def _forward(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None, bug=None):
    """fp32 attention; the sink joins the softmax as a last column without a value row."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s, keep, tau = _logits(q, k, causal=causal, scale=scale, softcap=softcap, bug=bug)
    if sinks is not None:
        sig = sinks.float() * (tau if bug == "sink_scaled" else 1.0)
        col = sig.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
        p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    else:
        p = torch.softmax(s, dim=-1)
        p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (p @ v.float()).to(q.dtype)


def correct(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
    return _forward(q, k, v, causal=causal, scale=scale, softcap=softcap, sinks=sinks)


def plain(q, k, v, *, causal=False, scale=None):
    """The same forward for a kernel that takes neither option."""
    return _forward(q, k, v, causal=causal, scale=scale)


def cap_unscaled(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
    return _forward(
        q, k, v, causal=causal, scale=scale, softcap=softcap, sinks=sinks, bug="cap_unscaled"
    )


def cap_ignored(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
    return _forward(
        q, k, v, causal=causal, scale=scale, softcap=softcap, sinks=sinks, bug="cap_ignored"
    )


def sink_scaled(q, k, v, *, causal=False, scale=None, softcap=None, sinks=None):
    return _forward(
        q, k, v, causal=causal, scale=scale, softcap=softcap, sinks=sinks, bug="sink_scaled"
    )


def _backward(q, k, v, do, *, causal=False, scale=None, softcap=None, sinks=None, bug=None):
    """dQ, dK, dV (and dσ with sinks) in fp32 by the formulas; ``bug`` plants one mistake."""
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    s, keep, tau = _logits(q, kk, causal=causal, scale=scale, softcap=softcap)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    if sinks is not None:
        lse = torch.logaddexp(lse, sinks.float().reshape(1, -1, 1, 1))
    p = torch.where(keep, torch.exp(s - lse), torch.zeros_like(s))
    o = p @ vv
    do = do.float()
    dd = (do * o).sum(-1, keepdim=True)
    ds = p * (do @ vv.transpose(-1, -2) - dd)
    if softcap and bug != "cap_slope_missing":
        ds = ds * (1 - (s / softcap).masked_fill(~keep, 0.0) ** 2)
    dq = ds @ kk * tau
    dk_h = ds.transpose(-1, -2) @ q.float() * tau
    dv_h = p.transpose(-1, -2) @ do
    b, hq, nk = q.shape[0], q.shape[1], k.shape[2]
    dk = dk_h.reshape(b, hq // rep, rep, nk, -1).sum(2)
    dv = dv_h.reshape(b, hq // rep, rep, nk, -1).sum(2)
    grads = (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype))
    if sinks is None:
        return grads
    p_sink = torch.exp(sinks.float().reshape(1, -1, 1, 1) - lse)
    dsinks = -(p_sink * dd).sum(dim=(0, 2, 3))
    return (*grads, dsinks if bug != "sink_grad_sign" else -dsinks)


manual = flashcheck.kernel(correct, name="manual", backward=_backward)
sink_grad_sign = flashcheck.kernel(
    correct, name="sink_grad_sign", backward=partial(_backward, bug="sink_grad_sign")
)
# The cap's slope 1 − tanh² left out of dS (as a backward through a detached tanh gives it).
cap_slope_missing = flashcheck.kernel(
    correct, name="cap_slope_missing", backward=partial(_backward, bug="cap_slope_missing")
)
