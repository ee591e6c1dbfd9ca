"""Correctness of benchmarked gradients: a fast wrong backward must not score.

Every ``dQ`` row is independent of the others, so ``dQ`` is checked exactly where the forward's
output is: on the sampled query rows (:func:`flashcheck.harness.bench.check.sample_rows`) of the
first and last head of the last batch entry. The oracle runs on the sub-problem made of those
rows, all keys and an explicit mask equal to the timed problem's mask on those rows: its
``dQ`` rows are the timed problem's, at a cost of ``R·Nk·d``.

``dK_j`` and ``dV_j`` sum over every query row that keeps key ``j``, so no row sample gives
them; what is checked is a sample of keys (first, last and seeded ones) of the last head of
the last batch entry, every query row included:

- ``kv_mode = "oracle"`` (``Nq·Nk`` up to ``oracle_max_n²``): the certified gradient oracle
  (:func:`flashcheck.harness.oracle.evaluate.oracle` with ``do=`` and ``keys=``) and the
  a-priori gradient bounds of the provider's class, as for ``dQ``;
- ``kv_mode = "fp64"`` (larger problems, where the oracle and the bounds cost minutes per head
  and gigabytes, docs/bench.md): a float64 evaluation of the exact formulas on the benchmark's
  device, row chunk by row chunk. It is not certified; its error relative to the floors is of
  order ``N·2⁻⁵³``, some nine orders of magnitude below an ulp of bf16. The verdict there is
  the empirical rule only (NaN/Inf where the reference is finite: FAIL-HARD; above
  ``2 × naive + 1`` floored ulp: FAIL).

``E_naive`` (the empirical rule's baseline) for all three gradients is the error of torch
autograd through the ``naive`` provider's forward (the ``naive`` backward class) on the checked
heads, on the same device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import Format, format_of, round_to_format
from ..core.semantics import as_exact_array
from ..core.status import Status
from ..judging.gradient_bounds import gradient_bounds
from ..judging.roundoff import TensorBounds
from ..judging.verdict import gradient_errors, judge_gradients
from ..oracle.evaluate import oracle
from ..oracle.tensor import CertifiedTensor
from .check import sample_rows
from .providers import PROVIDERS

__all__ = [
    "ORACLE_MAX_N",
    "SAMPLE_KEYS",
    "Float64KeyGradients",
    "GradReference",
    "fp64_key_gradients",
    "grad_reference",
    "judge_grads",
    "sampled_grads",
]

SAMPLE_KEYS = 12
# dK/dV with the certified oracle and bounds up to Nq = Nk = 1024: their cost grows as N² per
# head, and at 4096 one head already takes minutes and gigabytes on the CPU
# (benchmarks/bench_grad_check_cost.py; docs/bench.md has its figures).
ORACLE_MAX_N = 1024
_FP64_CHUNK = 2048  # query rows per float64 work matrix


def _heads(h: int) -> list[int]:
    return [0] if h == 1 else [0, h - 1]


def _host(x: Any) -> np.ndarray:
    """A host copy in the tensor's own format (bf16 as ``ml_dtypes.bfloat16``)."""
    import ml_dtypes
    import torch

    t = x.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@dataclass
class Float64KeyGradients:
    """dK, dV of sampled keys in float64 with their floors, shaped like the oracle's
    ``(1, 1, K, d)`` tensors (``lo`` is zero: a plain float64 value; no certified error,
    ``err = inf``; ``rounded`` is the float64 value rounded, ``certified`` False)."""

    fmt: Format
    keys: np.ndarray
    dk: CertifiedTensor
    dv: CertifiedTensor

    def __getitem__(self, name: str) -> CertifiedTensor:
        return {"dk": self.dk, "dv": self.dv}[name]


def fp64_key_gradients(
    q: Any,
    k: Any,
    v: Any,
    do: Any,
    *,
    causal: bool,
    keys: np.ndarray,
    chunk: int = _FP64_CHUNK,
    softcap: float | None = None,
    sink: float | None = None,
) -> Float64KeyGradients:
    """Float64 ``dK``, ``dV`` of ``keys`` for one head (torch tensors ``(N, d)``, any device).

    With ``P`` the float64 softmax of ``t = τ·QKᵀ`` (causal: bottom-right aligned),
    ``dP = dO·Vᵀ``, ``D_i = Σ_c dO_ic·O_ic`` and ``dS = P∘(dP − D)``:
    ``dK_j = τ·Σ_i dS_ij·q_i``, ``dV_j = Σ_i P_ij·dO_i``; the floors are the oracle's
    ``τ·Σ_i P_ij(|dP_ij| + |D_i|)|q_i|`` and ``Σ_i P_ij|dO_i|``. With ``softcap = c`` the
    scores are ``t = c·tanh(s/c)`` and ``dS`` (and its floor) gains the factor
    ``1 − tanh²(s/c)``; a ``sink`` logit σ joins each row's denominator with no value row.
    Rows are processed ``chunk`` at a time, so memory is ``chunk·Nk`` doubles.
    """
    import torch

    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    fmt = format_of(q.dtype)
    qd, kd, vd, dod = (x.detach().double() for x in (q, k, v, do))
    nq, d = qd.shape
    nk = kd.shape[0]
    tau = 1.0 / math.sqrt(d)
    idx = torch.as_tensor(np.asarray(keys, np.int64), device=qd.device)
    out = {
        n: torch.zeros(idx.numel(), x.shape[1], dtype=torch.float64, device=qd.device)
        for n, x in (("dk", kd), ("dv", vd), ("fk", kd), ("fv", vd))
    }
    cols = torch.arange(nk, device=qd.device)
    for r0 in range(0, nq, chunk):
        r1 = min(nq, r0 + chunk)
        s = (qd[r0:r1] @ kd.T) * tau
        slope = torch.ones_like(s)
        if softcap:
            th = torch.tanh(s / softcap)
            s, slope = softcap * th, 1.0 - th * th
        if causal:
            rows = torch.arange(r0, r1, device=qd.device)
            s = s.masked_fill(cols[None, :] > rows[:, None] + (nk - nq), float("-inf"))
        if sink is None:
            p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # a row that keeps no key: P = 0
        else:
            col = torch.full((r1 - r0, 1), float(sink), dtype=s.dtype, device=s.device)
            p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[:, :-1]
        o = p @ vd
        dp = dod[r0:r1] @ vd.T
        dsum = (dod[r0:r1] * o).sum(-1, keepdim=True)
        pk = p[:, idx] * slope[:, idx]
        dsk = pk * (dp[:, idx] - dsum)
        out["dk"] += tau * (dsk.T @ qd[r0:r1])
        out["dv"] += p[:, idx].T @ dod[r0:r1]
        out["fk"] += tau * ((pk * (dp[:, idx].abs() + dsum.abs())).T @ qd[r0:r1].abs())
        out["fv"] += p[:, idx].T @ dod[r0:r1].abs()
    host = {n: t.cpu().numpy()[None, None] for n, t in out.items()}

    def tensor(hi: np.ndarray, floor: np.ndarray) -> CertifiedTensor:
        zero = np.zeros_like(hi)
        rounded = round_to_format(hi, fmt)
        return CertifiedTensor(hi, zero, zero + np.inf, floor, rounded, np.zeros(hi.shape, bool))

    return Float64KeyGradients(
        fmt, np.asarray(keys), tensor(host["dk"], host["fk"]), tensor(host["dv"], host["fv"])
    )


def sampled_grads(
    dq: Any, dk: Any, dv: Any, rows: np.ndarray, keys: np.ndarray
) -> dict[str, np.ndarray]:
    """The elements :class:`GradReference` checks, from full ``(B, H, N, d)`` gradients: dQ on
    ``rows`` of the first and last head, dK and dV on ``keys`` of the last head, of the last
    batch entry; float64 host copies shaped like the oracle's fields."""
    b, h = dq.shape[0] - 1, dq.shape[1] - 1
    hs = _heads(dq.shape[1])

    def pick(x, heads, idx):
        return as_exact_array(x[b : b + 1, heads][:, :, idx.tolist()], "grad")[0]

    return {"dq": pick(dq, hs, rows), "dk": pick(dk, [h], keys), "dv": pick(dv, [h], keys)}


def _naive_grads(q, k, v, do, causal, rows, keys, softcap=None, sinks=None) -> dict:
    """Gradients of torch autograd through the ``naive`` provider, on the checked heads only
    (one head at a time: each materializes its ``N × N`` scores); with softmax options,
    through :func:`flashcheck.kernels.naive.naive_torch`, the same-precision baseline that
    takes them."""
    import torch

    from ...kernels.naive import naive_torch

    b, hs = q.shape[0] - 1, _heads(q.shape[1])
    dqs = []
    for h in hs:
        qh, kh, vh = (
            x[b : b + 1, h : h + 1].detach().clone().requires_grad_(True) for x in (q, k, v)
        )
        if softcap or sinks is not None:
            sk = None if sinks is None else sinks[h : h + 1].detach()
            o = naive_torch(qh, kh, vh, causal=causal, softcap=softcap, sinks=sk)[0]
        else:
            o = PROVIDERS["naive"].make(qh, kh, vh, causal)(qh, kh, vh)
        gq, gk, gv = torch.autograd.grad(o, (qh, kh, vh), do[b : b + 1, h : h + 1])
        dqs.append(as_exact_array(gq[:, :, rows.tolist()], "dq")[0])
        if h == hs[-1]:
            dk = as_exact_array(gk[:, :, keys.tolist()], "dk")[0]
            dvv = as_exact_array(gv[:, :, keys.tolist()], "dv")[0]
        del o, gq, gk, gv
    return {"dq": np.concatenate(dqs, axis=1), "dk": dk, "dv": dvv}


@dataclass
class GradReference:
    """The exact gradients, the naive backward's errors and the inputs of one configuration's
    sample; :meth:`bounds` gives a class's bounds on the same elements."""

    rows: np.ndarray
    keys: np.ndarray
    causal: bool
    kv_mode: str  # "oracle" (certified) or "fp64" (float64 reference, empirical rule only)
    dq_ref: Any
    kv_ref: Any
    naive: dict[str, float]
    dq_inputs: tuple
    kv_inputs: tuple | None
    seconds: float = 0.0
    softcap: float | None = None
    sinks: np.ndarray | None = None  # the logits of the checked heads (first, last)
    _bounds: dict[tuple, dict[str, tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)

    def bounds(
        self, arithmetic: str, tanh: str = "accurate"
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{grad: (deterministic, probabilistic)}`` for the checked elements of
        ``arithmetic`` and the soft-cap's ``tanh`` (dK, dV absent in ``fp64`` mode), cached."""
        if (arithmetic, tanh) not in self._bounds:
            qs, ks, vs, dos, keep = self.dq_inputs
            opts = {"softcap": self.softcap, "tanh": tanh}
            bq = gradient_bounds(
                qs, ks, vs, dos, arithmetic=arithmetic, mask=keep, sinks=self.sinks, **opts
            )
            out = {"dq": (bq.dq.det, bq.dq.prob)}
            if self.kv_inputs is not None:
                last = None if self.sinks is None else self.sinks[-1:]
                bk = gradient_bounds(
                    *self.kv_inputs, arithmetic=arithmetic, causal=self.causal, sinks=last, **opts
                )
                for g in ("dk", "dv"):
                    det, prob = bk[g].det, bk[g].prob
                    out[g] = (det[:, :, self.keys], prob[:, :, self.keys])
            self._bounds[(arithmetic, tanh)] = out
        return self._bounds[(arithmetic, tanh)]


def grad_reference(
    q: Any,
    k: Any,
    v: Any,
    do: Any,
    *,
    causal: bool,
    rows: np.ndarray,
    keys: np.ndarray | None = None,
    oracle_max_n: int = ORACLE_MAX_N,
    seed: int = 0,
    softcap: float | None = None,
    sinks: Any = None,
) -> GradReference:
    """The reference for the elements :func:`sampled_grads` picks from ``(B, H, N, d)`` torch
    tensors ``q, k, v, do`` (one device): see the module docstring for what is exact where.
    ``softcap`` and ``sinks`` (one logit per query head, all heads) as the kernel was given."""
    import time

    from ...kernels.recurrence import keep_mask

    if oracle_max_n < 0:
        raise ValueError(
            f"oracle_max_n must be >= 0 (0: never the oracle for dK/dV), got {oracle_max_n}"
        )
    t0 = time.perf_counter()
    nq, nk = q.shape[2], k.shape[2]
    keys = sample_rows(nk, SAMPLE_KEYS, seed=seed + 1) if keys is None else np.asarray(keys)
    b, hs, hl = q.shape[0] - 1, _heads(q.shape[1]), q.shape[1] - 1
    # dQ: the sub-problem of the sampled rows, the timed problem's mask made explicit.
    keep = keep_mask(nq, nk, rows, np.arange(nk), causal, None, None)[None, None]
    qs, dos = (_host(x[b : b + 1, hs])[:, :, rows] for x in (q, do))
    ks, vs = (_host(x[b : b + 1, hs]) for x in (k, v))
    # keys=[]: the sub-problem's own dK/dV (partial sums over the sampled rows) are not wanted,
    # and certifying them would send much of them to the strict path.
    sk = None if sinks is None else np.asarray(_host(sinks), np.float32)[hs]
    last = None if sk is None else sk[-1:]
    dq_ref = oracle(qs, ks, vs, mask=keep, do=dos, keys=np.arange(0), softcap=softcap, sinks=sk)
    # dK, dV of the sampled keys of the last head: every query row.
    one = tuple(x[b : b + 1, hl : hl + 1] for x in (q, k, v, do))
    if max(nq, nk) <= oracle_max_n:
        kv_inputs = tuple(_host(x) for x in one)
        kv_ref = oracle(
            *kv_inputs[:3],
            causal=causal,
            do=kv_inputs[3],
            rows=rows[:1],
            keys=keys,
            softcap=softcap,
            sinks=last,
        )
        mode = "oracle"
    else:
        kv_inputs = None
        kv_ref = fp64_key_gradients(
            *(x[0, 0] for x in one),
            causal=causal,
            keys=keys,
            softcap=softcap,
            sink=None if last is None else float(last[0]),
        )
        mode = "fp64"
    naive_g = _naive_grads(q, k, v, do, causal, rows, keys, softcap, sinks)
    naive = gradient_errors({"dq": naive_g["dq"]}, dq_ref)
    naive.update(gradient_errors({g: naive_g[g] for g in ("dk", "dv")}, kv_ref))
    return GradReference(
        rows,
        keys,
        causal,
        mode,
        dq_ref,
        kv_ref,
        naive,
        (qs, ks, vs, dos, keep),
        kv_inputs,
        seconds=time.perf_counter() - t0,
        softcap=softcap,
        sinks=sk,
    )


def judge_grads(
    grads: dict[str, np.ndarray], ref: GradReference, arithmetic: str, tanh: str = "accurate"
) -> dict:
    """Verdict of one provider's sampled gradients (from :func:`sampled_grads`): the worst of
    dQ, dK, dV, with each one's max floored ulp, naive ulp and bound utilization (``tanh``: the
    soft-cap's, as the provider declares it)."""
    bounds = ref.bounds(arithmetic, tanh)
    per: dict[str, Any] = {}
    for g in ("dq", "dk", "dv"):
        base = ref.dq_ref if g == "dq" else ref.kv_ref
        b = bounds.get(g)
        shim = None if b is None else {g: TensorBounds(b[0], b[1])}
        per[g] = judge_gradients({g: grads[g]}, base, shim, naive={g: ref.naive[g]})[g]
    verdict = Status.worst(x.verdict for x in per.values())
    return {
        "verdict": verdict,
        "reasons": [r for x in per.values() for r in x.reasons],
        "max_ulp": {g: x.max_ulp for g, x in per.items()},
        "naive_ulp": {g: x.naive_ulp for g, x in per.items()},
        "det_util": {g: x.det_util for g, x in per.items()},
        "rows": int(ref.rows.size),
        "keys": int(ref.keys.size),
        "kv_mode": ref.kv_mode,
    }
