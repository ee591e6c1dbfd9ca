"""The NaN rule (``nan-rule``), a structural check: outputs of finite inputs stay finite, and
every output a NaN input is involved in is NaN (SPEC 3.1), unless the kernel declares
``nan_inputs="any"``. Where an output a NaN input should reach comes out finite, it names the
input and, for causal cases, whether a causal mask aligned top-left (query i keeping keys
j <= i) explains it: flashcheck aligns causal bottom-right, as FlashAttention does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..core.semantics import make_problem, nan_rows_and_cols
from ..core.status import Status
from ..judging.verdict import CONVENTION
from ..oracle.evaluate import oracle
from .structural import StructuralResult

__all__ = ["TOP_LEFT_MISSED", "TOP_LEFT_OR_POLICY", "nan_rule"]


def _zero(x: np.ndarray, which) -> np.ndarray:
    """``x`` with the elements ``which(x)`` selects set to 0 (isolates NaN from ±inf)."""
    return np.where(which(x), 0.0, x)


TOP_LEFT_MISSED = (
    "; consistent with a causal mask aligned top-left (query i keeps keys j <= i): the NaN sits "
    "at keys that alignment drops (flashcheck aligns causal bottom-right, as FlashAttention: "
    "j <= i + Nk - Nq)"
)


TOP_LEFT_OR_POLICY = (
    "; either the kernel drops those keys (a causal mask aligned top-left, query i keeping keys "
    "j <= i, does: flashcheck aligns causal bottom-right, as FlashAttention: j <= i + Nk - Nq), "
    'or it suppresses NaN on purpose (then declare nan_inputs="any" in flashcheck.kernel, or '
    "--nan-inputs any)"
)


def _missed_by_top_left(
    case: Case, p: Any, bh: tuple[int, int], missed: np.ndarray, nan_out: np.ndarray
) -> str:
    """Whether the kernel's NaN in (b, h) are those of a causal mask aligned top-left: ``"yes"``
    where every output a NaN input missed (``missed``, (Nq, dv)) is one that alignment does not
    involve it in, and every output it does involve it in is NaN (``nan_out``), some at least;
    ``"maybe"`` where the first holds but that alignment involves no NaN input at all (a kernel
    zeroing NaN looks the same there); ``"no"`` otherwise. With Nq < Nk top-left keeps fewer
    keys than bottom-right, so such a kernel leaves those NaN out, and declaring
    ``nan_inputs="any"`` would hide a mask bug."""
    _, _, _, nq, nk, *_ = case.shape
    if not case.causal or case.window is not None or case.mask is not None or nq >= nk:
        return "no"
    b, h = bh
    kvh = p.kv_head(h)
    rows = np.arange(nq)
    keep = np.arange(nk)[None, :] <= rows[:, None]
    qq, kk, vv = (_zero(x, np.isinf) for x in (p.q[b, h], p.k[b, kvh], p.v[b, kvh]))
    _, involved = nan_rows_and_cols(qq, kk, vv, keep)
    if (missed & involved).any():
        return "no"
    if not involved.any():
        return "maybe"
    return "yes" if nan_out[involved].all() else "no"


def _top_left_hint(case: Case, leak: np.ndarray, empty: np.ndarray) -> str:
    """The diagnosis of NaN in rows a bottom-right causal mask empties (``empty``, (B, Hq, Nq)):
    under a top-left alignment exactly those rows keep keys with a NaN or inf input, and some
    other empty row came out finite (NaN in every empty row is the NaN-for-masked-rows
    convention, which explains it as well)."""
    b_n, hq, _, nq, nk, *_ = case.shape
    nan_rows = leak.any(-1)
    if not case.causal or nq <= nk or not (empty & ~nan_rows).any():
        return ""
    p = make_problem(case.q, case.k, case.v, **{**case.options(), "causal": False})
    rows = np.arange(nq)
    top_left = np.arange(nk)[None, :] <= rows[:, None]
    for b in range(b_n):
        for h in range(hq):
            kvh = p.kv_head(h)
            keep = p.keep(b, h, rows) & top_left
            poisoned, _ = nan_rows_and_cols(p.q[b, h], p.k[b, kvh], p.v[b, kvh], keep)
            if (nan_rows[b, h] != (poisoned & empty[b, h])).any():
                return ""
    return (
        "; consistent with a causal mask aligned top-left (query i keeps keys j <= i): exactly "
        "the rows with a NaN or inf input among those keys give NaN (flashcheck aligns causal "
        "bottom-right, as FlashAttention: j <= i + Nk - Nq)"
    )


def _dropped_nonfinite(case: Case, rows: np.ndarray) -> str:
    """For the ``rows`` ((B, Hq, Nq) booleans) of a masked case: the first non-finite k or v
    row among the keys the mask drops for one of them, named with its index (``""`` if none,
    or the case has no mask). An output going non-finite there is what a kernel that does not
    apply the mask gives."""
    if not (case.causal or case.window is not None or case.mask is not None):
        return ""
    p = make_problem(case.q, case.k, case.v, **case.options())
    for b, h, i in np.argwhere(rows):
        kvh = p.kv_head(int(h))
        drop = ~p.keep(int(b), int(h), np.array([i]))[0]
        for name, x in (("k", p.k[b, kvh]), ("v", p.v[b, kvh])):
            bad = np.flatnonzero(drop & ~np.isfinite(x).all(-1))
            if bad.size:
                j = int(bad[0])
                c = int(np.argmax(~np.isfinite(x[j])))
                return (
                    f"row {int(i)} of (b={int(b)}, h={int(h)}) drops key {j}, whose "
                    f"{name}[{int(b)}, {kvh}, {j}, {c}] = {float(x[j, c])!r}"
                )
    return ""


def _nan_source(qq, kk, vv, keep_row, i: int, c: int, bhk: tuple[int, int, int]) -> str:
    """The NaN input that output ``(i, c)`` of one (batch, head) involves, named with its
    index in the case's tensors (q's row, a kept key's k row, a kept key's v column)."""
    b, h, kvh = bhk
    if np.isnan(qq[i]).any():
        return f"the NaN in q[{b}, {h}, {i}, {int(np.argmax(np.isnan(qq[i])))}]"
    for name, x, col in (("k", kk, None), ("v", vv, c)):
        rows = np.isnan(x).any(-1) if col is None else np.isnan(x[:, col])
        hit = np.flatnonzero(rows & keep_row)
        if hit.size:
            j = int(hit[0])
            at = int(np.argmax(np.isnan(x[j]))) if col is None else col
            return f"the NaN in {name}[{b}, {kvh}, {j}, {at}] (key {j}, kept by row {i})"
    return "a NaN input"


def nan_rule(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Outputs of finite inputs stay finite; every output a NaN input is involved in is NaN.

    A kernel declaring ``nan_inputs="any"`` may give finite outputs where a NaN input is
    involved: that finding is a PASS reported as a convention; finite inputs giving NaN/Inf
    fail whatever the declaration. An output that an ±inf input is involved in is not held to
    NaN (IEEE gives it no single value), so a case with ±inf inputs is checked a second time
    with each of them made NaN: a kernel that turns NaN into 0 could hide behind them."""
    found = _nan_rule_on(adapter, case, device)
    if found.status is not Status.PASS:
        return found
    nan_only = _infs_made_nan(case)
    if nan_only is None:
        return found
    again = _nan_rule_on(adapter, nan_only, device)
    if again.status is Status.PASS:
        return found
    return replace(again, message=f"with the case's ±inf inputs made NaN, {again.message}")


def _infs_made_nan(case: Case) -> Case | None:
    """``case`` with every ±inf input replaced by NaN, or ``None`` if it has none."""
    arrays = {}
    for name in ("q", "k", "v"):
        x = getattr(case, name)
        inf = np.isinf(np.asarray(x, dtype=np.float32))
        if inf.any():
            x = x.copy()
            x[inf] = np.nan
            arrays[name] = x
    return replace(case, **arrays) if arrays else None


def _nan_rule_on(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    out = adapter.run(case, device)
    ref = oracle(case.q, case.k, case.v, **case.options())
    leak = np.isfinite(ref.o.hi) & ~np.isfinite(out.o)
    if leak.any():
        masked = np.isneginf(ref.lse.hi)[..., None] & np.ones_like(leak)
        dropped = _dropped_nonfinite(case, leak.any(-1))
        if not (leak & ~masked).any():
            rows = f"fully masked rows give NaN ({int(leak.any(-1).sum())} rows), not O = 0"
            if dropped:
                # Not necessarily a convention: a kernel that ignores the mask gives the same.
                return StructuralResult.failed(
                    f"{rows}: either the NaN-for-masked-rows convention (flashcheck's contract "
                    f"is O = 0, as FlashAttention's), or the mask is not applied: {dropped}"
                    + _top_left_hint(case, leak, np.isneginf(ref.lse.hi))
                )
            return StructuralResult.failed(
                f"{CONVENTION}{rows} (flashcheck's contract, as FlashAttention)"
                + _top_left_hint(case, leak, np.isneginf(ref.lse.hi))
            )
        i = tuple(int(x) for x in np.argwhere(leak & ~masked)[0])
        return StructuralResult.failed(
            f"NaN/Inf leaked into {int((leak & ~masked).sum())} outputs whose inputs are finite "
            "(the row's q and every key its mask keeps) "
            f"(first: O{i} = {float(out.o[i])!r} where the exact result is {ref.o.hi[i]:.6g})"
            + (f"; consistent with the mask not applied: {dropped}" if dropped else "")
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
                src = _nan_source(qq, kk, vv, keep[i], i, c, (b, h, kvh))
                found = (
                    f"{src} did not reach O{(b, h, i, c)} = {float(out.o[b, h, i, c])!r} "
                    f"({int(missed.sum())} such outputs in (b={b}, h={h}))"
                )
                top_left = _missed_by_top_left(case, p, (b, h), missed, np.isnan(out.o[b, h]))
                if top_left == "yes":
                    return StructuralResult.failed(f"{found}{TOP_LEFT_MISSED}")
                if top_left == "maybe" and adapter.nan_inputs != "any":
                    return StructuralResult.failed(f"{found}{TOP_LEFT_OR_POLICY}")
                if adapter.nan_inputs == "any":
                    return StructuralResult.passed(
                        f'{CONVENTION}NaN inputs give finite outputs (declared nan_inputs="any"):'
                        f" {found}"
                    )
                return StructuralResult.failed(
                    f'{found} (declare nan_inputs="any" in flashcheck.kernel, or --nan-inputs '
                    "any, if intended)"
                )
    return StructuralResult.passed(
        "every output a NaN input is involved in is NaN, outputs of finite inputs are finite "
        "(outputs involving ±Inf are not held to NaN: IEEE gives them no single value)"
    )
