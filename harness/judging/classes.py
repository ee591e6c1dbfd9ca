"""Arithmetic classes and the precision floor: which classes apply to an input format, and which
of them form the envelope of class ``unknown`` (an undeclared kernel).

A kernel that does not declare its arithmetic is assumed to compute at least at its input
format's precision. A class whose products are rounded below that precision (``tf32`` for fp32
inputs: 10 fraction bits instead of 23) applies only when declared; it is not among the
classes whose loosest bound judges an undeclared kernel. When an undeclared kernel's errors
exceed that envelope but fit such a lower class, :func:`precision_reason` says so and names the
declaration that would accept it.

FP8 inputs (``e4m3``, ``e5m2``, with descales) have one class of their own, ``flash-fp8``
(FlashAttention-3's arithmetic: exact products, fp32 accumulation, P quantized to e4m3), and one
below it, ``flash-fp8-p-e5m2`` (the same with P quantized to e5m2, one bit fewer).
"""

from __future__ import annotations

__all__ = [
    "ARITHMETIC_CLASSES",
    "KNOWN_CLASSES",
    "PRECISION_BELOW",
    "WIDE_CLASSES",
    "applicable_classes",
    "floor_classes",
    "precision_reason",
    "precision_reason_class",
    "reduced_classes",
]

ARITHMETIC_CLASSES = (
    "naive",
    "flash",
    "flash-fa1",
    "tf32",
    "flash-fp8",
    "flash-fp8-p-e5m2",
    "unknown",
)
KNOWN_CLASSES = ARITHMETIC_CLASSES[:-1]
# The classes a kernel of 16- and 32-bit inputs can be declared to have (the command lines'
# --arithmetic choices).
WIDE_CLASSES = ("naive", "flash", "flash-fa1", "tf32")
_WIDE = ("fp16", "bf16", "fp32")
_FP8 = ("e4m3", "e5m2")
# The input formats a class applies to.
_INPUTS = {
    "naive": _WIDE,
    "flash": _WIDE,
    "flash-fa1": _WIDE,
    "tf32": ("fp32",),
    "flash-fp8": _FP8,
    "flash-fp8-p-e5m2": _FP8,
}
# The classes whose arithmetic is below the input format's precision, per input format.
_REDUCED = {"fp32": ("tf32",), "e4m3": ("flash-fp8-p-e5m2",), "e5m2": ("flash-fp8-p-e5m2",)}
# How a reason names a reduced class's arithmetic, and the precision it falls below.
_PRODUCTS = {"tf32": "tf32 matmuls", "flash-fp8-p-e5m2": "P quantized to e5m2"}
_BELOW = {"flash-fp8-p-e5m2": "flash-fp8"}


def _check(fmt_name: str) -> None:
    if not isinstance(fmt_name, str):
        raise TypeError(f"fmt_name must be a format name such as 'fp32', got {fmt_name!r}")


# How the reason of :func:`precision_reason` starts (found by it in a verdict's reasons).
PRECISION_BELOW = "precision below "


def applicable_classes(fmt_name: str) -> tuple[str, ...]:
    """The known classes that apply to inputs in format ``fmt_name`` (``"fp16"``, ``"bf16"``,
    ``"fp32"``, ``"e4m3"``, ``"e5m2"``): naive, flash and flash-fa1 to the 16- and 32-bit
    formats, ``tf32`` to fp32 only, the two FP8 classes to the FP8 formats only."""
    _check(fmt_name)
    return tuple(c for c in KNOWN_CLASSES if fmt_name in _INPUTS[c])


def reduced_classes(fmt_name: str) -> tuple[str, ...]:
    """The applicable classes whose arithmetic is below the input format's precision (for fp32
    inputs: ``tf32``; for FP8 inputs: ``flash-fp8-p-e5m2``; none for fp16 and bf16 today)."""
    return tuple(c for c in applicable_classes(fmt_name) if c in _REDUCED.get(fmt_name, ()))


def floor_classes(fmt_name: str) -> tuple[str, ...]:
    """The classes at or above the input format's precision: those whose loosest bound judges
    a kernel of class ``unknown``."""
    lower = reduced_classes(fmt_name)
    return tuple(c for c in applicable_classes(fmt_name) if c not in lower)


def precision_reason(fmt_name: str, cls: str) -> str:
    """The reason given when an undeclared kernel's errors exceed the floor's envelope but fit
    the reduced class ``cls``, with the declaration that would accept them."""
    # An FP8 class is named against flash-fp8, whatever format the caller holds (a verdict
    # knows the output's, bf16).
    if cls not in reduced_classes(fmt_name) and cls not in _BELOW:
        raise ValueError(f"{cls!r} is not a reduced-precision class for {fmt_name} inputs")
    # The errors fit that class's bounds, which is not proof of its arithmetic: exp or P taken
    # in fp16 by an fp32 kernel fits the tf32 bounds too (found by a user's trial).
    below = _BELOW.get(cls, fmt_name)
    # "fit the bounds of", not "fit": a user whose fp32 kernel lost precision in exp(s − LSE)
    # read "the errors fit tf32 matmuls" as the cause.
    return (
        f"{PRECISION_BELOW}{below}: the errors fit the bounds of {_PRODUCTS.get(cls, cls)} "
        f'(declare arithmetic="{cls}", --arithmetic {cls}, only if that is what the kernel '
        f"does: any other step below {below} precision, an exponential or a product taken "
        "with fewer bits, can fit the same bounds)"
    )


def precision_reason_class(reason: str) -> str | None:
    """The reduced class a :func:`precision_reason` names (``"tf32"``), also behind a verdict's
    prefix (``"FAIL-HARD: precision below ..."``); ``None`` for any other reason."""
    if PRECISION_BELOW not in reason:
        return None
    _, sep, rest = reason.partition('declare arithmetic="')
    return rest.split('"', 1)[0] if sep else None
