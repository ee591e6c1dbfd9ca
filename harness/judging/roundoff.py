"""What every a-priori bound is built of: the unit roundoffs and hardware assumptions, Higham's
``γ_n``, the growth of a perturbed softmax weight, and one tensor's pair of bounds.

``docs/error-bounds.md`` derives each constant; :mod:`flashcheck.harness.judging.bounds` (the
forward) and :mod:`flashcheck.harness.judging.gradient_bounds` (dQ, dK, dV) use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.formats import FP32

__all__ = [
    "FTZ",
    "HALF_SUB32",
    "LAMBDA",
    "RHO_EXP",
    "RHO_TANH",
    "RHO_TANH_APPROX",
    "SAFETY",
    "TANH_ERRORS",
    "TF32_SUB",
    "U32",
    "UA",
    "U_TF32",
    "TensorBounds",
    "finite",
    "gamma",
    "records",
    "tanh_error",
    "weight_growth",
]

LAMBDA = 6.0  # probabilistic bounds: each term fails with probability <= 2·exp(−18) ≈ 3e−8

U32 = FP32.u
# Tensor-core adders align and truncate (not IEEE round-to-nearest; Fasi et al. 2021), so an
# fp32 accumulation step is charged 2·u32 (the chopping bound), not u32.
UA = 2 * U32
# exp2 in fp32: PTX ex2.approx is documented at 2 ulp (test-derived, not guaranteed); CPU
# libraries are within 1 ulp. 2 ulp = 4·u32 relative.
RHO_EXP = 4 * U32
# tanh in fp32 for the soft-cap: CUDA's tanhf is documented at 2 ulp, CPU libraries within 1.
RHO_TANH = 4 * U32
# The hardware tanh.approx.f32 (FlashAttention's and FlashInfer's soft-cap), for kernels that
# declare tanh="approx": its largest relative error over every finite fp32 argument, both
# signs, measured on an H200 (sm_90), is 1.1126e-5 = 2^-16.456 at |x| = 0.58991
# (benchmarks/gpu_softcap_approx.py, benchmarks/RESULTS.md), rounded up to 2^-16. NVIDIA
# documents a looser bound for the instruction; other GPU generations are not measured.
RHO_TANH_APPROX = 2.0**-16
TANH_ERRORS = {"accurate": RHO_TANH, "approx": RHO_TANH_APPROX}
U_TF32 = 2.0**-10  # tf32 operands are truncated by the MMA unit: relative error < 2^-10
# ...except below the normal range: a subnormal fp32 operand keeps only the top 10 of its 23
# fraction bits, an absolute error < 2^-136 (measured on H100: a subnormal V lost 8.5 %).
TF32_SUB = 2.0**-136
FTZ = 2.0**-126  # fp32 values below the normal range may be flushed to zero (ex2.approx.ftz)
HALF_SUB32 = 2.0**-150  # half the spacing of fp32's subnormals: rounding error below 2^-126
SAFETY = 8  # the bound is multiplied by 1 + SAFETY·u_F: covers second-order cross terms


def tanh_error(tanh: str) -> float:
    """The relative error of a kernel's soft-cap tanh, by its declaration (:data:`TANH_ERRORS`)."""
    if tanh not in TANH_ERRORS:
        raise ValueError(
            f"tanh must be 'accurate' (an fp32 tanh within 2 ulp) or 'approx' (the GPU's "
            f"tanh.approx.f32), got {tanh!r}"
        )
    return TANH_ERRORS[tanh]


def gamma(n: Any, u: float) -> np.ndarray:
    """Higham's ``γ_n = n·u / (1 − n·u)`` (``inf`` once ``n·u ≥ 1``)."""
    nu = np.asarray(n, dtype=np.float64) * u
    with np.errstate(divide="ignore"):
        return np.where(nu < 1, nu / np.maximum(1 - nu, 1e-300), np.inf)


def weight_growth(p: np.ndarray, log_p: np.ndarray, x: Any) -> np.ndarray:
    """``p·(e^x − 1)`` for weights ``p = e^log_p`` and perturbations ``x ≥ 0`` (nats).

    A weight far below float64's range (``p = 0`` after ``exp``, say ``s − m = −1100`` when two
    huge logits differ by a tenth of a percent) can still grow to order one when the kernel's
    rounding of the logits is large enough to close the gap (a bf16 score of 3.7e5 has a
    spacing of 2048). The product is therefore also formed in the log domain, and the larger of
    the two forms is returned (they agree to rounding where both are representable).
    """
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        direct = p * np.expm1(x)
        # log(e^x − 1) without overflow: x + log(1 − e^−x) for large x
        log_grown = np.where(x > 30.0, x + np.log1p(-np.exp(-x)), np.log(np.expm1(x)))
        logged = np.exp(log_p + log_grown)
    return np.nan_to_num(np.fmax(direct, logged), nan=0.0, posinf=np.inf)


def finite(x: np.ndarray) -> np.ndarray:
    """``x`` with NaN and ±inf replaced by 0. Non-finite inputs make the exact result NaN, so
    their bound is irrelevant, but it must not spill into other elements through ``0·inf``."""
    return np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)


@dataclass(frozen=True)
class TensorBounds:
    """Absolute error bounds on one output tensor, elementwise and of the tensor's shape.

    ``det``: the deterministic bound (first order in the unit roundoffs, a ``1 + 8u`` factor
    for the rest); ``prob``: the probabilistic bound (``λ·√n·u`` accumulation constants and
    Hoeffding bounds; ``prob ≤ det``). An element whose exact result needs no arithmetic (a row
    that keeps no key) has bound 0.
    """

    det: np.ndarray
    prob: np.ndarray

    def __post_init__(self) -> None:
        if np.shape(self.det) != np.shape(self.prob):
            raise ValueError(
                f"det and prob must have one shape, got {np.shape(self.det)} and "
                f"{np.shape(self.prob)}"
            )

    @staticmethod
    def loosest(each: list[TensorBounds]) -> TensorBounds:
        """The elementwise largest of several bounds (class ``unknown``)."""
        return TensorBounds(
            np.maximum.reduce([b.det for b in each]), np.maximum.reduce([b.prob for b in each])
        )


def records(s: np.ndarray, keep: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Keys that may raise the running max, scanning keys in order (within ``tol``)."""
    masked = np.where(keep, s, -np.inf)
    run = np.maximum.accumulate(masked, axis=1)
    prev = np.concatenate([np.full((s.shape[0], 1), -np.inf), run[:, :-1]], axis=1)
    with np.errstate(invalid="ignore"):
        return (keep & (masked > prev - tol)).sum(axis=1)
