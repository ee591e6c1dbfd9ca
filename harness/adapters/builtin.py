"""The project's own dense kernels with their declared contracts (docs/kernels.md), and the
table of every built-in kernel.

``recurrence-fa2`` / ``recurrence-fa1``: the numpy online-softmax recurrence (flash arithmetic,
16- and 5-key blocks); ``naive-numpy`` / ``naive-torch``: standard attention at the input
precision; ``triton`` / ``triton-tf32``: the Triton FlashAttention-2 forward and backward (IEEE
fp32 or tf32 dots for fp32 inputs), with the bitwise reproducible two-kernel backward;
``triton-atomic``: the same forward with the backward's fused path (``deterministic=False``:
dQ by fp32 atomic adds, not bitwise reproducible on a GPU), run only when named, as is
``triton-approx-tanh`` (``triton`` with the soft-cap's tanh by the GPU's ``tanh.approx.f32``,
declared ``tanh="approx"``; GPU only). The kernels of the ragged
layouts are declared in :mod:`~flashcheck.harness.adapters.builtin_ragged`, the FP8 kernel in
:mod:`~flashcheck.harness.adapters.builtin_fp8`, and what each can run where in
:mod:`~flashcheck.harness.adapters.availability`; :func:`project_kernels` holds them all.
"""

from __future__ import annotations

import numpy as np

from ..cases.case import Case
from .adapter import Kernel
from .availability import (
    BWD_FLASH_SCORES,
    gemm_flushes_subnormals,
    gemm_leaks_nan,
    torch_device_ok,
    triton_available,
)
from .builtin_fp8 import fp8_kernels
from .builtin_ragged import SPLIT_SIZE, ragged_kernels

__all__ = [
    "BWD_FLASH_SCORES",
    "SPLIT_SIZE",
    "gemm_flushes_subnormals",
    "gemm_leaks_nan",
    "project_kernels",
    "torch_device_ok",
]


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


def _triton_approx(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.triton_flash import flash_attention

    opts = {"causal": causal, "window": window, "scale": scale, "approx_tanh": True}
    return flash_attention(q, k, v, softcap=softcap, sinks=_detached(sinks), **opts)


def _triton_tf32(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
    from ...kernels.triton_flash import flash_attention

    opts = {"causal": causal, "window": window, "scale": scale, "allow_tf32": True}
    return flash_attention(q, k, v, softcap=softcap, sinks=_detached(sinks), **opts)


def _triton_backward(
    q, k, v, do, *, causal, window, scale, mask=None, allow_tf32=False, softcap=None, sinks=None,
    deterministic=True, approx_tanh=False,
):  # fmt: skip
    """The Triton FA2 backward, after the Triton forward (for O and LSE); ``(dQ, dK, dV)``, and
    ``dσ`` after them with sinks. Two-kernel (bitwise reproducible) unless ``deterministic`` is
    False: campaign results are compared bit for bit across runs and machines."""
    from ...kernels.triton_flash import flash_attention
    from ...kernels.triton_flash_bwd import flash_attention_backward

    opts = {"causal": causal, "window": window, "scale": scale, "allow_tf32": allow_tf32}
    opts.update(softcap=softcap, sinks=_detached(sinks), approx_tanh=approx_tanh)
    o, lse = flash_attention(q, k, v, **opts)
    return flash_attention_backward(q, k, v, o, lse, do, deterministic=deterministic, **opts)


def _triton_atomic_backward(
    q, k, v, do, *, causal, window, scale, mask=None, softcap=None, sinks=None
):
    opts = {"causal": causal, "window": window, "scale": scale, "softcap": softcap}
    return _triton_backward(q, k, v, do, sinks=sinks, deterministic=False, **opts)


def _triton_approx_backward(
    q, k, v, do, *, causal, window, scale, mask=None, softcap=None, sinks=None
):
    opts = {"causal": causal, "window": window, "scale": scale, "softcap": softcap}
    return _triton_backward(q, k, v, do, sinks=sinks, approx_tanh=True, **opts)


def _triton_tf32_backward(
    q, k, v, do, *, causal, window, scale, mask=None, softcap=None, sinks=None
):
    opts = {"causal": causal, "window": window, "scale": scale, "softcap": softcap}
    return _triton_backward(q, k, v, do, allow_tf32=True, sinks=sinks, **opts)


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


def project_kernels() -> dict[str, Kernel]:
    """The project's own kernels, by name: the reference kernels, the Triton dense kernels,
    the ragged layouts' and the FP8 kernel, in that order."""
    return {**_reference_kernels(), **_triton_kernels(), **ragged_kernels(), **fp8_kernels()}


def _reference_kernels() -> dict[str, Kernel]:
    """The numpy recurrence (FA2 and FA1 blocking) and the naive numpy and torch kernels."""
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
    }


def _triton_kernels() -> dict[str, Kernel]:
    """The Triton FlashAttention-2 forward and backward, IEEE fp32 and tf32 dots."""
    return {
        "triton": Kernel(
            "triton",
            _triton,
            "flash",
            api="torch",
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale", "softcap", "sinks"}),
            check_available=triton_available,
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
            check_available=triton_available,
            backward=_triton_tf32_backward,
            backward_arithmetic="tf32",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
        ),
        # triton with the soft-cap's tanh by the GPU's tanh.approx.f32 (FlashAttention's
        # choice); its bounds take that tanh's error. GPU only: the interpreter keeps the
        # accurate tanh, so there it would only repeat "triton".
        "triton-approx-tanh": Kernel(
            "triton-approx-tanh",
            _triton_approx,
            "flash",
            api="torch",
            devices=("cuda",),
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale", "softcap", "sinks"}),
            check_available=triton_available,
            backward=_triton_approx_backward,
            backward_arithmetic="flash",
            backward_score_limit=BWD_FLASH_SCORES,
            deterministic=True,
            batch_invariant=True,
            tanh="approx",
        ),
        # triton's forward; its gradients are the fused backward's, whose dQ sums by atomic
        # adds in a run-dependent order on a GPU: neither bitwise property is promised.
        "triton-atomic": Kernel(
            "triton-atomic",
            _triton,
            "flash",
            api="torch",
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale", "softcap", "sinks"}),
            check_available=triton_available,
            backward=_triton_atomic_backward,
            backward_arithmetic="flash",
            backward_score_limit=BWD_FLASH_SCORES,
        ),
    }
