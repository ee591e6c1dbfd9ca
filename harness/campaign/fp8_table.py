"""FlashAttention-3's Table 3 measurement: RMSE against the exact result on outlier inputs.

Inputs ``Q, K, V`` ``(1, 1, N, 128)`` are drawn in fp32 from N(0,1) + N(0,100)·Bernoulli(0.001)
(:func:`~flashcheck.harness.cases.fp8_families.fa3_outliers`); the exact result is the
oracle's attention of those fp32 values. Each kernel gets them in each of its FP8 and 16-bit
dtypes: rounded to fp16/bf16, or quantized to FP8 with one descale per head
(:func:`~flashcheck.harness.core.fp8.quantize`), so the RMSE includes the input's quantization,
as in the paper. A second figure is the RMSE against the exact result of the inputs the kernel
was actually given. Beside the kernels under test: the project's exact numpy emulation of the
flash-fp8 class, the FP8 baseline (standard attention with P quantized after normalising) and
the fp16 naive baseline (all three on the CPU). Above ``MAX_ROWS`` query rows the
RMSE is taken over that many evenly spaced rows (rows are independent; the oracle evaluates
only those).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..adapters.adapter import Kernel
from ..adapters.builtin import project_kernels
from ..adapters.call_limit import KernelHung
from ..cases.case import DTYPES, FP8_DTYPES, Case
from ..cases.fp8_families import fa3_outliers
from ..core.formats import format_of, round_to_format
from ..core.fp8 import quantize
from ..oracle.evaluate import oracle, problem_oracle

__all__ = ["FP8_EMULATION", "FP8_NAIVE", "MAX_ROWS", "TABLE3_PAPER", "Table3Row", "table3_rows"]

MAX_ROWS = 512

TABLE3_PAPER = (
    ("FP16 baseline (standard attention)", 3.2e-4),
    ("FlashAttention-2 / FlashAttention-3, FP16", 1.9e-4),
    ("FP8 baseline", 2.4e-2),
    ("FlashAttention-3, FP8 (block quantization, incoherent processing)", 9.1e-3),
)


def _emulation(
    q, k, v, *, causal=False, scale=None, descale_q=None, descale_k=None, descale_v=None
):
    from flashcheck.kernels.fp8_attention import flash_fp8_attention

    return flash_fp8_attention(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        descale_q=descale_q,
        descale_k=descale_k,
        descale_v=descale_v,
    )


def _naive(q, k, v, *, causal=False, scale=None, descale_q=None, descale_k=None, descale_v=None):
    from flashcheck.kernels.fp8_attention import naive_fp8_attention

    return naive_fp8_attention(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        descale_q=descale_q,
        descale_k=descale_k,
        descale_v=descale_v,
    )


FP8_EMULATION = Kernel(
    "flash-fp8-numpy",
    _emulation,
    arithmetic="flash-fp8",
    api="numpy",
    dtypes=("e4m3", "e5m2"),
    devices=("cpu",),
    masks=frozenset({"causal"}),
    options=frozenset({"causal", "scale"}),
    key_block=64,
)
# FlashAttention-3's "FP8 baseline": standard attention, the normalised P quantized to e4m3.
FP8_NAIVE = Kernel(
    "naive-fp8-numpy",
    _naive,
    api="numpy",
    dtypes=("e4m3",),
    devices=("cpu",),
    masks=frozenset({"causal"}),
    options=frozenset({"causal", "scale"}),
)


def _case(x: list[np.ndarray], dtype: str) -> Case:
    if dtype in FP8_DTYPES:
        (q8, dq), (k8, dk), (v8, dv) = (quantize(a, dtype) for a in x)
        return Case(q8, k8, v8, family="fa3_table3", descale_q=dq, descale_k=dk, descale_v=dv)
    arrays = [round_to_format(a, format_of(dtype)).astype(DTYPES[dtype]) for a in x]
    return Case(*arrays, family="fa3_table3")


@dataclass(frozen=True)
class Table3Row:
    """One row of Table 3: a kernel and dtype, its RMSE against the exact result of the fp32
    inputs and against that of the inputs it was given; where it gave no finite output (it
    raised, hung, or returned NaN/Inf), both are ``None`` and ``error`` says why."""

    kernel: str
    dtype: str
    vs_exact: float | None
    vs_own: float | None
    error: str = ""


def table3_rows(
    adapters: dict[str, Kernel], *, n: int, device: str, seed: int = 0
) -> list[Table3Row]:
    """A :class:`Table3Row` for every kernel and FP8/16-bit dtype that runs on ``device``
    (module docstring); a kernel that fails here gets its row with the reason, and the table
    goes on."""
    rng = np.random.default_rng(seed)
    x = [fa3_outliers(rng, (1, 1, n, 128)).astype(np.float32).astype(np.float64) for _ in "qkv"]
    rows = np.linspace(0, n - 1, min(n, MAX_ROWS)).round().astype(np.int64)
    exact = oracle(*(a.astype(np.float32) for a in x), fmt="fp32", rows=rows).o.hi
    kernels = dict(adapters)
    kernels.setdefault(FP8_EMULATION.name, FP8_EMULATION)
    kernels.setdefault(FP8_NAIVE.name, FP8_NAIVE)
    kernels.setdefault("naive-numpy", project_kernels()["naive-numpy"])
    table = []
    for name, adapter in kernels.items():
        # the numpy references run on the CPU beside a GPU kernel
        dev = device if device in adapter.devices else "cpu"
        for dtype in adapter.dtypes:
            if dtype not in ("fp16", "bf16", *FP8_DTYPES) or adapter.unavailable(dtype, dev):
                continue
            if name == "naive-numpy" and dtype != "fp16":
                continue  # the paper's FP16 baseline
            case = _case(x, dtype)
            if adapter.supports(case, dev) is not None:
                continue
            try:
                o = adapter.run(case, dev).o[:, :, rows]
            except (Exception, KernelHung) as err:  # (KernelHung: past --timeout)
                why = str(err).strip().splitlines()[0] if str(err).strip() else ""
                table.append(Table3Row(name, dtype, None, None, f"{type(err).__name__}: {why}"))
                continue
            if not np.isfinite(o).all():  # never an RMSE that hides NaN/Inf
                table.append(Table3Row(name, dtype, None, None, "NaN/Inf in O"))
                continue
            own = problem_oracle(case.problem, fmt="fp32", rows=rows).o.hi
            table.append(Table3Row(name, dtype, _rmse(o, exact), _rmse(o, own)))
    return table


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((a - b) ** 2)))
