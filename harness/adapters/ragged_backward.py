"""Calling the backward of a varlen kernel on a varlen
:class:`~flashcheck.harness.cases.ragged.RaggedCase`.

A varlen kernel declared with ``backward=`` (``flashcheck.kernel(fn, layout="varlen",
backward=...)``) gives its gradients in the layout's own shapes, ``dQ (total_q, Hq, d)``,
``dK (total_k, Hk, d)``, ``dV (total_k, Hk, dv)``, for an upstream ``dO (total_q, Hq, dv)``:

- ``backward="autograd"``: torch autograd through ``fn``'s ``O`` (as ``flash_attn_varlen_func``
  is differentiated);
- a function: ``bwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, do, *,
  causal=..., window=..., scale=...) -> (dQ, dK, dV)`` (only the options ``fn`` takes).

Paged decode kernels have no backward to check.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cases.ragged import RaggedCase, torch_tensor
from ..core.semantics import as_exact_array
from .adapter import Kernel, KernelCall, KernelGradients, KernelOutputError
from .call_limit import kernel_call
from .kernel_call import ieee_quiet, raised_by
from .ragged_call import kernel_layout

__all__ = ["call_varlen_backward", "varlen_gradients"]


def _options(kernel: Kernel, case: RaggedCase) -> dict[str, Any]:
    opts = case.options()
    if kernel.options is not None:
        opts = {key: val for key, val in opts.items() if key in kernel.options}
    return opts


def call_varlen_backward(
    kernel: Kernel, case: RaggedCase, do: np.ndarray, device: str = "cpu"
) -> KernelCall:
    """Call ``kernel``'s backward (module docstring) on the varlen ``case`` and the upstream
    gradient ``do`` (``(total_q, Hq, dv)`` in the inputs' format): a :class:`KernelCall` whose
    ``args`` are the tensors handed over by name (``q``, ``k``, ``v``, the prefix sums, ``do``)."""
    if kernel_layout(kernel) != "varlen" or case.layout != "varlen":
        raise ValueError(
            f"varlen gradients need a varlen kernel and case, got {kernel_layout(kernel)} and "
            f"{case.layout}"
        )
    if kernel.backward is None:
        raise ValueError(f"{kernel.name} declares no backward (flashcheck.kernel(backward=...))")
    if kernel.backward == "autograd" and kernel.api != "torch":
        raise ValueError(f"{kernel.name}: torch autograd only differentiates torch kernels")
    args = case.arguments(kernel.api, device)
    args["do"] = np.array(do, copy=True) if kernel.api == "numpy" else torch_tensor(do, device)
    lead = [args[n] for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    lead += [case.batch.max_seqlen_q, case.batch.max_seqlen_k]
    opts = _options(kernel, case)
    if callable(kernel.backward):
        own = raised_by(f"the backward of {kernel.name}", case)
        with ieee_quiet(), kernel_call(kernel.name, case), own:
            return KernelCall(args, kernel.backward(*lead, args["do"], **opts))
    import torch

    wrt = [args[n].requires_grad_(True) for n in ("q", "k", "v")]
    through = raised_by(f"autograd through {kernel.name}", case)
    with torch.enable_grad(), ieee_quiet(), kernel_call(kernel.name, case), through:
        out = kernel.fn(*lead, **opts)
        o = out[0] if isinstance(out, tuple | list) else out
        if not getattr(o, "requires_grad", False):
            raise KernelOutputError(
                f"{kernel.name}'s O does not depend on q, k, v through torch autograd: declare "
                "backward=None, or pass a backward function"
            )
        res = torch.autograd.grad(o, wrt, grad_outputs=args["do"], allow_unused=True)
    # An input O does not depend on has gradient 0 (judged as such).
    return KernelCall(
        args, [torch.zeros_like(x) if g is None else g for g, x in zip(res, wrt, strict=True)]
    )


def varlen_gradients(kernel: Kernel, case: RaggedCase, call: KernelCall) -> KernelGradients:
    """A varlen backward call's ``(dQ, dK, dV)`` checked against the layout's shapes and copied
    exactly to float64; ``KernelOutputError`` says what is wrong."""
    res = call.result
    if not isinstance(res, tuple | list) or len(res) != 3:
        raise KernelOutputError(f"{kernel.name}'s varlen backward must return (dQ, dK, dV)")
    grads = []
    for name, g, like in zip(("dQ", "dK", "dV"), res, ("q", "k", "v"), strict=True):
        if type(g).__module__.startswith("torch"):
            g = g.detach().cpu()
        try:
            g64, _ = as_exact_array(g, f"kernel {name}")
        except (TypeError, ValueError) as err:
            raise KernelOutputError(f"{kernel.name} returned an unusable {name}: {err}") from None
        want = case.tensors[like].shape
        if g64.shape != want:
            raise KernelOutputError(
                f"{kernel.name} returned {name} of shape {g64.shape}, expected {want} (varlen)"
            )
        grads.append(g64)
    return KernelGradients(*grads, dtype=case.dtype)
