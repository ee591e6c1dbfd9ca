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

A call that raises (an exception, a declined input) marks that class unsupported and keeps its
message (reported with the contract); an output of the wrong shape counts as running (it is
judged, as BAD-OUTPUT, later). A call that hangs (a ``runner`` with a time limit answers
``TIMEOUT``) or kills its process (a segfault, ``os._exit``, an illegal memory access) is not a
contract: on the base shape it means the kernel cannot run at all, later it keeps the class in
the contract so that the campaign records the hang or the crash where it happens. (A kernel
that died on odd lengths had the probe narrow its contract to multiples of 16, and passed.)
After either, the next call runs in a fresh process: the base shape is called there first, so
that the next shape's time is its own and not the process's start (which read as a compile).
Only classes the contract left undeclared are probed, once per kernel, device and process.

Compile keys (:mod:`flashcheck.harness.adapters.compilekeys`): unless the contract declares
them, the base shape is called a second time; a kernel whose first call is not markedly slower
than the repeat has none, and is probed as above (one call more, nothing else changes). One
that compiles is probed on shapes that each change as few dimensions of the base as possible
and repeat none: each other dtype; ``Nq != Nk`` both ways at a ragged length (the base length
plus one), which settles the ragged and the unequal lengths together where it runs (else the
ragged length 17 alone, then ``Nq != Nk`` at twice the base length); ``dv`` alone, then the head
dim, in the other regime (64 or 128: ``head_dims`` stays "any" if it runs); every option on the
base shape. That is about seven first calls (the base shape, two dtypes, two lengths, one head
dim, causal) instead of one per probe shape (about twenty), and the times of those very calls
say which dimensions are keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..cases.case import Case
from ..cases.families import HEAD_DIMS, Recipe, make_case
from ..core.status import Status
from .adapter import ALL_DTYPES, ALL_MASKS, NO_TENSOR, Kernel
from .compilekeys import CallTimes, compile_cost, infer_keys
from .outcome import Outcome, call_kernel, died
from .ragged_probe import probe_ragged
from .softmax_options import SOFTMAX_OPTIONS

__all__ = ["Runner", "default_probe_device", "probe", "resolved"]

# Calls the kernel on one case: in this process by default, or in an isolated worker with a
# time limit (``TIMEOUT`` when the kernel hangs).
Runner = Callable[[Case], Outcome]
Clock = Callable[[], float]

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
    """A probe call ran past the runner's time limit, or killed its process; its message
    says which ("it hung: ...", "it killed its process: ...")."""


class _Ran(Exception):
    """A probe call returned something that is not an attention output: it ran (judged as
    BAD-OUTPUT by the campaign)."""


def _message(text: str) -> str:
    # (long enough for an import error with the user's file and line, which a kernel that ran
    # on no input gives as its only reason; 160 cut it at "(at /tmp/...")
    text = text.strip().replace("\n", " ")
    return text if len(text) <= 320 else text[:317] + "..."


class _Prober:
    def __init__(self, kernel: Kernel, device: str, runner: Runner | None, clock: Clock):
        self.kernel, self.device, self.clock = kernel, device, clock
        self.runner = runner or (lambda case: call_kernel(kernel.run, case, device))
        self.seconds = 0.0  # of the last call
        # (the values of COMPILE_DIMS, seconds) of every call that ran, in order
        self.calls: list[tuple[tuple[object, ...], float]] = []
        # For a compiling kernel: every answer by input, so that no shape is called twice.
        self.memo: dict[tuple, tuple[str, str]] | None = None
        self.base: tuple[str, int, int] = ("", 0, 0)  # (dtype, length, head dim) it runs
        self.notes: list[tuple[str, str]] = []  # (input class, why) of each rejection
        self.fresh = False  # the last call hung or crashed: the next runs in a new process

    def check(self, what: str, **shape: Any) -> bool:
        """Whether the kernel runs on this input (in the base dtype unless ``dtype=``);
        a rejection's reason goes to :attr:`notes` under ``what``. A hang or a wrong output
        counts as running: inside the contract, judged by the campaign."""
        try:
            why = self.attempt(shape.pop("dtype", self.base[0]), **shape)
        except (_Hung, _Ran):
            return True
        if why:
            self.notes.append((what, why))
        return not why

    def attempt(self, dtype: str, b=1, hq=1, hk=1, nq=16, nk=16, d=64, dv=None, **opts) -> str:
        """'' if the kernel runs on this input, else why not; :class:`_Hung` or :class:`_Ran`
        for a hang or a wrong output."""
        dv = d if dv is None else dv
        memo_key = (dtype, b, hq, hk, nq, nk, d, dv, repr(sorted(opts.items())))
        if self.memo is not None and memo_key in self.memo and "mask" not in opts:
            kind, why = self.memo[memo_key]
        else:
            kind, why = self._call(dtype, b, hq, hk, nq, nk, d, dv, opts)
            if self.memo is not None:
                self.memo[memo_key] = (kind, why)
        if kind == "hung":
            raise _Hung(why)  # (a hang, or a crash: "it killed its process: ...")
        if kind == "ran":
            raise _Ran(why)
        return why

    def _call(self, dtype: str, b, hq, hk, nq, nk, d, dv, opts) -> tuple[str, str]:
        rec = Recipe(dtype, "randn", b, hq, hk, nq, nk, d, dv, seed=0)
        case = make_case(rec)
        if opts:
            case = Case(case.q, case.k, case.v, family="probe", seed=0, **opts)
        if self.fresh and self.base[0]:
            self.fresh = False
            dt0, n0, d0 = self.base
            self.runner(make_case(Recipe(dt0, "randn", 1, 1, 1, n0, n0, d0, d0, seed=0)))
        t0 = self.clock()
        out = self.runner(case)
        self.seconds = self.clock() - t0
        if not isinstance(out, Outcome):
            raise TypeError(f"a probe runner returns an Outcome, got {type(out).__name__}")
        if out.status is Status.TIMEOUT or died(out):
            self.fresh = True
            what = "it hung" if out.status is Status.TIMEOUT else "it killed its process"
            return "hung", f"{what}: {out.message}"
        if out.status is Status.BAD_OUTPUT and NO_TENSOR not in out.message:
            return "ran", out.message  # a wrong shape: judged (BAD-OUTPUT) where it happens
        if out.ok:
            causal = bool(opts.get("causal", False))
            self.calls.append(((dtype, nq, nk, d, dv, causal), self.seconds))
            return "ok", ""
        # Any other outcome (an exception, a declined input) marks the input class unsupported.
        return "no", _message(out.message) or str(out.status)


def resolved(
    kernel: Kernel,
    device: str | None = None,
    runner: Runner | None = None,
    *,
    clock: Clock = time.perf_counter,
) -> Kernel:
    """``kernel`` with every contract field known: itself if nothing is pending, else probed
    on ``device`` (default: CUDA if the kernel and the machine have it, else the CPU)."""
    return probe(kernel, device, runner, clock=clock) if kernel.pending else kernel


def probe(
    kernel: Kernel,
    device: str | None = None,
    runner: Runner | None = None,
    *,
    clock: Clock = time.perf_counter,
) -> Kernel:
    """``kernel`` with its pending contract fields discovered on ``device`` (see the module
    docstring); a kernel that runs on no probe input gets no dtypes, and the reason.
    ``runner(case)`` calls the kernel and answers its
    :class:`~flashcheck.harness.adapters.outcome.Outcome` (default: in this process), e.g. in an
    isolated worker with a time limit (``TIMEOUT`` for a hang). ``clock()`` gives the seconds
    the calls are timed with (compile keys)."""
    device = device or default_probe_device(kernel)
    key = (kernel.name, id(kernel.fn), device, kernel.pending, kernel.dtypes, kernel.head_dims)
    if key not in _CACHE and (kernel.layout != "dense" or kernel.op != "attention"):
        # A ragged layout or a merge: probed in its own layout, in this process.
        _CACHE[key] = probe_ragged(kernel, device)
    if key not in _CACHE:
        _CACHE[key] = _probe(kernel, device, runner, clock)
    return _CACHE[key]


def _candidates(kernel: Kernel) -> tuple[str, ...]:
    return tuple(dt for dt in ALL_DTYPES if dt in kernel.dtypes) or ALL_DTYPES


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


def _probe(kernel: Kernel, device: str, runner: Runner | None, clock: Clock) -> Kernel:
    p = _Prober(kernel, device, runner, clock)
    todo = kernel.pending
    # (pending dtypes: those still possible, every one unless a caller narrowed them to what
    # it will run; a compiling kernel pays a compile per dtype probed)
    dtypes = kernel.dtypes if "dtypes" not in todo else _candidates(kernel)
    lengths = (kernel.seq_multiple,) if "seq_multiple" not in todo else BASE_LENGTHS
    dims = BASE_DIMS if kernel.head_dims is None else kernel.head_dims
    try:
        base, first_error = _base(p, dtypes, lengths, dims)
    except _Hung as err:
        return _no_run(kernel, str(err))
    if base is None:
        return _no_run(kernel, first_error)
    p.base = base
    times = _time_base(p) if "compile_keys" in todo else None
    keys: tuple[str, ...] = ()
    out = None
    if "compile_keys" not in todo and kernel.compile_keys:
        out = _contract(p, todo, keyed=True)  # declared: probed on as few shapes as possible
    if times is not None and times.compiles:
        p.memo = {}
        out = _contract(p, todo, keyed=True)
        keys = infer_keys(p.calls, times)
        if not keys:
            # The first call was slow for another reason (imports, a CUDA context) and no new
            # shape compiled: probed as any other kernel, for the same contract.
            p.memo, p.notes, out = None, [], None
    if out is None:
        out = _contract(p, todo, keyed=False)
    if "compile_keys" in todo:
        cost = round(compile_cost(p.calls, times), 3) if keys and times else 0.0
        out.update(compile_keys=keys, compile_seconds=cost)
    return replace(kernel, **out, unsupported=tuple(p.notes), pending=frozenset())


def _contract(p: _Prober, todo: frozenset[str], *, keyed: bool) -> dict[str, Any]:
    """The pending contract fields but compile keys, probed from the base shape: for a
    compiling kernel (``keyed``) on as few new shapes as possible (see the module)."""
    dt0, n0, d0 = p.base
    out: dict[str, Any] = {}
    check = p.check
    if "dtypes" in todo:
        out["dtypes"] = tuple(
            dt
            for dt in _candidates(p.kernel)
            if dt == dt0 or check(dt, dtype=dt, nq=n0, nk=n0, d=d0)
        )
    m = _probe_lengths(p, todo, keyed, out)
    # Where a compiling kernel is probed: on the base shape, which it has compiled already.
    s = n0 if keyed else m
    _probe_dims(p, todo, keyed, m, out)
    if "unequal_lengths" in todo and "unequal_lengths" not in out:
        out["unequal_lengths"] = check("Nq != Nk", nq=s, nk=2 * s, d=d0) and check(
            "Nq != Nk", nq=2 * s, nk=s, d=d0
        )
    if "gqa" in todo:
        # Two key heads as well as one: a kernel that leaves the heads to broadcasting (a
        # matmul over q's 2 heads and k's 1) passes with one key head and fails with 4 query
        # heads over 2 key heads.
        out["gqa"] = check("grouped-query heads", hq=2, hk=1, nq=s, nk=s, d=d0) and check(
            "grouped-query heads", hq=4, hk=2, nq=s, nk=s, d=d0
        )
    if "batched" in todo:
        out["batched"] = check("batch and heads > 1", b=2, hq=2, hk=2, nq=s, nk=s, d=d0)
    if "masks" in todo or "options" in todo:
        ok = _probe_options(p.kernel, check, s, d0)
        if "masks" in todo:
            out["masks"] = frozenset(ok & ALL_MASKS)
            # softcap/sinks the signature names but the kernel does not run with are dropped
            soft = (p.kernel.options or frozenset()) & SOFTMAX_OPTIONS
            if soft - ok and "options" not in todo:
                out["options"] = p.kernel.options - (soft - ok)
        if "options" in todo:
            out["options"] = frozenset(ok)
    return out


def _time_base(p: _Prober) -> CallTimes | None:
    """The base shape's first call (just made) and a repeat, or ``None`` if the repeat hangs
    or gives a wrong output."""
    dt0, n0, d0 = p.base
    first = p.seconds if p.calls else 0.0
    try:
        p.attempt(dt0, nq=n0, nk=n0, d=d0)
    except (_Hung, _Ran):
        return None
    return CallTimes(first, p.seconds)


def _probe_lengths(p: _Prober, todo: frozenset[str], keyed: bool, out: dict[str, Any]) -> int:
    """``seq_multiple`` into ``out`` if pending (for a compiling kernel, ``unequal_lengths``
    with it where one pair of calls settles both); returns the sequence-length multiple."""
    dt0, n0, d0 = p.base
    m = p.kernel.seq_multiple
    if keyed and {"seq_multiple", "unequal_lengths"} <= todo:
        # A compiling kernel pays for each length: Nq != Nk both ways at a ragged length
        # settles both classes in two calls if it runs (a refusal is probed class by class).
        if _runs(p, dt0, nq=n0, nk=n0 + 1, d=d0) and _runs(p, dt0, nq=n0 + 1, nk=n0, d=d0):
            out["seq_multiple"], out["unequal_lengths"] = 1, True
            return 1
    if "seq_multiple" in todo:
        # A compiling kernel pays for each length: one ragged length says enough.
        if all(p.check(f"sequence length {n}", nq=n, nk=n, d=d0) for n in RAGGED[: 2 - keyed]):
            m = 1
        else:
            # The smaller base lengths failed with every head dim and dtype: n0 is the multiple.
            # The ragged length's message stays in the notes: it says why.
            m = n0
        out["seq_multiple"] = m
    return m


def _probe_dims(p: _Prober, todo: frozenset[str], keyed: bool, m: int, out: dict) -> None:
    """``head_dims`` and ``distinct_dv`` into ``out`` (those pending): every head dim of the
    families on ``m x m``, or for a compiling kernel the other regime (64 or 128) only, after
    ``dv`` alone (its time tells ``dv`` from ``d`` before both change together)."""
    dt0, n0, d0 = p.base
    if keyed:
        other = 128 if d0 <= 64 else 64
        if "distinct_dv" in todo:
            out["distinct_dv"] = p.check("dv != d", nq=n0, nk=n0, d=d0, dv=other)
        if "head_dims" in todo:
            ok = p.check(f"head dim {other}", nq=n0, nk=n0, d=other)
            out["head_dims"] = None if ok else (d0,)
        return
    if "head_dims" in todo:
        out["head_dims"] = _probe_head_dims(p, dt0, d0, m, p.notes)
    dims_ok = out.get("head_dims", p.kernel.head_dims) or HEAD_DIMS
    if "distinct_dv" in todo:
        other = next((x for x in sorted(dims_ok, key=lambda x: abs(x - d0)) if x != d0), None)
        out["distinct_dv"] = other is not None and p.check("dv != d", nq=m, nk=m, d=d0, dv=other)


def _runs(p: _Prober, dtype: str, **shape: Any) -> bool:
    """Whether the kernel runs on this input (a hang or a wrong output counts as running)."""
    try:
        return not p.attempt(dtype, **shape)
    except (_Hung, _Ran):
        return True


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
        "softcap": {"softcap": 2.0},
        "sinks": {"sinks": np.zeros(1, np.float32)},
    }
    return {opt for opt in offered if check(opt, nq=m, nk=m, d=d0, **trials[opt])}
