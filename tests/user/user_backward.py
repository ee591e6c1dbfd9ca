"""Attention kernels with a backward, as a user would declare them outside the package.

``textbook_autograd`` lets torch autograd differentiate an fp32 textbook forward;
``manual`` is the same forward with a hand-written backward (the formulas of SPEC 3.7 in fp32).
The others are that backward with one real bug each.
"""

from functools import partial

import torch

import flashcheck


def _scores(q, k, causal, scale):
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    keep = (j <= i + (nk - nq)) if causal else torch.ones(nq, nk, dtype=torch.bool)
    return s.masked_fill(~keep.to(q.device), float("-inf")), keep.to(q.device)


def _forward(q, k, v, *, causal=False, scale=None):
    """fp32 softmax attention, GQA by repeating K and V; a row that keeps no key gives 0."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s, keep = _scores(q, k, causal, scale)
    p = torch.softmax(s, dim=-1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (p @ v.float()).to(q.dtype)


def _backward(q, k, v, do, *, causal=False, scale=None, bug=None):
    """dQ, dK, dV in fp32 by the formulas; ``bug`` plants one mistake."""
    d = q.shape[-1]
    tau = d**-0.5 if scale is None else scale
    rep = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    s, keep = _scores(q, kk, causal, scale)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    if bug == "nan_masked":
        p = torch.exp(s - lse)  # exp(-inf - (-inf)) = NaN for rows that keep no key
    else:
        p = torch.where(keep.any(-1, keepdim=True), torch.exp(s - lse), torch.zeros_like(s))
    o = p @ vv
    do = do.float()
    dp = do @ vv.transpose(-1, -2)
    ds = p * (dp - (do * o).sum(-1, keepdim=True))
    dq = ds @ kk * (1.0 if bug == "no_dq_scale" else tau)
    dk_h = ds.transpose(-1, -2) @ q.float() * tau
    dv_h = p.transpose(-1, -2) @ do
    b, hq, nk = q.shape[0], q.shape[1], k.shape[2]
    if bug == "gqa_first_head":
        # only the first query head of each group, counted once per head of the group
        dk = dk_h[:, ::rep] * rep
        dv = dv_h[:, ::rep] * rep
    else:
        dk = dk_h.reshape(b, hq // rep, rep, nk, -1).sum(2)
        dv = dv_h.reshape(b, hq // rep, rep, nk, -1).sum(2)
    return dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)


textbook_autograd = flashcheck.kernel(_forward, name="textbook_autograd", backward="autograd")
manual = flashcheck.kernel(_forward, name="manual", backward=_backward)
no_dq_scale = flashcheck.kernel(
    _forward, name="no_dq_scale", backward=partial(_backward, bug="no_dq_scale")
)
gqa_first_head = flashcheck.kernel(
    _forward, name="gqa_first_head", backward=partial(_backward, bug="gqa_first_head")
)
nan_masked = flashcheck.kernel(
    _forward, name="nan_masked", backward=partial(_backward, bug="nan_masked")
)
# Declares the flash backward class but its forward returns O only: backward conformance, which
# recomputes P from LSE, has nothing to compare (the suite must say so, not pass).
flash_no_lse = flashcheck.kernel(
    _forward,
    name="flash_no_lse",
    dtypes=("fp16",),
    backward=_backward,
    backward_arithmetic="flash",
)


def _doubles_do(q, k, v, do, *, causal=False, scale=None):
    """Bug: doubles the caller's dO in place and halves the gradients back."""
    do.mul_(2)
    return tuple(g / 2 for g in _backward(q, k, v, do, causal=causal, scale=scale))


_DQ_BUFFERS = {}


def _reuses_dq(q, k, v, do, *, causal=False, scale=None):
    """Bug: writes dQ into one persistent buffer per shape and returns that buffer."""
    dq, dk, dv = _backward(q, k, v, do, causal=causal, scale=scale)
    key = (tuple(dq.shape), dq.dtype, dq.device)
    if key not in _DQ_BUFFERS:
        _DQ_BUFFERS[key] = torch.empty_like(dq)
    return _DQ_BUFFERS[key].copy_(dq), dk, dv


doubles_do = flashcheck.kernel(_forward, name="doubles_do", backward=_doubles_do)
reuses_dq = flashcheck.kernel(_forward, name="reuses_dq", backward=_reuses_dq)


def _assumes_contiguous_do(q, k, v, do, *, causal=False, scale=None):
    """Bug: reads dO's storage as if dO were contiguous (strides computed from its shape)."""
    strides = [1] * do.dim()
    for i in range(do.dim() - 2, -1, -1):
        strides[i] = strides[i + 1] * do.shape[i + 1]
    flat = torch.as_strided(do, do.shape, strides, do.storage_offset())
    return _backward(q, k, v, flat, causal=causal, scale=scale)


assumes_contiguous_do = flashcheck.kernel(
    _forward, name="assumes_contiguous_do", backward=_assumes_contiguous_do
)


def _layout_bits(q, k, v, do, *, causal=False, scale=None):
    """Right values, but dQ one ulp up where dO is not contiguous (as a kernel compiled once per
    stride alignment can give): within the bounds, so reported, not failed."""
    dq, dk, dv = _backward(q, k, v, do, causal=causal, scale=scale)
    if not do.is_contiguous():
        dq = torch.where(dq != 0, torch.nextafter(dq, torch.full_like(dq, float("inf"))), dq)
    return dq, dk, dv


layout_bits = flashcheck.kernel(_forward, name="layout_bits", backward=_layout_bits)


def _views_do(q, k, v, do, *, causal=False, scale=None):
    """Bug: reshapes dO with .view, which raises for a dO that is not contiguous (the expanded
    gradient of O.sum(), a slice)."""
    flat = do.view(-1, do.shape[-1])
    return _backward(q, k, v, flat.view(do.shape), causal=causal, scale=scale)


views_do = flashcheck.kernel(_forward, name="views_do", backward=_views_do)
