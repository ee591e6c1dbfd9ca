"""Discovering a plain function's contract by running it on tiny inputs.

A kernel that only takes some shapes (no grouped-query heads, ``Nq == Nk``, lengths a multiple
of 128, power-of-two head dims, fp16 only...) would otherwise turn most generated cases into
errors, and the shapes it does take would be tested less. :func:`probe` calls the kernel on
small N(0, 1) inputs, one input class at a time, starting from the first shape it accepts:

1. a base shape: the smallest sequence length of (16, 32, 64, 128, 256), head dim of
   (64, 128, 32, 16) and dtype the kernel runs without raising;
2. from there, each dtype; ragged lengths (17 and 33) or else the smallest power-of-two
   multiple that works; every head dim of the input families; ``dv != d``; ``Nq != Nk``;
   grouped-query heads; several (batch, head) slices; each mask and an explicit scale its
   signature takes.

A call that gives no value (an exception, a declined input, a crash of its process) marks that
class unsupported and keeps its message (reported with the contract); an output of the wrong
shape counts as running (it is judged, as BAD-OUTPUT, later). A call that hangs (a ``runner``
with a time limit answers ``TIMEOUT``) is not a contract: on the base shape it means the kernel
cannot run at all, later it keeps the class in the contract so that the campaign records the
hang where it happens. Only classes the contract left undeclared are probed, once per kernel,
device and process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..cases.case import Case
from ..cases.families import HEAD_DIMS, Recipe, make_case
from ..core.status import Status
from .adapter import ALL_DTYPES, Kernel
from .outcome import Outcome, call_kernel

__all__ = ["Runner", "default_probe_device", "probe", "resolved"]

# Calls the kernel on one case: in this process by default, or in an isolated worker with a
# time limit (``TIMEOUT`` when the kernel hangs).
Runner = Callable[[Case], Outcome]

BASE_LENGTHS = (16, 32, 64, 128, 256)
BASE_DIMS = (64, 128, 32, 16)
RAGGED = (17, 33)
_CACHE: dict[tuple[Any, ...], Kernel] = {}


def default_probe_device(kernel: Kernel) -> str:
    """CUDA when the kernel runs there and torch sees a GPU, else the CPU."""
    if kernel.api == "torch" and "cuda" in kernel.devices:
        try:
            import torch

            if torch.cuda.is_available():
                return "cuda"
        except ImportError:
            pass
    return "cpu" if "cpu" in kernel.devices else kernel.devices[0]


class _Hung(Exception):
    """A probe call ran past the runner's time limit."""


class _Ran(Exception):
    """A probe call returned something that is not an attention output: it ran (judged as
    BAD-OUTPUT by the campaign)."""


def _message(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= 160 else text[:157] + "..."


class _Prober:
    def __init__(self, kernel: Kernel, device: str, runner: Runner | None):
        self.kernel, self.device = kernel, device
        self.runner = runner or (lambda case: call_kernel(kernel.run, case, device))

    def attempt(self, dtype: str, b=1, hq=1, hk=1, nq=16, nk=16, d=64, dv=None, **opts) -> str:
        """'' if the kernel runs on this input, else why not; :class:`_Hung` or :class:`_Ran`
        for a hang or a wrong output."""
        rec = Recipe(dtype, "randn", b, hq, hk, nq, nk, d, d if dv is None else dv, seed=0)
        case = make_case(rec)
        if opts:
            case = Case(case.q, case.k, case.v, family="probe", seed=0, **opts)
        out = self.runner(case)
        if not isinstance(out, Outcome):
            raise TypeError(f"a probe runner returns an Outcome, got {type(out).__name__}")
        if out.status is Status.TIMEOUT:
            raise _Hung(out.message)
        if out.status is Status.BAD_OUTPUT:
            raise _Ran(out.message)
        if out.ok:
            return ""
        # Any other outcome (an exception, a declined input, a crash) marks the input class
        # unsupported.
        return _message(out.message) or str(out.status)


def resolved(kernel: Kernel, device: str | None = None, runner: Runner | None = None) -> Kernel:
    """``kernel`` with every contract field known: itself if nothing is pending, else probed
    on ``device`` (default: CUDA if the kernel and the machine have it, else the CPU)."""
    return probe(kernel, device, runner) if kernel.pending else kernel


def probe(kernel: Kernel, device: str | None = None, runner: Runner | None = None) -> Kernel:
    """``kernel`` with its pending contract fields discovered on ``device`` (see the module
    docstring); a kernel that runs on no probe input gets no dtypes, and the reason.
    ``runner(case)`` calls the kernel and answers its
    :class:`~flashcheck.harness.adapters.outcome.Outcome` (default: in this process), e.g. in an
    isolated worker with a time limit (``TIMEOUT`` for a hang)."""
    device = device or default_probe_device(kernel)
    key = (kernel.name, id(kernel.fn), device, kernel.pending, kernel.dtypes, kernel.head_dims)
    if key not in _CACHE:
        _CACHE[key] = _probe(kernel, device, runner)
    return _CACHE[key]


def _no_run(kernel: Kernel, why: str) -> Kernel:
    return replace(
        kernel, dtypes=(), pending=frozenset(), unsupported=(("every probe input", why),)
    )


def _base(p: _Prober, dtypes, lengths, dims) -> tuple[tuple[str, int, int] | None, str]:
    """The first ``(dtype, length, head dim)`` the kernel runs, or ``None`` and its first
    complaint; :class:`_Hung` if it hangs."""
    first_error = ""
    try:
        for n in lengths:
            for d in dims:
                for dt in dtypes:
                    why = p.attempt(dt, nq=n, nk=n, d=d)
                    if not why:
                        return (dt, n, d), ""
                    first_error = first_error or why
    except _Ran:
        return (dtypes[0], lengths[0], dims[0]), ""  # it returns something: judged later
    return None, first_error


def _probe(kernel: Kernel, device: str, runner: Runner | None) -> Kernel:
    p = _Prober(kernel, device, runner)
    todo = kernel.pending
    notes: list[tuple[str, str]] = []
    dtypes = kernel.dtypes if "dtypes" not in todo else ALL_DTYPES
    lengths = (kernel.seq_multiple,) if "seq_multiple" not in todo else BASE_LENGTHS
    dims = BASE_DIMS if kernel.head_dims is None else kernel.head_dims
    try:
        base, first_error = _base(p, dtypes, lengths, dims)
    except _Hung as err:
        return _no_run(kernel, f"it hung: {err}")
    if base is None:
        return _no_run(kernel, first_error)
    dt0, n0, d0 = base
    out: dict[str, Any] = {}

    def check(what: str, **shape) -> bool:
        try:
            why = p.attempt(shape.pop("dtype", dt0), **shape)
        except (_Hung, _Ran):
            return True  # it ran (or hung): inside the contract, judged by the campaign
        if why:
            notes.append((what, why))
        return not why

    if "dtypes" in todo:
        out["dtypes"] = tuple(
            dt for dt in ALL_DTYPES if dt == dt0 or check(dt, dtype=dt, nq=n0, nk=n0, d=d0)
        )
    m = kernel.seq_multiple
    if "seq_multiple" in todo:
        if all(check(f"sequence length {n}", nq=n, nk=n, d=d0) for n in RAGGED):
            m = 1
        else:
            # The smaller base lengths failed with every head dim and dtype: n0 is the multiple.
            # The ragged length's message stays in the notes: it says why.
            m = n0
        out["seq_multiple"] = m
    if "head_dims" in todo:
        out["head_dims"] = _probe_head_dims(p, dt0, d0, m, notes)
    dims_ok = out.get("head_dims", kernel.head_dims) or HEAD_DIMS
    if "distinct_dv" in todo:
        other = next((x for x in sorted(dims_ok, key=lambda x: abs(x - d0)) if x != d0), None)
        out["distinct_dv"] = other is not None and check("dv != d", nq=m, nk=m, d=d0, dv=other)
    if "unequal_lengths" in todo:
        out["unequal_lengths"] = check("Nq != Nk", nq=m, nk=2 * m, d=d0) and check(
            "Nq != Nk", nq=2 * m, nk=m, d=d0
        )
    if "gqa" in todo:
        out["gqa"] = check("grouped-query heads", hq=2, hk=1, nq=m, nk=m, d=d0)
    if "batched" in todo:
        out["batched"] = check("batch and heads > 1", b=2, hq=2, hk=2, nq=m, nk=m, d=d0)
    if "masks" in todo or "options" in todo:
        ok = _probe_options(kernel, check, m, d0)
        if "masks" in todo:
            out["masks"] = frozenset(ok - {"scale"})
        if "options" in todo:
            out["options"] = frozenset(ok)
    return replace(kernel, **out, unsupported=tuple(notes), pending=frozenset())


def _probe_head_dims(p: _Prober, dt0: str, d0: int, m: int, notes: list) -> tuple | None:
    """The head dims of :data:`HEAD_DIMS` the kernel runs (``None``: all of them); the first
    rejection's reason goes to ``notes``."""
    found, rejected, why0 = [], [], ""
    for x in HEAD_DIMS:
        try:
            why = "" if x == d0 else p.attempt(dt0, nq=m, nk=m, d=x)
        except (_Hung, _Ran):
            why = ""
        (rejected if why else found).append(x)
        why0 = why0 or why
    if rejected:
        notes.append((f"head dims {rejected}", why0))
    return tuple(found) if rejected else None


def _probe_options(kernel: Kernel, check: Callable[..., bool], m: int, d0: int) -> set[str]:
    """The options among those the signature offers that the kernel runs with: each tried
    alone on an ``m × m`` case (an explicit mask keeps about 70 % of the keys and key 0)."""
    offered = (
        kernel.options
        if kernel.options is not None
        else frozenset({"causal", "window", "mask", "scale"})
    )
    rng = np.random.default_rng(0)
    keep = rng.random((1, 1, m, m)) < 0.7
    keep[..., 0] = True
    trials = {
        "causal": {"causal": True},
        "window": {"window": (min(4, m), 0)},
        "mask": {"mask": keep},
        "scale": {"scale": 0.5},
    }
    return {opt for opt in offered if check(opt, nq=m, nk=m, d=d0, **trials[opt])}
