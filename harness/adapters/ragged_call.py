"""Calling a kernel of a ragged layout on a :class:`~flashcheck.harness.cases.ragged.RaggedCase`.

The calls follow FlashAttention's public functions (docs/api.md, "Ragged batches"):

- varlen: ``fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
  window, scale)`` → ``O (total_q, Hq, dv)`` or ``(O, LSE)`` with ``LSE (Hq, total_q)``;
- paged: ``fn(q, k_cache, v_cache, *, cache_seqlens, block_table, causal, window, scale)`` →
  ``O (B, Nq, Hq, dv)`` or ``(O, LSE)`` with ``LSE (B, Hq, Nq)``;
- combine: ``fn(out_partial, lse_partial)`` → ``(O, LSE)``, ``O (..., dv)``, ``LSE (...)``.

Only the options the kernel's signature names are passed (as for dense kernels).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from ..cases.ragged import FLOATS, INDEX, RaggedCase
from ..core.semantics import as_exact_array
from .adapter import (
    NO_TENSOR,
    Kernel,
    KernelCall,
    KernelOutput,
    KernelOutputError,
    score_magnitude,
)
from .call_limit import kernel_call
from .kernel_call import ieee_quiet, raised_by
from .kernel_output import check_output_format, lse_to_f64

__all__ = [
    "call_ragged",
    "dense_arrays_refusal",
    "head_dim_for",
    "kernel_layout",
    "ragged_output",
    "ragged_supports",
    "shapes",
]


def kernel_layout(kernel: Kernel) -> str:
    """The case layout a kernel takes: ``"dense"``, ``"varlen"``, ``"paged"`` or
    ``"combine"``."""
    return "combine" if kernel.op == "combine" else kernel.layout


def ragged_supports(kernel: Kernel, case: RaggedCase) -> str | None:
    """Why ``case`` is outside ``kernel``'s contract, or ``None`` if it is inside."""
    want = kernel_layout(kernel)
    if want != case.layout:
        return f"{kernel.name} takes {want} inputs, the case is {case.layout}"
    if case.dtype not in kernel.dtypes:
        return f"{kernel.name} does not support {case.dtype}"
    if case.layout == "combine":
        return None
    t = case.tensors
    hq, d = t["q"].shape[-2:]
    hk, dv = t["v" if case.layout == "varlen" else "v_cache"].shape[-2:]
    if case.causal and "causal" not in kernel.masks:
        return "causal masks unsupported"
    if case.window is not None and "window" not in kernel.masks:
        return "windows unsupported"
    if case.scale is not None and kernel.options is not None and "scale" not in kernel.options:
        return "an explicit scale is unsupported"
    if max(d, dv) > kernel.max_head_dim:
        return f"head dim > {kernel.max_head_dim}"
    if kernel.head_dims is not None and not {d, dv} <= set(kernel.head_dims):
        return f"head dims ({d}, {dv}) not among {kernel.head_dims}"
    if dv != d and not kernel.distinct_dv:
        return "dv != d unsupported"
    if hq != hk and not kernel.gqa:
        return "grouped-query heads (Hq != Hk) unsupported"
    limit = kernel.score_limit.get(case.dtype)
    if limit is not None:
        mag = max((score_magnitude(case.sequence(b)) for b in range(case.sequences)), default=0.0)
        if mag >= limit:
            return f"scores reach {mag:.3g} >= the kernel's limit {limit:.3g}"
    return None


def shapes(case: RaggedCase) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shapes of ``O`` and ``LSE`` a kernel returns for ``case``."""
    t = case.tensors
    if case.layout == "combine":
        lead = t["lse_partial"].shape[1:]
        return (*lead, t["out_partial"].shape[-1]), lead
    if case.layout == "varlen":
        total_q, hq, _ = t["q"].shape
        return (total_q, hq, t["v"].shape[2]), (hq, total_q)
    bsz, nq, hq, _ = t["q"].shape
    return (bsz, nq, hq, t["v_cache"].shape[3]), (bsz, hq, nq)


def _options(kernel: Kernel, case: RaggedCase) -> dict[str, Any]:
    opts = case.options()
    if kernel.options is not None:
        opts = {key: val for key, val in opts.items() if key in kernel.options}
    return opts


def call_ragged(kernel: Kernel, case: RaggedCase, device: str = "cpu") -> KernelCall:
    """Call ``kernel`` on ``case`` in the case's layout (module docstring): numpy arrays for
    ``api="numpy"``, else torch tensors on ``device`` (bit-exact; index tensors int32)."""
    if kernel_layout(kernel) != case.layout:
        raise ValueError(f"{kernel.name} takes {kernel_layout(kernel)} inputs, not {case.layout}")
    args = case.arguments(kernel.api, device)
    opts = _options(kernel, case)
    with contextlib.ExitStack() as stack:
        stack.enter_context(ieee_quiet())
        if kernel.api == "torch":
            import torch

            stack.enter_context(torch.no_grad())
        stack.enter_context(kernel_call(kernel.name, case))
        stack.enter_context(raised_by(kernel.name, case))
        if case.layout == "combine":
            res = kernel.fn(args["out_partial"], args["lse_partial"])
        elif case.layout == "varlen":
            batch = case.batch
            res = kernel.fn(
                args["q"],
                args["k"],
                args["v"],
                args["cu_seqlens_q"],
                args["cu_seqlens_k"],
                batch.max_seqlen_q,
                batch.max_seqlen_k,
                **opts,
            )
        else:
            res = kernel.fn(
                args["q"],
                args["k_cache"],
                args["v_cache"],
                cache_seqlens=args["cache_seqlens"],
                block_table=args["block_table"],
                **opts,
            )
    return KernelCall(args, res)


def _exact(x: Any, name: str, kernel: Kernel) -> tuple[np.ndarray, str]:
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu()
    try:
        arr, fmt = as_exact_array(x, f"kernel {name}")
    except (TypeError, ValueError) as err:
        raise KernelOutputError(f"{kernel.name} returned an unusable {name}: {err}") from None
    return arr, fmt.name


def ragged_output(kernel: Kernel, case: RaggedCase, call: KernelCall) -> KernelOutput:
    """A call's ``O`` (and ``LSE``) checked against the layout's shapes and copied exactly to
    float64; ``KernelOutputError`` says what is wrong."""
    res = call.result
    o, lse = (res if isinstance(res, tuple | list) else (res, None))[:2]
    if o is None:
        raise KernelOutputError(
            f"{kernel.name} {NO_TENSOR} (None): return O, or (O, LSE), as tensors or arrays"
        )
    want_o, want_lse = shapes(case)
    o64, o_dtype = _exact(o, "O", kernel)
    if o64.shape != want_o:
        raise KernelOutputError(
            f"{kernel.name} returned O of shape {o64.shape}, expected {want_o} ({case.layout})"
        )
    if case.layout != "combine":  # (a merge's O is judged in the format it comes back in)
        check_output_format(kernel.name, o_dtype, case)
    lse64 = None
    if lse is not None:
        lse64 = lse_to_f64(lse)
        if lse64.shape != want_lse:
            raise KernelOutputError(
                f"{kernel.name} returned LSE of shape {lse64.shape}, expected {want_lse} "
                f"({case.layout})"
            )
    if case.layout == "combine" and lse64 is None:
        raise KernelOutputError(f"{kernel.name}: a merge returns (O, LSE), got O alone")
    return KernelOutput(o64, lse64, o_dtype)


def head_dim_for(adapter: Kernel, want: int) -> int:
    """``want`` if the kernel takes that head dim, else the closest one it takes (the
    smallest above, else the largest): the families are drawn inside its contract."""
    if adapter.head_dims is None:
        return min(want, adapter.max_head_dim)
    if want in adapter.head_dims:
        return want
    above = [d for d in adapter.head_dims if d > want]
    return min(above) if above else max(adapter.head_dims)


def dense_arrays_refusal(adapter: Kernel, api: str) -> str:
    """Why ``api`` (``check``, ``check_gradients``) refuses dense arrays for ``adapter``, a
    kernel of a ragged layout, and what to pass instead (a user read "declare the contract
    wider (dtypes=..., masks=...)", which no declaration of that kind fixes)."""
    layout = "combine" if adapter.op == "combine" else adapter.layout
    names = ", ".join(f"{n}=..." for n in (*FLOATS[layout], *INDEX[layout]))
    what = {
        "varlen": "declared with layout='varlen': it takes packed sequences",
        "paged": "declared with layout='paged': it takes a paged KV cache",
        "combine": "declared with op='combine': it takes split-KV partial results to merge",
    }[layout]
    draw = ", or draw cases with flashcheck.strategies.ragged_cases" if api == "check" else ""
    how = (
        f"Build its input with flashcheck.RaggedCase.from_arrays({layout!r}, {names}) and pass "
        f"that as the case{draw}"
    )
    if api != "check" and layout != "varlen":
        how = f"{api} takes dense kernels and varlen ones declared with a backward"
    return f"{adapter.name} is {what}, not dense (B, H, N, d) arrays. {how}"
