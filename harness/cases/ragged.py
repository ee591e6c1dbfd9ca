"""A test case in a ragged layout: a varlen or paged batch, or the partials of a split-KV merge.

A :class:`RaggedCase` holds what a kernel of that layout is handed, by the names of its
arguments (FlashAttention's public functions, docs/api.md "Ragged batches"):

- ``varlen``: ``q (total_q, Hq, d)``, ``k (total_k, Hk, d)``, ``v (total_k, Hk, dv)`` and the
  int32 prefix sums ``cu_seqlens_q``, ``cu_seqlens_k`` ``(B+1,)``;
- ``paged``: ``q (B, Nq, Hq, d)``, the page pools ``k_cache (num_blocks, page_size, Hk, d)``,
  ``v_cache (num_blocks, page_size, Hk, dv)``, int32 ``block_table (B, max_pages)`` and
  ``cache_seqlens (B,)``;
- ``combine``: ``out_partial (S, ..., dv)`` and ``lse_partial (S, ...)`` (fp32).

Float inputs are numpy arrays in their own format, taken exactly; index tensors are int32.
Each sequence of a varlen or paged batch is the dense :class:`~flashcheck.harness.cases.case.Case`
:meth:`RaggedCase.sequence` cuts out, so everything that judges a dense case judges it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..core.formats import format_of
from ..core.layouts import PagedBatch, VarlenBatch, index_array, paged_batch, varlen_batch
from ..core.semantics import as_exact_array
from .case import DTYPES, Case

__all__ = ["BITS", "FLOATS", "INDEX", "RAGGED_LAYOUTS", "RaggedCase", "format_name", "torch_tensor"]

# The layouts a ragged case comes in (``combine`` is the split-KV merge's input).
RAGGED_LAYOUTS = ("varlen", "paged", "combine")
FLOATS = {
    "varlen": ("q", "k", "v"),
    "paged": ("q", "k_cache", "v_cache"),
    "combine": ("out_partial", "lse_partial"),
}
INDEX = {
    "varlen": ("cu_seqlens_q", "cu_seqlens_k"),
    "paged": ("block_table", "cache_seqlens"),
    "combine": (),
}
BITS = {"fp16": np.uint16, "bf16": np.uint16, "fp32": np.uint32}


def format_name(x: np.ndarray) -> str:
    """The format name (``"fp16"``, ``"bf16"``, ``"fp32"``) of a float array."""
    return format_of(x.dtype).name


def torch_tensor(x: np.ndarray, device: str = "cpu") -> Any:
    """A torch tensor on ``device`` with the bits of ``x`` (fp16, bf16, fp32 or int32)."""
    import torch

    x = np.ascontiguousarray(x)
    if x.dtype == np.int32 or x.dtype == np.float32:
        return torch.from_numpy(x.copy()).to(device)
    tdt = torch.bfloat16 if format_name(x) == "bf16" else torch.float16
    return torch.from_numpy(x.view(np.int16).copy()).view(tdt).to(device)


@dataclass
class RaggedCase:
    """Inputs of one call in ``layout`` (module docstring) and the attention options.

    ``tensors``: the float inputs by argument name, in their format; ``index``: the int32
    index tensors by name; ``causal``, ``window``, ``scale``: as for dense cases, applied per
    sequence (causal bottom-right aligned to each sequence); the merge takes none.
    ``family``, ``seed``, ``params``: where the case came from (no effect on the computation).
    """

    layout: str
    tensors: dict[str, np.ndarray]
    index: dict[str, np.ndarray] = field(default_factory=dict)
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    scale: float | None = None
    family: str = "manual"
    seed: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.layout not in RAGGED_LAYOUTS:
            raise ValueError(f"layout must be one of {RAGGED_LAYOUTS}, got {self.layout!r}")
        want = (*FLOATS[self.layout], *INDEX[self.layout])
        got = (*self.tensors, *self.index)
        if sorted(got) != sorted(want):
            raise ValueError(f"a {self.layout} case holds {want}, got {tuple(got)}")
        for name, x in self.tensors.items():
            if not isinstance(x, np.ndarray) or x.dtype not in DTYPES.values():
                raise ValueError(f"{name} must be a numpy array in one of {sorted(DTYPES)}")
        self.index = {
            name: index_array(x, name, ndim=np.ndim(x)).astype(np.int32)
            for name, x in self.index.items()
        }
        if self.layout == "combine":
            self._check_combine()
        else:
            _ = self.batch  # every shape, index and length checked, with how to fix it

    def _check_combine(self) -> None:
        if self.causal or self.window is not None or self.scale is not None:
            raise ValueError("a combine case takes no causal, window or scale: leave them out")
        o, lse = self.tensors["out_partial"], self.tensors["lse_partial"]
        if lse.dtype != np.float32:
            raise ValueError(
                f"lse_partial must be fp32 (as merge kernels store it), got {lse.dtype}"
            )
        if o.ndim < 2 or o.shape[0] < 1 or lse.shape != o.shape[:-1]:
            raise ValueError(
                f"out_partial must be (S, ..., dv) with S >= 1 and lse_partial (S, ...) with "
                f"the same leading axes, got {o.shape} and {lse.shape}"
            )

    @cached_property
    def batch(self) -> VarlenBatch | PagedBatch:
        """The validated batch of :mod:`flashcheck.harness.core.layouts` (not for combine)."""
        if self.layout == "varlen":
            q, k, v = (self.tensors[n] for n in FLOATS["varlen"])
            return varlen_batch(q, k, v, **self.index)
        if self.layout == "paged":
            q, kc, vc = (self.tensors[n] for n in FLOATS["paged"])
            return paged_batch(q, kc, vc, **self.index)
        raise ValueError("a combine case is no batch of sequences")

    def __getstate__(self) -> dict[str, Any]:
        return {key: val for key, val in self.__dict__.items() if key != "batch"}

    @property
    def dtype(self) -> str:
        """The format of the (first) float input: ``q`` or ``out_partial``."""
        return format_name(self.tensors[FLOATS[self.layout][0]])

    @property
    def sequences(self) -> int:
        """The number of sequences ``B`` (for combine: the number of merged rows)."""
        if self.layout == "combine":
            return int(np.prod(self.tensors["lse_partial"].shape[1:], dtype=np.int64))
        return self.batch.batch

    def lengths(self, b: int) -> tuple[int, int]:
        """``(Nq_b, Nk_b)``: the query rows and keys of sequence ``b``."""
        if self.layout == "varlen":
            cu_q, cu_k = self.index["cu_seqlens_q"], self.index["cu_seqlens_k"]
            return int(cu_q[b + 1] - cu_q[b]), int(cu_k[b + 1] - cu_k[b])
        if self.layout == "paged":
            return self.tensors["q"].shape[1], int(self.index["cache_seqlens"][b])
        raise ValueError("a combine case has no sequences")

    def options(self) -> dict[str, Any]:
        """The attention options every sequence shares (none for combine)."""
        if self.layout == "combine":
            return {}
        return {"causal": self.causal, "window": self.window, "scale": self.scale}

    def sequence(self, b: int) -> Case:
        """Sequence ``b`` as the dense case ``(1, H, N_b, ·)`` it is, with the same options."""
        q, k, v = self.batch.sequence(b)
        return Case(
            np.ascontiguousarray(q),
            np.ascontiguousarray(k),
            np.ascontiguousarray(v),
            **self.options(),
            family=self.family,
            seed=self.seed,
        )

    def arguments(self, api: str = "numpy", device: str = "cpu") -> dict[str, Any]:
        """Every tensor of the call by name: numpy arrays, or torch tensors on ``device``
        (bit-exact, index tensors int32), as the kernel is handed them."""
        out = {**self.tensors, **self.index}
        if api == "numpy":
            return {name: np.array(x, copy=True) for name, x in out.items()}
        return {name: torch_tensor(x, device) for name, x in out.items()}

    def bits(self, name: str) -> np.ndarray:
        """The bit patterns of float input ``name`` as unsigned ints."""
        x = self.tensors[name]
        return np.ascontiguousarray(x).view(BITS[format_name(x)])

    def describe(self) -> str:
        """One line: layout, format, sizes, options, family and seed."""
        t = self.tensors
        if self.layout == "combine":
            o = t["out_partial"]
            body = f"S={o.shape[0]} rows={self.sequences} dv={o.shape[-1]}"
        else:
            hq, d = t["q"].shape[-2:]
            hk, dv = t[FLOATS[self.layout][2]].shape[-2:]
            lens = [self.lengths(b) for b in range(self.sequences)]
            body = f"B={len(lens)} Hq={hq} Hk={hk} d={d} dv={dv} (Nq, Nk)={lens}"
            if self.layout == "paged":
                body += f" page_size={t['k_cache'].shape[1]} pages={t['k_cache'].shape[0]}"
        opts = [
            name
            for name, on in (
                ("causal", self.causal),
                (f"window={self.window}", self.window is not None),
                (f"scale={self.scale!r}", self.scale is not None),
            )
            if on
        ]
        extra = f" {' '.join(opts)}" if opts else ""
        return f"{self.family} {self.layout} {self.dtype} {body}{extra} seed={self.seed}"

    def __repr__(self) -> str:
        return f"RaggedCase({self.describe()})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # Hypothesis prints a falsifying example with this protocol; without it a dataclass
        # is spelled field by field, every array in full (39 kB for one varlen case).
        printer.text(repr(self))

    @classmethod
    def from_arrays(
        cls,
        layout: str,
        *,
        causal: bool = False,
        window: tuple[int | None, int | None] | None = None,
        scale: float | None = None,
        **tensors: Any,
    ) -> RaggedCase:
        """A case from numpy arrays or torch tensors (any device), values taken exactly:
        ``RaggedCase.from_arrays("varlen", q=..., k=..., v=..., cu_seqlens_q=...,
        cu_seqlens_k=...)``, ``("paged", q=, k_cache=, v_cache=, block_table=,
        cache_seqlens=)`` or ``("combine", out_partial=, lse_partial=)``."""
        if layout not in RAGGED_LAYOUTS:
            raise ValueError(f"layout must be one of {RAGGED_LAYOUTS}, got {layout!r}")
        floats, index = {}, {}
        for name, x in tensors.items():
            if name in INDEX[layout]:
                index[name] = index_array(x, name, ndim=np.ndim(x)).astype(np.int32)
            elif name in FLOATS[layout]:
                exact, fmt = as_exact_array(x, name)
                floats[name] = exact.astype(DTYPES[fmt.name])
            else:
                want = (*FLOATS[layout], *INDEX[layout])
                raise TypeError(f"a {layout} case takes {want}, not {name!r}")
        scale = None if scale is None else float(scale)
        return cls(layout, floats, index, causal=bool(causal), window=window, scale=scale)
