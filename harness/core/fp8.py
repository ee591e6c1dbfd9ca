"""FP8 inputs with descales: what the exact input of an FP8 attention kernel is.

An FP8 kernel (FlashAttention-3's convention) takes ``q, k, v`` in ``float8_e4m3fn`` (or
``float8_e5m2``) together with three descale factors ``descale_q, descale_k, descale_v``, fp32
arrays of shape ``(B, Hk)``: one per batch element and key/value head (a query head uses the
descale of its key/value head). The exact input is the FP8 value times its descale::

    Q[b, h] = q8[b, h] · descale_q[b, h // g],   K[b, j] = k8[b, j] · descale_k[b, j],
    V[b, j] = v8[b, j] · descale_v[b, j]          (g = Hq / Hk)

and the attention of those exact values is the answer (:mod:`.semantics`). Each product of an
FP8 value (≤ 4 significant bits) and an fp32 descale (≤ 24) has ≤ 28 significant bits and is
exactly a float64, so the exact inputs are carried as float64 arrays on the grid of
:data:`FP8_GRID`. Descales must be finite and positive. Quantizing a tensor into FP8 happens
before the kernel (:func:`quantize`): a case holds FP8 values, never values beyond 448.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .formats import FP8_FORMATS, Format, format_of, round_to_format

__all__ = [
    "DESCALES",
    "FP8_GRID",
    "Fp8Scaling",
    "as_descale",
    "as_fp8_array",
    "exact_input",
    "fp8_format_of",
    "quantize",
]

DESCALES = ("descale_q", "descale_k", "descale_v")

# Every fp8 value times an fp32 descale: ≤ 4 + 24 significant bits, integer multiples of
# 2^-16 · 2^-149 (e5m2's and fp32's smallest subnormals), magnitudes below 2^144. Not a storage
# format: the grid on which the oracle's strict path forms exact integer dot products.
FP8_GRID = Format("fp8-scaled", p=28, emin=-138, emax=143, storage=False)


@dataclass(frozen=True)
class Fp8Scaling:
    """How a problem's exact inputs came from FP8 values: their format and the three descales
    (float64 arrays ``(B, Hk)`` holding fp32 values)."""

    fmt: Format
    descale_q: np.ndarray
    descale_k: np.ndarray
    descale_v: np.ndarray

    def descales(self) -> dict[str, np.ndarray]:
        """The descales by keyword (``descale_q``, ``descale_k``, ``descale_v``)."""
        return {n: getattr(self, n) for n in DESCALES}


def fp8_format_of(x: Any) -> Format | None:
    """The FP8 format of a numpy array or torch tensor, or ``None`` when it is not FP8."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return None
    try:
        fmt = format_of(dtype)
    except TypeError:
        return None
    return fmt if fmt.name in FP8_FORMATS else None


def as_fp8_array(x: Any, name: str) -> tuple[np.ndarray, Format]:
    """Exact float64 copy of an FP8 numpy array (``ml_dtypes.float8_e4m3fn``/``float8_e5m2``)
    or torch tensor (any device; copied through its bit patterns) and its format."""
    fmt = fp8_format_of(x)
    if fmt is None:
        raise TypeError(
            f"{name} must be float8_e4m3fn or float8_e5m2 (numpy through ml_dtypes, or torch), "
            f"got {getattr(x, 'dtype', type(x).__name__)}"
        )
    if type(x).__module__.startswith("torch"):
        import torch

        bits = x.detach().cpu().contiguous().view(torch.uint8).numpy()
        arr = bits.view(fmt.numpy_dtype)
    else:
        arr = np.asarray(x)
    return arr.astype(np.float64), fmt


def as_descale(d: Any, name: str, shape: tuple[int, int]) -> np.ndarray:
    """A descale as a float64 array ``(B, Hk)`` of fp32 values; ``None`` means all ones.

    Raises when ``d`` is not float32 (numpy or torch), has another shape, or holds a value that
    is not finite and positive."""
    if d is None:
        return np.ones(shape)
    if type(d).__module__.startswith("torch"):
        d = d.detach().cpu().numpy()
    arr = np.asarray(d)
    if arr.dtype != np.float32:
        raise TypeError(
            f"{name} must be float32 (FA3's descales are fp32), got {arr.dtype}: pass "
            f"{name}.astype(np.float32) or .float()"
        )
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape (B, Hk) = {shape}, got {arr.shape}")
    out = arr.astype(np.float64)
    if not np.all(np.isfinite(out) & (out > 0)):
        raise ValueError(f"{name} must be finite and positive, got {out[~(out > 0)][:3]}...")
    return out


def quantize(x: Any, fmt: Any = "e4m3", *, heads: int | None = None) -> tuple[np.ndarray, Any]:
    """Quantize real values ``x`` ``(B, H, N, d)`` to FP8 with one descale per ``(b, h)``.

    ``descale = fl32(amax / max_fp8)`` per (batch, head) (1 where a head is all zero), and
    ``x8 = RN_fp8(x / descale)`` (saturating for e4m3). ``heads``: group the ``H`` heads in
    blocks of ``H / heads`` sharing one descale (query heads of one key/value head). Returns
    the FP8 array (an ml_dtypes array) and the descales, float32 ``(B, heads or H)``."""
    f = format_of(fmt)
    if f.name not in FP8_FORMATS:
        raise ValueError(f"fmt must be 'e4m3' or 'e5m2', got {f.name}")
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 4:
        raise ValueError(f"x must be (B, H, N, d), got shape {a.shape}")
    b, h = a.shape[:2]
    groups = h if heads is None else heads
    if groups < 1 or h % groups:
        raise ValueError(f"heads ({groups}) must divide the number of heads ({h})")
    amax = np.abs(a.reshape(b, groups, -1)).max(axis=2, initial=0.0)
    amax = np.where(np.isfinite(amax), amax, f.max_finite)
    desc = np.where(amax > 0, amax / f.max_finite, 1.0).astype(np.float32)
    per_head = np.repeat(desc.astype(np.float64), h // groups, axis=1)[:, :, None, None]
    x8 = round_to_format(a / per_head, f).astype(f.numpy_dtype)
    return x8, desc


def exact_input(x8: np.ndarray, descale: np.ndarray, hk: int) -> np.ndarray:
    """``x8 · descale`` per (batch, head), exactly (≤ 28 significant bits fit a double); the
    ``H`` heads of ``x8`` use the descales of their key/value head (``H / hk`` per group)."""
    g = x8.shape[1] // hk
    d = np.repeat(descale, g, axis=1)[:, :, None, None]
    with np.errstate(invalid="ignore"):
        return x8 * d
