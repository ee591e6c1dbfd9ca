"""The project's kernels of the ragged layouts as built-ins (docs/api.md, "Ragged batches").

``recurrence-varlen`` (the recurrence per packed sequence), ``triton-varlen`` (the Triton varlen
forward and backward, cu_seqlens), ``split-kv-paged`` (paged decode, split-KV with 64 keys per
split) and ``split-kv-combine`` (the fp32 merge of split-KV partials); ``triton-decode-paged``
and ``triton-combine``: the Triton paged split-KV decode forward and its merge kernel.
docs/kernels.md describes each.
"""

from __future__ import annotations

from .adapter import Kernel
from .availability import BWD_FLASH_SCORES, triton_available, triton_combine_available

__all__ = ["SPLIT_SIZE", "ragged_kernels"]


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


def ragged_kernels() -> dict[str, Kernel]:
    """The ragged layouts' kernels by name: the numpy varlen and paged recurrences, the
    fp32 split-KV merge, and the Triton varlen, paged decode and merge kernels."""
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
            check_available=triton_available,
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
            check_available=triton_available,
            layout="paged",
            **fixed,
        ),
        "triton-combine": Kernel(
            "triton-combine",
            _triton_combine,
            "unknown",
            masks=frozenset(),
            options=frozenset(),
            check_available=triton_combine_available,
            op="combine",
            **fixed,
        ),
    }
