"""What the project's own kernels can run where, found on the machine at run time.

A Triton kernel needs Triton, and on a CPU the interpreter (``TRITON_INTERPRET=1``), whose bf16
``tl.dot`` a canary of the kernel checks; a torch kernel on ``cuda`` needs a device torch sees.
torch's own GEMMs depart from IEEE arithmetic on some machines (subnormal operands flushed to
zero, a NaN leaking across rows): small canary GEMMs detect each departure once per dtype and
device, so an answer describes the installed library, not a list of versions. The score range
the FlashAttention-2 backwards are specified for is here too: an input limit, not a fault.

The functions here import no kernel table: the built-in declarations (dense, ragged, FP8) all
use them.
"""

from __future__ import annotations

import importlib.util
import os

__all__ = [
    "BWD_FLASH_SCORES",
    "gemm_flushes_subnormals",
    "gemm_leaks_nan",
    "torch_device_ok",
    "triton_available",
    "triton_combine_available",
    "triton_interpreter_bf16",
    "uses_triton",
]


# FA2's backward recomputes P = exp2(t − lse2) from the fp32 score t and LSE, each rounded by
# ~2^-24 of its size: past |s| ~ 2^26 that rounding alone is 2^3 in the exponent, and near
# 1e9 exp2 overflows. The backward is specified below this magnitude (the forward has no limit).
BWD_FLASH_SCORES = 2.0**26


def torch_device_ok(dtype: str, device: str) -> str | None:
    """Why torch cannot run on ``device`` here (``"no CUDA device"``), or ``None``; ``dtype``
    is accepted for the signature of ``Kernel.check_available`` and does not matter."""
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
    return None


def triton_available(dtype: str, device: str) -> str | None:
    """Why the project's Triton kernels cannot run ``dtype`` on ``device`` here, or ``None``:
    Triton missing, no CUDA device, a CPU without the interpreter, or bf16 under an interpreter
    whose ``tl.dot`` gets bf16 wrong (the kernel's canary)."""
    try:
        found = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a module entry of None: imports are blocked
        found = False
    if not found:
        return "Triton is not installed (pip install triton)"
    if device == "cuda":
        return torch_device_ok(dtype, device)
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device == "cpu" and not interp:
        return "the Triton kernel runs on CPU only under TRITON_INTERPRET=1"
    if device == "cpu" and dtype == "bf16":
        import torch

        from ...kernels import triton_flash

        if not triton_flash.bf16_dot_supported(torch):
            return (
                "bf16 tl.dot is broken in the Triton interpreter (triton-lang/triton#11584; "
                "detected at run time by the kernel's canary)"
            )
    return None


def uses_triton(fn: object) -> bool:
    """Whether ``fn`` (a user's kernel function) is written with Triton: its module's globals
    hold Triton or something of it (``triton``, ``tl``, a ``@triton.jit`` function)."""
    glob = getattr(fn, "__globals__", None) or {}
    for value in list(glob.values()):
        name = getattr(value, "__name__", "") if isinstance(value, type(os)) else ""
        owner = type(value).__module__ or ""
        if name.split(".")[0] == "triton" or owner.split(".")[0] == "triton":
            return True
    return False


def triton_interpreter_bf16(dtype: str, device: str) -> str | None:
    """Why a user's Triton kernel cannot be judged in ``dtype`` on ``device`` here: bf16 on the
    CPU under an interpreter whose bf16 ``tl.dot`` is wrong (a correct user's kernel got 14
    FAIL-HARD in bf16, and the report said "Limitations: None detected"); else ``None``."""
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device != "cpu" or dtype != "bf16" or not interp:
        return None
    why = triton_available(dtype, device)
    if why is None or "11584" not in why:
        return None
    return (
        "bf16 tl.dot is broken in the Triton interpreter (triton-lang/triton#11584, detected "
        "by flashcheck's canary): a Triton kernel's bf16 results under TRITON_INTERPRET=1 are "
        "the interpreter's, not the kernel's; run bf16 on a GPU"
    )


def triton_combine_available(dtype: str, device: str) -> str | None:
    """As :func:`triton_available`, but bf16 runs under the interpreter: the merge has no dot."""
    return triton_available("fp16" if dtype == "bf16" else dtype, device)


_FLUSH_CACHE: dict[tuple[str, str], bool] = {}


def gemm_flushes_subnormals(dtype: str, device: str) -> bool:
    """Whether torch's GEMM in ``dtype`` on ``device`` flushes subnormal operands to zero.

    Found by the report campaign: torch 2.13's CPU bf16 matmul (the oneDNN path taken from
    16×16 operands up) returns 0 for P·V with subnormal V, where IEEE arithmetic keeps them
    (fp32 accumulation holds bf16 subnormal products exactly). Checked once per dtype and
    device with a small canary GEMM, so the answer is the installed library's, not a list.
    """
    key = (dtype, device)
    if key not in _FLUSH_CACHE:
        import torch

        from ..core.formats import FORMATS

        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        tiny = float(FORMATS[dtype].min_normal) / 4  # exactly representable: a power of two
        p = torch.full((16, 16), 1 / 16, dtype=tdt, device=device)
        v = torch.full((16, 64), tiny, dtype=tdt, device=device)
        _FLUSH_CACHE[key] = bool((p @ v).float().abs().max().item() == 0.0)
    return _FLUSH_CACHE[key]


_LEAK_CACHE: dict[tuple[str, str], bool] = {}


def gemm_leaks_nan(dtype: str, device: str) -> bool:
    """Whether torch's GEMM in ``dtype`` on ``device`` lets a NaN in one row of A reach other
    rows of ``A @ B``.

    Found by the property suite: torch 2.13's CPU bf16 matmul on AMX machines (oneDNN's
    brgemm kernel when K is not a multiple of 32, uxlfoundation/oneDNN#5717) turns the
    neighbouring row of a NaN row into NaN, so the naive baseline breaks the NaN rule for a
    reason outside this project. Checked once per dtype and device with a canary GEMM
    (64×19 @ 19×64, a shape that takes that kernel), so the answer is the installed library's.
    """
    key = (dtype, device)
    if key not in _LEAK_CACHE:
        import torch

        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        a = torch.full((64, 19), 0.5, dtype=tdt, device=device)
        a[1] = float("nan")
        b = torch.full((19, 64), 0.25, dtype=tdt, device=device)
        out = (a @ b).float()
        _LEAK_CACHE[key] = bool(torch.isnan(out[0]).any() or torch.isnan(out[2:]).any())
    return _LEAK_CACHE[key]
