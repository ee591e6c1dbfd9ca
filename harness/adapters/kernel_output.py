"""What a kernel call gives back, as the harness reads it: ``O`` (and ``LSE``) or the gradients,
checked for shape and type and copied exactly to float64, or the errors that say the kernel
returned something unusable or declined the input itself.

The copies are exact (every fp16, bf16, fp32 and FP8 value is a float64), so judging them
against the oracle measures the kernel's own rounding and nothing of the conversion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cases.case import FP8_DTYPES, Case
from ..core.semantics import as_exact_array
from .kernel_call import KernelCall

__all__ = [
    "NO_TENSOR",
    "KernelGradients",
    "KernelOutput",
    "KernelOutputError",
    "KernelUnsupported",
    "check_output_format",
    "checked_gradients",
    "checked_output",
    "lse_to_f64",
]


NO_TENSOR = "returned no tensor"


class KernelOutputError(ValueError):
    """A kernel returned something that is not an attention output (wrong shape or type)."""


class KernelUnsupported(RuntimeError):
    """The kernel itself declined the input, saying why (a library backend's own constraints,
    found at run time): the case is outside its contract, not a failure."""


@dataclass(frozen=True)
class KernelOutput:
    """A kernel's result as exact float64 copies (``lse`` is ``None`` if it returns none)."""

    o: np.ndarray
    lse: np.ndarray | None
    o_dtype: str


@dataclass(frozen=True)
class KernelGradients:
    """A kernel's ``dQ``, ``dK``, ``dV`` for the case's ``dO``, as exact float64 copies."""

    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dtype: str
    dsinks: np.ndarray | None = None  # dσ (Hq,), for a case with sinks


def checked_output(kernel_name: str, case: Case, call: KernelCall) -> KernelOutput:
    """A forward call's ``O`` (and ``LSE``) checked against the shapes ``(B, Hq, Nq, dv)`` and
    ``(B, Hq, Nq)`` and copied exactly to float64; ``kernel_name`` names the kernel in the
    errors."""
    res = call.result
    o, lse = (res if isinstance(res, tuple | list) else (res, None))[:2]
    if o is None:
        raise KernelOutputError(
            f"{kernel_name} {NO_TENSOR} (None): return O, or (O, LSE), as tensors or arrays"
        )
    try:
        o64, fmt = as_exact_array(o, "kernel output")
    except (TypeError, ValueError) as err:
        raise KernelOutputError(f"{kernel_name} returned an unusable O: {err}") from None
    want = (*case.q.shape[:3], case.v.shape[3])
    check_output_format(kernel_name, fmt.name, case)
    if o64.shape != want:
        raise KernelOutputError(
            f"{kernel_name} returned O of shape {o64.shape}, expected (B, Hq, Nq, dv) = {want}"
            + _transposed(o64.shape, want)
        )
    lse64 = None if lse is None else lse_to_f64(lse)
    if lse64 is not None and lse64.shape != want[:3]:
        raise KernelOutputError(
            f"{kernel_name} returned LSE of shape {lse64.shape}, expected (B, Hq, Nq) = "
            f"{want[:3]}" + _transposed(lse64.shape, want[:3])
        )
    return KernelOutput(o64, lse64, fmt.name)


def check_output_format(kernel_name: str, got: str, case: Any) -> None:
    """Refuse an ``O`` in a format other than the one it is judged in: the inputs' (``case``:
    a dense, varlen or paged case), bf16 for FP8 inputs as FlashAttention-3 returns it. O's
    errors are counted in ulps of that format, on whose grid a wider format's values (fp32 O
    for fp16 inputs, a reference kernel's accumulator) do not fall: such a kernel crashed the
    check with "values are not representable in fp16". (Gradients are measured in floored
    ulps of real values, so an fp32 dQ for fp16 inputs is judged, not refused.)"""
    fp8 = case.dtype in FP8_DTYPES
    want = "bf16" if fp8 else case.dtype
    if got != want:
        why = "bf16 for FP8 inputs, as FlashAttention-3 returns it" if fp8 else "the inputs'"
        fix = "o.to(torch.bfloat16)" if fp8 else "o.to(q.dtype)"
        raise KernelOutputError(
            f"{kernel_name} returned O in {got}, but O is judged in {want} ({why}): return it "
            f"in {want}, e.g. {fix}"
        )


def _transposed(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    """A hint where ``got`` is ``want`` with its head and sequence axes swapped: the layout of
    FlashAttention's ``flash_attn_func``, (B, N, H, d), a common slip for a kernel written
    against it."""
    if len(got) != len(want) or want[1] == want[2] or got != (want[0], want[2], want[1], *want[3:]):
        return ""
    return (
        " (the heads and the sequence swapped, as in flash_attn_func's (B, N, H, ...) layout: "
        "a plain function is called with q, k, v of shape (B, H, N, d) and returns its results "
        "in that layout, here the transpose(1, 2) of what it returned)"
    )


def checked_gradients(kernel_name: str, case: Case, call: KernelCall) -> KernelGradients:
    """A backward call's ``(dQ, dK, dV)`` (and ``dσ`` for a case with sinks) checked against the
    shapes of ``q``, ``k``, ``v`` (and the sinks) and copied exactly to float64; ``kernel_name``
    names the kernel in the errors."""
    res = call.result
    names, likes = ("dQ", "dK", "dV"), [case.q, case.k, case.v]
    if case.sinks is not None:
        names, likes = (*names, "dsinks"), [*likes, case.sinks]
    if not isinstance(res, tuple | list) or len(res) != len(names):
        raise KernelOutputError(f"{kernel_name}'s backward must return ({', '.join(names)})")
    grads = []
    for name, g, like in zip(names, res, likes, strict=True):
        try:
            g64, _ = as_exact_array(g, f"kernel {name}")
        except (TypeError, ValueError) as err:
            raise KernelOutputError(f"{kernel_name} returned an unusable {name}: {err}") from None
        if g64.shape != like.shape:
            raise KernelOutputError(
                f"{kernel_name} returned {name} of shape {g64.shape}, expected {like.shape}"
            )
        grads.append(g64)
    return KernelGradients(*grads[:3], dtype=case.dtype, dsinks=(grads[3:] or [None])[0])


def lse_to_f64(lse: Any) -> np.ndarray:
    """A returned LSE as a float64 array: a tensor (on any device) read through fp32, an array
    as it is."""
    if type(lse).__module__.startswith("torch"):
        return lse.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(lse, dtype=np.float64)
