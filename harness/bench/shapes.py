"""The shapes of a benchmark run: each part's list of (batch, heads, length, head dim, dtype,
causality) and the pass that is timed on it, with its FLOP count (see
:mod:`flashcheck.harness.bench.suite` for what each part measures)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .providers import PROVIDERS, Provider, provider_table

__all__ = [
    "FLOP_FACTOR",
    "ITEMSIZE",
    "PARTS",
    "PASSES",
    "TOKENS",
    "WIDTH",
    "Shape",
    "plan",
]

TOKENS = 16384
WIDTH = 2048
NS = (1024, 2048, 4096, 8192, 16384, 32768)
HEAD_DIMS = (64, 128, 256)
WIDTHS = (1024, 2048, 4096, 8192)
MEMORY_HEADS = 8
# The plain providers: tf32 takes fp32 inputs only; the option variants run in "options".
GRID_PROVIDERS = tuple(p for p in PROVIDERS if p != "triton-tf32" and "+" not in p)
FP32_PROVIDERS = ("triton", "triton-tf32", "sdpa-efficient", "sdpa-math", "flex", "naive")
OPTION_PROVIDERS = ("triton", "triton+softcap", "triton+softcap-approx", "triton+sinks")
PARTS = ("grid", "width", "memory", "fp32", "options")
PASSES = ("fwd", "bwd", "fwd+bwd")
# FLOPs of a pass in units of the forward's 4·N²·d: the backward runs five GEMMs of the
# forward's size (S = QKᵀ again, dV, dP, dQ, dK) to the forward's two.
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
ITEMSIZE = {"fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class Shape:
    part: str
    dtype: str
    b: int
    h: int
    n: int
    d: int
    causal: bool
    pass_: str = "fwd"

    def __post_init__(self) -> None:
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r}: choose from {', '.join(PASSES)}")

    @property
    def key(self) -> str:
        """Unique per shape and pass; forward keys keep their old form (no pass suffix), so
        earlier results files resume and render unchanged."""
        mask = "causal" if self.causal else "full"
        key = f"{self.part}/{self.dtype}/b{self.b}h{self.h}n{self.n}d{self.d}/{mask}"
        return key if self.pass_ == "fwd" else f"{key}/{self.pass_}"

    @property
    def forward_flops(self) -> float:
        """``4·N²·d`` per head (the two GEMMs), halved for causal."""
        return 4.0 * self.b * self.h * self.n * self.n * self.d * (0.5 if self.causal else 1.0)

    @property
    def flops(self) -> float:
        """The FLOPs of this shape's pass: the forward's times :data:`FLOP_FACTOR`."""
        return self.forward_flops * FLOP_FACTOR[self.pass_]

    def as_dict(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "dtype": self.dtype,
            "b": self.b,
            "h": self.h,
            "n": self.n,
            "d": self.d,
            "causal": self.causal,
            "pass": self.pass_,
        }


def _check_plan(parts, providers, passes, dtypes, ns, head_dims) -> None:
    """``ValueError``, saying what to choose from, for a selection :func:`plan` cannot run."""
    for p in parts:
        if p not in PARTS:
            raise ValueError(f"unknown part {p!r}: choose from {', '.join(PARTS)}")
    unknown = [p for p in providers or () if p not in PROVIDERS]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}: choose from {', '.join(PROVIDERS)}")
    if not passes or any(p not in PASSES for p in passes):
        raise ValueError(
            f"passes must be a non-empty selection of {', '.join(PASSES)}, got {passes!r}"
        )
    if dtypes is not None and any(dt not in ITEMSIZE for dt in dtypes):
        raise ValueError(f"dtypes must be among {', '.join(ITEMSIZE)}, got {dtypes!r}")
    for name, vals in (("ns", ns), ("head_dims", head_dims)):
        if vals is not None and any(not isinstance(x, int) or x < 1 for x in vals):
            raise ValueError(f"{name} must be positive ints, got {vals!r}")


def plan(
    *,
    parts: tuple[str, ...] = PARTS,
    quick: bool = False,
    providers: tuple[str, ...] | None = None,
    passes: tuple[str, ...] = ("fwd",),
    ns: tuple[int, ...] | None = None,
    head_dims: tuple[int, ...] | None = None,
    dtypes: tuple[str, ...] | None = None,
    kernels: tuple[Provider, ...] = (),
) -> list[tuple[Shape, tuple[str, ...]]]:
    """The shapes of ``parts``, each with the providers that run on it, in run order: the
    goal shapes (bf16, d = 128) first, so an interrupted run has measured what matters most.

    Each shape appears once per pass of ``passes`` (in that order, pass by pass). ``ns``,
    ``head_dims``, ``dtypes`` keep only the shapes with those values (``None``: all).
    ``providers`` selects among the built-ins (``None``: all); ``kernels`` (a user's, from
    :func:`~flashcheck.harness.bench.kernel_providers.kernel_providers`) run beside them in
    the grid, width and memory parts, and in the fp32 part where they take fp32. Shapes a
    provider does not take stay in its list: the run records why it skipped them.
    """
    _check_plan(parts, providers, passes, dtypes, ns, head_dims)
    table = provider_table(kernels)
    user = tuple(k.name for k in kernels)
    grid_provs, fp32_provs = GRID_PROVIDERS + user, FP32_PROVIDERS + _fp32_kernels(kernels)
    only_n, only_d, only_dt = ns, head_dims, dtypes  # the names below are the grid's own
    ns = (1024, 4096) if quick else NS
    dims = (64, 128) if quick else HEAD_DIMS
    dtypes = ("bf16",) if quick else ("bf16", "fp16")

    def keep(names: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(p for p in names if providers is None or p in providers or p in user)

    out: list[tuple[Shape, tuple[str, ...]]] = []
    if "grid" in parts:
        order = sorted(dims, key=lambda d: (d != 128, d))
        for dt in dtypes:
            for d in order:
                for causal in (False, True):
                    for n in ns:
                        shape = Shape("grid", dt, max(1, TOKENS // n), WIDTH // d, n, d, causal)
                        out.append((shape, keep(grid_provs)))
    if "width" in parts:
        for w in WIDTHS[:2] if quick else WIDTHS:
            for causal in (False, True):
                out.append(
                    (
                        Shape("width", "bf16", TOKENS // 4096, w // 128, 4096, 128, causal),
                        keep(grid_provs),
                    )
                )
    if "memory" in parts:
        for n in ns:
            out.append((Shape("memory", "bf16", 1, MEMORY_HEADS, n, 128, False), keep(grid_provs)))
    if "fp32" in parts:
        for d in (64, 128):
            for causal in (False, True):
                for n in (1024,) if quick else (1024, 4096, 16384):
                    out.append(
                        (
                            Shape("fp32", "fp32", max(1, TOKENS // n), WIDTH // d, n, d, causal),
                            keep(fp32_provs),
                        )
                    )
    if "options" in parts:
        out += _option_shapes(quick, keep(OPTION_PROVIDERS))
    out = [
        (s, p)
        for s, p in out
        if p
        and (only_n is None or s.n in only_n)
        and (only_d is None or s.d in only_d)
        and (only_dt is None or s.dtype in only_dt)
    ]
    return [
        (replace(s, pass_=ps), kept)
        for ps in passes
        for s, p in out
        if (kept := _for_pass(p, ps, table))
    ]


def _fp32_kernels(kernels: tuple[Provider, ...]) -> tuple[str, ...]:
    """The user kernels that run in the fp32 part: those that take fp32."""
    return tuple(k.name for k in kernels if "fp32" in k.dtypes)


def _for_pass(names: tuple[str, ...], pass_: str, table: dict[str, Provider]) -> tuple[str, ...]:
    """``names`` without the backward-only providers in the forward pass (their forward is
    another provider's)."""
    if pass_ != "fwd":
        return names
    return tuple(p for p in names if not table[p].backward_only)


def _option_shapes(quick: bool, provs: tuple[str, ...]) -> list[tuple[Shape, tuple[str, ...]]]:
    """The ``options`` part: the Triton kernel with and without soft-capping and sinks on the
    grid's convention (bf16, ``B·N = 16384``, ``H·d = 2048``), d = 128 and 64."""
    ns = (1024, 4096) if quick else (1024, 4096, 16384)
    dims = (128,) if quick else (128, 64)
    return [
        (Shape("options", "bf16", max(1, TOKENS // n), WIDTH // d, n, d, causal), provs)
        for d in dims
        for causal in (False, True)
        for n in ns
    ]
