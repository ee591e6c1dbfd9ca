"""The oracle of the split-KV merge (``op="combine"``): exact, certified, correctly rounded.

A kernel that splits the keys of a row into ``S`` chunks computes, per chunk ``s``, a partial
output ``o_s`` (normalized within the chunk) and its log-sum-exp ``lse_s``, then merges them::

    LSE = log Σ_s exp(lse_s),        O_c = Σ_s exp(lse_s − LSE) · o_sc

over the splits with ``lse_s > −inf``: a split whose ``lse`` is ``−inf`` holds no key and
contributes nothing (its ``o`` is not read). A row whose splits are all ``−inf`` gives
``O = 0`` and ``LSE = −inf``. The partials are taken as exact binary values.

Non-finite partials: an ``lse_s`` that is NaN or ``+inf`` makes the row's ``O`` and ``LSE``
NaN; a non-finite ``o_sc`` of a contributing split makes ``O_c`` NaN.

The merge is an attention problem: one query ``q = 1`` (``d = 1``, ``scale = 1``) over ``S``
keys ``k_s = lse_s`` with values ``o_s``, the empty splits masked out. Its scores are the
``lse_s`` exactly, so its softmax weights are ``exp(lse_s − LSE)`` and its outputs are the
merge's ``O`` and ``LSE``. The merge is therefore certified by the dense oracle itself (fast
mode with the strict fallback, or strict), floors included: ``Σ_s p_s |o_sc|`` for ``O_c`` and
``Σ_s p_s |lse_s|`` for LSE, with ``p_s = exp(lse_s − LSE)``; its NaN rule is the one above.
Partials in fp16 or bf16 enter as the fp32 values they exactly are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import FP32, Format, format_of
from ..core.semantics import as_exact_array, make_problem
from .evaluate import problem_oracle
from .tensor import FIELDS, CertifiedTensor

__all__ = ["CombineResult", "combine_oracle"]


@dataclass
class CombineResult:
    """The merged ``o`` ``(..., dv)`` and ``lse`` ``(...)``, each a :class:`CertifiedTensor`
    (the partials' shapes without the split axis), rounded into ``fmt``."""

    fmt: Format
    mode: str
    tensors: dict[str, CertifiedTensor]
    stats: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> CertifiedTensor:
        """The tensor ``name`` (``"o"`` or ``"lse"``)."""
        if name not in self.tensors:
            raise KeyError(f"{name!r} was not computed; the oracle holds {sorted(self.tensors)}")
        return self.tensors[name]

    @property
    def o(self) -> CertifiedTensor:
        return self.tensors["o"]

    @property
    def lse(self) -> CertifiedTensor:
        return self.tensors["lse"]


def _check(out_partial: Any, lse_partial: Any) -> tuple[np.ndarray, np.ndarray, Format]:
    o, fmt = as_exact_array(out_partial, "out_partial")
    lse, _ = as_exact_array(lse_partial, "lse_partial")
    if o.ndim < 2 or o.shape[0] < 1:
        raise ValueError(
            f"out_partial must be (S, ..., dv) with S >= 1 splits, got shape {o.shape}"
        )
    if lse.shape != o.shape[:-1]:
        raise ValueError(
            f"lse_partial must be (S, ...) = {o.shape[:-1]}, out_partial's shape without its "
            f"last axis, got {lse.shape}"
        )
    return o, lse, fmt


def combine_oracle(
    out_partial: Any,
    lse_partial: Any,
    *,
    fmt: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
) -> CombineResult:
    """The exact merge of split-KV partials (module docstring), certified per element.

    Args:
        out_partial: ``(S, ..., dv)`` partial outputs, fp32 (or fp16/bf16), numpy or torch.
        lse_partial: ``(S, ...)`` their natural-log LSE, ``−inf`` for an empty split.
        fmt: format of the correctly rounded results (default: ``out_partial``'s).
        mode, prec, max_prec: as for the dense oracle (``"fast"`` or ``"strict"``; the strict
            path's starting and largest working precision in bits).
    """
    o_all, lse_all, in_fmt = _check(out_partial, lse_partial)
    target_fmt = in_fmt if fmt is None else format_of(fmt)
    n_split, dv = o_all.shape[0], o_all.shape[-1]
    lead = o_all.shape[1:-1]
    n_rows = int(np.prod(lead, dtype=np.int64))
    # Row r is batch entry r of a one-query, one-head problem with S keys of width 1.
    scores = lse_all.reshape(n_split, n_rows).T
    values = o_all.reshape(n_split, n_rows, dv).transpose(1, 0, 2)
    keep = ~np.isneginf(scores)
    f32 = FP32.numpy_dtype
    problem = make_problem(
        np.ones((n_rows, 1, 1, 1), dtype=f32),
        np.where(keep, scores, 0.0).astype(f32)[:, None, :, None],
        values.astype(f32)[:, None],
        scale=1.0,
        mask=keep[:, None, None, :],
    )
    res = problem_oracle(problem, fmt=target_fmt, mode=mode, prec=prec, max_prec=max_prec)
    tensors = {
        "o": CertifiedTensor(**{f: getattr(res.o, f).reshape(*lead, dv) for f in FIELDS}),
        "lse": CertifiedTensor(**{f: getattr(res.lse, f).reshape(lead) for f in FIELDS}),
    }
    return CombineResult(res.fmt, mode, tensors, res.stats)
