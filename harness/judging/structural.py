"""Structural properties of a kernel on one case, each returning ``(ok, message)``.

These are the checks of the property suite that compare a kernel with itself or with its
declared arithmetic rather than with the oracle's accuracy bounds. They live here, not in the
tests, so that ``flashcheck replay`` re-runs exactly the property a saved case failed.

- ``batch-head-independence``: each (batch, head) slice computed alone equals the same slice of
  the batched call (bitwise for kernels that declare it, else within twice the bound);
- ``padded-buffers``: inputs placed inside NaN-filled buffers give the same outputs (bitwise
  for deterministic, batch-invariant kernels, else within twice the bound);
- ``determinism``: two runs agree (bitwise if the kernel declares it, else within twice the
  bound);
- ``key-permutation``: permuting keys and values moves O by at most the two bounds;
- ``nan-rule``: outputs of finite inputs stay finite; outputs involving a NaN input are NaN;
- ``conformance``: the kernel matches the exactly emulated arithmetic of its class;
- ``options-applied``: ``causal``, ``window`` and an explicit ``scale`` change the output
  where they change the exact answer (a kernel that ignores an option).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..checks.accuracy import kernel_bounds
from ..core.formats import FORMATS, round_to_format, ulp
from ..core.semantics import make_problem, nan_rows_and_cols
from ..oracle.evaluate import oracle
from .bounds import RHO_EXP, U32, gamma
from .verdict import CONVENTION

__all__ = ["CHECKS", "ONE_BLOCK", "agree", "padded_inputs", "same_bits"]

ONE_BLOCK = 16  # every configuration of the Triton kernel has BLOCK_N >= 16


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two float64 copies (any NaN equals any NaN here)."""
    if a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | (a.view(np.int64) == b.view(np.int64))))


def padded_inputs(case: Case, adapter: Kernel, device: str) -> tuple[Any, Any, Any]:
    """The case's q, k, v as views into larger buffers filled with NaN."""
    out = []
    for name in ("q", "k", "v"):
        x = getattr(case, name)
        shape = tuple(n + p for n, p in zip(x.shape, (1, 1, 3, 5), strict=True))
        buf = np.full(shape, np.nan, dtype=x.dtype)
        buf[1:, :-1, 2:-1, 3:-2] = x
        view = buf[1:, :-1, 2:-1, 3:-2]
        if adapter.api == "torch":
            view = Case(buf, buf, buf).to_torch(device)[0][1:, :-1, 2:-1, 3:-2]
        out.append(view)
    return tuple(out)


def agree(a: np.ndarray, b: np.ndarray, tol: np.ndarray | None) -> bool:
    """Bitwise equal (``tol`` None), or NaN and ±Inf in the same places and every finite
    difference within ``tol``: a NaN never hides inside a tolerance."""
    if tol is None:
        return same_bits(a, b)
    if a.shape != b.shape:
        return False
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not (np.array_equal(fa, fb) and np.array_equal(np.isnan(a), np.isnan(b))):
        return False
    if not np.array_equal(a[~fa & ~np.isnan(a)], b[~fb & ~np.isnan(b)]):
        return False
    both = fa & fb
    return bool(np.all(np.abs(a[both] - b[both]) <= np.broadcast_to(tol, a.shape)[both]))


def _self_tolerance(adapter: Kernel, case: Case, promised: bool) -> np.ndarray | None:
    """``None`` (bitwise) when the kernel promises it, else twice the bound on O: two outputs
    each within the bound of the exact answer are within twice the bound of each other."""
    return None if promised else 2 * kernel_bounds(adapter, case).o.det


def batch_head_independence(adapter: Kernel, case: Case, device: str):
    full = adapter.run(case, device)
    b_n, hq, *_ = case.shape
    for b in range(b_n):
        for h in range(hq):
            sl = case.slice(b, h)
            part = adapter.run(sl, device)
            tol = _self_tolerance(adapter, sl, adapter.batch_invariant)
            if not agree(full.o[b, h], part.o[0, 0], None if tol is None else tol[0, 0]):
                how = "bitwise equal" if tol is None else "within twice its error bound of"
                return False, f"(b={b}, h={h}) is not {how} the slice computed alone"
    return True, "each (batch, head) slice agrees with the slice computed alone"


def padded_buffers(adapter: Kernel, case: Case, device: str):
    plain = adapter.run(case, device)
    padded = adapter.run(case, device, inputs=padded_inputs(case, adapter, device))
    promised = adapter.batch_invariant and adapter.deterministic
    tol = _self_tolerance(adapter, case, promised)
    same = agree(plain.o, padded.o, tol) and (
        plain.lse is None
        or padded.lse is None
        or agree(plain.lse, padded.lse, None if promised else np.inf)
    )
    if not same:
        return False, "outputs differ when the inputs sit inside NaN padding"
    return True, "the same output with NaN-padded inputs"


def determinism(adapter: Kernel, case: Case, device: str):
    a, b = adapter.run(case, device), adapter.run(case, device)
    tol = _self_tolerance(adapter, case, adapter.deterministic)
    lse_tol = None if adapter.deterministic else np.inf
    if not (agree(a.o, b.o, tol) and (a.lse is None or agree(a.lse, b.lse, lse_tol))):
        how = "bitwise" if tol is None else "within twice the error bound"
        return False, f"two runs on the same inputs differ (compared {how})"
    return True, "two runs agree"


def key_permutation(adapter: Kernel, case: Case, device: str, perm: Any = None):
    nk = case.shape[4]
    if perm is None:  # replay: the permutation is a function of the case's seed
        perm = np.random.default_rng(case.seed or 0).permutation(nk)
    perm = np.asarray(perm)
    moved = Case(
        case.q,
        case.k[:, :, perm],
        case.v[:, :, perm],
        scale=case.scale,
        family=case.family,
        seed=case.seed,
        params=case.params,
    )
    a, b = adapter.run(case, device), adapter.run(moved, device)
    tol = kernel_bounds(adapter, case).o.det + kernel_bounds(adapter, moved).o.det
    if not agree(a.o, b.o, tol):
        diff = np.abs(a.o - b.o)
        return (
            False,
            f"permuting keys moved O by {np.nanmax(diff):.3g}, more than the two bounds allow",
        )
    return True, "permutation moved O within the bounds"


def _zero(x: np.ndarray, which) -> np.ndarray:
    """``x`` with the elements ``which(x)`` selects set to 0 (isolates NaN from ±inf)."""
    return np.where(which(x), 0.0, x)


def nan_rule(adapter: Kernel, case: Case, device: str):
    out = adapter.run(case, device)
    ref = oracle(case.q, case.k, case.v, **case.options())
    leak = np.isfinite(ref.o.hi) & ~np.isfinite(out.o)
    if leak.any():
        masked = np.isneginf(ref.lse.hi)[..., None] & np.ones_like(leak)
        if not (leak & ~masked).any():
            return False, (
                f"{CONVENTION}fully masked rows give NaN ({int(leak.any(-1).sum())} rows), not "
                "O = 0 (flashcheck's contract, as FlashAttention)"
            )
        i = tuple(int(x) for x in np.argwhere(leak & ~masked)[0])
        return False, (
            f"NaN/Inf leaked into {int((leak & ~masked).sum())} outputs of finite inputs "
            f"(first: O{i} = {float(out.o[i])!r} where the exact result is {ref.o.hi[i]:.6g})"
        )
    p = make_problem(case.q, case.k, case.v, **case.options())
    b_n, hq, _, nq, *_ = p.shape
    for b in range(b_n):
        for h in range(hq):
            kvh = p.kv_head(h)
            keep = p.keep(b, h, np.arange(nq))
            qq, kk, vv = p.q[b, h], p.k[b, kvh], p.v[b, kvh]
            _, elem = nan_rows_and_cols(*(_zero(x, np.isinf) for x in (qq, kk, vv)), keep)
            # Where an ±inf input is involved too, IEEE gives no single answer (an inf score
            # can drop a key: exp(−inf) = 0); only outputs free of inf must show the NaN.
            _, elem_inf = nan_rows_and_cols(*(_zero(x, np.isnan) for x in (qq, kk, vv)), keep)
            missed = elem & ~elem_inf & ~np.isnan(out.o[b, h])
            if missed.any():
                i, c = (int(x) for x in np.argwhere(missed)[0])
                return False, (
                    f"a NaN input did not reach O{(b, h, i, c)} = {float(out.o[b, h, i, c])!r} "
                    f"({int(missed.sum())} such outputs in (b={b}, h={h}))"
                )
    return True, (
        "every output a NaN input is involved in is NaN, outputs of finite inputs are finite "
        "(outputs involving ±Inf are not held to NaN: IEEE gives them no single value)"
    )


def _near_boundary_term(case: Case, fmt) -> np.ndarray:
    """Σ over keys whose p̃ may round differently in two fp32-accurate computations."""
    _, hq, hk, _, _, d, _ = case.shape
    q, k, v = (getattr(case, n).astype(np.float64) for n in ("q", "k", "v"))
    tau = case.scale if case.scale is not None else 1 / math.sqrt(d)
    rep = hq // hk
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = tau * q @ np.swapaxes(k, -1, -2)
    a = abs(tau) * np.abs(q) @ np.swapaxes(np.abs(k), -1, -2)
    m = s.max(axis=-1, keepdims=True)
    pt = np.exp(s - m)
    # fp32-level relative error of p̃ (dot, scale, shift, exp2), doubled for two computations
    eps = 2 * (gamma(d + 1, 2 * U32) * a + U32 * (np.abs(s) + 2 * np.abs(s - m)) + RHO_EXP)
    eps = np.minimum(eps, 50.0)  # beyond e^50 every key is ambiguous anyway; keeps exp finite
    lo, hi = round_to_format(pt * np.exp(-eps), fmt), round_to_format(pt * np.exp(eps), fmt)
    w = np.where(lo != hi, ulp(pt, fmt) * 1.01, 0.0) / pt.sum(axis=-1, keepdims=True)
    return w @ np.abs(v)


def conformance(adapter: Kernel, case: Case, device: str):
    """Within one key block (``Nk ≤ 16``) a flash kernel and the emulated recurrence share
    the roundings of P and of the output, so ``|O − O_emulated| ≤ 2·B32 + ulp_F(O) +`` (keys
    whose P may round the other way); see docs/error-bounds.md §6."""
    from ...kernels.recurrence import PrecisionPolicy, online_attention

    if adapter.arithmetic != "flash" or case.shape[4] > ONE_BLOCK or case.mask is not None:
        return True, "not applicable (flash class, Nk <= 16, no explicit mask)"
    out = adapter.run(case, device)
    dtype = case.dtype
    policy = PrecisionPolicy(input=dtype, score="fp32", accum="fp32", p=dtype, output="fp32")
    emu, _ = online_attention(
        case.q,
        case.k,
        case.v,
        policy=policy,
        block_k=ONE_BLOCK,
        causal=case.causal,
        window=case.window,
        scale=case.scale,
    )
    emu = emu.astype(np.float64)
    fmt = FORMATS[dtype]
    b32 = kernel_bounds(adapter, case, fp32_only=True).o.det
    tol = 2 * b32 + ulp(out.o, fmt) + _near_boundary_term(case, fmt)
    diff = np.abs(out.o - emu)
    if np.any(diff > tol):
        i = np.unravel_index(np.argmax(diff / tol), diff.shape)
        return False, (
            f"O{tuple(int(x) for x in i)} = {out.o[i]!r} but the emulated flash arithmetic "
            f"gives {emu[i]!r} (tolerance {tol[i]:.3g})"
        )
    return True, f"matches the emulation (max diff/tol {float(np.max(diff / tol)):.3g})"


def options_applied(adapter: Kernel, case: Case, device: str):
    """Each option the case sets (``causal``, ``window``, an explicit ``scale``) changes the
    kernel's output wherever it changes the exact answer by more than the two bounds: a kernel
    that ignores an option is caught even on cases where its error would stay small."""
    variants = []
    if case.causal:
        variants.append(("causal=True", replace(case, causal=False)))
    if case.window is not None:
        variants.append((f"window={case.window}", replace(case, window=None)))
    if case.scale is not None:
        variants.append((f"scale={case.scale!r}", replace(case, scale=None)))
    if not variants:
        return True, "not applicable (the case sets no option)"
    out = adapter.run(case, device)
    ref = oracle(case.q, case.k, case.v, **case.options())
    bound = kernel_bounds(adapter, case).o.det
    for label, other in variants:
        ref2 = oracle(other.q, other.k, other.v, **other.options())
        tol = bound + kernel_bounds(adapter, other).o.det
        with np.errstate(invalid="ignore"):
            moved = (
                np.isfinite(ref.o.hi)
                & np.isfinite(ref2.o.hi)
                & (np.abs(ref.o.hi - ref2.o.hi) > tol)
            )
        if not moved.any():
            continue
        o2 = adapter.run(other, device).o
        if same_bits(out.o[moved], o2[moved]):
            change = float(np.max(np.abs(ref.o.hi - ref2.o.hi)[moved]))
            return False, (
                f"{label} did not change the output where it changes the exact answer (by up "
                f"to {change:.3g}): the kernel ignores the option there, or computes those "
                "outputs wrongly with it"
            )
    return True, "every option set changed the output where it should"


CHECKS: dict[str, Callable[..., tuple[bool, str]]] = {
    "batch-head-independence": batch_head_independence,
    "padded-buffers": padded_buffers,
    "determinism": determinism,
    "key-permutation": key_permutation,
    "nan-rule": nan_rule,
    "conformance": conformance,
    "options-applied": options_applied,
}
