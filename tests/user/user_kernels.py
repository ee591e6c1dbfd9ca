"""Attention kernels as a user would write them, outside the flashcheck package.

The tests copy this file into an empty folder and run the installed ``flashcheck`` command on
it, as a user would: each function is a real bug class (or a correct kernel that must pass).
"""

import torch

import flashcheck


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


def online_softmax(q, k, v, *, causal=False, scale=None):
    """Correct: FlashAttention's recurrence in torch, 32-key blocks, fp32 state, one division
    at the end; a row that keeps no key gives 0."""
    b, hq, nq, d = q.shape
    nk = k.shape[2]
    rep = hq // k.shape[1]
    kk, vv = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    qf = q.float() * (d**-0.5 if scale is None else scale)
    keep = _keep(nq, nk, causal, q.device)
    m = torch.full((b, hq, nq, 1), float("-inf"), device=q.device)
    den = torch.zeros((b, hq, nq, 1), device=q.device)
    acc = torch.zeros((b, hq, nq, v.shape[-1]), device=q.device)
    for j in range(0, nk, 32):
        s = qf @ kk[:, :, j : j + 32].transpose(-1, -2)
        s = s.masked_fill(~keep[:, j : j + 32], float("-inf"))
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(m - safe)
        p = torch.exp(s - safe)
        den = den * alpha + p.sum(-1, keepdim=True)
        acc = acc * alpha + p @ vv[:, :, j : j + 32]
        m = m_new
    # Only a row that kept no key (its max still -inf) is 0; testing den > 0 instead would also
    # zero the rows a NaN input made NaN (the suite's NaN rule catches that).
    out = torch.where(torch.isneginf(m), torch.zeros_like(acc), acc / den)
    return out.to(q.dtype)


def head_leak_aligned(q, k, v, *, causal=False, scale=None):
    """Bug: a fast path for block-aligned lengths (multiples of 16) maps query head h to
    key/value head h % Hk instead of h // (Hq / Hk): wrong only with grouped-query heads, and
    only at aligned lengths."""
    hq, hk = q.shape[1], k.shape[1]
    if q.shape[2] % 16 or k.shape[2] % 16 or hq == hk:
        return textbook(q, k, v, causal=causal, scale=scale)
    idx = torch.arange(hq, device=q.device) % hk
    return _attend(q, k[:, idx], v[:, idx], causal, scale)


def sentinel_mask(q, k, v, *, causal=False, scale=None):
    """Bug: masked scores are set to -1e4 instead of -inf, so a row that keeps no key averages
    every value instead of giving 0 (and very negative scores compete with masked ones)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    s = s.masked_fill(~_keep(nq, nk, causal, q.device), -1e4)
    return (torch.softmax(s, dim=-1) @ v.float()).to(q.dtype)


def sentinel_max(q, k, v, *, causal=False, scale=None):
    """Bug: the running maximum starts at -1e6 instead of -inf, so a row whose scores all lie
    below -1e6 underflows to 0 / 0 (fp32 and bf16 scores reach that far)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    keep = _keep(nq, nk, causal, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    m = torch.clamp(s.amax(-1, keepdim=True), min=-1e6)
    p = torch.exp(s - m)
    out = (p @ v.float()) / p.sum(-1, keepdim=True)
    return torch.where(keep.any(-1, keepdim=True), out, torch.zeros_like(out)).to(q.dtype)


def sentinel_max_guarded(q, k, v, *, causal=False, scale=None):
    """Bug: the running maximum starts at -1e4 instead of -inf, and a row whose sum is 0 is
    written as 0 (a common guard against 0 / 0): a row whose scores all lie below -1e4 - 104
    comes out 0, with no NaN to give it away."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    s = s.masked_fill(~_keep(nq, nk, causal, q.device), float("-inf"))
    p = torch.exp(s - torch.clamp(s.amax(-1, keepdim=True), min=-1e4))
    total = p.sum(-1, keepdim=True)
    return torch.where(total == 0, torch.zeros(()), (p @ v.float()) / total).to(q.dtype)


def nan_rows_to_zero(q, k, v, *, causal=False, scale=None):
    """Bug: a flash kernel's ``where(l > 0, acc / l, 0)``, meant for rows that keep no key,
    also turns every row a NaN input reaches into zeros (NaN > 0 is false)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    s = s.masked_fill(~_keep(nq, nk, causal, q.device), float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isneginf(m), torch.zeros_like(m), m))
    total = p.sum(-1, keepdim=True)
    return torch.where(total > 0, (p @ v.float()) / total, torch.zeros(())).to(q.dtype)


def no_max_subtraction(q, k, v, *, causal=False, scale=None):
    """Bug: softmax as exp(s) / sum(exp(s)), without subtracting the row max: exact in real
    arithmetic, inf / inf = NaN once a score passes exp's overflow (88.7 in fp32)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    keep = _keep(nq, nk, causal, q.device)
    e = torch.exp(s.masked_fill(~keep, float("-inf")))
    out = (e @ v.float()) / e.sum(-1, keepdim=True)
    return torch.where(keep.any(-1, keepdim=True), out, torch.zeros_like(out)).to(q.dtype)


def returns_q(q, k, v, *, causal=False, scale=None):
    """Bug: returns its input: the right shape whenever dv == d, and wrong."""
    return q.clone()


def always_raises(q, k, v, *, causal=False, scale=None):
    """Bug: cannot run at all."""
    raise NotImplementedError("the kernel is not built for this machine")


def always_hangs(q, k, v, *, causal=False, scale=None):
    """Bug: never returns."""
    import time

    time.sleep(3600)


def hangs_on_nan(q, k, v, *, causal=False, scale=None):
    """Bug: waits for its input to be finite (a NaN input never is); correct otherwise."""
    import time

    while not bool(torch.isfinite(q).all()):
        time.sleep(0.01)
    return textbook(q, k, v, causal=causal, scale=scale)


def kills_its_process(q, k, v, *, causal=False, scale=None):
    """Bug: the process dies (as a segfault would) on 64-row inputs, a length probes do not
    use but the suite draws."""
    import os

    if q.shape[2] == 64:
        os._exit(3)
    return textbook(q, k, v, causal=causal, scale=scale)


def scales_q_in_place(q, k, v, *, causal=False, scale=None):
    """Bug: applies the scale to the caller's q in place (``q.mul_(scale)``) and attends with
    scale 1: its output is right, the caller's q is not."""
    q.mul_(q.shape[-1] ** -0.5 if scale is None else scale)
    return textbook(q, k, v, causal=causal, scale=1.0)


_BUFFERS = {}


def reuses_its_buffer(q, k, v, *, causal=False, scale=None):
    """Bug: writes every result into one persistent buffer per shape and returns that buffer:
    each call is right, but the caller's previous result changes on the next call."""
    o = textbook(q, k, v, causal=causal, scale=scale)
    key = (tuple(o.shape), o.dtype, o.device)
    if key not in _BUFFERS:
        _BUFFERS[key] = torch.empty_like(o)
    return _BUFFERS[key].copy_(o)


def nan_to_num(q, k, v, *, causal=False, scale=None):
    """Correct on finite inputs, but maps NaN probabilities to 0 (a common idiom for fully
    masked rows): a NaN input does not reach the outputs it is involved in."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    s = s.masked_fill(~_keep(nq, nk, causal, q.device), float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0) @ v).to(q.dtype)


def top_left_causal(q, k, v, *, causal=False, scale=None):
    """Bug: the causal mask aligned top-left (query i keeps keys j <= i), right only for
    Nq == Nk; flashcheck, like FlashAttention, aligns it bottom-right."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i, float("-inf"))
    return (torch.softmax(s, dim=-1) @ v).to(q.dtype)


def forgets_default_scale(q, k, v, *, causal=False, scale=None):
    """Bug: applies an explicit scale, but no 1/sqrt(d) when none is given."""
    return textbook(q, k, v, causal=causal, scale=1.0 if scale is None else scale)


def _half(s, v):
    """Attention over one part of the keys: its O (normalized within the part) and its LSE."""
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.where(torch.isneginf(lse), torch.zeros_like(s), torch.exp(s - lse))
    return p @ v, lse


def split_kv_when_small(q, k, v, *, causal=False, scale=None):
    """Correct, but not batch-invariant: like decode kernels that fill the GPU with KV splits
    when the batch is small, a batch of one is computed in two halves of the keys merged by
    their LSE; larger batches in one pass. Both in fp32, both within the error bounds."""
    if q.shape[0] > 1 or k.shape[2] < 2:
        return textbook(q, k, v, causal=causal, scale=scale)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    s = s.masked_fill(~_keep(nq, nk, causal, q.device), float("-inf"))
    h = nk // 2
    (o1, l1), (o2, l2) = _half(s[..., :h], v[..., :h, :]), _half(s[..., h:], v[..., h:, :])
    lse = torch.logaddexp(l1, l2)
    w1 = torch.where(torch.isneginf(lse), 0.0, torch.exp(l1 - lse))
    w2 = torch.where(torch.isneginf(lse), 0.0, torch.exp(l2 - lse))
    return (w1 * o1 + w2 * o2).to(q.dtype)


def one_slice_alone_differs(q, k, v, *, causal=False, scale=None):
    """Correct, but not batch-invariant where libraries often are not: a call on a single
    (batch, head) slice takes another path (here its scores summed over d in reverse order, as
    a matrix-vector routine might) than a call on several; both fp32, within the bounds.
    Returns O and LSE."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    qf = q.float()
    if q.shape[0] * q.shape[1] == 1:
        s = (qf[..., :, None, :] * k[..., None, :, :]).flip(-1).cumsum(-1)[..., -1]
    else:
        s = qf @ k.transpose(-1, -2)
    s = s * (d**-0.5 if scale is None else scale)
    keep = _keep(nq, nk, causal, q.device)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.where(keep.any(-1, keepdim=True), torch.softmax(s, dim=-1), 0.0)
    return (p @ v).to(q.dtype), torch.logsumexp(s, dim=-1)


# The same kernel, wrongly declared batch-invariant.
split_kv_declared = flashcheck.kernel(
    split_kv_when_small, name="split_kv_declared", batch_invariant=True
)


def drops_keys_past_1024(q, k, v, *, causal=False, scale=None):
    """Bug: a fixed 1024-key buffer; keys past it are silently left out. Right at every length
    up to 1024."""
    return textbook(q, k[..., :1024, :], v[..., :1024, :], causal=causal, scale=scale)


def stuck(q, k, v, *, causal=False, scale=None):
    """Correct, and a minute per call: a call still running when the run is interrupted."""
    import time

    time.sleep(60)
    return textbook(q, k, v, causal=causal, scale=scale)


def sleepy(q, k, v, *, causal=False, scale=None):
    """Correct, and 0.1 s per call: a run long enough to be interrupted."""
    import time

    time.sleep(0.1)
    return textbook(q, k, v, causal=causal, scale=scale)
