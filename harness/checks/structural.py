"""Structural checks: a kernel compared with itself on one case, each answering a
:class:`StructuralResult` (PASS, FAIL, or NOT-APPLICABLE with the reason).

These are the checks of the property suite that compare a kernel with itself rather than with
the oracle's accuracy bounds. They live here, not in the tests, so that ``flashcheck replay``
and the campaign re-run exactly the check a saved case failed.

- ``batch-head-independence``: each (batch, head) slice computed alone equals the same slice of
  the batched call (bitwise for kernels that declare it, else within twice the bound);
- ``padded-buffers``: inputs placed inside NaN-filled buffers give the same outputs (bitwise
  for deterministic, batch-invariant kernels, else within twice the bound);
- ``determinism``: two runs agree (bitwise if the kernel declares it, else within twice the
  bound); ``gradient-determinism`` the same for the backward;
- ``key-permutation``: permuting keys and values moves O by at most the two bounds;
- ``nan-rule``: outputs of finite inputs stay finite; outputs involving a NaN input are NaN;
- ``options-applied``: ``causal``, ``window`` and an explicit ``scale`` change the output
  where they change the exact answer (a kernel that ignores an option).

A check that has nothing to test on a case (one (batch, head) slice, no option set, a mask
that a key permutation would move) says so: NOT-APPLICABLE is never a pass. The checks against
the emulated arithmetic of a kernel's class are in :mod:`flashcheck.harness.checks.conformance`;
the integrity of inputs and returned results in :mod:`flashcheck.harness.checks.integrity`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..checks.accuracy import kernel_bounds, kernel_gradient_bounds
from ..core.semantics import make_problem, nan_rows_and_cols
from ..core.status import Status
from ..judging.verdict import CONVENTION, GRADIENT_LABELS
from ..oracle.evaluate import oracle

__all__ = [
    "ONE_BLOCK",
    "StructuralResult",
    "agree",
    "batch_head_independence",
    "determinism",
    "gradient_determinism",
    "key_permutation",
    "nan_rule",
    "options_applied",
    "padded_buffers",
    "padded_inputs",
    "same_bits",
]

ONE_BLOCK = 16  # every configuration of the Triton kernel has BLOCK_N >= 16
_CHECK_STATUSES = (Status.PASS, Status.FAIL, Status.NOT_APPLICABLE)


@dataclass(frozen=True)
class StructuralResult:
    """What one structural check found: ``PASS``, ``FAIL``, or ``NOT-APPLICABLE`` (the case
    gives the check nothing to test), and ``message``, what was compared or why not."""

    status: Status
    message: str

    def __post_init__(self) -> None:
        status = Status(self.status)
        if status not in _CHECK_STATUSES:
            raise ValueError(f"a structural check is PASS, FAIL or NOT-APPLICABLE, got {status!r}")
        object.__setattr__(self, "status", status)

    @classmethod
    def passed(cls, message: str) -> StructuralResult:
        return cls(Status.PASS, message)

    @classmethod
    def failed(cls, message: str) -> StructuralResult:
        return cls(Status.FAIL, message)

    @classmethod
    def not_applicable(cls, why: str) -> StructuralResult:
        return cls(Status.NOT_APPLICABLE, f"not applicable ({why})")

    def __str__(self) -> str:
        return f"{self.status}: {self.message}"


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


def batch_head_independence(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Each (batch, head) slice computed alone against the same slice of the batched call."""
    b_n, hq, *_ = case.shape
    if not adapter.batched:
        return StructuralResult.not_applicable("the kernel takes one (batch, head) slice per call")
    if b_n * hq < 2:
        return StructuralResult.not_applicable("one (batch, head) slice: nothing to compare")
    full = adapter.run(case, device)
    for b in range(b_n):
        for h in range(hq):
            sl = case.slice(b, h)
            part = adapter.run(sl, device)
            tol = _self_tolerance(adapter, sl, adapter.batch_invariant)
            if not agree(full.o[b, h], part.o[0, 0], None if tol is None else tol[0, 0]):
                how = "bitwise equal to" if tol is None else "within twice its error bound of"
                return StructuralResult.failed(
                    f"(b={b}, h={h}) is not {how} the slice computed alone"
                )
    return StructuralResult.passed("each (batch, head) slice agrees with the slice computed alone")


def padded_buffers(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """The case's inputs as views inside NaN-filled buffers give the same outputs."""
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
        return StructuralResult.failed("outputs differ when the inputs sit inside NaN padding")
    return StructuralResult.passed("the same output with NaN-padded inputs")


def determinism(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Two runs on the same inputs: bitwise equal if the kernel declares it, else within
    twice its bound."""
    a, b = adapter.run(case, device), adapter.run(case, device)
    tol = _self_tolerance(adapter, case, adapter.deterministic)
    lse_tol = None if adapter.deterministic else np.inf
    if not (agree(a.o, b.o, tol) and (a.lse is None or agree(a.lse, b.lse, lse_tol))):
        how = "bitwise" if tol is None else "within twice the error bound"
        return StructuralResult.failed(f"two runs on the same inputs differ (compared {how})")
    return StructuralResult.passed("two runs agree")


def key_permutation(adapter: Kernel, case: Case, device: str, perm: Any = None) -> StructuralResult:
    """Permuting keys and values together leaves the exact answer unchanged: the kernel's
    outputs may differ by at most its two bounds."""
    nk = case.shape[4]
    if case.causal or case.window is not None or case.mask is not None:
        return StructuralResult.not_applicable(
            "the case sets a mask: permuting keys changes the exact answer"
        )
    if nk < 2:
        return StructuralResult.not_applicable("one key: no permutation moves it")
    if perm is None:  # replay: the permutation is a function of the case's seed
        perm = np.random.default_rng(case.seed or 0).permutation(nk)
    perm = np.asarray(perm)
    if np.array_equal(perm, np.arange(nk)):
        return StructuralResult.not_applicable("the permutation drawn is the identity")
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
        return StructuralResult.failed(
            f"permuting keys moved O by {np.nanmax(diff):.3g}, more than the two bounds allow"
        )
    return StructuralResult.passed("permutation moved O within the bounds")


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
        if not (leak & ~masked).any():
            return StructuralResult.failed(
                f"{CONVENTION}fully masked rows give NaN ({int(leak.any(-1).sum())} rows), not "
                "O = 0 (flashcheck's contract, as FlashAttention)"
                + _top_left_hint(case, leak, np.isneginf(ref.lse.hi))
            )
        i = tuple(int(x) for x in np.argwhere(leak & ~masked)[0])
        return StructuralResult.failed(
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


def options_applied(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Each option the case sets (``causal``, ``window``, an explicit ``scale``, ``softcap``,
    ``sinks``) changes the kernel's output wherever it changes the exact answer by more than the
    two bounds: a kernel that ignores an option is caught even on cases where its error would
    stay small."""
    variants = []
    if case.causal:
        variants.append(("causal=True", replace(case, causal=False)))
    if case.window is not None:
        variants.append((f"window={case.window}", replace(case, window=None)))
    if case.scale is not None:
        variants.append((f"scale={case.scale!r}", replace(case, scale=None)))
    if case.softcap is not None:
        variants.append((f"softcap={case.softcap!r}", replace(case, softcap=None)))
    if case.sinks is not None:
        variants.append(("sinks", replace(case, sinks=None)))
    if not variants:
        return StructuralResult.not_applicable("the case sets no option")
    out = adapter.run(case, device)
    ref = oracle(case.q, case.k, case.v, **case.options())
    bound = kernel_bounds(adapter, case).o.det
    tested = []
    for label, other in variants:
        ref2 = oracle(other.q, other.k, other.v, **other.options())
        other_det = kernel_bounds(adapter, other).o.det
        tol = bound + other_det
        with np.errstate(invalid="ignore"):
            moved = (
                np.isfinite(ref.o.hi)
                & np.isfinite(ref2.o.hi)
                & (np.abs(ref.o.hi - ref2.o.hi) > tol)
            )
        if not moved.any():
            continue
        tested.append(label)
        broken = moved & ~np.isfinite(out.o)
        empty = np.isneginf(ref.lse.hi)[..., None] & np.ones_like(broken)
        if broken.any() and not (broken & ~empty).any():  # SDPA's NaN for an empty row
            return StructuralResult.failed(
                f"{CONVENTION}fully masked rows give NaN (with {label}), not O = 0: whether the "
                "kernel applies the option cannot be seen there"
            )
        if broken.any():  # an unchanged NaN says nothing about the option
            return StructuralResult.failed(
                f"O is NaN/Inf in {int(broken.sum())} elements where the exact answer is finite "
                f"(with {label}): whether the kernel applies the option cannot be seen there"
            )
        o2 = adapter.run(other, device).o
        if same_bits(out.o[moved], o2[moved]):
            change = float(np.max(np.abs(ref.o.hi - ref2.o.hi)[moved]))
            said = (
                f"{label} did not change the output where it changes the exact answer (by up "
                f"to {change:.3g})"
            )
            # Wrong without the option too: the option may be applied and something else wrong
            # (a row maximum that never goes below a sentinel, say), so do not blame it.
            with np.errstate(invalid="ignore"):
                wrong = int((moved & (np.abs(o2.astype(np.float64) - ref2.o.hi) > other_det)).sum())
            if wrong:
                return StructuralResult.failed(
                    f"{said}, and without it the output is wrong there too ({wrong} of those "
                    "elements beyond their bound): whether the option is applied cannot be "
                    "told; the accuracy results show what else is wrong"
                )
            return StructuralResult.failed(
                f"{said}: the kernel ignores the option there (without it the output is right)"
            )
    if not tested:
        return StructuralResult.not_applicable(
            "no option set changes the exact answer by more than the two bounds here"
        )
    return StructuralResult.passed("every option set changed the output where it should")


def gradient_determinism(adapter: Kernel, case: Case, device: str) -> StructuralResult:
    """Two backward calls on the same case: bitwise equal for a kernel declared deterministic;
    otherwise within twice the gradient bound of each other (never a NaN in one run only)."""
    a = adapter.run_backward(case, device)
    b = adapter.run_backward(case, device)
    bounds = None if adapter.deterministic else kernel_gradient_bounds(adapter, case)
    for name in ("dq", "dk", "dv"):
        x, y = getattr(a, name), getattr(b, name)
        label = GRADIENT_LABELS[name]
        if (np.isnan(x) != np.isnan(y)).any():
            return StructuralResult.failed(f"{label} is NaN in one run and not in the other")
        if adapter.deterministic:
            if not np.array_equal(x, y, equal_nan=True):
                n = int((~((x == y) | (np.isnan(x) & np.isnan(y)))).sum())
                return StructuralResult.failed(
                    f"{label} differs between two runs in {n} elements (declared deterministic)"
                )
            continue
        with np.errstate(invalid="ignore"):
            diff = np.where(np.isfinite(x) & np.isfinite(y), np.abs(x - y), 0.0)
        over = diff > 2 * bounds[name].det
        if over.any():
            return StructuralResult.failed(
                f"{label} of two runs differ by more than twice the bound in "
                f"{int(over.sum())} elements (max {diff.max():.3g})"
            )
    how = "bitwise" if adapter.deterministic else "within twice the bound"
    return StructuralResult.passed(f"two backward runs agree {how}")
