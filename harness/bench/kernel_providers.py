"""A user's kernel in the benchmark: ``flashcheck bench --kernel MODULE:FUNCTION``.

The kernel is found as ``flashcheck report --kernel`` finds it
(:func:`flashcheck.harness.adapters.registry.resolve`) and becomes a
:class:`~flashcheck.harness.bench.providers.Provider` named after it. Nothing is probed: an
autotuned kernel's probe would cost minutes, so the provider trusts what the kernel declares
(dtypes, head dims, masks, options, arithmetic class, backward) and takes the contract's
defaults for the rest. A call the kernel refuses is recorded as an error with its message.

The calling convention is the contract's (``fn(q, k, v, *, causal=..., scale=...) -> O or
(O, LSE)`` on ``(B, H, N, d)`` tensors) narrowed to what the kernel takes
(:func:`kernel_call`): ``causal`` only if it takes that option, ``scale = 1/sqrt(d)`` (the
contract's default, the benchmark's scale) only if it takes ``scale``, nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from ..adapters.adapter import ALL_DTYPES, Kernel
from ..adapters.declare import BASE_OPTIONS
from ..adapters.registry import resolve
from .providers import Provider, provider_table

__all__ = ["kernel_call", "kernel_grad_call", "kernel_provider", "kernel_providers"]


def _options(kern: Kernel) -> frozenset[str]:
    """The keyword options the kernel takes (``None`` in its contract: the base four)."""
    return kern.options if kern.options is not None else BASE_OPTIONS


def _keywords(options: frozenset[str], *, causal: bool, d: int) -> dict[str, Any]:
    if causal and "causal" not in options:
        raise ValueError(
            "a causal shape for a kernel that takes no causal option: the benchmark skips "
            "those shapes (Provider.unsupported) before it builds a call"
        )
    kw: dict[str, Any] = {}
    if "causal" in options:
        kw["causal"] = causal
    if "scale" in options:
        kw["scale"] = 1.0 / math.sqrt(d)
    return kw


def kernel_call(
    fn: Callable[..., Any], options: Iterable[str], *, causal: bool, d: int
) -> Callable[[Any, Any, Any], Any]:
    """``fn`` as the benchmark calls it: ``call(q, k, v) -> O``.

    ``fn(q, k, v, causal=causal)`` where ``options`` holds ``causal`` (a causal shape needs
    it: ``ValueError`` otherwise), plus ``scale=1/sqrt(d)`` where it holds ``scale``; a tuple
    or list result gives its first item (O of ``(O, LSE)``).
    """
    kw = _keywords(frozenset(options), causal=causal, d=d)

    def call(q: Any, k: Any, v: Any) -> Any:
        out = fn(q, k, v, **kw)
        return out[0] if isinstance(out, tuple | list) else out

    return call


def kernel_grad_call(
    fn: Callable[..., Any],
    bwd: Callable[..., Any],
    options: Iterable[str],
    *,
    causal: bool,
    d: int,
) -> Callable[[Any, Any, Any], Any]:
    """A forward that torch autograd differentiates with the kernel's own backward function:
    ``call(q, k, v) -> O`` whose gradient for ``dO`` is ``bwd(q, k, v, dO, **kw)[:3]`` (``kw``:
    the keywords :func:`kernel_call` passes ``fn``)."""
    import torch

    kw = _keywords(frozenset(options), causal=causal, d=d)
    forward = kernel_call(fn, options, causal=causal, d=d)

    class KernelFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, q: Any, k: Any, v: Any) -> Any:
            ctx.save_for_backward(q, k, v)
            return forward(q, k, v)

        @staticmethod
        def backward(ctx: Any, do: Any) -> Any:
            q, k, v = ctx.saved_tensors
            dq, dk, dv = tuple(bwd(q, k, v, do, **kw))[:3]
            return dq, dk, dv

    return KernelFunction.apply


def kernel_provider(kern: Kernel) -> Provider:
    """The benchmark provider of a dense attention :class:`Kernel` on torch tensors, named
    ``kern.name``; ``ValueError`` for a kernel the benchmark cannot call."""
    if kern.layout != "dense" or kern.op != "attention":
        raise ValueError(
            f"--kernel {kern.name}: a {kern.layout} {kern.op} kernel; flashcheck bench times "
            "dense attention fn(q, k, v) on (B, H, N, d) tensors"
        )
    if kern.api != "torch" or "cuda" not in kern.devices:
        raise ValueError(
            f"--kernel {kern.name}: flashcheck bench times torch tensors on a CUDA GPU; this "
            f"kernel takes api={kern.api!r} on {', '.join(kern.devices)}"
        )
    options = _options(kern)
    fn, bwd = kern.fn, kern.backward

    def build(q: Any, k: Any, v: Any, causal: bool) -> Callable[..., Any]:
        return kernel_call(fn, options, causal=causal, d=q.shape[-1])

    def build_grad(q: Any, k: Any, v: Any, causal: bool) -> Callable[..., Any]:
        return kernel_grad_call(fn, bwd, options, causal=causal, d=q.shape[-1])

    return Provider(
        kern.name,
        tuple(dt for dt in kern.dtypes if dt in ALL_DTYPES),
        kern.max_head_dim,
        False,
        kern.arithmetic,
        build,
        backward_arithmetic=kern.backward_arithmetic,
        # "autograd": through ``build``'s forward; a function: wrapped; None: no backward.
        build_grad=build_grad if callable(bwd) else None,
        head_dims=kern.head_dims,
        takes_causal="causal" in options and "causal" in kern.masks,
        has_backward=bwd is not None,
        kernel_spec=kern.name,
    )


def kernel_providers(specs: Iterable[str]) -> tuple[Provider, ...]:
    """The providers of the ``--kernel`` specs (duplicates once), in their order.

    ``ValueError`` with the registry's message for a spec that does not resolve, and for a
    kernel the benchmark cannot call or whose name a built-in provider has."""
    provs = tuple(kernel_provider(resolve(s)) for s in dict.fromkeys(specs))
    provider_table(provs)  # refuses a name that is taken
    return provs
