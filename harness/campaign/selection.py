"""Which kernels and dtypes a campaign runs, and on which device each kernel runs."""

from __future__ import annotations

from collections.abc import Sequence

from ..adapters.adapter import Kernel
from ..adapters.registry import resolve
from ..cases.case import DTYPES

__all__ = ["check_dtypes", "default_kernels", "kernel_device", "resolve_kernels"]


def kernel_device(adapter: Kernel, device: str) -> str:
    """``device`` if the kernel runs there, else its first device."""
    return device if device in adapter.devices else adapter.devices[0]


def default_kernels() -> list[str]:
    """Every built-in kernel of dense attention (the project's and the library adapters)."""
    from ..adapters.registry import builtin_kernels

    return [name for name, k in builtin_kernels().items() if _dense(k)]


def _dense(kernel: Kernel) -> bool:
    return kernel.layout == "dense" and kernel.op == "attention"


def resolve_kernels(specs: Sequence[str]) -> dict[str, Kernel]:
    """Adapters for ``specs`` (duplicates dropped, order kept); ``ValueError`` names a bad one,
    and a kernel of a ragged layout or a merge, whose campaigns are not offered yet."""
    out: dict[str, Kernel] = {}
    for spec in specs:
        if spec not in out:
            out[spec] = resolve(spec)
            if not _dense(out[spec]):
                what = "op='combine'" if out[spec].op == "combine" else out[spec].layout
                raise ValueError(
                    f"{spec} is a {what} kernel: campaigns for ragged layouts and split-KV "
                    "merges come in a later release; judge it on a case with "
                    "flashcheck.check(kernel, flashcheck.RaggedCase...)"
                )
    return out


def check_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    """``dtypes`` without duplicates (``ValueError`` names an unknown one)."""
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}: choose from {sorted(DTYPES)}")
    return tuple(dict.fromkeys(dtypes))
