"""Kernel adapters: one calling convention for every kernel the harness measures.

A :class:`KernelAdapter` wraps a function ``fn(q, k, v, *, causal, window, mask, scale)`` that
returns ``O`` or ``(O, LSE)``, and declares what the harness needs to judge it: the arithmetic
class (which error bound applies, :mod:`harness.bounds`), the dtypes, devices and masks it
supports, its key-block size, and the largest score magnitude it is specified for (a naive fp16
kernel stores S in fp16, so scores beyond 65504 are outside its contract, not a bug).

``resolve(spec)`` accepts a built-in name (:data:`BUILTIN`) or ``"package.module:attribute"``
where the attribute is a :class:`KernelAdapter` or a plain function taking torch tensors (then
the arithmetic is ``"unknown"`` and only the empirical policy applies).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.cases import Case
from harness.semantics import as_exact_array

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "KernelAdapter",
    "KernelOutput",
    "KernelOutputError",
    "KernelUnsupported",
    "builtin_adapters",
    "entry_point_kernels",
    "resolve",
]

ALL_DTYPES = ("fp16", "bf16", "fp32")
FP32_SCORES = 1e37  # fp32 score accumulators: |scale·q·k| and its partial sums stay finite
ENTRY_POINT_GROUP = "flashcheck.kernels"


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
class KernelAdapter:
    """How to call a kernel and what it promises.

    ``api``: ``"numpy"`` (inputs as numpy arrays) or ``"torch"`` (tensors on ``device``).
    ``arithmetic``: a class of :data:`harness.bounds.ARITHMETIC_CLASSES`.
    ``score_limit``: per dtype, the largest ``scale·Σ|q||k|`` the kernel is specified for.
    ``deterministic``: repeated calls are bitwise identical. ``batch_invariant``: a (batch,
    head) slice computed alone is bitwise identical to the same slice of a batched call.
    ``head_dims``: the head dims it accepts (``None``: any up to ``max_head_dim``).
    ``options``: the keyword options ``fn`` accepts among ``causal``, ``window``, ``mask``,
    ``scale`` (``None``: all four); options it lacks are not passed, and a case that needs one
    is outside its contract.
    """

    name: str
    fn: Callable[..., Any]
    arithmetic: str = "unknown"
    api: str = "torch"
    dtypes: tuple[str, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    masks: frozenset[str] = frozenset({"causal", "window", "mask"})
    max_head_dim: int = 256
    head_dims: tuple[int, ...] | None = None
    options: frozenset[str] | None = None
    key_block: int | None = None
    deterministic: bool = True
    batch_invariant: bool = True
    score_limit: dict[str, float] = field(default_factory=dict)
    check_available: Callable[[str, str], str | None] | None = None
    check_case: Callable[[Case, str | None], str | None] | None = None

    def unavailable(self, dtype: str, device: str) -> str | None:
        """Why this kernel cannot run ``dtype`` on ``device`` here, or ``None`` if it can."""
        if dtype not in self.dtypes:
            return f"{self.name} does not support {dtype}"
        if device not in self.devices:
            return f"{self.name} does not run on {device}"
        if self.check_available is not None:
            return self.check_available(dtype, device)
        return None

    def supports(self, case: Case, device: str | None = None) -> str | None:
        """Why ``case`` is outside this kernel's contract (on ``device``, if given), or ``None``
        if it is inside."""
        if case.causal and "causal" not in self.masks:
            return "causal masks unsupported"
        if case.window is not None and "window" not in self.masks:
            return "windows unsupported"
        if case.mask is not None and "mask" not in self.masks:
            return "explicit masks unsupported"
        *_, d, dv = case.shape
        if max(d, dv) > self.max_head_dim:
            return f"head dim > {self.max_head_dim}"
        if self.head_dims is not None and not {d, dv} <= set(self.head_dims):
            return f"head dims ({d}, {dv}) not among {self.head_dims}"
        if case.scale is not None and self.options is not None and "scale" not in self.options:
            return "an explicit scale is unsupported"
        limit = self.score_limit.get(case.dtype, FP32_SCORES)
        if score_magnitude(case) >= limit:
            return f"scores reach {score_magnitude(case):.3g} >= the kernel's limit {limit:.3g}"
        if self.check_case is not None:
            return self.check_case(case, device)
        return None

    def run(self, case: Case, device: str = "cpu", inputs: tuple | None = None) -> KernelOutput:
        """Call the kernel on ``case`` and copy its outputs exactly to float64.

        ``inputs``: ``(q, k, v)`` to pass instead of the case's own arrays (same values, e.g.
        views into padded buffers); numpy arrays or tensors on ``device`` according to ``api``.
        """
        opts = {"causal": case.causal, "window": case.window, "scale": case.scale}
        if case.mask is not None:
            opts["mask"] = case.mask
        if self.options is not None:
            opts = {key: val for key, val in opts.items() if key in self.options}
        if self.api == "numpy":
            q, k, v = inputs if inputs is not None else (case.q, case.k, case.v)
            # Kernels compute in IEEE arithmetic: overflow and NaN are results to be judged
            # (the NaN-rule and bound properties look at them), not warnings to raise.
            with _ieee_quiet():
                res = self.fn(q, k, v, **opts)
        else:
            import torch

            q, k, v = inputs if inputs is not None else case.to_torch(device)
            if "mask" in opts:
                opts["mask"] = torch.from_numpy(np.array(case.mask, copy=True)).to(device)
            with torch.no_grad(), _ieee_quiet():  # the Triton interpreter runs numpy
                res = self.fn(q, k, v, **opts)
        o, lse = (res if isinstance(res, tuple | list) else (res, None))[:2]
        try:
            o64, fmt = as_exact_array(o, "kernel output")
        except (TypeError, ValueError) as err:
            raise KernelOutputError(f"{self.name} returned an unusable O: {err}") from None
        want = (*case.q.shape[:3], case.v.shape[3])
        if o64.shape != want:
            raise KernelOutputError(f"{self.name} returned O of shape {o64.shape}, expected {want}")
        lse64 = None if lse is None else _lse_to_f64(lse)
        if lse64 is not None and lse64.shape != want[:3]:
            raise KernelOutputError(
                f"{self.name} returned LSE of shape {lse64.shape}, expected {want[:3]}"
            )
        return KernelOutput(o64, lse64, fmt.name)


@contextlib.contextmanager
def _ieee_quiet():
    """numpy's floating-point warnings off while a kernel runs: overflow and NaN are results to
    be judged (by the bound and NaN-rule properties), not errors. Only RuntimeWarning is
    silenced (numpy's "invalid value", "All-NaN slice"), and only inside the kernel call."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def score_magnitude(case: Case) -> float:
    """``max scale·Σ_t |q_t||k_t|`` over finite inputs: bounds every score and partial sum."""
    import math

    *_, d, _ = case.shape
    tau = abs(case.scale) if case.scale is not None else 1 / math.sqrt(d)
    q = np.nan_to_num(np.abs(case.q.astype(np.float64)), nan=0, posinf=0)
    k = np.nan_to_num(np.abs(case.k.astype(np.float64)), nan=0, posinf=0)
    rep = q.shape[1] // k.shape[1]
    k = np.repeat(k, rep, axis=1)
    return float(tau * (q @ np.swapaxes(k, -1, -2)).max(initial=0.0))


def _lse_to_f64(lse: Any) -> np.ndarray:
    if type(lse).__module__.startswith("torch"):
        return lse.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(lse, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# Built-in kernels


def _recurrence(variant: str, block_k: int):
    def fn(q, k, v, *, causal, window, scale, mask=None):
        from harness.formats import format_of
        from kernels.recurrence import PrecisionPolicy, online_attention

        policy = PrecisionPolicy.flash(format_of(q.dtype).name)
        return online_attention(
            q, k, v, policy=policy, variant=variant, block_q=16, block_k=block_k,
            causal=causal, window=window, mask=mask, scale=scale,
        )  # fmt: skip

    return fn


def _naive_numpy(q, k, v, *, causal, window, scale, mask=None):
    from kernels.naive import naive_numpy

    return naive_numpy(q, k, v, causal=causal, window=window, mask=mask, scale=scale)


def _naive_torch(q, k, v, *, causal, window, scale, mask=None):
    from kernels.naive import naive_torch

    return naive_torch(q, k, v, causal=causal, window=window, mask=mask, scale=scale)


def _triton(q, k, v, *, causal, window, scale, mask=None):
    from kernels.triton_flash import flash_attention

    return flash_attention(q, k, v, causal=causal, window=window, scale=scale)


def _triton_tf32(q, k, v, *, causal, window, scale, mask=None):
    from kernels.triton_flash import flash_attention

    return flash_attention(q, k, v, causal=causal, window=window, scale=scale, allow_tf32=True)


def _triton_available(dtype: str, device: str) -> str | None:
    if device == "cuda":
        return _torch_device_ok(dtype, device)
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    if device == "cpu" and not interp:
        return "the Triton kernel runs on CPU only under TRITON_INTERPRET=1"
    if device == "cpu" and dtype == "bf16":
        import torch

        from kernels import triton_flash

        if not triton_flash._bf16_dot_works(torch):
            return (
                "bf16 tl.dot is broken in the Triton interpreter (triton-lang/triton#11584; "
                "detected at run time by the kernel's canary)"
            )
    return None


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

        from harness.formats import FORMATS

        tdt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        tiny = float(FORMATS[dtype].min_normal) / 4  # exactly representable: a power of two
        p = torch.full((16, 16), 1 / 16, dtype=tdt, device=device)
        v = torch.full((16, 64), tiny, dtype=tdt, device=device)
        _FLUSH_CACHE[key] = bool((p @ v).float().abs().max().item() == 0.0)
    return _FLUSH_CACHE[key]


def _naive_torch_case(case: Case, device: str | None) -> str | None:
    if device is None:
        return None
    fmt = case.fmt
    sub = any(
        bool(np.any((x != 0) & (np.abs(x.astype(np.float32)) < fmt.min_normal)))
        for x in (case.q, case.k, case.v)
    )
    if sub and gemm_flushes_subnormals(case.dtype, device):
        return (
            f"subnormal inputs: torch's {case.dtype} GEMM on {device} flushes them to zero "
            "(detected at run time by a canary GEMM; IEEE bounds do not apply)"
        )
    return None


def _torch_device_ok(dtype: str, device: str) -> str | None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "no CUDA device"
    return None


def builtin_adapters() -> dict[str, KernelAdapter]:
    """The project's own kernels and the library ones of :mod:`harness.torch_adapters`."""
    from harness.torch_adapters import library_adapters

    # Naive fp16 stores S in fp16: scores must stay below its largest finite value, 65504.
    naive_limit = {"fp16": 65504.0}
    return {
        "recurrence-fa2": KernelAdapter(
            "recurrence-fa2", _recurrence("fa2", 16), "flash", api="numpy", devices=("cpu",),
            key_block=16,
        ),
        "recurrence-fa1": KernelAdapter(
            "recurrence-fa1", _recurrence("fa1", 5), "flash-fa1", api="numpy", devices=("cpu",),
            key_block=5,
        ),
        "naive-numpy": KernelAdapter(
            "naive-numpy", _naive_numpy, "naive", api="numpy", devices=("cpu",),
            score_limit=naive_limit,
        ),
        "naive-torch": KernelAdapter(
            "naive-torch", _naive_torch, "naive", api="torch", batch_invariant=False,
            score_limit=naive_limit, check_available=_torch_device_ok,
            check_case=_naive_torch_case,
        ),
        "triton": KernelAdapter(
            "triton", _triton, "flash", api="torch", masks=frozenset({"causal", "window"}),
            check_available=_triton_available,
        ),
        "triton-tf32": KernelAdapter(
            "triton-tf32", _triton_tf32, "tf32", api="torch", dtypes=("fp32",),
            devices=("cuda",), masks=frozenset({"causal", "window"}),
            check_available=_triton_available,
        ),
        **library_adapters(),
    }  # fmt: skip


BUILTIN = tuple(builtin_adapters())


def entry_point_kernels() -> dict[str, Any]:
    """Kernels other packages register under the ``flashcheck.kernels`` entry-point group.

    In the registering package's ``pyproject.toml``::

        [project.entry-points."flashcheck.kernels"]
        mykernel = "mypkg.attention:adapter"

    The object may be a :class:`KernelAdapter` or a plain function (see :func:`resolve`).
    Returns name → entry point (loaded only when used).
    """
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _from_object(obj: Any, spec: str) -> KernelAdapter:
    if isinstance(obj, KernelAdapter):
        return obj
    if callable(obj):
        opts = _accepted_options(obj)
        masks = frozenset(m for m in ("causal", "window", "mask") if m in opts)
        return KernelAdapter(spec, obj, masks=masks, options=opts)
    raise ValueError(f"{spec!r} is neither a KernelAdapter nor a callable")


def _accepted_options(fn: Callable[..., Any]) -> frozenset[str]:
    """The options among causal/window/mask/scale that ``fn`` takes as keywords."""
    import inspect

    names = frozenset({"causal", "window", "mask", "scale"})
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume everything
        return names
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return names
    return frozenset(p.name for p in params if p.name in names and p.kind is not p.POSITIONAL_ONLY)


def resolve(spec: str) -> KernelAdapter:
    """The kernel named by ``spec``.

    ``spec`` is a built-in name (:data:`BUILTIN`), a name registered under the
    ``flashcheck.kernels`` entry-point group, or ``"package.module:attribute"``. The object
    found is a :class:`KernelAdapter`, or a plain function ``fn(q, k, v, **options)`` taking
    torch tensors and returning ``O`` or ``(O, LSE)``: it then gets arithmetic ``"unknown"``
    (empirical policy only), and the masks its signature accepts (``causal``, ``window``,
    ``mask``) are the masks it is tested with.
    """
    table = builtin_adapters()
    if spec in table:
        return table[spec]
    if ":" not in spec:
        eps = entry_point_kernels()
        if spec in eps:
            try:
                obj = eps[spec].load()
            except Exception as err:  # a broken plugin: say which, do not crash the caller
                raise ValueError(f"cannot load entry point {spec!r} ({eps[spec].value}): "
                                 f"{type(err).__name__}: {err}") from None  # fmt: skip
            return _from_object(obj, spec)
        known = ", ".join([*BUILTIN, *sorted(eps)])
        raise ValueError(
            f"unknown kernel {spec!r}: use one of {known} or 'package.module:function'"
        )
    mod_name, _, attr = spec.partition(":")
    # Like `python -m`, look for the user's module in the current directory first.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as err:
        raise ValueError(f"cannot import {mod_name!r} for kernel {spec!r}: {err}") from None
    try:
        obj = getattr(mod, attr)
    except AttributeError:
        raise ValueError(f"module {mod_name!r} has no attribute {attr!r}") from None
    return _from_object(obj, spec)
