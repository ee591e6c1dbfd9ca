"""An attention kernel that compiles per shape, as a user's Triton kernel does, outside the
flashcheck package.

``jit_batch_bug`` sleeps on the first call of every new (Nq, Nk, d, causal, dtype), as a JIT
compile or an autotuner does (``USER_COMPILE_SECONDS``, default 10 s), and is fast afterwards;
with ``USER_COMPILE_LOG`` set, each compile appends "pid key" to that file.
It computes attention correctly in fp32, except at block-aligned query lengths (Nq % 16 == 0)
with more than one batch: there every batch reads batch 0's keys and values.
"""

import os
import time

import torch

_COMPILED = set()


def _compile(key):
    if key not in _COMPILED:
        _COMPILED.add(key)
        time.sleep(float(os.environ.get("USER_COMPILE_SECONDS", "10")))
        if os.environ.get("USER_COMPILE_LOG"):
            with open(os.environ["USER_COMPILE_LOG"], "a") as log:
                log.write(f"{os.getpid()} {key}\n")


def _attend(q, k, v, causal, scale):
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    s = (q.float() @ k.float().transpose(-1, -2)) * (d**-0.5 if scale is None else scale)
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    keep = (j <= i + (nk - nq)) if causal else torch.ones(nq, nk, dtype=torch.bool)
    s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, dim=-1)
    p = torch.where(keep.any(-1, keepdim=True), p, torch.zeros_like(p))
    return (p @ v.float()).to(q.dtype)


def jit_batch_bug(q, k, v, *, causal=False, scale=None):
    """Bug: at Nq % 16 == 0 with B > 1, every batch attends to batch 0's keys and values."""
    _compile((q.shape[2], k.shape[2], q.shape[3], causal, q.dtype))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    if q.shape[2] % 16 == 0 and q.shape[0] > 1:
        k, v = k[:1].expand_as(k), v[:1].expand(*k.shape[:3], v.shape[3])
    return _attend(q, k, v, causal, scale)
