"""``flashcheck.oracle``: one entry point for every layout and for the split-KV merge.

- ``oracle(q, k, v, ...)``: dense ``(B, H, N, d)`` inputs
  (:func:`flashcheck.harness.oracle.evaluate.oracle`, unchanged);
- ``oracle(q, k, v, cu_seqlens_q=..., cu_seqlens_k=..., ...)``: a varlen batch;
- ``oracle(q, k_cache, v_cache, block_table=..., cache_seqlens=..., ...)``: a paged batch
  (:mod:`flashcheck.harness.oracle.layouts`);
- ``oracle(out_partial, lse_partial, op="combine")``: the merge of split-KV partials
  (:mod:`flashcheck.harness.oracle.combine`).
"""

from __future__ import annotations

from typing import Any

from ..core.layouts import paged_batch, varlen_batch
from .combine import CombineResult, combine_oracle
from .evaluate import OracleResult
from .evaluate import oracle as dense_oracle
from .layouts import LayoutResult, paged_oracle, varlen_oracle

__all__ = ["OPS", "oracle"]

OPS = ("attention", "combine")


def _refuse(what: str, given: dict[str, Any], fix: str) -> None:
    extra = sorted(name for name, val in given.items() if val is not None)
    if extra:
        raise ValueError(f"{what} takes no {', '.join(extra)}: {fix}")


def oracle(
    *tensors: Any,
    op: str = "attention",
    cu_seqlens_q: Any = None,
    cu_seqlens_k: Any = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    block_table: Any = None,
    cache_seqlens: Any = None,
    causal: bool = False,
    window: Any = None,
    mask: Any = None,
    scale: float | None = None,
    fmt: Any = None,
    rows: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
    do: Any = None,
    keys: Any = None,
    softcap: float | None = None,
    sinks: Any = None,
    descale_q: Any = None,
    descale_k: Any = None,
    descale_v: Any = None,
) -> OracleResult | LayoutResult | CombineResult:
    """The exact attention (or split-KV merge) of the given inputs, certified, in their layout.

    The layout follows from the keywords given: ``cu_seqlens_q``/``cu_seqlens_k`` (varlen),
    ``block_table``/``cache_seqlens`` (paged), neither (dense). Each sequence of a ragged batch
    is certified exactly as the dense problem it is (docs/oracle.md, "Ragged batches"); the
    answer is a :class:`LayoutResult` with ``O`` and ``LSE`` in the layout's own shapes. With
    ``op="combine"`` the two tensors are ``out_partial (S, ..., dv)`` and
    ``lse_partial (S, ...)``; the answer is a :class:`CombineResult`. The dense options
    (causal, window, mask, scale, fmt, rows, mode, prec, max_prec, do, keys, softcap, sinks,
    and the FP8 descales descale_q, descale_k, descale_v) are those of
    :func:`flashcheck.harness.oracle.evaluate.oracle`; the ragged layouts take all but ``mask``,
    ``softcap``, ``sinks`` and the descales (``rows`` and ``keys`` name packed rows of a varlen
    batch; paged batches take neither, nor ``do``).

    Longer than 80 lines: the signature names the options of every layout, and the body
    refuses, with a fix, each option that a layout does not take.
    """
    varlen = {"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k}
    varlen_sizes = {"max_seqlen_q": max_seqlen_q, "max_seqlen_k": max_seqlen_k}
    descales = {"descale_q": descale_q, "descale_k": descale_k, "descale_v": descale_v}
    paged = {"block_table": block_table, "cache_seqlens": cache_seqlens}
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if op == "combine":
        if len(tensors) != 2:
            raise TypeError(
                f"op='combine' takes two tensors, out_partial (S, ..., dv) and lse_partial "
                f"(S, ...), got {len(tensors)}"
            )
        attention = {"causal": causal or None, "window": window, "mask": mask, "scale": scale}
        attention.update(softcap=softcap, sinks=sinks, **descales)
        attention.update(rows=rows, do=do, keys=keys, **varlen, **varlen_sizes, **paged)
        _refuse("op='combine'", attention, "the merge takes only fmt, mode, prec and max_prec")
        return combine_oracle(*tensors, fmt=fmt, mode=mode, prec=prec, max_prec=max_prec)
    if len(tensors) != 3:
        raise TypeError(f"the oracle takes three tensors (q, k, v), got {len(tensors)}")
    is_varlen = any(x is not None for x in (*varlen.values(), *varlen_sizes.values()))
    is_paged = any(x is not None for x in paged.values())
    if is_varlen and is_paged:
        raise ValueError(
            "pass either cu_seqlens_q/cu_seqlens_k (varlen) or block_table/cache_seqlens "
            "(paged), not both"
        )
    opts = {"causal": causal, "window": window, "scale": scale, "fmt": fmt, "mode": mode}
    opts.update(prec=prec, max_prec=max_prec)
    if is_varlen:
        if any(x is None for x in varlen.values()):
            raise ValueError("a varlen batch needs both cu_seqlens_q and cu_seqlens_k")
        _refuse(
            "a varlen batch",
            {"mask": mask, "softcap": softcap, "sinks": sinks, **descales},
            _RAGGED_FIX,
        )
        batch = varlen_batch(*tensors, **varlen, **varlen_sizes)
        return varlen_oracle(batch, do=do, rows=rows, keys=keys, **opts)
    if is_paged:
        if any(x is None for x in paged.values()):
            raise ValueError("a paged batch needs both block_table and cache_seqlens")
        _refuse(
            "a paged batch",
            {
                "mask": mask,
                "rows": rows,
                "keys": keys,
                "do": do,
                "softcap": softcap,
                "sinks": sinks,
                **descales,
            },
            _RAGGED_FIX + " (paged gradients are not offered: decode kernels have no backward)",
        )
        return paged_oracle(paged_batch(*tensors, **paged), **opts)
    opts.update(softcap=softcap, sinks=sinks, **descales)
    return dense_oracle(*tensors, mask=mask, rows=rows, do=do, keys=keys, **opts)


_RAGGED_FIX = (
    "ragged batches take causal/window masks (and a paged batch every row); for an explicit "
    "mask, soft-capping, sinks or a row sample of a paged batch, call the oracle on the "
    "sequence as a dense problem"
)
