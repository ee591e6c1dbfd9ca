"""Correctness of benchmarked outputs: a fast wrong kernel must not score.

For each benchmarked configuration the exact answer is computed once, on a sample of rows of
two heads (the first and the last) of the last batch entry — the entries a wrong stride or
offset reaches last — by the mpmath oracle (:func:`flashcheck.harness.oracle.evaluate.oracle`).
Every provider's output on the same inputs is then judged like any report result
(:func:`flashcheck.harness.judging.verdict.judge`): against the a-priori bounds of its arithmetic
class where it has one, and against
``2 × naive + 1 ulp``, where naive is the same-precision numpy baseline on the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.semantics import as_exact_array
from ..judging.bounds import Bounds, error_bounds
from ..judging.verdict import judge, naive_error
from ..oracle.evaluate import OracleResult, oracle

__all__ = ["Reference", "judge_rows", "reference", "sample_rows", "sampled_output"]

SAMPLE_ROWS = 12


def sample_rows(n: int, count: int = SAMPLE_ROWS, *, seed: int = 0) -> np.ndarray:
    """``count`` query rows of ``n``: the first, the last and a seeded spread in between."""
    if n < 1 or count < 1:
        raise ValueError(f"n and count must be >= 1, got n={n}, count={count}")
    if n <= count:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    inner = rng.choice(np.arange(1, n - 1), size=count - 2, replace=False)
    return np.unique(np.concatenate([[0, n - 1], inner]))


def _heads(h: int) -> list[int]:
    return [0] if h == 1 else [0, h - 1]


def sampled_output(o: Any, rows: np.ndarray) -> np.ndarray:
    """The rows and heads :func:`reference` checks, from a full ``(B, H, N, dv)`` output."""
    b = o.shape[0] - 1
    hs = _heads(o.shape[1])
    return as_exact_array(o[b : b + 1, hs][:, :, rows.tolist()], "o")[0].astype(np.float64)


def _host(x: Any) -> np.ndarray:
    """A host numpy copy in the tensor's own format (bf16 as ``ml_dtypes.bfloat16``)."""
    if isinstance(x, np.ndarray):
        return x
    import ml_dtypes
    import torch

    t = x.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@dataclass
class Reference:
    """The oracle, the naive baseline's error and the inputs of one configuration's sample
    (``softcap``, ``sinks``: the softmax options it was computed with; ``sinks`` the logits of
    the sampled heads)."""

    rows: np.ndarray
    causal: bool
    ref: OracleResult
    naive_ulp: float
    inputs: tuple[Any, Any, Any]
    softcap: float | None = None
    sinks: np.ndarray | None = None
    _bounds: dict[tuple[str, str], Bounds] = field(default_factory=dict)

    def bounds(self, arithmetic: str, tanh: str = "accurate") -> Bounds:
        """Bounds of ``arithmetic`` on the sample (``"unknown"``: the loosest class at or above
        the input format's precision, as in the error report), with the soft-cap's ``tanh``,
        cached."""
        if (arithmetic, tanh) not in self._bounds:
            q, k, v = self.inputs
            self._bounds[(arithmetic, tanh)] = error_bounds(
                q,
                k,
                v,
                arithmetic=arithmetic,
                causal=self.causal,
                rows=self.rows,
                softcap=self.softcap,
                sinks=self.sinks,
                tanh=tanh,
            )
        return self._bounds[(arithmetic, tanh)]


def reference(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool,
    rows: np.ndarray,
    softcap: float | None = None,
    sinks: Any = None,
) -> Reference:
    """Oracle and same-precision naive error on ``rows`` of :func:`sampled_output`'s heads;
    ``softcap`` and ``sinks`` (one logit per query head, all heads) as the kernel was given."""
    from ...kernels.naive import naive_numpy
    from ...kernels.recurrence import keep_mask

    b = q.shape[0] - 1
    hs = _heads(q.shape[1])
    qs, ks, vs = (_host(x[b : b + 1, hs]) for x in (q, k, v))
    sk = None if sinks is None else np.asarray(_host(sinks), np.float32)[hs]
    ref = oracle(qs, ks, vs, causal=causal, rows=rows, softcap=softcap, sinks=sk)
    nq, nk = qs.shape[2], ks.shape[2]
    keep = keep_mask(nq, nk, rows, np.arange(nk), causal, None, None)
    o_naive, _ = naive_numpy(
        qs[:, :, rows], ks, vs, mask=keep[None, None], softcap=softcap, sinks=sk
    )
    naive = naive_error(o_naive.astype(np.float64), ref)
    return Reference(rows, causal, ref, naive, (qs, ks, vs), softcap, sk)


def judge_rows(
    o_rows: np.ndarray, ref: Reference, arithmetic: str, tanh: str = "accurate"
) -> dict[str, Any]:
    """Verdict of one provider's sampled output: status, max floored ulp, naive ulp, bound use
    (``tanh``: the soft-cap's, as the provider declares it)."""
    v = judge(o_rows, None, ref.ref, ref.bounds(arithmetic, tanh), naive_ulp=ref.naive_ulp)
    return {
        "verdict": v.verdict,
        "max_ulp": v.max_ulp,
        "naive_ulp": ref.naive_ulp,
        "det_util": v.det_util,
        "reasons": list(v.reasons),
        "rows": int(ref.rows.size),
    }
