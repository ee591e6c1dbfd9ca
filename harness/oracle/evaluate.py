"""The mpmath oracle: attention outputs to ≥ 100 bits, with certified error bounds.

``oracle(q, k, v, ...)`` evaluates the attention of :mod:`flashcheck.harness.core.semantics` and
returns, for
every requested output element ``O[b, h, i, c]`` and ``LSE[b, h, i]``:

- the value as a double-double ``hi + lo``;
- ``err``: a certified bound on ``|hi + lo − exact|``;
- the floor scale ``W_c = Σ_j p_j |v_jc|`` (for LSE: ``Σ_j p_j |s_j|``), to ~1e-12 relative;
- ``rounded``: the exact value correctly rounded (nearest-even) into the target format;
- ``certified``: the bound is within ``2^−100 · W`` (or far below the format's smallest
  subnormal) and decides the rounding.

Two modes that must agree (tests check that they do):

``strict``
    Every operation in mpmath interval arithmetic (``mpmath.iv``) at working precision
    ``prec``: the interval is the certificate. Score dot products are formed as exact Python
    integers first. Elements that miss the accuracy target, or whose interval straddles a
    rounding boundary of the target format, are recomputed at doubled precision up to
    ``max_prec`` (Ziv's strategy). A value exactly on a rounding boundary (e.g. the mean of two
    neighbouring fp16 values) is decided only when its interval is a single point (an exact
    evaluation); otherwise it keeps ``certified = False`` and ``rounded`` applies ties-to-even to
    the best estimate.

``fast``
    Exact scores from exact float64 slice products (see :mod:`flashcheck.harness.oracle.exact`:
    products of two fp16/bf16/fp32 values have ≤ 48 significant bits and fit a double), a
    double-double
    softmax with per-element certified bounds, ``P·V`` and the row sums by slice products again,
    mpmath for ``1/l`` and ``log l`` per row. Every element that is not certified is recomputed
    by the strict path (the Ziv-style fallback), so both modes certify the same contract.

``docs/oracle.md`` gives the derivation of every bound used here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.formats import BF16, Format, format_of
from ..core.semantics import AttentionProblem, as_exact_array, make_problem, nan_rows_and_cols
from .backward import GRADIENTS, fast_group
from .backward_strict import strict_group
from .common import ACCURACY_BITS, MIN_PREC, Scale, decide, finite_or_zero, scale_of, target
from .fast import fast_rows
from .options import options_forward
from .options_backward import gradient_nan, options_gradients
from .strict import strict_fill
from .tensor import FIELDS, CertifiedTensor

__all__ = [
    "ACCURACY_BITS",
    "TENSORS",
    "CertifiedTensor",
    "OracleResult",
    "oracle",
    "problem_oracle",
]


TENSORS = ("o", "lse", "dq", "dk", "dv", "dsinks")


@dataclass
class OracleResult:
    """The oracle's answer: one :class:`CertifiedTensor` per output, for the requested rows.

    ``o`` ``(B, Hq, R, dv)`` and ``lse`` ``(B, Hq, R)`` for the rows ``rows``; with ``do``
    given, also the gradients ``dq`` ``(B, Hq, R, d)`` for the same rows, ``dk``
    ``(B, Hk, K, d)``, ``dv`` ``(B, Hk, K, dv)`` for the keys ``keys`` and with sinks ``dsinks``
    ``(Hq,)`` (without ``do``: ``None``). ``tensors`` maps each computed output's name to its
    tensor; ``fmt`` is the format ``rounded`` is in.
    """

    fmt: Format
    rows: np.ndarray
    mode: str
    tensors: dict[str, CertifiedTensor]
    stats: dict[str, Any] = field(default_factory=dict)
    keys: np.ndarray | None = None

    def __post_init__(self) -> None:
        unknown = set(self.tensors) - set(TENSORS)
        if unknown or not {"o", "lse"} <= set(self.tensors):
            raise ValueError(
                f"an OracleResult holds o, lse and maybe dq, dk, dv, not {sorted(self.tensors)}"
            )

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

    @property
    def dsinks(self) -> CertifiedTensor | None:  # dσ (Hq,), with do and sinks given
        return self.tensors.get("dsinks")


# ---------------------------------------------------------------------------------------------
# Public entry point


def oracle(
    q: Any,
    k: Any,
    v: Any,
    *,
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
) -> OracleResult:
    """Attention ``O = softmax(scale·QKᵀ + mask)·V`` and ``LSE`` to ≥ 100 bits, certified.

    Args:
        q, k, v: ``(B, Hq, Nq, d)``, ``(B, Hk, Nk, d)``, ``(B, Hk, Nk, dv)`` numpy arrays or torch
            tensors (any device) of one format: float16, bfloat16 or float32, or FP8
            (float8_e4m3fn, float8_e5m2) with the descales below. Their values are taken as
            exact.
        causal, window, mask: masking as in :mod:`flashcheck.harness.core.semantics` (bottom-right
        aligned). scale: the float the kernel is given; ``None`` means the exact real ``1/sqrt(d)``.
        fmt: format of the correctly rounded results (default: the input format; bf16 for
            FP8 inputs).
        rows: query rows to evaluate (rows are independent); default all ``Nq`` rows.
        mode: ``"fast"`` or ``"strict"`` (see the module docstring).
        prec: starting working precision of the strict path, in bits (≥ 110).
        max_prec: the precision at which Ziv escalation stops.
        do: the upstream gradient ``dO`` ``(B, Hq, Nq, dv)`` in the inputs' format: also return
            the exact ``dQ``, ``dK``, ``dV`` of ``Σ dO ∘ O`` (LSE has no upstream
            gradient). ``dQ`` rows are independent (``rows`` applies); every ``dK``/``dV``
            element needs every query row, but key rows are independent: ``keys`` selects them.
        keys: key rows whose ``dK``, ``dV`` are wanted (default all ``Nk``; needs ``do``).
        softcap, sinks: the softmax options of :func:`~flashcheck.harness.core.semantics.
            check_softcap_sinks`; with ``do`` and sinks, also ``dsinks`` (:mod:`.options`).
        descale_q, descale_k, descale_v: for FP8 inputs, fp32 ``(B, Hk)`` factors (default 1):
            the exact input is the FP8 value times its descale (:mod:`flashcheck.harness.core.
            fp8`). The answer is exact for those products. FP8 takes no ``do``.

    Returns:
        :class:`OracleResult` with arrays of shape ``(B, Hq, R, dv)`` (O) and ``(B, Hq, R)`` (LSE),
        and with ``do`` the gradients (see :class:`OracleResult`).
    """
    problem = make_problem(
        q,
        k,
        v,
        causal=causal,
        window=window,
        mask=mask,
        scale=scale,
        softcap=softcap,
        sinks=sinks,
        descale_q=descale_q,
        descale_k=descale_k,
        descale_v=descale_v,
    )
    return problem_oracle(
        problem, fmt=fmt, rows=rows, mode=mode, prec=prec, max_prec=max_prec, do=do, keys=keys
    )


def problem_oracle(
    problem: AttentionProblem,
    *,
    fmt: Any = None,
    rows: Any = None,
    mode: str = "fast",
    prec: int = 128,
    max_prec: int = 4096,
    do: Any = None,
    keys: Any = None,
) -> OracleResult:
    """:func:`oracle` of an already validated problem (a case's ``problem``): the same answer."""
    if mode not in ("fast", "strict"):
        raise ValueError(f"mode must be 'fast' or 'strict', got {mode!r}")
    if not isinstance(prec, int) or prec < MIN_PREC:
        raise ValueError(
            f"prec={prec!r} bits cannot deliver the oracle's {ACCURACY_BITS}-bit accuracy; "
            f"use prec >= {MIN_PREC} (default 128)"
        )
    if not isinstance(max_prec, int) or max_prec < prec:
        raise ValueError(f"max_prec ({max_prec!r}) must be an int >= prec ({prec})")
    default_fmt = BF16 if problem.fp8 is not None else problem.fmt  # FA3's FP8 output: bf16
    target_fmt = default_fmt if fmt is None else format_of(fmt)
    if not target_fmt.storage:
        raise ValueError(f"{target_fmt.name} has no storage format to round results into")
    bsz, hq, _, nq, _, _, dv = problem.shape
    if rows is None:
        row_idx = np.arange(nq)
    else:
        row_idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if row_idx.size and (row_idx.min() < 0 or row_idx.max() >= nq):
            raise ValueError(f"rows must lie in [0, {nq}), got {rows!r}")
    sc = scale_of(problem)
    t0 = time.perf_counter()
    stats = {"strict_evaluations": 0, "max_prec_used": 0, "fallback_elements": 0}
    if problem.has_options:
        tensors = options_forward(problem, sc, target_fmt, row_idx, mode, prec, max_prec, stats)
    else:
        tensors = _forward(problem, sc, target_fmt, row_idx, mode, prec, max_prec, stats)
    key_idx = None
    if do is not None and problem.fp8 is not None:
        raise ValueError("FP8 inputs have no gradient oracle: call it without do= and keys=")
    if do is not None:
        do_arr, do_fmt = as_exact_array(do, "do")
        if do_fmt != problem.fmt:
            raise TypeError(
                f"do has dtype {do_fmt.name} but q, k, v are {problem.fmt.name}: pass the "
                "upstream gradient in the inputs' format (a kernel's dO has O's dtype)"
            )
        if do_arr.shape != (bsz, hq, nq, dv):
            raise ValueError(f"do must have O's shape {(bsz, hq, nq, dv)}, got {do_arr.shape}")
        nk = problem.k.shape[2]
        key_idx = np.arange(nk) if keys is None else np.asarray(keys, np.int64).reshape(-1)
        if key_idx.size and (key_idx.min() < 0 or key_idx.max() >= nk):
            raise ValueError(f"keys must lie in [0, {nk}), got {keys!r}")
        if problem.has_options:
            opts = (sc, target_fmt, row_idx, key_idx, mode, prec, max_prec, stats)
            tensors.update(options_gradients(problem, do_arr, *opts))
        else:
            grads = _gradients(
                problem, do_arr, sc, target_fmt, row_idx, key_idx, mode, prec, max_prec, stats
            )
            tensors.update({n: CertifiedTensor.from_fields(grads, f"{n}_") for n in GRADIENTS})
    elif keys is not None:
        raise ValueError("keys selects dK/dV rows: pass the upstream gradient do= as well")

    stats["seconds"] = time.perf_counter() - t0
    return OracleResult(
        fmt=target_fmt, rows=row_idx, mode=mode, tensors=tensors, stats=stats, keys=key_idx
    )


def _gradients(
    problem: AttentionProblem,
    do: np.ndarray,
    sc: Scale,
    fmt: Format,
    rows: np.ndarray,
    keys: np.ndarray,
    mode: str,
    prec: int,
    max_prec: int,
    stats: dict[str, Any],
) -> dict[str, np.ndarray]:
    """dQ, dK, dV for the requested rows and keys: the fast path, certified or recomputed
    strictly, or the strict path throughout (docs/oracle.md §7)."""
    bsz, hq, hk, nq, nk, d, dv = problem.shape
    group = hq // hk
    widths = {"dq": d, "dk": d, "dv": dv}
    lead = {"dq": (bsz, hq, rows.size), "dk": (bsz, hk, keys.size), "dv": (bsz, hk, keys.size)}
    res = {}
    for name in GRADIENTS:
        shape = (*lead[name], widths[name])
        res.update({f"{name}_{f}": np.zeros(shape) for f in FIELDS[:-1]})
        res[f"{name}_certified"] = np.ones(shape, dtype=bool)
    all_rows = np.arange(nq)
    for b in range(bsz):
        for kvh in range(hk):
            heads = range(kvh * group, (kvh + 1) * group)
            q = problem.q[b, heads[0] : heads[-1] + 1]
            dog = do[b, heads[0] : heads[-1] + 1]
            k, v = problem.k[b, kvh], problem.v[b, kvh]
            keep = np.stack([problem.keep(b, h, all_rows) for h in heads]) if group else None
            bad_row, bad_key = gradient_nan(q, k, v, dog, keep)
            args = (
                finite_or_zero(q),
                finite_or_zero(k),
                finite_or_zero(v),
                finite_or_zero(dog),
                keep,
            )
            full = {
                name: np.zeros((group, nq, d)) if name == "dq" else np.zeros((nk, widths[name]))
                for name in GRADIENTS
            }
            todo = {name: np.zeros(arr.shape, dtype=bool) for name, arr in full.items()}
            todo["dq"][:, rows] = ~bad_row[:, rows, None]
            todo["dk"][keys] = ~bad_key[keys, None]
            todo["dv"][keys] = ~bad_key[keys, None]
            work = {f"{n}_{f}": np.zeros(full[n].shape) for n in GRADIENTS for f in FIELDS[:-1]}
            work.update({f"{n}_certified": np.ones(full[n].shape, bool) for n in GRADIENTS})
            start = prec
            if mode == "fast":
                for name, val in fast_group(*args, sc).items():
                    work[name][...] = val
                for name in GRADIENTS:
                    hi, lo, err = (work[f"{name}_{f}"] for f in ("hi", "lo", "err"))
                    rounded, decided = decide(hi, lo, err, fmt)
                    work[f"{name}_rounded"][...] = rounded
                    ok = decided & (err <= target(work[f"{name}_floor"], fmt))
                    work[f"{name}_certified"][...] = ok
                    todo[name] &= ~ok
                    stats["fallback_elements"] += int(todo[name].sum())
                start = max(prec, 2 * MIN_PREC)
            if any(t.any() for t in todo.values()):
                strict_group(*args, sc, fmt, problem.fmt, todo, work, start, max_prec, stats)
            # NaN rule last: it overrides what was computed from sanitised inputs.
            for name, bad in (("dq", bad_row), ("dk", bad_key), ("dv", bad_key)):
                for f in ("hi", "rounded"):
                    work[f"{name}_{f}"][bad] = np.nan
                for f in ("lo", "err", "floor"):
                    work[f"{name}_{f}"][bad] = 0.0
                work[f"{name}_certified"][bad] = True
            for f in FIELDS:
                res[f"dq_{f}"][b, heads[0] : heads[-1] + 1] = work[f"dq_{f}"][:, rows]
                res[f"dk_{f}"][b, kvh] = work[f"dk_{f}"][keys]
                res[f"dv_{f}"][b, kvh] = work[f"dv_{f}"][keys]
    return res


def _forward(
    problem: AttentionProblem,
    sc: Scale,
    target_fmt: Format,
    row_idx: np.ndarray,
    mode: str,
    prec: int,
    max_prec: int,
    stats: dict[str, Any],
) -> dict[str, CertifiedTensor]:
    """O and LSE of the requested rows, head by head: the fast path, certified or recomputed
    strictly (Ziv), or the strict path throughout; then the NaN rule of
    :func:`~flashcheck.harness.core.semantics.nan_rows_and_cols`. Longer than 80 lines: one
    loop whose branches share every array view; split, they would pass a dozen arguments."""
    bsz, hq, _, _, _, _, dv = problem.shape
    r_n = row_idx.size
    arrays = {
        name: np.zeros((bsz, hq, r_n, dv))
        for name in ("o_hi", "o_lo", "o_err", "o_floor", "o_rounded")
    }
    arrays.update({name: np.zeros((bsz, hq, r_n)) for name in ("lse_lo", "lse_err", "lse_floor")})
    arrays["lse_hi"] = np.full((bsz, hq, r_n), -np.inf)
    arrays["lse_rounded"] = np.full((bsz, hq, r_n), -np.inf)
    o_cert = np.ones((bsz, hq, r_n, dv), dtype=bool)
    lse_cert = np.ones((bsz, hq, r_n), dtype=bool)

    for b in range(bsz):
        for h in range(hq):
            kvh = problem.kv_head(h)
            keep = problem.keep(b, h, row_idx)
            qr = problem.q[b, h][row_idx]
            kk, vv = problem.k[b, kvh], problem.v[b, kvh]
            row_nan, elem_nan = nan_rows_and_cols(qr, kk, vv, keep)
            view = {name: arr[b, h] for name, arr in arrays.items()}
            view["o_certified"] = o_cert[b, h]
            view["lse_certified"] = lse_cert[b, h]
            has = keep.any(axis=1)
            if not has.any():
                # Nq = 0, Nk = 0 or every row masked: O = 0 and LSE = −inf as initialised,
                # in both modes (the fast path's reductions need at least one kept key).
                todo_o = np.zeros((keep.shape[0], dv), dtype=bool)
                todo_l = np.zeros(keep.shape[0], dtype=bool)
            elif mode == "fast":
                res = fast_rows(
                    finite_or_zero(qr), finite_or_zero(kk), finite_or_zero(vv), keep, sc
                )
                for name, val in res.items():
                    view[name][...] = val
                view["o_rounded"][...], dec_o = decide(
                    res["o_hi"], res["o_lo"], res["o_err"], target_fmt
                )
                view["lse_rounded"][...], dec_l = decide(
                    res["lse_hi"], res["lse_lo"], res["lse_err"], target_fmt
                )
                ok_o = dec_o & (res["o_err"] <= target(res["o_floor"], target_fmt))
                # LSE's scale is max(W, |LSE|): W = Σ p|s| is 0 for all-zero scores, LSE = log n.
                lse_scale = np.maximum(res["lse_floor"], np.abs(res["lse_hi"]))
                ok_l = dec_l & (res["lse_err"] <= target(lse_scale, target_fmt))
                ok_l |= ~has
                todo_o = ~ok_o & ~elem_nan & has[:, None]
                todo_l = ~ok_l & ~row_nan
                start = max(prec, 2 * MIN_PREC)
            else:
                todo_o = ~elem_nan & has[:, None]
                todo_l = ~row_nan & has
                start = prec
            if mode == "fast":
                stats["fallback_elements"] += int(todo_o.sum() + todo_l.sum())
            if todo_o.any() or todo_l.any():
                strict_fill(
                    problem,
                    sc,
                    target_fmt,
                    b,
                    h,
                    row_idx,
                    todo_o,
                    todo_l,
                    view,
                    start,
                    max_prec,
                    stats,
                )
            # NaN rule last: it overrides whatever was computed from sanitized inputs.
            for name in ("o_hi", "o_rounded"):
                view[name][elem_nan] = np.nan
            for name in ("o_lo", "o_err", "o_floor"):
                view[name][elem_nan] = 0.0
            for name in ("lse_hi", "lse_rounded"):
                view[name][row_nan] = np.nan
            for name in ("lse_lo", "lse_err", "lse_floor"):
                view[name][row_nan] = 0.0
            view["o_certified"][elem_nan] = True
            view["lse_certified"][row_nan | ~has] = True
            view["lse_rounded"][~has & ~row_nan] = -np.inf

    arrays["o_certified"] = o_cert
    arrays["lse_certified"] = lse_cert
    tensors = {name: CertifiedTensor.from_fields(arrays, f"{name}_") for name in ("o", "lse")}
    return tensors
