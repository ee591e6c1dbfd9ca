"""An autotuned Triton attention kernel as users bring them, for the compile-key GPU check
(benchmarks/gpu_autotuned.sh): flashcheck's own forward kernel wrapped in ``triton.autotune``
over 16 configurations (BLOCK_M, BLOCK_N, warps, stages), keyed on the sequence lengths and the
head dim, as the upstream Triton tutorial's kernel is. Every new (Nq, Nk, d) then re-tunes:
16 compiles and a benchmark of each.

``attn`` is correct. ``attn_batch_bug`` plants a wrapper bug: at block-aligned query lengths
(Nq % 64 == 0) with more than one batch it passes a key/value batch stride of 0, so every batch
reads batch 0's keys and values.

Known limits: the portable launch path only (no TMA, no warp specialization), CUDA only. It is
not part of flashcheck; the package never imports it.
"""

import math

import torch
import triton

from flashcheck.kernels import triton_flash as tf

_LOG2E = 1.0 / math.log(2.0)

CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)
    for bm in (64, 128)
    for bn in (32, 64)
    for w in (4, 8)
    for s in (2, 3)
]
assert len(CONFIGS) == 16

_tuned = triton.autotune(configs=CONFIGS, key=["NQ", "NK", "D", "DV"])(tf._flash_fwd)


def _forward(q, k, v, *, causal=False, scale=None, batch_bug=False):
    bsz, hq, nq, d = q.shape
    _, hk, nk, dv = v.shape
    scale = d**-0.5 if scale is None else float(scale)
    o = torch.empty((bsz, hq, nq, dv), dtype=q.dtype, device=q.device)
    lse = torch.empty((bsz, hq, nq), dtype=torch.float32, device=q.device)
    ks, vs = list(k.stride()), list(v.stride())
    if batch_bug and bsz > 1 and nq % 64 == 0:
        ks[0] = vs[0] = 0  # the planted bug: every batch reads batch 0's keys and values
    block_d = max(16, triton.next_power_of_2(d))
    block_dv = max(64, triton.next_power_of_2(dv))  # (the project pads dv for BLOCK_M 128)

    def grid(meta):
        return (triton.cdiv(nq, meta["BLOCK_M"]), bsz * hq)

    _tuned[grid](
        q, k, v, o, lse,
        *q.stride(), *ks, *vs, *o.stride(), *lse.stride(),
        hq, hk, nq, nk, d, dv,
        scale * _LOG2E, -1, -1,
        CAUSAL=bool(causal), WINDOW=False,
        BLOCK_D=block_d, BLOCK_DV=block_dv,
        PRECISION="ieee", TMA=False, WARP_SPECIALIZE=False,
        HEAVY_FIRST=bool(causal), SPLIT=False, POS_SCALE=scale > 0,
        ACC_IN_DOT=False, PREFETCH=False,
    )  # fmt: skip
    return o, lse


def attn(q, k, v, *, causal=False, scale=None):
    """Correct: flashcheck's forward, autotuned per (Nq, Nk, d, dv)."""
    return _forward(q, k, v, causal=causal, scale=scale)


def attn_batch_bug(q, k, v, *, causal=False, scale=None):
    """Bug: batch 0's keys and values for every batch at Nq % 64 == 0 when B > 1."""
    return _forward(q, k, v, causal=causal, scale=scale, batch_bug=True)
