"""Discovering the contract of a kernel of a ragged layout (or a merge) on tiny inputs.

As the dense probe (:mod:`flashcheck.harness.adapters.probe`) does, one input class at a time
from the first input the kernel runs, but on tiny batches in the kernel's own layout: two
sequences (one of them without keys) for varlen, two sequences in pages of 4 slots for paged,
three splits with an empty one for the merge. A varlen or paged kernel is probed for its
dtypes, head dims (16, 32, 64, 128), ``dv != d``, grouped-query heads and each of causal,
window and an explicit scale its signature takes; a merge for the formats of its partials. A
call that raises or declines marks that class unsupported, with its message; a call that
returns the wrong shape counts as running (it is judged, as BAD-OUTPUT, where it happens); so
does one stopped by its time limit (:mod:`.call_limit`), except on the first input, where it
means that the kernel cannot run at all.
Whether the kernel returns LSE is not part of the contract: the checks judge it when it does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..cases.ragged import RaggedCase
from ..cases.ragged_inputs import combine_case, paged_case, varlen_case
from ..core.status import Status
from .adapter import ALL_DTYPES, Kernel
from .outcome import call_kernel
from .ragged_call import call_ragged, kernel_layout, ragged_output

__all__ = ["probe_ragged"]

PROBE_DIMS = (64, 16, 32, 128)


def _case(layout: str, dtype: str, d: int = 16, dv: int | None = None, **opts: Any) -> RaggedCase:
    if layout == "combine":
        return combine_case(3, (2, 2), dv=8, dtype=dtype, all_empty_rows=0)
    shape = {"dtype": dtype, "d": d, "dv": dv, "hq": opts.pop("hq", 1), "hk": 1, **opts}
    if layout == "varlen":
        return varlen_case([3, 2], [5, 0], **shape)
    return paged_case([5, 2], nq=2, page_size=4, **shape)


class _RaggedProber:
    def __init__(self, kernel: Kernel, device: str):
        self.kernel, self.device = kernel, device
        self.layout = kernel_layout(kernel)
        self.notes: list[tuple[str, str]] = []
        self.hung = ""  # why the last call was stopped by its time limit ('' if it was not)

    def runs(self, what: str, dtype: str, **shape: Any) -> bool:
        case = _case(self.layout, dtype, **shape)
        out = call_kernel(
            lambda: ragged_output(self.kernel, case, call_ragged(self.kernel, case, self.device))
        )
        self.hung = out.message if out.status is Status.TIMEOUT else ""
        if out.ok or out.status in (Status.BAD_OUTPUT, Status.TIMEOUT):
            return True
        why = out.message.strip().replace("\n", " ")
        self.notes.append((what, why if len(why) <= 160 else why[:157] + "..."))
        return False


def probe_ragged(kernel: Kernel, device: str) -> Kernel:
    """``kernel`` (of a ragged layout, or a merge) with its pending contract fields found on
    ``device`` (module docstring); a kernel that runs on no probe input gets no dtypes."""
    p = _RaggedProber(kernel, device)
    todo = kernel.pending
    candidates = kernel.dtypes if "dtypes" not in todo else ALL_DTYPES
    dims = kernel.head_dims or PROBE_DIMS
    base = next(
        ((dt, d) for d in dims[:2] for dt in candidates if p.runs(f"{dt} d={d}", dt, d=d)), None
    )
    if base is None or p.hung:
        # A hang on the first input that runs is not a contract: the kernel cannot run at all
        # (as for dense kernels); a hang later keeps its class, judged where it happens.
        why = f"it hung: {p.hung}" if p.hung else p.notes[0][1] if p.notes else "no probe input ran"
        return replace(
            kernel, dtypes=(), pending=frozenset(), unsupported=(("every probe input", why),)
        )
    p.notes.clear()
    dt0, d0 = base
    out: dict[str, Any] = {}
    if "dtypes" in todo:
        out["dtypes"] = tuple(dt for dt in candidates if dt == dt0 or p.runs(dt, dt, d=d0))
    if p.layout != "combine":
        _attention_fields(p, todo, dt0, d0, dims, out)
    return replace(kernel, **out, unsupported=tuple(p.notes), pending=frozenset())


def _attention_fields(p: _RaggedProber, todo, dt0: str, d0: int, dims, out: dict) -> None:
    if "head_dims" in todo:
        found = [d for d in dims if d == d0 or p.runs(f"head dim {d}", dt0, d=d)]
        out["head_dims"] = None if len(found) == len(dims) else tuple(sorted(found))
    if "distinct_dv" in todo:
        out["distinct_dv"] = p.runs("dv != d", dt0, d=d0, dv=d0 // 2 or 1)
    if "gqa" in todo:
        out["gqa"] = p.runs("grouped-query heads", dt0, d=d0, hq=2)
    if "masks" in todo or "options" in todo:
        offered = p.kernel.options if p.kernel.options is not None else {"causal", "scale"}
        trials = {"causal": {"causal": True}, "window": {"window": (2, 0)}, "scale": {"scale": 0.5}}
        if p.layout == "paged":
            trials.pop("window")
        ok = {opt for opt in offered if opt in trials and p.runs(opt, dt0, d=d0, **trials[opt])}
        if "masks" in todo:
            out["masks"] = frozenset(ok - {"scale"})
        if "options" in todo:
            out["options"] = frozenset(ok)
