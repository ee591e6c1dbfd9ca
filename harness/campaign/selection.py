"""Which kernels and dtypes a campaign runs, and on which device each kernel runs."""

from __future__ import annotations

from collections.abc import Sequence

from ..adapters.adapter import Kernel
from ..adapters.registry import resolve
from ..cases.case import DTYPES

__all__ = [
    "check_dtypes",
    "default_kernels",
    "kernel_device",
    "ragged_run",
    "resolve_kernels",
    "resolve_ragged_kernels",
]


def kernel_device(adapter: Kernel, device: str) -> str:
    """``device`` if the kernel runs there, else its first device."""
    return device if device in adapter.devices else adapter.devices[0]


def default_kernels() -> list[str]:
    """Every built-in kernel of dense attention (the project's and the library adapters), but
    those run only when named (``registry.NAMED_ONLY``)."""
    from ..adapters.registry import NAMED_ONLY, builtin_kernels

    return [name for name, k in builtin_kernels().items() if _dense(k) and name not in NAMED_ONLY]


def _dense(kernel: Kernel) -> bool:
    return kernel.layout == "dense" and kernel.op == "attention"


def _what(kernel: Kernel) -> str:
    return "split-KV merge (op='combine')" if kernel.op == "combine" else f"{kernel.layout} kernel"


def resolve_kernels(specs: Sequence[str]) -> dict[str, Kernel]:
    """Adapters for ``specs`` (duplicates dropped, order kept); ``ValueError`` names a bad one,
    and a kernel of a ragged layout or a merge, which runs in a campaign of its own."""
    out: dict[str, Kernel] = {}
    for spec in specs:
        if spec not in out:
            out[spec] = resolve(spec)
            if not _dense(out[spec]):
                raise ValueError(
                    f"{spec} is a {_what(out[spec])}: kernels of ragged layouts and split-KV "
                    "merges run in a campaign of their own, without dense kernels "
                    f"(flashcheck report --kernel {spec})"
                )
    return out


def resolve_ragged_kernels(specs: Sequence[str]) -> dict[str, Kernel]:
    """Adapters for ``specs``, every one of a ragged layout or a merge (``ValueError``
    otherwise)."""
    out = {spec: resolve(spec) for spec in dict.fromkeys(specs)}
    dense = [spec for spec, k in out.items() if _dense(k)]
    if dense or not out:
        raise ValueError(
            f"a campaign of ragged layouts takes kernels of those layouts only; {dense or 'none'} "
            "are dense: run them in a campaign of their own"
        )
    return out


def ragged_run(specs: Sequence[str]) -> bool:
    """Whether ``specs`` name kernels of ragged layouts or merges (``False`` for dense kernels
    or none); ``ValueError`` when they mix the two, which one report does not hold."""
    kinds = {spec: _dense(resolve(spec)) for spec in dict.fromkeys(specs)}
    if all(kinds.values()):
        return False
    if not any(kinds.values()):
        return True
    dense = [s for s, d in kinds.items() if d]
    ragged = [s for s, d in kinds.items() if not d]
    raise ValueError(
        f"one report holds either dense kernels ({', '.join(dense)}) or kernels of ragged "
        f"layouts and split-KV merges ({', '.join(ragged)}), not both: run two reports "
        "(--name tells them apart)"
    )


def check_dtypes(dtypes: Sequence[str]) -> tuple[str, ...]:
    """``dtypes`` without duplicates (``ValueError`` names an unknown one)."""
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise ValueError(f"unknown dtype(s) {bad}: choose from {sorted(DTYPES)}")
    return tuple(dict.fromkeys(dtypes))
