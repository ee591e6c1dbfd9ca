"""Attention kernels as a user would write them, outside the flashcheck package.

The tests copy this file into an empty folder and run the installed ``flashcheck`` command on
it, as a user would: each function is a real bug class (or a correct kernel that must pass).
"""

import torch


def _keep(nq, nk, causal, device):
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return (j <= i + (nk - nq)) if causal else torch.ones(nq, nk, dtype=torch.bool, device=device)


def _attend(q, k, v, causal, scale):
    """fp32 softmax attention of one or more (batch, head) slices, cast back to the input dtype;
    a row that keeps no key gives 0 (the contract), NaN inputs still give NaN."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    keep = _keep(nq, nk, causal, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (p @ v.float()).to(q.dtype)


def textbook(q, k, v, *, causal=False, scale=None):
    """Correct: the textbook formula in fp32, GQA by repeating K and V."""
    rep = q.shape[1] // k.shape[1]
    return _attend(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), causal, scale)


def batch_leak(q, k, v, *, causal=False, scale=None):
    """Bug: correct for batch 1, but the key/value slice index forgets the batch offset, so
    batch b > 0 attends to batch 0's keys. Like many tiled kernels it also takes only
    sequence lengths that are multiples of its 128-row block."""
    b, h, nq, d = q.shape
    hk, nk = k.shape[1], k.shape[2]
    if nq % 128 or nk % 128:
        raise ValueError(f"sequence lengths must be multiples of 128, got {nq} and {nk}")
    qf = q.reshape(b * h, nq, d)
    kf, vf = k.reshape(b * hk, nk, d), v.reshape(b * hk, nk, v.shape[-1])
    out = []
    for i in range(b * h):
        kv = (i % h) // (h // hk)  # should be (i // h) * hk + (i % h) // (h // hk)
        out.append(_attend(qf[i], kf[kv], vf[kv], causal, scale))
    return torch.stack(out).reshape(b, h, nq, -1)
