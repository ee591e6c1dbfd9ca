"""Declaring a kernel's contract: :func:`kernel` (``flashcheck.kernel``), which wraps a plain
attention function with what it promises (arithmetic class, dtypes, masks, options, backward,
NaN policy, compile keys, layout); every field left out is probed on first use
(:mod:`flashcheck.harness.adapters.probe`). Finding kernels by name is
:mod:`flashcheck.harness.adapters.registry`'s.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterable
from typing import Any

from ..cases.case import FP8_DTYPES
from ..core.layouts import LAYOUTS
from ..judging.bounds import ARITHMETIC_CLASSES
from ..judging.roundoff import tanh_error
from .adapter import ALL_DTYPES, ALL_MASKS, CONTRACT_FIELDS, NAN_POLICIES, Kernel
from .availability import triton_interpreter_bf16, uses_triton
from .compilekeys import COMPILE_DIMS
from .softmax_options import SOFTMAX_OPTIONS
from .spec_check import check_backward_signature

__all__ = ["BASE_OPTIONS", "OPS", "OPTION_NAMES", "accepted_options", "kernel"]

OPS = ("attention", "combine")
BASE_OPTIONS = frozenset({"causal", "window", "mask", "scale"})
# Soft-capping and sinks change the softmax: a kernel takes them only where its signature names
# them (a **kwargs signature is not assumed to), or its declaration says so.
OPTION_NAMES = BASE_OPTIONS | SOFTMAX_OPTIONS


def accepted_options(fn: Callable[..., Any]) -> frozenset[str]:
    """The options among causal/window/mask/scale/softcap/sinks that ``fn`` takes as keywords
    (a ``**kwargs`` signature: the first four, and the others it names)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume the base four
        return BASE_OPTIONS
    named = frozenset(
        p.name for p in params if p.name in OPTION_NAMES and p.kind is not p.POSITIONAL_ONLY
    )
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return BASE_OPTIONS | named
    return named


def _names(value: Iterable[str] | str, allowed: Iterable[str], what: str) -> tuple[str, ...]:
    items = (value,) if isinstance(value, str) else tuple(value)
    bad = [x for x in items if x not in allowed]
    if bad:
        raise ValueError(f"unknown {what} {bad}: choose from {sorted(allowed)}")
    return tuple(dict.fromkeys(items))


def kernel(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    arithmetic: str = "unknown",
    api: str = "torch",
    dtypes: Iterable[str] | None = None,
    devices: Iterable[str] = ("cpu", "cuda"),
    head_dims: Iterable[int] | None = None,
    max_head_dim: int = 256,
    masks: Iterable[str] | None = None,
    options: Iterable[str] | None = None,
    gqa: bool | None = None,
    unequal_lengths: bool | None = None,
    distinct_dv: bool | None = None,
    batched: bool | None = None,
    seq_multiple: int | None = None,
    key_block: int | None = None,
    deterministic: bool = False,
    batch_invariant: bool = False,
    score_limit: dict[str, float] | None = None,
    backward: Callable[..., Any] | str | None = None,
    backward_arithmetic: str = "unknown",
    backward_score_limit: float | None = None,
    nan_inputs: str = "propagate",
    tanh: str = "accurate",
    compile_keys: Iterable[str] | None = None,
    layout: str = "dense",
    op: str = "attention",
) -> Any:
    """Declare the contract of an attention function ``fn(q, k, v, *, causal=..., window=...,
    mask=..., scale=...) -> O or (O, LSE)``; usable as ``kernel(fn, ...)`` or as a decorator
    ``@kernel(...)``.

    The function computes ``O = softmax(scale·Q·Kᵀ + mask)·V`` per (batch, head) on inputs of
    shape ``(B, H, N, d)`` (``scale`` defaults to ``1/sqrt(d)``). It receives only the
    options its signature names. Every argument left ``None`` is discovered on first use by
    running ``fn`` on tiny inputs (an exception marks that input class unsupported); what is
    declared is trusted.

    Args:
        name: shown in reports (default: the function's qualified name).
        arithmetic: one of ``naive``, ``flash``, ``flash-fa1``, ``tf32`` (bounds of that class
            apply) or ``unknown`` (the loosest bound of every class, docs/error-bounds.md).
        api: ``"torch"`` (tensors on the device) or ``"numpy"`` (numpy arrays).
        dtypes: among ``fp16``, ``bf16``, ``fp32``. devices: among ``cpu``, ``cuda``.
        head_dims: the head dims it accepts; max_head_dim: the largest.
        masks: among ``causal``, ``window``, ``mask`` (and only those its signature takes).
        options: the keyword options it takes, among ``causal``, ``window``, ``mask``,
            ``scale``, ``softcap`` and ``sinks`` (default: those its signature names; a
            ``**kwargs`` signature is taken to mean the first four). Cases that need an option
            it lacks are outside its contract; the others are not passed to it.
        gqa: accepts fewer key/value heads than query heads. unequal_lengths: ``Nq != Nk``.
        distinct_dv: a value head dim other than ``d``. batched: ``B·H > 1`` in one call.
        seq_multiple: every sequence length must be a multiple of this.
        key_block: the key-block size of a flash kernel (sets its bound's summation depth).
        deterministic, batch_invariant: promise bitwise reproducibility across calls and across
            batch composition; otherwise the kernel is compared with itself within its bound.
        score_limit: per dtype, the largest ``scale·Σ|q||k|`` it is specified for.
        backward: how to get its gradients for gradient checks: ``"autograd"`` (torch autograd
            through ``fn``'s output) or a function ``bwd(q, k, v, do, *, causal=..., ...) ->
            (dQ, dK, dV)`` taking the options ``fn`` takes; ``None``: no gradient checks. With
            ``layout="varlen"``: ``bwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
            max_seqlen_k, do, *, causal=..., ...)`` in the packed layout (paged: none).
        backward_arithmetic: the class whose gradient bounds apply (``naive``, ``flash``,
            ``flash-fa1``, ``tf32`` or ``unknown``, the loosest: docs/error-bounds.md §11).
        backward_score_limit: the largest ``scale·Σ|q||k|`` the backward is specified for.
        nan_inputs: ``"propagate"`` (every output a NaN input is involved in is NaN) or
            ``"any"`` (finite outputs there are accepted as a convention, e.g.
            ``nan_to_num`` on the probabilities); finite inputs must give finite outputs
            either way.
        tanh: how a soft-capped kernel computes tanh: ``"accurate"`` (within 2 ulp of fp32,
            as CUDA's ``tanhf`` and CPU libraries) or ``"approx"`` (the GPU's
            ``tanh.approx.f32``, as FlashAttention's and FlashInfer's soft-cap: relative error
            up to ``2^-16``, measured over every fp32 argument on an H200). It sets the tanh's
            term in the bounds; a kernel with the approximate tanh declared ``"accurate"``
            fails at large caps.
        compile_keys: the dimensions among ``dtype``, ``nq``, ``nk``, ``d``, ``dv``,
            ``causal`` whose every new value costs the kernel a compile (autotuning, constexpr
            shapes): then every generator draws them from a small palette. ``()`` declares
            none; ``None`` has a probe time the kernel's first and repeated calls to find them.
        layout: ``"dense"`` (the signature above), ``"varlen"`` (``fn(q, k, v, cu_seqlens_q,
            cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=..., window=..., scale=...)``,
            as ``flash_attn_varlen_func``) or ``"paged"`` (``fn(q, k_cache, v_cache, *,
            cache_seqlens, block_table, causal=..., scale=...)``, as
            ``flash_attn_with_kvcache``): docs/api.md, "Ragged batches".
        op: ``"attention"`` or ``"combine"``: ``fn(out_partial, lse_partial) -> (O, LSE)``,
            the merge of split-KV partials (no attention options).

    Returns:
        a :class:`~flashcheck.harness.adapters.adapter.Kernel` (or a decorator making one).

    Longer than 80 lines: the signature and this docstring name every contract field; the
    body checks each argument, with a message that says how to fix the call.
    """
    if fn is None:
        given = {key: val for key, val in locals().items() if key != "fn"}
        return lambda f: kernel(f, **given)
    declared_in = sys._getframe(1).f_globals.get("__name__", "")
    if not callable(fn):
        raise TypeError(f"kernel() takes the attention function itself, got {type(fn).__name__}")
    if arithmetic not in ARITHMETIC_CLASSES:
        raise ValueError(f"arithmetic must be one of {ARITHMETIC_CLASSES}, got {arithmetic!r}")
    if api not in ("torch", "numpy"):
        raise ValueError(f"api must be 'torch' or 'numpy', got {api!r}")
    if seq_multiple is not None and (not isinstance(seq_multiple, int) or seq_multiple < 1):
        raise ValueError(f"seq_multiple must be a positive int, got {seq_multiple!r}")
    if not isinstance(max_head_dim, int) or max_head_dim < 1:
        raise ValueError(f"max_head_dim must be a positive int, got {max_head_dim!r}")
    if backward is not None and backward != "autograd" and not callable(backward):
        raise ValueError(
            f"backward must be 'autograd', a function bwd(q, k, v, do, **options) -> (dQ, dK, "
            f"dV), or None; got {backward!r}"
        )
    if backward == "autograd" and api != "torch":
        raise ValueError("backward='autograd' needs api='torch': autograd differentiates torch")
    if backward_arithmetic not in ARITHMETIC_CLASSES:
        raise ValueError(
            f"backward_arithmetic must be one of {ARITHMETIC_CLASSES}, got {backward_arithmetic!r}"
        )
    tanh_error(tanh)  # raises, saying what to pass
    if nan_inputs not in NAN_POLICIES:
        raise ValueError(
            f"nan_inputs must be one of {NAN_POLICIES} ('any' accepts finite outputs where a "
            f"NaN input is involved), got {nan_inputs!r}"
        )
    layout_args = {"masks": masks, "head_dims": head_dims, "gqa": gqa, "backward": backward}
    layout_args.update(unequal_lengths=unequal_lengths, batched=batched, key_block=key_block)
    layout_args.update(seq_multiple=seq_multiple, compile_keys=compile_keys)
    layout_args.update(distinct_dv=distinct_dv, score_limit=score_limit)
    layout_args["arithmetic"] = None if arithmetic == "unknown" else arithmetic
    fixed = _check_layout(layout, op, layout_args)
    opts = accepted_options(fn)
    if options is not None:
        if op == "combine" and options:
            raise ValueError(
                f"a split-KV merge takes no attention options, got options={sorted(options)}: "
                "leave options out for op='combine'"
            )
        opts = frozenset(_names(options, OPTION_NAMES, "option(s)"))
    if fixed:
        opts = opts - {"mask"} if op == "attention" else frozenset()
    if callable(backward) and layout == "dense" and op == "attention":
        check_backward_signature(backward, opts)
    # Until a probe narrows them, the masks are those the signature can take at all.
    declared: dict[str, Any] = {"options": opts}
    undeclared_masks = frozenset(m for m in ALL_MASKS if m in opts)
    if dtypes is not None:
        declared["dtypes"] = _names(dtypes, (*ALL_DTYPES, *FP8_DTYPES), "dtype(s)")
    if head_dims is not None:
        dims = tuple(sorted({int(x) for x in head_dims}))
        if not dims or dims[0] < 1:
            raise ValueError(f"head_dims must be positive ints, got {head_dims!r}")
        declared["head_dims"] = dims
    if masks is not None:
        want = frozenset(_names(masks, ALL_MASKS, "mask(s)"))
        missing = sorted(want - opts)
        if missing:
            raise ValueError(
                f"masks {missing} are declared but {getattr(fn, '__name__', fn)!r} takes no "
                f"keyword argument of that name: add it to the function's signature"
            )
        declared["masks"] = want
    if compile_keys is not None:
        declared["compile_keys"] = _names(compile_keys, COMPILE_DIMS, "compile key(s)")
    for key, val in (
        ("gqa", gqa),
        ("unequal_lengths", unequal_lengths),
        ("distinct_dv", distinct_dv),
        ("batched", batched),
        ("seq_multiple", seq_multiple),
    ):
        if val is not None:
            declared[key] = val
    declared.update(fixed)
    label = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    return Kernel(
        label,
        fn,
        arithmetic,
        api=api,
        devices=_names(devices, ("cpu", "cuda"), "device(s)"),
        max_head_dim=max_head_dim,
        key_block=key_block,
        deterministic=deterministic,
        batch_invariant=batch_invariant,
        score_limit=dict(score_limit or {}),
        backward=backward,
        backward_arithmetic=backward_arithmetic,
        backward_score_limit=backward_score_limit,
        nan_inputs=nan_inputs,
        tanh=tanh,
        pending=frozenset(f for f in CONTRACT_FIELDS if f not in declared),
        layout=layout,
        op=op,
        declared_in=declared_in,
        check_available=triton_interpreter_bf16 if uses_triton(fn) else None,
        **{"masks": undeclared_masks, **declared},
    )


# What a ragged layout fixes in the contract: every length and batch shape is the layout's own.
_RAGGED_FIXED = {"unequal_lengths": True, "batched": True, "seq_multiple": 1, "compile_keys": ()}
_NOT_RAGGED = ("unequal_lengths", "batched", "seq_multiple", "compile_keys", "backward")
_NOT_COMBINE = (
    *_NOT_RAGGED,
    *("masks", "head_dims", "gqa", "key_block", "distinct_dv", "score_limit", "arithmetic"),
)


def _check_layout(layout: str, op: str, given: dict[str, Any]) -> dict[str, Any]:
    """The contract fields a ragged layout or the merge fixes (``{}`` for dense attention);
    a declaration that does not apply to them is refused, saying what to leave out."""
    if layout not in LAYOUTS:
        raise ValueError(
            f"layout must be one of {LAYOUTS}, got {layout!r}: 'varlen' for packed sequences "
            "with cu_seqlens (flash_attn_varlen_func), 'paged' for a paged KV cache with a "
            "block table (flash_attn_with_kvcache)"
        )
    if op not in OPS:
        raise ValueError(
            f"op must be one of {OPS}, got {op!r}: 'combine' declares a merge of split-KV "
            "partials fn(out_partial, lse_partial) -> (O, LSE)"
        )
    if op == "combine" and layout != "dense":
        raise ValueError(
            "op='combine' takes no layout: a merge reads (out_partial, lse_partial) whatever "
            "layout made them; leave layout out"
        )
    if layout == "dense" and op == "attention":
        return {}
    refused = _NOT_COMBINE if op == "combine" else _NOT_RAGGED
    if layout == "varlen":  # a varlen backward is checked per sequence (checks/ragged_gradients)
        refused = tuple(key for key in refused if key != "backward")
    what = "op='combine'" if op == "combine" else f"layout={layout!r}"
    bad = sorted(key for key in refused if given.get(key) not in (None, {}))
    if bad:
        why = (
            "a merge has no attention options or shapes to declare, and is judged by the "
            "merge's own bounds (docs/error-bounds.md, section 12)"
        )
        if op == "attention":
            why = "lengths and batch shapes are the layout's own"
            if "backward" in bad:
                why = "paged decode kernels have no gradient checks (varlen ones do)"
        raise ValueError(f"{what} takes no {', '.join(bad)}: {why}; leave them out")
    masks = given.get("masks")
    if op == "attention" and masks is not None and "mask" in _as_tuple(masks):
        raise ValueError(
            f"{what} takes causal and window masks, not an explicit mask: drop 'mask' from masks"
        )
    fixed = dict(_RAGGED_FIXED)
    if op == "combine":
        fixed.update(masks=frozenset(), options=frozenset(), gqa=True, head_dims=None)
        fixed["distinct_dv"] = True
    return fixed


def _as_tuple(value: Iterable[str] | str) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)
