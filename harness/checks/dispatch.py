"""``flashcheck.check`` and ``flashcheck.call``: a dense case to the dense check, a
:class:`~flashcheck.harness.cases.ragged.RaggedCase` to the ragged one, whose result carries
the bug class its failure is consistent with (:mod:`.ragged_diagnosis`), as the report and the
property suite give it."""

from __future__ import annotations

import os
from typing import Any

from ..adapters.probe import default_probe_device
from ..adapters.ragged_call import call_ragged
from ..adapters.registry import as_kernel
from ..cases.ragged import RaggedCase
from ..cases.ragged_store import save_ragged_case
from . import array_checks
from .ragged import RaggedCheckResult, check_ragged_case
from .ragged_diagnosis import diagnose_ragged
from .raised import saved_if_raised

__all__ = ["call", "check", "check_ragged"]


def check_ragged(
    kernel: Any,
    case: RaggedCase,
    *,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
) -> RaggedCheckResult:
    """Judge ``kernel`` (declared with ``flashcheck.kernel(fn, layout=...)`` or ``op=``) on a
    :class:`RaggedCase`; ``device``, ``save`` and ``case_dir`` as for
    :func:`flashcheck.check`."""
    if save not in ("failure", "always", "never"):
        raise ValueError(f"save must be 'failure', 'always' or 'never', got {save!r}")
    adapter = as_kernel(kernel)
    if adapter.layout == "dense" and adapter.op == "attention":
        raise ValueError(
            f"{adapter.name} is declared for dense (B, H, N, d) inputs but the case is "
            f"{case.layout}: declare it with flashcheck.kernel(fn, "
            + ("op='combine')" if case.layout == "combine" else f"layout={case.layout!r})")
        )
    device = device or default_probe_device(adapter)
    context = {"property": "accuracy", "api": "check"}

    def write(verdict: dict[str, Any]) -> str:
        return save_ragged_case(
            case,
            kernel=adapter.name,
            device=device,
            verdict=verdict,
            context=context,
            directory=case_dir,
        )

    with saved_if_raised(save, write, case_dir):
        res = check_ragged_case(adapter, case, device=device)
    if not res.passed:
        res.diagnosis = diagnose_ragged(res, adapter)
    if save == "always" or (save == "failure" and not res.passed):
        res.case_id = write(res.as_dict())
        res.case_dir = None if case_dir is None else os.fspath(case_dir)
    return res


def check(
    kernel: Any,
    q: Any,
    k: Any = None,
    v: Any = None,
    *,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    mask: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    device: str | None = None,
    save: str = "failure",
    case_dir: str | os.PathLike | None = None,
    **descales: Any,
) -> Any:
    """``flashcheck.check``: :func:`check_ragged` when ``q`` is a :class:`RaggedCase` (which
    carries its own options), else the dense check
    :func:`flashcheck.harness.checks.array_checks.check` with the same arguments (FP8 inputs'
    ``descale_q``, ``descale_k``, ``descale_v`` among them)."""
    if not isinstance(q, RaggedCase):
        opts = {"causal": causal, "window": window, "mask": mask, "scale": scale}
        opts.update(softcap=softcap, sinks=sinks, **descales)
        return array_checks.check(
            kernel, q, k, v, device=device, save=save, case_dir=case_dir, **opts
        )
    if k is not None or v is not None:
        raise ValueError("pass either a RaggedCase as q, or the arrays q, k, v; not both")
    if descales:
        raise ValueError(f"{sorted(descales)}: FP8 inputs are dense cases only")
    if softcap is not None or sinks is not None:
        raise ValueError(
            "soft-capping and sinks are not available for ragged layouts yet: check each "
            "sequence as a dense case (RaggedCase.sequence(b)) with softcap= / sinks="
        )
    given = {"causal": causal or None, "window": window, "mask": mask, "scale": scale}
    extra = sorted(name for name, val in given.items() if val is not None)
    if extra:
        raise ValueError(
            f"a RaggedCase carries its own options: build it with {extra} instead of passing "
            "them to check"
        )
    return check_ragged(kernel, q, device=device, save=save, case_dir=case_dir)


def call(kernel: Any, case: Any, *, device: str | None = None) -> Any:
    """``flashcheck.call``: ``kernel`` called on ``case`` as the checks call it, returning what
    it returned; a :class:`RaggedCase` in its layout
    (:func:`~flashcheck.harness.adapters.ragged_call.call_ragged`), a dense case as
    :func:`flashcheck.harness.checks.array_checks.call` does."""
    if not isinstance(case, RaggedCase):
        return array_checks.call(kernel, case, device=device)
    adapter = as_kernel(kernel)
    return call_ragged(adapter, case, device or default_probe_device(adapter)).result
