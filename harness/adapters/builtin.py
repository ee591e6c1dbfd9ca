"""The project's own kernels with their declared contracts (docs/kernels.md).

``recurrence-fa2`` / ``recurrence-fa1``: the numpy online-softmax recurrence (flash arithmetic,
16- and 5-key blocks); ``naive-numpy`` / ``naive-torch``: standard attention at the input
precision; ``triton`` / ``triton-tf32``: the Triton FlashAttention-2 forward and backward (IEEE
fp32 or tf32 dots for fp32 inputs). Ragged layouts (docs/api.md, "Ragged batches"):
``recurrence-varlen`` (the recurrence per packed sequence), ``triton-varlen`` (the Triton
varlen forward and backward, cu_seqlens), ``split-kv-paged`` (paged decode,
split-KV with 64 keys per split) and ``split-kv-combine`` (the fp32 merge of split-KV
partials); ``triton-decode-paged`` and ``triton-combine``: the Triton paged split-KV decode
forward and its merge kernel. docs/kernels.md describes each.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from ..cases.case import Case
from .adapter import Kernel
from .builtin_fp8 import fp8_kernels

__all__ = [
    "BWD_FLASH_SCORES",
    "gemm_flushes_subnormals",
    "gemm_leaks_nan",
    "project_kernels",
    "torch_device_ok",
]


# FA2's backward recomputes P = exp2(t − lse2) from the fp32 score t and LSE, each rounded by
# ~2^-24 of its size: past |s| ~ 2^26 that rounding alone is 2^3 in the exponent, and near
# 1e9 exp2 overflows. The backward is specified below this magnitude (the forward has no limit).
BWD_FLASH_SCORES = 2.0**26


def _recurrence(variant: str, block_k: int):
    def fn(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
        from ...kernels.recurrence import PrecisionPolicy, online_attention
        from ..core.formats import format_of

        policy = PrecisionPolicy.flash(format_of(q.dtype).name)
        return online_attention(
            q,
            k,
            v,
            policy=policy,
            variant=variant,
            block_q=16,
            block_k=block_k,
            causal=causal,
            window=window,
            mask=mask,
            scale=scale,
            softcap=softcap,
            sinks=sinks,
        )

    return fn


def _recurrence_backward(
    q, k, v, do, *, causal, window, scale, mask=None, softcap=None, sinks=None
):
    """The FA2 backward of the recurrence, after its own forward (for O and LSE)."""
    from ...kernels.recurrence import (
        PrecisionPolicy,
        online_attention,
        online_attention_backward,
    )
    from ..core.formats import format_of

    bwd_policy = PrecisionPolicy.flash(format_of(q.dtype).name)
    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
    opts.update(softcap=softcap, sinks=sinks)
    o, lse = online_attention(q, k, v, policy=bwd_policy, block_q=16, block_k=16, **opts)
    return online_attention_backward(
        q, k, v, o, lse, do, policy=bwd_policy, block_q=16, block_k=16, **opts
    )


def _naive_numpy_backward(q, k, v, do, *, causal, window, scale, mask=None, **options):
    from ...kernels.naive import naive_numpy_backward

    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale, **options}
    return naive_numpy_backward(q, k, v, do, **opts)


def _naive_numpy(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.naive import naive_numpy

    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
    return naive_numpy(q, k, v, softcap=softcap, sinks=sinks, **opts)


def _naive_torch(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.naive import naive_torch

    opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
    return naive_torch(q, k, v, softcap=softcap, sinks=sinks, **opts)


def _triton(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.triton_flash import flash_attention

    opts = {"causal": causal, "window": window, "scale": scale}
    return flash_attention(q, k, v, softcap=softcap, sinks=_detached(sinks), **opts)


def _detached(sinks):
    """The sinks as the Triton kernels take them (a plain tensor: they are not differentiated
    through torch autograd; their backward returns dσ itself)."""
    return None if sinks is None else sinks.detach()


def _triton_tf32(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.triton_flash import flash_attention

    opts = {"causal": causal, "window": window, "scale": scale, "allow_tf32": True}
    return flash_attention(q, k, v, softcap=softcap, sinks=_detached(sinks), **opts)


def _triton_backward(
    q, k, v, do, *, causal, window, scale, mask=None, allow_tf32=False, softcap=None, sinks=None
):
    """The Triton FA2 backward, after the Triton forward (for O and LSE); ``(dQ, dK, dV)``, and
    ``dσ`` after them with sinks."""
    from ...kernels.triton_flash import flash_attention
    from ...kernels.triton_flash_bwd import flash_attention_backward

    opts = {"causal": causal, "window": window, "scale": scale, "allow_tf32": allow_tf32}
    opts.update(softcap=softcap, sinks=_detached(sinks))
    o, lse = flash_attention(q, k, v, **opts)
    return flash_attention_backward(q, k, v, o, lse, do, **opts)


def _triton_tf32_backward(
    q, k, v, do, *, causal, window, scale, mask=None, softcap=None, sinks=None
):
    opts = {"causal": causal, "window": window, "scale": scale, "softcap": softcap}
    return _triton_backward(q, k, v, do, allow_tf32=True, sinks=sinks, **opts)


def _recurrence_varlen(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, window, scale
):
    from ...kernels.ragged import varlen_attention
    from ...kernels.recurrence import PrecisionPolicy
    from ..core.formats import format_of

    policy = PrecisionPolicy.flash(format_of(q.dtype).name)
    opts = {"causal": causal, "window": window, "scale": scale}
    return varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, policy=policy, **opts)


def _triton_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **opts):
    from ...kernels.triton_varlen_bwd import flash_attn_varlen_differentiable

    return flash_attn_varlen_differentiable(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **opts
    )


# Keys per split of the paged decode kernel: fixed, never derived from the batch.
SPLIT_SIZE = 64


def _split_kv_paged(q, k_cache, v_cache, *, cache_seqlens, block_table, causal, window, scale):
    from ...kernels.ragged import paged_attention
    from ...kernels.recurrence import PrecisionPolicy
    from ..core.formats import format_of

    policy = PrecisionPolicy.flash(format_of(q.dtype).name)
    return paged_attention(
        q,
        k_cache,
        v_cache,
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        policy=policy,
        split_size=SPLIT_SIZE,
        causal=causal,
        window=window,
        scale=scale,
    )


def _split_kv_combine(out_partial, lse_partial):
    """The fp32 merge, O written in the partials' format (LSE stays fp32)."""
    from ...kernels.split_kv import merge_partials

    o, lse = merge_partials(out_partial, lse_partial, accum="fp32")
    return o.astype(out_partial.dtype), lse


def _triton_decode_paged(q, k_cache, v_cache, *, cache_seqlens, block_table, causal, scale):
    from ...kernels.triton_decode import flash_decode_paged

    opts = {"cache_seqlens": cache_seqlens, "block_table": block_table}
    return flash_decode_paged(q, k_cache, v_cache, causal=causal, scale=scale, **opts)


def _triton_combine(out_partial, lse_partial):
    from ...kernels.triton_decode import combine_partials

    return combine_partials(out_partial, lse_partial)


def _triton_combine_available(dtype: str, device: str) -> str | None:
    """As the Triton kernels, but bf16 runs under the interpreter: the merge has no dot."""
    return _triton_available("fp16" if dtype == "bf16" else dtype, device)


def _triton_available(dtype: str, device: str) -> str | None:
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a module entry of None: imports are blocked
        found = False
    if not found:
        return "Triton is not installed (pip install triton)"
    if device == "cuda":
        return torch_device_ok(dtype, device)
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device == "cpu" and not interp:
        return "the Triton kernel runs on CPU only under TRITON_INTERPRET=1"
    if device == "cpu" and dtype == "bf16":
        import torch

        from ...kernels import triton_flash

        if not triton_flash.bf16_dot_supported(torch):
            return (
                "bf16 tl.dot is broken in the Triton interpreter (triton-lang/triton#11584; "
                "detected at run time by the kernel's canary)"
            )
    return None


_FLUSH_CACHE: dict[tuple[str, str], bool] = {}


def gemm_flushes_subnormals(dtype: str, device: str) -> bool:
    """Whether torch's GEMM in ``dtype`` on ``device`` flushes subnormal operands to zero.

    Found by the report campaign: torch 2.13's CPU bf16 matmul (the oneDNN path taken from
    16×16 operands up) returns 0 for P·V with subnormal V, where IEEE arithmetic keeps them
    (fp32 accumulation holds bf16 subnormal products exactly). Checked once per dtype and
    device with a small canary GEMM, so the answer is the installed library's, not a list.
    """
    key = (dtype, device)
    if key not in _FLUSH_CACHE:
        import torch

        from ..core.formats import FORMATS

        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        tiny = float(FORMATS[dtype].min_normal) / 4  # exactly representable: a power of two
        p = torch.full((16, 16), 1 / 16, dtype=tdt, device=device)
        v = torch.full((16, 64), tiny, dtype=tdt, device=device)
        _FLUSH_CACHE[key] = bool((p @ v).float().abs().max().item() == 0.0)
    return _FLUSH_CACHE[key]


_LEAK_CACHE: dict[tuple[str, str], bool] = {}


def gemm_leaks_nan(dtype: str, device: str) -> bool:
    """Whether torch's GEMM in ``dtype`` on ``device`` lets a NaN in one row of A reach other
    rows of ``A @ B``.

    Found by the property suite: torch 2.13's CPU bf16 matmul on AMX machines (oneDNN's
    brgemm kernel when K is not a multiple of 32, uxlfoundation/oneDNN#5717) turns the
    neighbouring row of a NaN row into NaN, so the naive baseline breaks the NaN rule for a
    reason outside this project. Checked once per dtype and device with a canary GEMM
    (64×19 @ 19×64, a shape that takes that kernel), so the answer is the installed library's.
    """
    key = (dtype, device)
    if key not in _LEAK_CACHE:
        import torch

        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        a = torch.full((64, 19), 0.5, dtype=tdt, device=device)
        a[1] = float("nan")
        b = torch.full((19, 64), 0.25, dtype=tdt, device=device)
        out = (a @ b).float()
        _LEAK_CACHE[key] = bool(torch.isnan(out[0]).any() or torch.isnan(out[2:]).any())
    return _LEAK_CACHE[key]


def _naive_torch_case(case: Case, device: str | None) -> str | None:
    if device is None:
        return None
    nonfinite = any(not np.all(np.isfinite(x.astype(np.float32))) for x in (case.q, case.k, case.v))
    if nonfinite and gemm_leaks_nan(case.dtype, device):
        return (
            f"non-finite inputs: torch's {case.dtype} GEMM on {device} leaks NaN across rows "
            "(uxlfoundation/oneDNN#5717; detected at run time by a canary GEMM)"
        )
    fmt = case.fmt
    sub = any(
        bool(np.any((x != 0) & (np.abs(x.astype(np.float32)) < fmt.min_normal)))
        for x in (case.q, case.k, case.v)
    )
    if sub and gemm_flushes_subnormals(case.dtype, device):
        return (
            f"subnormal inputs: torch's {case.dtype} GEMM on {device} flushes them to zero "
            "(detected at run time by a canary GEMM; IEEE bounds do not apply)"
        )
    return None


def torch_device_ok(dtype: str, device: str) -> str | None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
    return None


def project_kernels() -> dict[str, Kernel]:
    """The project's own kernels, by name. (Longer than 80 lines: one declaration
    table, a kernel per entry.)"""
    # Naive fp16 stores S in fp16: scores must stay below its largest finite value, 65504.
    naive_limit = {"fp16": 65504.0}
    every = frozenset({"causal", "window", "mask", "scale", "softcap", "sinks"})
    return {
        "recurrence-fa2": Kernel(
            "recurrence-fa2",
            _recurrence("fa2", 16),
            "flash",
            api="numpy",
            options=every,
            devices=("cpu",),
            key_block=16,
            backward=_recurrence_backward,
            backward_arithmetic="flash",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
        ),
        "recurrence-fa1": Kernel(
            "recurrence-fa1",
            _recurrence("fa1", 5),
            "flash-fa1",
            api="numpy",
            options=every,
            devices=("cpu",),
            key_block=5,
            deterministic=True,
            batch_invariant=True,
        ),
        "naive-numpy": Kernel(
            "naive-numpy",
            _naive_numpy,
            "naive",
            api="numpy",
            options=every,
            devices=("cpu",),
            score_limit=naive_limit,
            backward=_naive_numpy_backward,
            backward_arithmetic="naive",
            deterministic=True,
            batch_invariant=True,
        ),
        "naive-torch": Kernel(
            "naive-torch",
            _naive_torch,
            "naive",
            api="torch",
            options=every,
            batch_invariant=False,
            score_limit=naive_limit,
            check_available=torch_device_ok,
            check_case=_naive_torch_case,
            backward="autograd",
            backward_arithmetic="naive",
            deterministic=True,
        ),
        "triton": Kernel(
            "triton",
            _triton,
            "flash",
            api="torch",
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale", "softcap", "sinks"}),
            check_available=_triton_available,
            backward=_triton_backward,
            backward_arithmetic="flash",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
        ),
        "triton-tf32": Kernel(
            "triton-tf32",
            _triton_tf32,
            "tf32",
            api="torch",
            dtypes=("fp32",),
            devices=("cuda",),
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale", "softcap", "sinks"}),
            check_available=_triton_available,
            backward=_triton_tf32_backward,
            backward_arithmetic="tf32",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
        ),
        **_ragged_kernels(),
        **fp8_kernels(),
    }


def _ragged_kernels() -> dict[str, Kernel]:
    """The numpy kernels of the ragged layouts and the split-KV merge."""
    ragged = {"api": "numpy", "devices": ("cpu",), "deterministic": True, "batch_invariant": True}
    ragged["masks"] = frozenset({"causal", "window"})
    return {
        "recurrence-varlen": Kernel(
            "recurrence-varlen",
            _recurrence_varlen,
            "flash",
            key_block=16,
            layout="varlen",
            **ragged,
        ),
        "triton-varlen": Kernel(
            "triton-varlen",
            _triton_varlen,
            "flash",
            api="torch",
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale"}),
            check_available=_triton_available,
            backward="autograd",
            backward_arithmetic="flash",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
            layout="varlen",
        ),
        "split-kv-paged": Kernel(
            "split-kv-paged", _split_kv_paged, "flash", key_block=16, layout="paged", **ragged
        ),
        "split-kv-combine": Kernel(
            "split-kv-combine",
            _split_kv_combine,
            "unknown",
            api="numpy",
            devices=("cpu",),
            masks=frozenset(),
            options=frozenset(),
            deterministic=True,
            batch_invariant=True,
            op="combine",
        ),
        **_triton_ragged_kernels(),
    }


def _triton_ragged_kernels() -> dict[str, Kernel]:
    """The Triton paged decode kernel (fixed keys per split) and its split-KV merge."""
    fixed = {"api": "torch", "deterministic": True, "batch_invariant": True}
    return {
        "triton-decode-paged": Kernel(
            "triton-decode-paged",
            _triton_decode_paged,
            "flash",
            masks=frozenset({"causal"}),
            options=frozenset({"causal", "scale"}),
            check_available=_triton_available,
            layout="paged",
            **fixed,
        ),
        "triton-combine": Kernel(
            "triton-combine",
            _triton_combine,
            "unknown",
            masks=frozenset(),
            options=frozenset(),
            check_available=_triton_combine_available,
            op="combine",
            **fixed,
        ),
    }
