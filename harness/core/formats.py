"""Binary floating-point formats: parameters, exact rounding, ulp and ordered-integer distances.

A format F with ``p`` significand bits (hidden bit included), minimum normal exponent ``emin``
and maximum exponent ``emax`` holds the numbers ``±m·2^(e−p+1)`` with integer ``0 ≤ m < 2^p`` and
``emin ≤ e ≤ emax`` (subnormals at ``e = emin``). From these three integers follow

- unit roundoff ``u = 2^−p`` (round-to-nearest relative error bound),
- largest finite ``(2 − 2^(1−p))·2^emax``, smallest normal ``2^emin``,
  smallest subnormal ``2^(emin−p+1)``.

All values handled here are carried as float64, which holds every fp8, fp16, bf16 and fp32
number exactly. The two fp8 formats (``e4m3`` = ``float8_e4m3fn``, ``e5m2`` = ``float8_e5m2``)
differ at the top: e5m2 is IEEE-like (``±inf`` beyond 57344), while e4m3fn spends its top code
on NaN, so its largest value is 448 and it has no infinity; rounding into it *saturates*
(what torch's cast and CUDA's ``satfinite`` conversion do): every value beyond ±448, infinities
included, becomes ±448.

Rounding into F never goes through an intermediate format: ``ml_dtypes`` converts float64 to
bfloat16 via float32, a double rounding (``1 + 2^−8 + 2^−40`` becomes ``1.0`` instead of
``1 + 2^−7``), so :func:`round_to_format` rounds directly with round-to-nearest-even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import mpmath
import numpy as np

__all__ = [
    "BF16",
    "E4M3",
    "E5M2",
    "FORMATS",
    "FP8_FORMATS",
    "FP16",
    "FP32",
    "FP64",
    "TF32",
    "Format",
    "format_of",
    "ordered_int",
    "round_mpf",
    "round_to_format",
    "ulp",
    "ulp_distance",
]


@dataclass(frozen=True)
class Format:
    """A binary floating-point format ``(p, emin, emax)``; see the module docstring."""

    name: str
    p: int
    emin: int
    emax: int
    storage: bool = True  # False for tf32, an arithmetic mode with no storage type
    # e4m3fn: the largest value is below the IEEE pattern's (its top code is NaN) and rounding
    # saturates there instead of overflowing to inf, which the format lacks.
    top: float | None = None
    saturates: bool = False

    @property
    def u(self) -> float:
        """Unit roundoff ``2^−p``."""
        return math.ldexp(1.0, -self.p)

    @property
    def eps(self) -> float:
        """Machine epsilon ``2^(1−p)``: the gap between 1 and the next number."""
        return math.ldexp(1.0, 1 - self.p)

    @property
    def max_finite(self) -> float:
        if self.top is not None:
            return self.top
        return math.ldexp(2.0 - math.ldexp(1.0, 1 - self.p), self.emax)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.emin)

    @property
    def min_subnormal(self) -> float:
        return math.ldexp(1.0, self.emin - self.p + 1)

    @property
    def bits(self) -> int:
        """Storage width in bits (1 sign + exponent + p−1 fraction bits)."""
        exp_bits = (self.emax + 1).bit_length() + 1
        return 1 + exp_bits + self.p - 1

    @property
    def numpy_dtype(self) -> np.dtype:
        if not self.storage:
            raise TypeError(f"{self.name} is an arithmetic mode, not a storage format")
        return np.dtype(_NUMPY_DTYPES[self.name])

    @property
    def torch_dtype(self) -> Any:
        import torch

        if not self.storage:
            raise TypeError(f"{self.name} is an arithmetic mode, not a storage format")
        return {
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
            "fp32": torch.float32,
            "fp64": torch.float64,
            "e4m3": torch.float8_e4m3fn,
            "e5m2": torch.float8_e5m2,
        }[self.name]

    def __str__(self) -> str:
        return self.name


FP16 = Format("fp16", p=11, emin=-14, emax=15)
BF16 = Format("bf16", p=8, emin=-126, emax=127)
FP32 = Format("fp32", p=24, emin=-126, emax=127)
TF32 = Format("tf32", p=11, emin=-126, emax=127, storage=False)
FP64 = Format("fp64", p=53, emin=-1022, emax=1023)
E4M3 = Format("e4m3", p=4, emin=-6, emax=8, top=448.0, saturates=True)
E5M2 = Format("e5m2", p=3, emin=-14, emax=15)

FORMATS: dict[str, Format] = {f.name: f for f in (FP16, BF16, FP32, TF32, FP64)}
# Kept apart from FORMATS: the fp8 formats are inputs only with descales (core/fp8.py), and
# the campaigns' dtype loops over FORMATS must not grow.
FP8_FORMATS: dict[str, Format] = {f.name: f for f in (E4M3, E5M2)}

_NUMPY_DTYPES = {
    "fp16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "fp32": np.float32,
    "fp64": np.float64,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}
_ALIASES = {
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
    "float8_e4m3fn": "e4m3",
    "fp8_e4m3": "e4m3",
    "e4m3fn": "e4m3",
    "float8_e5m2": "e5m2",
    "fp8_e5m2": "e5m2",
}
_ALL = {**FORMATS, **FP8_FORMATS}


def format_of(x: Any) -> Format:
    """The :class:`Format` of a name ('fp16', 'bfloat16', ...), a numpy/torch dtype, or an array.

    Raises ``TypeError`` for anything that is not one of the binary formats fp16, bf16, fp32,
    tf32, fp64, e4m3 (``float8_e4m3fn``) or e5m2 (``float8_e5m2``); integers, complex and the
    other fp8 variants (``e4m3fnuz``, ...) are refused.
    """
    if isinstance(x, Format):
        return x
    if isinstance(x, str):
        key = _ALIASES.get(x.lower(), x.lower())
        if key in _ALL:
            return _ALL[key]
        raise TypeError(f"unknown format {x!r}; use one of {sorted(_ALL)}")
    if isinstance(x, type):  # a scalar type such as np.float16 or ml_dtypes.bfloat16
        try:
            x = np.dtype(x)
        except TypeError:
            raise TypeError(f"{x!r} is not a floating-point dtype") from None
    dtype = getattr(x, "dtype", x)
    name = str(dtype).removeprefix("torch.")
    key = _ALIASES.get(name)
    if key is not None:
        return _ALL[key]
    raise TypeError(
        f"dtype {name} is not a supported binary floating-point format; "
        "convert to float16, bfloat16, float32 or float64 first"
    )


def round_to_format(x: Any, fmt: Format) -> np.ndarray:
    """Round float64 values to the nearest value of ``fmt`` (ties to even), exactly.

    Subnormals get the spacing ``2^(emin−p+1)``; a value whose rounding (with unbounded
    exponent) exceeds ``max_finite`` becomes ±inf, as IEEE 754 prescribes, except in a
    saturating format (e4m3), where it and ±inf become ±max_finite. NaN and the sign of zero
    are kept. The result is float64 holding values of ``fmt``.
    """
    x = np.asarray(x, dtype=np.float64)
    if fmt.p >= 53 and fmt.emin <= -1022:
        return x.copy()
    _, e = np.frexp(x)
    e = np.maximum(e.astype(np.int64) - 1, fmt.emin)
    quantum = np.ldexp(1.0, e - fmt.p + 1)
    # x / quantum is an exact power-of-two scaling and lies below 2^p + 1; rint is
    # round-half-even, and the product back is exact.
    with np.errstate(invalid="ignore", over="ignore"):  # overflow to ±inf is the IEEE result
        r = np.rint(x / quantum) * quantum
    r = np.where(np.isfinite(x), r, x)
    over = np.abs(r) > fmt.max_finite
    if np.any(over):
        r = np.where(over, np.copysign(fmt.max_finite if fmt.saturates else np.inf, x), r)
    return r


def round_mpf(x: mpmath.mpf, fmt: Format) -> float:
    """Round an mpmath number to ``fmt`` (nearest, ties to even) with exact integer arithmetic."""
    if not mpmath.isfinite(x):
        return float(x)
    if x == 0:
        return 0.0  # mpmath has no signed zero
    sign, man, exp, bc = mpmath.mpf(x)._mpf_
    top = exp + bc - 1  # floor(log2 |x|)
    qexp = max(top, fmt.emin) - fmt.p + 1
    if top < qexp - 1:
        # Below half the smallest subnormal (e.g. a gradient weighted by exp(−10^35)): zero,
        # decided without shifting by the huge exponent difference.
        return -0.0 if sign else 0.0
    shift = qexp - exp
    if shift <= 0:
        n = man << -shift
    else:
        n, rem = divmod(man, 1 << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and n & 1):
            n += 1
    # Beyond float64's range (an interval end blown up at a low working precision, say):
    # ldexp raises rather than returning inf.
    fits = n.bit_length() <= 53 and qexp + n.bit_length() <= 1024
    value = math.ldexp(float(n), qexp) if fits else math.inf
    if value > fmt.max_finite:
        value = fmt.max_finite if fmt.saturates else math.inf
    return -value if sign else value


def ulp(y: Any, fmt: Format, lo: Any = None) -> np.ndarray:
    """Goldberg/Muller ulp: ``2^(max(e, emin) − p + 1)`` for ``2^e ≤ |y| < 2^(e+1)``.

    ``ulp(0) = 2^(emin−p+1)`` (the subnormal spacing), and magnitudes beyond the format's
    range get the top binade's spacing. ``y`` may be given as a double-double ``y + lo``
    (``|lo| ≤ ulp_64(y)/2``): when ``y`` is a power of two and ``lo`` points toward zero, the
    exact value lies in the binade below. NaN maps to NaN.
    """
    y = np.asarray(y, dtype=np.float64)
    m, e = np.frexp(np.abs(y))
    e = e.astype(np.int64) - 1
    if lo is not None:
        lo = np.asarray(lo, dtype=np.float64)
        below = (m == 0.5) & (lo != 0) & (np.sign(lo) == -np.sign(y))
        e = np.where(below, e - 1, e)
    e = np.where(np.isinf(y), fmt.emax, e)
    e = np.where(y == 0, fmt.emin, e)  # frexp(0) has exponent 0, not "−infinity"
    e = np.clip(e, fmt.emin, fmt.emax)
    out = np.ldexp(1.0, e - fmt.p + 1)
    return np.where(np.isnan(y), np.nan, out)


def _bits(x: np.ndarray, fmt: Format) -> tuple[np.ndarray, int]:
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    if np.any(round_to_format(x[finite], fmt) != x[finite]):
        raise ValueError(f"values are not representable in {fmt.name}; round them first")
    if fmt.name == "fp16":
        return x.astype(np.float16).view(np.uint16).astype(np.int64), 15
    if fmt.name == "bf16":
        # float64 -> float32 is exact for bf16 values; float32 -> bf16 then drops zero bits.
        b = x.astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
        return b.astype(np.int64), 15
    if fmt.name == "fp32":
        return x.astype(np.float32).view(np.uint32).astype(np.int64), 31
    if fmt.name == "fp64":
        return x.view(np.uint64), 63
    if fmt.name in FP8_FORMATS:
        b = x.astype(fmt.numpy_dtype).view(np.uint8)  # exact: the values are in the format
        return b.astype(np.int64), 7
    raise TypeError(f"{fmt.name} has no storage encoding")


def ordered_int(x: Any, fmt: Format) -> np.ndarray:
    """Map values of ``fmt`` to integers that preserve order and count representable steps.

    ``ord(x) = bits(x)`` for a clear sign bit and ``−(bits(x) & ~sign)`` otherwise, so +0 and
    −0 both map to 0 and ``|ord(a) − ord(b)|`` is the number of representable values between
    them (±inf sit one step beyond ±max_finite). NaN inputs map to an undefined integer;
    callers screen NaN first (see :mod:`flashcheck.harness.judging.metrics`).
    """
    bits, sign_bit = _bits(x, fmt)
    if fmt.name == "fp64":
        b = bits.astype(np.uint64)
        mag = (b & np.uint64((1 << 63) - 1)).astype(np.int64)
        return np.where((b >> np.uint64(63)) == 1, -mag, mag)
    sign = (bits >> sign_bit) & 1
    mag = bits & ((1 << sign_bit) - 1)
    return np.where(sign == 1, -mag, mag)


def ulp_distance(a: Any, b: Any, fmt: Format) -> np.ndarray:
    """Number of representable ``fmt`` values between ``a`` and ``b`` (0 when equal, ±0 equal)."""
    return np.abs(ordered_int(a, fmt) - ordered_int(b, fmt))
