"""The gradient check of a varlen kernel with a backward, on one varlen :class:`RaggedCase`.

The kernel's backward runs once on the whole packed batch for an upstream ``dO`` drawn from a
hash of the case's inputs (:func:`varlen_grad_output`: a replay draws the same one). Its
``dQ``, ``dK``, ``dV`` are cut into sequences, and each sequence is judged as the dense
gradient check judges a dense case (:func:`~.accuracy.check_gradients_case`: the oracle's
gradients with that sequence's ``dO``, the gradient bounds of the kernel's
``backward_arithmetic`` with the sequence's own lengths, the naive backward). Every packed key
row belongs to one sequence, so a backward that sums a sequence's dK or dV over another
sequence's query rows fails on the sequence whose rows it wrote.

Gradients whose exact value is 0 whatever the bounds: the keys of a sequence with no query rows
(nothing attends to them) and the query rows of a sequence with no keys; anything else there
(a leftover of ``torch.empty``, a neighbour's sum) is FAIL-HARD.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..adapters.adapter import Kernel, KernelGradients, score_magnitude
from ..adapters.probe import default_probe_device
from ..adapters.ragged_backward import call_varlen_backward, varlen_gradients
from ..adapters.registry import as_kernel
from ..cases.case import Case
from ..cases.ragged import RaggedCase
from ..cases.ragged_store import save_ragged_case
from ..core.status import Status
from . import array_checks
from .accuracy import check_gradients_case
from .check_results import GradientCheckResult, Replayable
from .ragged_references import GradientSequenceReference, gradient_reference
from .raised import saved_if_raised
from .text import format_reason_groups

__all__ = [
    "RaggedGradientResult",
    "check_gradients",
    "check_ragged_gradients",
    "check_varlen_gradients",
    "gradient_sequences",
    "varlen_backward_supports",
    "varlen_grad_output",
    "worst_gradient_util",
]

_NAMES = {"dq": "dQ", "dk": "dK", "dv": "dV"}


@dataclass(repr=False)
class RaggedGradientResult(Replayable):
    """One varlen kernel's gradients judged on one varlen case.

    ``do``: the upstream gradient ``(total_q, Hq, dv)``; ``grads``: the kernel's ``dQ``,
    ``dK``, ``dV`` in the packed layout (exact float64); ``sequences``: the dense
    :class:`~.accuracy.GradientCheckResult` of each sequence (``None`` for a sequence with no
    query rows or no keys, whose gradients are exactly 0: ``zero_reasons`` says where they are
    not); ``verdict``: the worst; ``reasons``: each failure, prefixed by its sequence."""

    kernel: str
    device: str
    case: RaggedCase
    do: np.ndarray
    grads: KernelGradients
    sequences: list[GradientCheckResult | None] = field(default_factory=list)
    zero_reasons: list[str] = field(default_factory=list)
    case_id: str | None = None
    case_dir: str | None = None

    @property
    def verdict(self) -> Status:
        seq = [r.verdict for r in self.sequences if r is not None]
        return Status.worst([*seq, *([Status.FAIL_HARD] if self.zero_reasons else [])])

    @property
    def passed(self) -> bool:
        return self.verdict == Status.PASS

    @property
    def reasons(self) -> list[str]:
        out = list(self.zero_reasons)
        for head, rs in self.reasons_by_sequence():
            out += [f"{head}, {r}" if r.startswith("worst element") else f"{head}: {r}" for r in rs]
        return out

    def reasons_by_sequence(self) -> list[tuple[str, list[str]]]:
        """Each failing sequence's heading (index and lengths) and its reasons, each led by
        the worst element of the gradient it is about."""
        out = []
        for b, res in enumerate(self.sequences):
            if res is None or res.passed:
                continue
            nq, nk = self.case.lengths(b)
            rs = []
            for name, tv in res.verdicts.items():
                if tv.verdict == Status.PASS:
                    continue
                at = f"worst element {self._element(b, name, tv.worst)}: " if tv.worst else ""
                rs += [at + r for r in tv.reasons]
            out.append((f"sequence {b} (Nq={nq}, Nk={nk})", rs))
        return out

    def _element(self, b: int, name: str, worst: list[dict[str, Any]]) -> str:
        """The worst element in the packed layout's indices."""
        _, h, i, c = worst[0]["index"]
        cu = self.case.index["cu_seqlens_q" if name == "dq" else "cu_seqlens_k"]
        what = "query" if name == "dq" else "key"
        return f"{_NAMES.get(name, name)}[{int(cu[b]) + i}, {h}, {c}] ({what} {i} of the sequence)"

    def __str__(self) -> str:
        lines = [f"kernel {self.kernel} on {self.device}: {self.case.describe()}"]
        lines += [f"gradients {self.verdict}", *(f"  - {r}" for r in self.zero_reasons)]
        lines += format_reason_groups(self.reasons_by_sequence())
        return "\n".join(lines + ([f"replay: {self.replay}"] if self.replay else []))

    def as_dict(self) -> dict[str, Any]:
        """The verdict as stored: status, reasons, and each sequence's dense verdicts."""
        return {
            "verdict": str(self.verdict),
            "reasons": self.reasons,
            "sequences": [None if r is None else r.as_dict() for r in self.sequences],
        }


def varlen_grad_output(case: RaggedCase) -> np.ndarray:
    """``dO (total_q, Hq, dv)`` of a varlen gradient check: standard normal values in the
    inputs' format, drawn from a seed that is a hash of the case's bits and prefix sums, so the
    same case always gets the same ``dO``."""
    h = hashlib.sha256()
    for name in ("q", "k", "v"):
        h.update(case.bits(name).tobytes() + str(case.tensors[name].shape).encode())
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        h.update(case.index[name].astype(np.int64).tobytes())
    rng = np.random.default_rng(int.from_bytes(h.digest()[:8], "little"))
    q, v = case.tensors["q"], case.tensors["v"]
    return rng.standard_normal((*q.shape[:2], v.shape[2])).astype(np.float32).astype(q.dtype)


def varlen_backward_supports(adapter: Kernel, case: RaggedCase) -> str | None:
    """Why the gradients of ``case`` are outside ``adapter``'s backward contract (no backward,
    not varlen, scores past its ``backward_score_limit``), or ``None``."""
    if adapter.backward is None:
        return f"{adapter.name} declares no backward"
    if case.layout != "varlen":
        return f"gradients are checked on varlen cases, the case is {case.layout}"
    limit = adapter.backward_score_limit
    if limit is not None:
        mag = max((score_magnitude(case.sequence(b)) for b in range(case.sequences)), default=0)
        if mag >= limit:
            return f"scores reach {mag:.3g} >= the backward's limit {limit:.3g}"
    return None


def _zero_reasons(case: RaggedCase, grads: KernelGradients, b: int) -> list[str]:
    """Where a sequence with no rows or no keys has gradients that are not exactly 0."""
    nq, nk = case.lengths(b)
    rows, keys = case.batch.query_rows(b), case.batch.key_rows(b)
    must = [("dq", grads.dq[rows])] if nk == 0 else []
    if nq == 0:
        must += [("dk", grads.dk[keys]), ("dv", grads.dv[keys])]
    out = []
    for name, g in must:
        bad = np.argwhere(~(g == 0))
        if bad.size:
            i, h, c = (int(x) for x in bad[0])
            start = rows.start if name == "dq" else keys.start
            out.append(
                f"sequence {b} (Nq={nq}, Nk={nk}): {_NAMES[name]}[{start + i}, {h}, {c}] = "
                f"{float(g[i, h, c])!r} where the exact gradient is 0 ({len(bad)} such elements): "
                + ("the sequence has no keys" if name == "dq" else "no query attends to its keys")
            )
    return out


def _dense(x: np.ndarray, rows: slice) -> np.ndarray:
    return np.ascontiguousarray(x[rows].transpose(1, 0, 2)[None])


def gradient_sequences(case: RaggedCase) -> dict[int, Case]:
    """The sequences of the varlen ``case`` whose gradients are judged against the oracle
    (those with query rows and keys), by index, each as the dense case it is with its rows
    of the case's ``dO`` (:func:`varlen_grad_output`)."""
    if case.layout != "varlen":
        raise ValueError(f"gradients are checked on varlen cases, the case is {case.layout}")
    do = varlen_grad_output(case)
    out = {}
    for b in range(case.sequences):
        nq, nk = case.lengths(b)
        if nq and nk:
            rows = case.batch.query_rows(b)
            out[b] = case.sequence(b).with_grad_output(_dense(do, rows).astype(do.dtype))
    return out


def check_varlen_gradients(
    adapter: Kernel,
    case: RaggedCase,
    *,
    device: str = "cpu",
    references: Callable[[int], GradientSequenceReference] | None = None,
) -> RaggedGradientResult:
    """Judge ``adapter``'s varlen backward on ``case`` (module docstring); ``ValueError`` where
    the case is outside its backward's contract (:func:`varlen_backward_supports`).
    ``references(b)``, where given, returns the
    :class:`~.ragged_references.GradientSequenceReference` of sequence ``b`` of
    :func:`gradient_sequences` computed elsewhere (called after the backward ran; it may wait
    for a pool); without it each is computed here."""
    why = varlen_backward_supports(adapter, case)
    if why:
        raise ValueError(f"gradients of this case are outside {adapter.name}'s contract: {why}")
    do = varlen_grad_output(case)
    grads = varlen_gradients(adapter, case, call_varlen_backward(adapter, case, do, device))
    res = RaggedGradientResult(adapter.name, device, case, do, grads)
    seqs = gradient_sequences(case)
    for b in range(case.sequences):
        if b not in seqs:
            res.sequences.append(None)
            res.zero_reasons += _zero_reasons(case, grads, b)
            continue
        rows, keys = case.batch.query_rows(b), case.batch.key_rows(b)
        if references is None:
            pre = gradient_reference(
                seqs[b],
                arithmetic=adapter.backward_arithmetic,
                key_block=adapter.key_block,
                tanh=adapter.tanh,
            )
        else:
            pre = references(b)
        got = KernelGradients(
            _dense(grads.dq, rows), _dense(grads.dk, keys), _dense(grads.dv, keys), case.dtype
        )
        res.sequences.append(
            check_gradients_case(
                adapter,
                seqs[b],
                device=device,
                grads=got,
                ref=pre.ref,
                naive=pre.naive,
                bounds=pre.bounds,
            )
        )
    return res


def worst_gradient_util(res: RaggedGradientResult) -> float | None:
    """The largest deterministic-bound utilization over the judged sequences' gradients."""
    utils = [
        tv.det_util
        for r in res.sequences
        if r is not None
        for tv in r.verdicts.values()
        if not math.isnan(tv.det_util)
    ]
    return max(utils) if utils else None


def check_ragged_gradients(
    kernel: Any,
    case: RaggedCase,
    *,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> RaggedGradientResult:
    """Judge the gradients of ``kernel`` (declared with ``flashcheck.kernel(fn,
    layout="varlen", backward=...)``) on a varlen :class:`RaggedCase` (module docstring);
    ``device``, ``save`` and ``case_dir`` as for :func:`flashcheck.check`. A saved case
    replays its accuracy check and this gradient check (``flashcheck replay``)."""
    if save not in ("failure", "always", "never"):
        raise ValueError(f"save must be 'failure', 'always' or 'never', got {save!r}")
    adapter = as_kernel(kernel)
    device = device or default_probe_device(adapter)

    def write(verdict: dict[str, Any], reasons: list[str]) -> str:
        findings = [f"gradients: {r}" for r in reasons[:1]]
        context = {"property": "gradients", "api": "check_gradients", "findings": findings}
        return save_ragged_case(
            case,
            kernel=adapter.name,
            device=device,
            context=context,
            directory=case_dir,
            gradient_verdict=verdict,
        )

    with saved_if_raised(save, lambda verdict: write(verdict, [verdict["message"]]), case_dir):
        res = check_varlen_gradients(adapter, case, device=device)
    if save == "always" or (save == "failure" and not res.passed):
        res.case_id = write(res.as_dict(), res.reasons)
        res.case_dir = None if case_dir is None else os.fspath(case_dir)
    return res


def check_gradients(kernel: Any, q: Any, k: Any = None, v: Any = None, **options: Any) -> Any:
    """``flashcheck.check_gradients``: :func:`check_ragged_gradients` when ``q`` is a varlen
    :class:`RaggedCase` (``options``: ``device``, ``save``, ``case_dir`` only; the case
    carries its own), else the dense :func:`~.array_checks.check_gradients` with the same
    arguments."""
    if not isinstance(q, RaggedCase):
        return array_checks.check_gradients(kernel, q, k, v, **options)
    extra = sorted(set(options) - {"device", "save", "case_dir"})
    if k is not None or v is not None or extra:
        raise ValueError(
            f"a RaggedCase carries its inputs and options: pass it alone (with device=, save=, "
            f"case_dir=), not {extra or 'k, v'}"
        )
    return check_ragged_gradients(kernel, q, **options)
