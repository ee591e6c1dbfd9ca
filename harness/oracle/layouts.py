"""The oracle of ragged batches: varlen and paged inputs, answered in the same layouts.

Each sequence ``b`` of the batch is cut out as the dense problem of
:mod:`flashcheck.harness.core.layouts` and certified by the dense oracle
(:func:`flashcheck.harness.oracle.evaluate.oracle`) with the same options; its answer is put
back where the layout keeps that sequence's rows:

- varlen: ``O (total_q, Hq, dv)``, ``LSE (Hq, total_q)``; with ``do`` ``(total_q, Hq, dv)``,
  ``dQ (total_q, Hq, d)``, ``dK (total_k, Hk, d)``, ``dV (total_k, Hk, dv)``;
- paged: ``O (B, Nq, Hq, dv)``, ``LSE (B, Hq, Nq)`` (no gradients: decode kernels have none).

Every field (hi, lo, err, floor, rounded, certified) is the dense oracle's, element for element,
so the answer carries the dense contract unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import Format, format_of
from ..core.layouts import PagedBatch, VarlenBatch
from ..core.semantics import as_exact_array
from .evaluate import TENSORS, OracleResult, oracle
from .tensor import FIELDS, CertifiedTensor

__all__ = ["LayoutResult", "paged_oracle", "varlen_oracle"]


@dataclass
class LayoutResult:
    """The oracle's answer for a ragged batch, in the batch's own layout.

    ``layout`` is ``"varlen"`` or ``"paged"``; ``tensors`` maps ``"o"``, ``"lse"`` (and with
    ``do`` ``"dq"``, ``"dk"``, ``"dv"``) to :class:`CertifiedTensor` in that layout's shapes
    (module docstring); ``sequences`` holds the dense answer of each sequence, in batch order.
    """

    layout: str
    fmt: Format
    mode: str
    tensors: dict[str, CertifiedTensor]
    sequences: tuple[OracleResult, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> CertifiedTensor:
        """The tensor ``name`` (``"o"``, ``"lse"``, ``"dq"``, ``"dk"`` or ``"dv"``)."""
        if name not in self.tensors:
            raise KeyError(f"{name!r} was not computed; the oracle holds {sorted(self.tensors)}")
        return self.tensors[name]

    @property
    def o(self) -> CertifiedTensor:
        return self.tensors["o"]

    @property
    def lse(self) -> CertifiedTensor:
        return self.tensors["lse"]

    @property
    def dq(self) -> CertifiedTensor | None:
        return self.tensors.get("dq")

    @property
    def dk(self) -> CertifiedTensor | None:
        return self.tensors.get("dk")

    @property
    def dv(self) -> CertifiedTensor | None:
        return self.tensors.get("dv")


def _empty(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    out = {f: np.zeros(shape) for f in FIELDS[:-1]}
    out["certified"] = np.ones(shape, dtype=bool)
    return out


def _merge_stats(parts: list[OracleResult]) -> dict[str, Any]:
    stats: dict[str, Any] = {"strict_evaluations": 0, "fallback_elements": 0, "seconds": 0.0}
    stats["max_prec_used"] = 0
    for res in parts:
        for key in ("strict_evaluations", "fallback_elements", "seconds"):
            stats[key] += res.stats.get(key, 0)
        stats["max_prec_used"] = max(stats["max_prec_used"], res.stats.get("max_prec_used", 0))
    stats["sequences"] = len(parts)
    return stats


def _options(fmt: Any, batch_fmt: Format) -> Format:
    target = batch_fmt if fmt is None else format_of(fmt)
    if not target.storage:
        raise ValueError(f"{target.name} has no storage format to round results into")
    return target


def _selection(given: Any, total: int, name: str, axis: str) -> np.ndarray:
    """Packed row indices (default all), checked against the packed length."""
    if given is None:
        return np.arange(total)
    idx = np.asarray(given, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= total):
        raise ValueError(
            f"{name} are packed {axis} rows and must lie in [0, {total}) ({axis}.shape[0]), "
            f"got {given!r}"
        )
    return idx


def _dense_do(do: Any, batch: VarlenBatch) -> np.ndarray:
    do_arr, do_fmt = as_exact_array(do, "do")
    if do_fmt != batch.fmt:
        raise TypeError(
            f"do has dtype {do_fmt.name} but q, k, v are {batch.fmt.name}: pass the "
            "upstream gradient in the inputs' format (a kernel's dO has O's dtype)"
        )
    want = (batch.q.shape[0], batch.q.shape[1], batch.v.shape[2])
    if do_arr.shape != want:
        raise ValueError(f"do must have O's shape {want}, got {do_arr.shape}")
    return do_arr


def varlen_oracle(
    batch: VarlenBatch,
    *,
    causal: bool = False,
    window: Any = None,
    scale: float | None = None,
    fmt: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
    do: Any = None,
    rows: Any = None,
    keys: Any = None,
) -> LayoutResult:
    """Certified ``O``, ``LSE`` (and with ``do`` the gradients) of a varlen batch, per
    sequence: sequence ``b`` is ``softmax(scale·Q_b K_bᵀ + mask_b)·V_b`` with its masks aligned
    to its own bottom-right corner. ``do``: ``dO (total_q, Hq, dv)`` in the inputs' format.
    ``rows`` (packed query rows, default all) selects the rows of ``O``, ``LSE`` and ``dQ``;
    ``keys`` (packed key rows, needs ``do``) those of ``dK`` and ``dV``, in the order given."""
    target = _options(fmt, batch.fmt)
    total_q, hq, d = batch.q.shape
    total_k, hk, dv = batch.v.shape
    do_arr = None if do is None else _dense_do(do, batch)
    if keys is not None and do_arr is None:
        raise ValueError("keys selects dK/dV rows: pass the upstream gradient do= as well")
    row_idx = _selection(rows, total_q, "rows", "q")
    key_idx = _selection(keys, total_k, "keys", "k")
    shapes = {"o": (row_idx.size, hq, dv), "lse": (hq, row_idx.size)}
    if do_arr is not None:
        shapes.update(dq=(row_idx.size, hq, d), dk=(key_idx.size, hk, d), dv=(key_idx.size, hk, dv))
    out = {name: _empty(shape) for name, shape in shapes.items()}
    parts = []
    opts = {"causal": causal, "window": window, "scale": scale, "fmt": target, "mode": mode}
    for b in range(batch.batch):
        qs, ks = batch.query_rows(b), batch.key_rows(b)
        at_q = np.flatnonzero((row_idx >= qs.start) & (row_idx < qs.stop))
        at_k = np.flatnonzero((key_idx >= ks.start) & (key_idx < ks.stop))
        extra = {}
        if do_arr is not None:
            extra["do"] = do_arr[qs].transpose(1, 0, 2)[None].astype(batch.fmt.numpy_dtype)
            extra["keys"] = key_idx[at_k] - ks.start
        res = oracle(
            *batch.sequence(b),
            prec=prec,
            max_prec=max_prec,
            rows=row_idx[at_q] - qs.start,
            **extra,
            **opts,
        )
        parts.append(res)
        for name in out:
            for f in FIELDS:
                dense = getattr(res[name], f)[0]
                if name == "lse":
                    out[name][f][:, at_q] = dense
                else:
                    out[name][f][at_k if name in ("dk", "dv") else at_q] = dense.transpose(1, 0, 2)
    tensors = {n: CertifiedTensor(**out[n]) for n in TENSORS if n in out}
    return LayoutResult("varlen", target, mode, tensors, tuple(parts), _merge_stats(parts))


def paged_oracle(
    batch: PagedBatch,
    *,
    causal: bool = False,
    window: Any = None,
    scale: float | None = None,
    fmt: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
) -> LayoutResult:
    """Certified ``O (B, Nq, Hq, dv)`` and ``LSE (B, Hq, Nq)`` of a paged batch, per sequence:
    sequence ``b`` attends to its first ``cache_seqlens[b]`` keys, gathered page by page in
    block-table order; nothing else of the cache is read."""
    target = _options(fmt, batch.fmt)
    bsz, nq, hq, _ = batch.q.shape
    dv = batch.v_cache.shape[3]
    out = {"o": _empty((bsz, nq, hq, dv)), "lse": _empty((bsz, hq, nq))}
    parts = []
    opts = {"causal": causal, "window": window, "scale": scale, "fmt": target, "mode": mode}
    for b in range(bsz):
        res = oracle(*batch.sequence(b), prec=prec, max_prec=max_prec, **opts)
        parts.append(res)
        for f in FIELDS:
            out["o"][f][b] = getattr(res.o, f)[0].transpose(1, 0, 2)
            out["lse"][f][b] = getattr(res.lse, f)[0]
    tensors = {n: CertifiedTensor(**out[n]) for n in ("o", "lse")}
    return LayoutResult("paged", target, mode, tensors, tuple(parts), _merge_stats(parts))
