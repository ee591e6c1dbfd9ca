"""The attention forwards a benchmark compares, each behind one calling convention.

A :class:`Provider` turns ``(q, k, v)`` of shape ``(B, H, N, d)`` (one CUDA device, one dtype)
and a causal flag into a zero-state callable ``fn(q, k, v) -> O``; everything a user would do
once per shape (building a block mask, compiling) happens in :meth:`Provider.make` or in the
warm-up runs, never in the timed ones.

- ``triton``: this project's kernel (:mod:`flashcheck.kernels.triton_flash`); ``triton-tf32`` is the
same
  kernel with tf32 dots, fp32 inputs only.
- ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math``: one backend of
  ``torch.nn.functional.scaled_dot_product_attention`` each, forced with ``sdpa_kernel`` so
  torch cannot fall back to another backend behind the benchmark's back.
- ``flex``: ``torch.nn.attention.flex_attention`` compiled with ``torch.compile`` (its eager
  path is a reference implementation, not the kernel users run), with a causal block mask.
- ``naive``: what people write by hand: ``softmax(Q·Kᵀ·scale)`` materialized in the input
  dtype (softmax in fp32), then ``·V``.
- ``triton-atomic``: the backward passes only: ``triton``'s forward with the backward's default,
  fused path (dQ by fp32 atomic adds inside the dK/dV kernel), beside ``triton``, which times the
  deterministic two-kernel backward.
- ``triton+softcap``, ``triton+sinks``: the project's kernel with one softmax option on
  (:data:`BENCH_SOFTCAP`; :func:`bench_sinks`), timed beside plain ``triton`` on the same inputs
  so the option's cost is a ratio of one run (the ``options`` part); ``triton+softcap-approx``
  the cap with the GPU's approximate tanh (``approx_tanh=True``, judged with its bounds).

A user's kernel (``flashcheck bench --kernel MODULE:FUNCTION``) becomes a provider of its own
(:mod:`flashcheck.harness.bench.kernel_providers`); :func:`provider_table` is the table of one
run, the built-ins and those.

For the backward (``flashcheck bench --pass bwd``) :meth:`Provider.make_grad` gives a forward
that torch autograd differentiates: the same callable for every provider but ``triton``, whose
differentiable form is :func:`flashcheck.kernels.triton_flash_bwd.flash_attention_differentiable`
(imported only when asked for, so the forward benchmark runs without it).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..adapters.library import SDPA_BACKENDS as _SDPA

__all__ = [
    "BENCH_SOFTCAP",
    "PROVIDERS",
    "Provider",
    "bench_sinks",
    "provider_names",
    "provider_table",
]

_HALF = ("fp16", "bf16")
_ALL = ("fp16", "bf16", "fp32")


@dataclass(frozen=True)
class Provider:
    """One benchmarked forward.

    ``materializes`` marks forwards that hold the ``N × N`` score matrix in memory: the
    benchmark skips shapes where that would not fit, instead of running out of memory.
    ``arithmetic`` is the class of the bounds its outputs are judged with
    (``"unknown"``: the loosest bound of the classes at or above the input format's precision,
    as in the error report). ``head_dims`` (``None``: any up to ``max_head_dim``),
    ``takes_causal`` and ``has_backward`` narrow what it runs, for a user's kernel
    (``kernel_spec``: the ``--kernel`` it came from; ``None`` for a built-in).
    """

    name: str
    dtypes: tuple[str, ...]
    max_head_dim: int
    materializes: bool
    arithmetic: str
    build: Callable[[Any, Any, Any, bool], Callable[..., Any]]
    # The gradient class its backward is judged with; build_grad: a differentiable forward
    # when ``build``'s is not one (None: autograd through ``build``'s).
    backward_arithmetic: str = "unknown"
    build_grad: Callable[[Any, Any, Any, bool], Callable[..., Any]] | None = None
    grad_module: str | None = None  # the module build_grad imports, checked before a run
    # Another provider's forward with a backward of its own: not run in the forward pass.
    backward_only: bool = False
    # The softmax options it computes (its outputs are checked against the oracle with them).
    softcap: float | None = None
    sinks: bool = False
    tanh: str = "accurate"  # the soft-cap's tanh, as flashcheck.kernel(tanh=...) declares it
    head_dims: tuple[int, ...] | None = None
    takes_causal: bool = True
    has_backward: bool = True
    kernel_spec: str | None = None

    @property
    def options(self) -> tuple[float | None, bool]:
        """``(softcap, sinks)``: providers with equal options share one oracle reference."""
        return (self.softcap, self.sinks)

    def unsupported(
        self, dtype: str, d: int, *, causal: bool = False, backward: bool = False
    ) -> str | None:
        """Why this provider does not run a ``dtype`` shape of head dim ``d`` (causal or not;
        for a backward pass or not), or ``None`` where it does."""
        if backward and not self.has_backward:
            return "no backward declared"
        if backward and self.grad_module and importlib.util.find_spec(self.grad_module) is None:
            return f"unsupported: {self.name.split('-')[0].capitalize()} backward not available"
        if dtype not in self.dtypes:
            return f"{self.name} does not take {dtype} (it takes {', '.join(self.dtypes)})"
        if d > self.max_head_dim:
            return f"{self.name} takes head dims up to {self.max_head_dim}"
        if self.head_dims is not None and d not in self.head_dims:
            return f"{self.name} takes head dims {', '.join(map(str, self.head_dims))}"
        if causal and not self.takes_causal:
            return f"{self.name} takes no causal mask"
        return None

    def score_bytes(self, b: int, h: int, n: int, itemsize: int, *, backward: bool = False) -> int:
        """Memory the materialized ``S``, fp32 softmax and ``P`` need (0 when not materialized);
        with ``backward``, twice that: autograd keeps them and the backward makes ``dP``, ``dS``
        of the same size."""
        per = b * h * n * n * (2 * itemsize + 4) if self.materializes else 0
        return 2 * per if backward else per

    def make(self, q: Any, k: Any, v: Any, causal: bool) -> Callable[..., Any]:
        return self.build(q, k, v, causal)

    def make_grad(self, q: Any, k: Any, v: Any, causal: bool) -> Callable[..., Any]:
        """A forward ``fn(q, k, v) -> O`` that autograd differentiates."""
        return (self.build_grad or self.build)(q, k, v, causal)


# A cap that bites on the benchmark's N(0, 1) inputs (scaled scores are about N(0, 1)), so
# the oracle check sees the tanh at work; the kernel's time does not depend on the value.
BENCH_SOFTCAP = 2.0


def bench_sinks(h: int, n_k: int, device: Any) -> Any:
    """The sink logits of a benchmarked shape: ``log(N_k) + t`` with ``t`` spread evenly over
    ``[-4, 4]`` across the ``h`` heads, so the sink's weight ranges from small to dominant
    against a row's total ``≈ N_k`` on N(0, 1) inputs; float32 ``(h,)``."""
    import torch

    return math.log(n_k) + torch.linspace(-4.0, 4.0, h, device=device, dtype=torch.float32)


def _option_kwargs(q: Any, k: Any, softcap: float | None, sinks: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if softcap:
        out["softcap"] = softcap
    if sinks:
        out["sinks"] = bench_sinks(q.shape[1], k.shape[2], q.device)
    return out


def _triton(tf32: bool, softcap: float | None = None, sinks: bool = False, approx: bool = False):
    def build(q, k, v, causal):
        from ...kernels.triton_flash import flash_attention

        opts = _option_kwargs(q, k, softcap, sinks)
        if approx:
            opts["approx_tanh"] = True

        def fn(q, k, v):
            return flash_attention(q, k, v, causal=causal, allow_tf32=tf32, **opts)[0]

        return fn

    return build


def _triton_grad(
    tf32: bool,
    softcap: float | None = None,
    sinks: bool = False,
    deterministic: bool = True,
    approx: bool = False,
):
    def build(q, k, v, causal):
        from ...kernels.triton_flash_bwd import flash_attention_differentiable

        opts = _option_kwargs(q, k, softcap, sinks)
        opts["deterministic"] = deterministic
        if approx:
            opts["approx_tanh"] = True

        def fn(q, k, v):
            return flash_attention_differentiable(q, k, v, causal=causal, allow_tf32=tf32, **opts)

        return fn

    return build


_TRITON_BWD = "flashcheck.kernels.triton_flash_bwd"


def _sdpa(backend: str):
    def build(q, k, v, causal):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        be = getattr(SDPBackend, backend)

        def fn(q, k, v):
            with sdpa_kernel([be]):
                return sdpa(q, k, v, is_causal=causal)

        return fn

    return build


_FLEX_COMPILED: dict[str, Any] = {}


def _flex(q, k, v, causal):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX_COMPILED:
        from ..adapters.library import raise_recompile_limits

        raise_recompile_limits()
        # The backward pass is timed through a retained graph; a compiled backward that
        # donates its saved buffers refuses retain_graph=True (RuntimeError, measured with
        # torch 2.11), so donation is off: flex's backward may hold slightly more memory.
        torch._functorch.config.donated_buffer = False
        _FLEX_COMPILED["fn"] = torch.compile(flex_attention, dynamic=False)
    compiled = _FLEX_COMPILED["fn"]
    n_q, n_k = q.shape[2], k.shape[2]
    block_mask = None
    if causal:

        def causal_mod(b, h, i, j):
            return j <= i + (n_k - n_q)

        block_mask = create_block_mask(causal_mod, None, None, n_q, n_k, device=q.device)

    def fn(q, k, v):
        return compiled(q, k, v, block_mask=block_mask)

    return fn


def _naive(q, k, v, causal):
    import torch

    n_q, n_k, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d)
    masked = None
    if causal:
        i = torch.arange(n_q, device=q.device)[:, None]
        j = torch.arange(n_k, device=q.device)[None, :]
        masked = j > i + (n_k - n_q)

    def fn(q, k, v):
        s = (q @ k.transpose(-1, -2)) * scale
        if masked is not None:
            s = s.masked_fill(masked, float("-inf"))
        p = torch.softmax(s.float(), dim=-1).to(q.dtype)
        return p @ v

    return fn


_TRITON = Provider(
    "triton",
    _ALL,
    256,
    False,
    "flash",
    _triton(False),
    backward_arithmetic="flash",
    build_grad=_triton_grad(False),
    grad_module=_TRITON_BWD,
)

PROVIDERS: dict[str, Provider] = {
    "triton": _TRITON,
    "triton-atomic": replace(
        _TRITON,
        name="triton-atomic",
        build_grad=_triton_grad(False, deterministic=False),
        backward_only=True,
    ),
    "triton-tf32": Provider(
        "triton-tf32",
        ("fp32",),
        256,
        False,
        "tf32",
        _triton(True),
        backward_arithmetic="tf32",
        build_grad=_triton_grad(True),
        grad_module=_TRITON_BWD,
    ),
    "sdpa-flash": Provider(
        "sdpa-flash", _HALF, 256, False, "flash", _sdpa(_SDPA["sdpa-flash"]), "flash"
    ),
    "sdpa-cudnn": Provider("sdpa-cudnn", _HALF, 256, False, "unknown", _sdpa(_SDPA["sdpa-cudnn"])),
    "sdpa-efficient": Provider(
        "sdpa-efficient", _ALL, 256, False, "unknown", _sdpa(_SDPA["sdpa-efficient"])
    ),
    "sdpa-math": Provider("sdpa-math", _ALL, 1 << 30, True, "unknown", _sdpa(_SDPA["sdpa-math"])),
    "flex": Provider("flex", _ALL, 256, False, "unknown", _flex),
    "naive": Provider("naive", _ALL, 1 << 30, True, "naive", _naive, "naive"),
    "triton+softcap": Provider(
        "triton+softcap",
        _ALL,
        256,
        False,
        "flash",
        _triton(False, softcap=BENCH_SOFTCAP),
        backward_arithmetic="flash",
        build_grad=_triton_grad(False, softcap=BENCH_SOFTCAP),
        grad_module=_TRITON_BWD,
        softcap=BENCH_SOFTCAP,
    ),
    "triton+softcap-approx": Provider(
        "triton+softcap-approx",
        _ALL,
        256,
        False,
        "flash",
        _triton(False, softcap=BENCH_SOFTCAP, approx=True),
        backward_arithmetic="flash",
        build_grad=_triton_grad(False, softcap=BENCH_SOFTCAP, approx=True),
        grad_module=_TRITON_BWD,
        softcap=BENCH_SOFTCAP,
        tanh="approx",
    ),
    "triton+sinks": Provider(
        "triton+sinks",
        _ALL,
        256,
        False,
        "flash",
        _triton(False, sinks=True),
        backward_arithmetic="flash",
        build_grad=_triton_grad(False, sinks=True),
        grad_module=_TRITON_BWD,
        sinks=True,
    ),
}


def provider_names() -> list[str]:
    return list(PROVIDERS)


def provider_table(extra: Iterable[Provider] = ()) -> dict[str, Provider]:
    """The providers of one run by name: the built-ins (:data:`PROVIDERS`), then ``extra`` (a
    user's kernels) in their order. ``ValueError`` for an extra whose name is taken."""
    table = dict(PROVIDERS)
    for p in extra:
        if p.name in table:
            which = "a built-in provider's" if p.name in PROVIDERS else "another --kernel's"
            fix = (
                f"pass --provider {p.name} for the built-in one, or " if p.name in PROVIDERS else ""
            )
            raise ValueError(
                f"--kernel {p.kernel_spec or p.name}: its name {p.name!r} is {which}; {fix}"
                "name the kernel by its package.module:function instead"
            )
        table[p.name] = p
    return table
