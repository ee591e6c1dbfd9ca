"""Built-in adapters for attention kernels that ship with other libraries.

- ``sdpa-math``, ``sdpa-flash``, ``sdpa-efficient``, ``sdpa-cudnn``: one backend of
  ``torch.nn.functional.scaled_dot_product_attention`` each, forced with
  ``torch.nn.attention.sdpa_kernel`` so torch cannot silently fall back to another one (a
  backend that cannot take an input raises, and the campaign records the error).
- ``flex``: ``torch.nn.attention.flex_attention`` under ``torch.compile`` (the eager path is a
  reference implementation, not the kernel users run); soft-capping through ``score_mod``,
  sinks by correcting O and LSE from the LSE it returns.
- ``flash-attn``: ``flash_attn.flash_attn_func`` when the ``flash-attn`` package is installed.

How each is called, and why:

- Masks. SDPA's ``is_causal`` is top-left aligned when ``Nq != Nk``; flashcheck's contract
  (docs/api.md) is bottom-right. The backends that take a boolean ``attn_mask`` (math, efficient)
  get the exact keep-mask of the case; flash and cuDNN take no mask, so they are only given
  causal cases with ``Nq == Nk``, where the two alignments agree. FlexAttention gets a
  ``mask_mod`` that implements the contract, flash-attn its own bottom-right ``causal`` and
  ``window_size``.
- GQA. K and V heads are repeated to the query heads before the call (the same values, so the
  same mathematical problem): backends differ in ``enable_gqa`` support and a missing feature
  should not be reported as a numerical failure.
- Outputs. SDPA returns no log-sum-exp, so only O is judged; FlexAttention and flash-attn
  return LSE (natural log), which is judged too.
- Arithmetic classes. ``sdpa-flash`` and ``flash-attn`` are FlashAttention-2 (fp32
  accumulators, P rounded to the input format before P·V) and get the ``flash`` bounds with
  the worst case over key-block sizes; the others are ``unknown``: the empirical policy only.
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import numpy as np

from ..cases.case import Case
from .adapter import Kernel, KernelUnsupported

__all__ = [
    "SDPA_BACKENDS",
    "flex_function",
    "library_kernels",
    "raise_recompile_limits",
    "with_sinks",
]

SDPA_BACKENDS = {
    "sdpa-math": "MATH",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}
_HALF = ("fp16", "bf16")


def raise_recompile_limits() -> None:
    """Let ``torch.compile`` recompile FlexAttention for every new shape.

    New shapes recompile; past dynamo's default limit of 8 recompilations torch silently falls
    back to flex_attention's eager reference path (tens of times slower, and materializing the
    score matrix), which would then be measured and reported as "flex".
    """
    import torch

    cfg = torch._dynamo.config
    for name, floor in (
        ("recompile_limit", 512),
        ("cache_size_limit", 512),
        ("accumulated_recompile_limit", 4096),
        ("accumulated_cache_size_limit", 4096),
    ):
        if hasattr(cfg, name):  # renamed across torch versions
            setattr(cfg, name, max(getattr(cfg, name), floor))


def _keep_tensor(q: Any, k: Any, causal: bool, window: Any, mask: Any) -> Any | None:
    """The case's boolean keep-mask ``(B or 1, Hq or 1, Nq, Nk)``, or ``None`` without masks."""
    import torch

    from ...kernels.recurrence import keep_mask

    nq, nk = q.shape[2], k.shape[2]
    if not causal and window is None and mask is None:
        return None
    keep = keep_mask(nq, nk, np.arange(nq), np.arange(nk), causal, window, None)
    out = torch.from_numpy(keep)[None, None].to(q.device)
    if mask is not None:
        out = out & mask.to(torch.bool)
    return out


def _repeat_kv(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    rep = q.shape[1] // k.shape[1]
    if rep == 1:
        return k, v
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)


def _sdpa(backend: str, takes_mask: bool):
    def fn(q, k, v, *, causal, window, scale, mask=None):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        k, v = _repeat_kv(q, k, v)
        kw: dict[str, Any] = {"scale": scale}
        if takes_mask:
            kw["attn_mask"] = _keep_tensor(q, k, causal, window, mask)
        else:
            kw["is_causal"] = causal  # only given Nq == Nk causal cases: see _square_causal
        with sdpa_kernel([getattr(SDPBackend, backend)]), warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                return F.scaled_dot_product_attention(q, k, v, **kw)
            except RuntimeError as err:
                if "No available kernel" not in str(err):
                    raise
                # torch says why in UserWarnings; keep the specific ones as the reason.
                why = [str(x.message).split(" (Triggered")[0] for x in w]
                why = [x for x in why if "not used because" not in x and "disabled" not in x]
                raise KernelUnsupported(
                    f"{backend} declined the input: {'; '.join(why) or err}"
                ) from None

    return fn


def _square_causal(case: Case, device: str | None = None) -> str | None:
    _, _, _, nq, nk, d, dv = case.shape
    if case.causal and nq != nk:
        return "causal with Nq != Nk: SDPA's is_causal is top-left aligned (bottom-right needed)"
    if d != dv:
        return "d != dv unsupported"
    return None


def with_sinks(o: Any, lse: Any, sinks: Any) -> tuple[Any, Any]:
    """Attention sinks added to an attention's ``O`` and natural-log ``LSE`` (torch tensors,
    ``(B, H, N, dv)`` and ``(B, H, N)``): the sink ``σ_h`` joins each row's denominator, so
    ``LSE' = log(e^LSE + e^σ_h)`` and ``O' = O·e^(LSE − LSE')`` (in fp32, then rounded to O's
    dtype: a second rounding of O). A row that kept no key (``LSE = −inf``, ``O = 0``) gets
    ``O' = 0``, ``LSE' = σ_h``. Differentiable: autograd through it gives ``dσ``."""
    import torch

    total = torch.logaddexp(lse.float(), sinks.float().reshape(1, -1, 1))
    o = (o.float() * torch.exp(lse.float() - total).unsqueeze(-1)).to(o.dtype)
    return o, total


def _flex_call(flex: Any, q: Any, k: Any, v: Any, kw: dict) -> tuple[Any, Any]:
    """``(O, LSE)`` of one FlexAttention call: ``return_aux`` where this torch has it
    (``return_lse`` is deprecated there), else ``return_lse``."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return flex(q, k, v, return_lse=True, **kw)
    o, aux = flex(q, k, v, return_aux=AuxRequest(lse=True), **kw)
    return o, aux.lse


def flex_function(*, compiled: bool = True):
    """The ``flex`` adapter's function: ``flex_attention`` under ``torch.compile`` as users call
    it (``compiled=False``: the eager reference path, for testing this adapter where the
    compiled kernel cannot run, e.g. with LSE on a CPU). Soft-capping is the ``score_mod``
    ``c·tanh(score/c)`` (the cap a captured tensor, so a new cap does not recompile); sinks
    correct O and LSE from the returned LSE (:func:`with_sinks`)."""
    flex: dict[str, Any] = {}

    def fn(q, k, v, *, causal, window, scale, mask=None, softcap=None, sinks=None):
        import torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        if "f" not in flex:
            if compiled:
                raise_recompile_limits()
            flex["f"] = torch.compile(flex_attention) if compiled else flex_attention
        b, hq, nq, _ = q.shape
        nk = k.shape[2]
        keep = _keep_tensor(q, k, causal, window, mask)
        block_mask = None
        if keep is not None:
            keep = keep.expand(b, hq, nq, nk).contiguous()

            def mask_mod(bi, hi, qi, kj):
                return keep[bi, hi, qi, kj]

            block_mask = create_block_mask(mask_mod, b, hq, nq, nk, device=q.device)
        k, v = _repeat_kv(q, k, v)
        score_mod = None
        if softcap:
            cap = torch.tensor(float(softcap), dtype=torch.float32, device=q.device)

            def score_mod(score, bi, hi, qi, kj):
                return cap * torch.tanh(score / cap)

        kw = {"block_mask": block_mask, "scale": scale, "score_mod": score_mod}
        o, lse = _flex_call(flex["f"], q, k, v, kw)
        if sinks is not None:
            o, lse = with_sinks(o, lse, sinks)
        return o, lse

    return fn


def _flash_attn(q, k, v, *, causal, window, scale):
    from flash_attn import flash_attn_func

    left, right = (None, None) if window is None else window
    ws = (-1 if left is None else left, -1 if right is None else right)
    # flash-attn takes (B, N, H, d) and handles GQA itself; it returns LSE when asked for
    # "attention probabilities" (softmax_lse is the second element).
    res = flash_attn_func(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=scale,
        causal=causal,
        window_size=ws,
        return_attn_probs=True,
    )
    return res[0].transpose(1, 2), res[1]


def _cuda_only(dtype: str, device: str) -> str | None:
    import torch

    if device != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    return None


def _cuda_if_asked(dtype: str, device: str) -> str | None:
    return _cuda_only(dtype, device) if device == "cuda" else None


def _flash_attn_available(dtype: str, device: str) -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed"
    return _cuda_only(dtype, device)


def _flex_available(dtype: str, device: str) -> str | None:
    try:
        found = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return "this torch has no torch.nn.attention.flex_attention"
    return _cuda_only(dtype, device)


def library_kernels() -> dict[str, Kernel]:
    """Adapters for torch's SDPA backends, FlexAttention and flash-attn, by name. (Longer
    than 80 lines: one declaration table, a kernel per entry.)"""
    all_masks = frozenset({"causal", "window", "mask"})
    pow2 = (16, 32, 64, 128, 256)
    mult8 = tuple(range(8, 257, 8))
    out = {
        "sdpa-math": Kernel(
            "sdpa-math",
            _sdpa("MATH", True),
            "unknown",
            masks=all_masks,
            batch_invariant=False,
            check_available=_cuda_if_asked,
            backward="autograd",
            deterministic=True,
        ),
        "sdpa-flash": Kernel(
            "sdpa-flash",
            _sdpa("FLASH_ATTENTION", False),
            "flash",
            dtypes=_HALF,
            devices=("cuda",),
            masks=frozenset({"causal"}),
            check_available=_cuda_only,
            check_case=_square_causal,
            backward="autograd",
            deterministic=True,
            batch_invariant=True,
        ),
        "sdpa-efficient": Kernel(
            "sdpa-efficient",
            _sdpa("EFFICIENT_ATTENTION", True),
            "unknown",
            devices=("cuda",),
            masks=all_masks,
            check_available=_cuda_only,
            backward="autograd",
            deterministic=True,
            batch_invariant=True,
        ),
        "sdpa-cudnn": Kernel(
            "sdpa-cudnn",
            _sdpa("CUDNN_ATTENTION", False),
            "unknown",
            dtypes=_HALF,
            devices=("cuda",),
            masks=frozenset({"causal"}),
            head_dims=mult8[:16],
            check_available=_cuda_only,
            check_case=_square_causal,
            backward="autograd",
            deterministic=True,
            batch_invariant=True,
        ),
        "flex": Kernel(
            "flex",
            flex_function(),
            "unknown",
            devices=("cuda",),
            masks=all_masks,
            options=frozenset({"causal", "window", "mask", "scale", "softcap", "sinks"}),
            head_dims=pow2,
            check_available=_flex_available,
            backward="autograd",
            deterministic=True,
            batch_invariant=True,
        ),
        "flash-attn": Kernel(
            "flash-attn",
            _flash_attn,
            "flash",
            dtypes=_HALF,
            devices=("cuda",),
            masks=frozenset({"causal", "window"}),
            options=frozenset({"causal", "window", "scale"}),
            check_available=_flash_attn_available,
            backward="autograd",
            deterministic=True,
            batch_invariant=True,
        ),
    }
    return out
