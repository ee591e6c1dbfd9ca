"""Shared parametrisation of the property suite: kernels, dtypes, device, sizes per profile."""

from __future__ import annotations

import pytest
from hypothesis import settings

from harness.adapters import KernelAdapter, builtin_adapters
from harness.cases import DTYPES
from properties.strategies import cases

try:
    import torch

    DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
except ImportError:  # pragma: no cover - torch is a dependency
    DEVICE = "cpu"

KERNELS = ("triton", "triton-tf32", "recurrence-fa2", "recurrence-fa1", "naive-numpy",
           "naive-torch")  # fmt: skip
ADAPTERS = builtin_adapters()
# Lengths up to 129 cover the 16/32/64/128 block edges; the hand-run profiles reach 1025.
_PROFILE = settings.get_current_profile_name()
MAX_LEN = {"thorough": 1025, "sweep": 1025}.get(_PROFILE, 129)
# B·Hq·Nq·Nk per example: the Triton interpreter runs ~1 s per 40k score elements on CPU.
MAX_WORK = {"thorough": 1 << 19, "sweep": 1 << 19}.get(_PROFILE, 1 << 14)


def kernel_dtype_params() -> list:
    """``(kernel, dtype)`` pairs the kernel declares, as pytest params with readable ids."""
    return [
        pytest.param(k, dt, id=f"{k}-{dt}")
        for k in KERNELS
        for dt in DTYPES
        if dt in ADAPTERS[k].dtypes
    ]


def device_for(adapter: KernelAdapter) -> str:
    return DEVICE if DEVICE in adapter.devices else adapter.devices[0]


def adapter_or_skip(kernel: str, dtype: str) -> tuple[KernelAdapter, str]:
    """The adapter and its device, or a pytest skip that names why it cannot run here."""
    adapter = ADAPTERS[kernel]
    dev = device_for(adapter)
    why = adapter.unavailable(dtype, dev)
    if why:
        pytest.skip(why)
    return adapter, dev


def case_strategy(adapter: KernelAdapter, dtype: str, **kw):
    masks = tuple(m for m in ("causal", "window", "mask") if m in adapter.masks)
    kw["masks"] = tuple(m for m in kw.get("masks", masks) if m in masks)
    kw.setdefault("max_len", MAX_LEN)
    kw.setdefault("max_work", MAX_WORK)
    return cases(dtype=dtype, score_limit=adapter.score_limit.get(dtype), **kw)


def fewer(n: int) -> settings:
    """A quarter of the profile's examples (at least ``n``): the structural properties."""
    return settings(max_examples=max(n, settings.default.max_examples // 4))
