"""Arithmetic shared by the numpy reference kernels: formats, precision policies, sequential
dots, ``exp``/``tanh`` rounded into a format, and the attention masks.

Every intermediate is a numpy array of its declared dtype, so each elementwise operation rounds to
nearest-even in that format (float16 and bfloat16 operations compute in float32 and round once,
which is correctly rounded because 24 ≥ 2p + 2). Transcendentals are evaluated in float64 and
rounded to the target format (within 0.5 ulp + 2^−53 relative of the exact value).

This module imports nothing from the harness.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

__all__ = [
    "ARITHMETIC",
    "FORMAT_DTYPES",
    "LOG2E",
    "PrecisionPolicy",
    "exp_in",
    "keep_mask",
    "rowsum",
    "sequential_dot",
    "tanh_in",
]

FORMAT_DTYPES = {
    "fp16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp32": np.dtype(np.float32),
    "fp64": np.dtype(np.float64),
}
LOG2E = 1.4426950408889634  # float64 nearest to log2(e)


@dataclass(frozen=True)
class PrecisionPolicy:
    """Formats of each intermediate ('fp16', 'bf16', 'fp32' or 'fp64').

    ``score``: S = q·kᵀ accumulation and its scaled value; ``accum``: m, l, p, α and the O
    accumulator; ``p``: the format P is rounded to before P·V; ``output``: O's format;
    ``exp``: 'exp' or 'exp2' (log2 e folded into the scale constant, rounded to ``score``).
    """

    input: str
    score: str = "fp32"
    accum: str = "fp32"
    p: str = "fp32"
    output: str | None = None
    exp: str = "exp2"

    def __post_init__(self) -> None:
        for field in ("input", "score", "accum", "p"):
            if getattr(self, field) not in FORMAT_DTYPES:
                raise ValueError(f"{field} format must be one of {sorted(FORMAT_DTYPES)}")
        if self.output is not None and self.output not in FORMAT_DTYPES:
            raise ValueError(f"output format must be one of {sorted(FORMAT_DTYPES)}")
        if self.exp not in ("exp", "exp2"):
            raise ValueError("exp must be 'exp' or 'exp2'")

    @classmethod
    def flash(cls, input: str) -> PrecisionPolicy:
        """FlashAttention-2's arithmetic: fp32 scores and softmax, P rounded to the input."""
        return cls(input=input, score="fp32", accum="fp32", p=input, exp="exp2")

    @classmethod
    def fp32(cls) -> PrecisionPolicy:
        return cls(input="fp32", score="fp32", accum="fp32", p="fp32", exp="exp2")

    @classmethod
    def fp64(cls, input: str) -> PrecisionPolicy:
        """Everything in float64: the algorithm's own error is ~1e-16 (a structural check)."""
        return cls(input=input, score="fp64", accum="fp64", p="fp64", output="fp64", exp="exp")


ARITHMETIC = {
    "flash": "flash: low-precision inputs, fp32 scores/softmax/accumulators, P rounded to input",
    "fp32": "fp32 recurrence: everything fp32, P not rounded",
    "fp64": "fp64 recurrence (structural reference)",
    "flash-backward": "flash backward (FA2 Algorithm 2): P recomputed from the LSE in fp32, D from "
    "the rounded O, P and dS rounded to the input before their dots, fp32 accumulators",
}


def sequential_dot(a: np.ndarray, b: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``a @ bᵀ`` accumulated sequentially over the inner index in dtype ``dt``."""
    a = a.astype(dt)
    b = b.astype(dt)
    acc = np.zeros((a.shape[0], b.shape[0]), dtype=dt)
    for t in range(a.shape[1]):
        acc = acc + a[:, t, None] * b[None, :, t]
    return acc


def exp_in(x: np.ndarray, flavour: str, dt: np.dtype) -> np.ndarray:
    """``exp(x)`` (``flavour="exp"``) or ``exp2(x)`` evaluated in float64, rounded to ``dt``."""
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        y = np.exp2(x64) if flavour == "exp2" else np.exp(x64)
    return y.astype(dt)


def rowsum(p: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Row sums of ``p`` accumulated sequentially over columns in ``dt``."""
    acc = np.zeros(p.shape[0], dtype=dt)
    for j in range(p.shape[1]):
        acc = acc + p[:, j]
    return acc


def tanh_in(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    """``tanh(x)`` evaluated in float64, rounded to ``dt``."""
    return np.tanh(x.astype(np.float64)).astype(dt)


def keep_mask(nq: int, nk: int, rows: np.ndarray, cols: np.ndarray, causal, window, mask):
    """Which keys ``cols`` each query row ``rows`` keeps: causal (bottom-right aligned), the
    window ``(left, right)`` and an explicit boolean ``mask`` combined, as docs/api.md defines
    attention."""
    i = rows[:, None]
    j = cols[None, :]
    off = nk - nq
    keep = np.ones((len(rows), len(cols)), dtype=bool)
    if causal:
        keep &= j <= i + off
    if window is not None:
        left, right = window
        if left is not None and left >= 0:
            keep &= j >= i + off - left
        if right is not None and right >= 0:
            keep &= j <= i + off + right
    if mask is not None:
        keep &= mask[np.ix_(rows, cols)]
    return keep
