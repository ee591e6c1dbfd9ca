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
- ``options-applied``: ``causal``, ``window``, an explicit ``scale``, a ``softcap`` and
  ``sinks`` change the output where they change the exact answer (a kernel that ignores an
  option); the report's case sets every option the kernel takes.

A check that has nothing to test on a case (one (batch, head) slice, no option set, a mask
that a key permutation would move) says so: NOT-APPLICABLE is never a pass. The checks against
the emulated arithmetic of a kernel's class are in :mod:`flashcheck.harness.checks.conformance`;
the integrity of inputs and returned results in :mod:`flashcheck.harness.checks.integrity`; the
NaN rule (``nan-rule``) in :mod:`flashcheck.harness.checks.nan_rule`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel
from ..cases.case import Case
from ..checks.accuracy import kernel_bounds, kernel_gradient_bounds
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
    "ignored_option",
    "key_permutation",
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


# The wording of options-applied's failures; :func:`ignored_option` reads it back (the exit
# gate names the option).
_UNCHANGED = " did not change the output where it changes the exact answer"
_IGNORES = "the kernel ignores the option there"


def ignored_option(reason: str) -> str | None:
    """The option an options-applied failure found ignored (``"softcap=4.034"``, ``"sinks"``),
    or ``None``: another failure, or one where the output is wrong without the option too (it
    cannot be told whether the option is applied)."""
    label, sep, rest = reason.partition(_UNCHANGED)
    return label if sep and _IGNORES in rest else None


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
        # Four significant digits, as a float (softcap=4.034, softcap=1.0).
        cap = float(f"{case.softcap:.4g}")
        variants.append((f"softcap={cap!r}", replace(case, softcap=None)))
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
            said = f"{label}{_UNCHANGED} (by up to {change:.3g} in O)"
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
            return StructuralResult.failed(f"{said}: {_IGNORES} (without it the output is right)")
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
