"""Shared parametrisation of the property suite: case sizes per profile, draws inside a contract.

The kernels and dtypes under test come from the pytest plugin
(:mod:`flashcheck.properties.plugin`): every test takes the ``flashcheck_kernel``,
``flashcheck_dtype`` and ``flashcheck_device`` fixtures.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, Phase, settings

from ..harness.cases.families import Recipe, make_case
from .plugin import compile_notice, palette_size, profile_name
from .strategies import (
    cases,
    contract_limits,
    softmax_options_taken,
    with_drawn_softmax_options,
)

__all__ = [
    "MAX_LEN",
    "MAX_WORK",
    "case_strategy",
    "family_outside_contract",
    "fewer",
    "no_softmax_options",
    "run_or_fail",
    "slow_ok",
]

# Lengths up to 129 cover the 16/32/64/128 block edges; the hand-run profiles reach 1025.
MAX_LEN = {"thorough": 1025, "sweep": 1025}
# B·Hq·Nq·Nk per example: the Triton interpreter runs ~1 s per 40k score elements on CPU.
MAX_WORK = {"thorough": 1 << 19, "sweep": 1 << 19}


def case_strategy(kernel: Any, dtype: str, *, softmax_options: bool = False, **kw: Any):
    """Cases for ``kernel`` in ``dtype``, inside its contract (a compiling kernel's keys from
    its palette, ``--flashcheck-palette``); ``kw`` narrows further (``masks=()`` drops every
    mask, ``families=...``, ``max_len=...``, ``min_slices=...``). ``softmax_options``: each
    case also gets a soft-cap, sinks or both, among those the kernel takes."""
    limits = contract_limits(kernel, palette=palette_size())
    if "masks" in kw:
        kw["masks"] = tuple(m for m in kw["masks"] if m in limits["masks"])
    profile = profile_name()
    kw.setdefault("max_len", MAX_LEN.get(profile, 129))
    # Room for two slices at the kernel's smallest accepted length.
    kw.setdefault("max_work", max(MAX_WORK.get(profile, 1 << 14), 4 * kernel.seq_multiple**2))
    drawn = cases(dtype=dtype, score_limit=kernel.score_limit.get(dtype), **{**limits, **kw})
    if softmax_options:
        return with_drawn_softmax_options(drawn, softmax_options_taken(kernel))
    return drawn


def no_softmax_options(kernel: Any) -> str | None:
    """Why the soft-cap and sinks properties have nothing to test on ``kernel`` (``None`` if
    it takes either)."""
    if softmax_options_taken(kernel):
        return None
    return (
        f"{kernel.name} takes neither softcap nor sinks (its contract: a keyword its signature "
        "names, or options=... declared)"
    )


def slow_ok() -> settings:
    """Whatever the profile: no deadline and no too-slow health check. An oracle call takes
    10-300 ms and a Triton compile seconds; Hypothesis' default 200 ms deadline would fail a
    correct kernel on the oracle's time."""
    return settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def no_target_phase_in_ci() -> settings:
    """:func:`slow_ok`, and under the ``ci`` profile no target phase. Hypothesis' target phase
    hill-climbs on the kernel's gradient error, which leads it to cases where the gradient
    oracle must recompute many elements on its strict (interval) path: 20-30 s an example.
    The Triton backward in fp32 under the interpreter went past 15 minutes that way, alone
    over CI's budget. The ``ci`` profile keeps its 40 generated examples; ``dev``,
    ``thorough`` and ``sweep`` keep the target phase."""
    if profile_name() != "ci":
        return slow_ok()
    return settings(slow_ok(), phases=[p for p in settings.default.phases if p != Phase.target])


def fewer(n: int, share: int = 4) -> settings:
    """A quarter (``1/share``) of the profile's examples, at least ``n``: the structural
    properties."""
    return settings(slow_ok(), max_examples=max(n, settings.default.max_examples // share))


def family_outside_contract(kernel: Any, dtype: str, device: str, family: str) -> str | None:
    """Why a whole input family lies outside ``kernel``'s contract on ``device`` (e.g. a
    library GEMM that breaks the NaN rule there), judged on one small case; else ``None``."""
    m = kernel.seq_multiple
    d = 16 if kernel.head_dims is None else kernel.head_dims[0]
    n = m if m > 1 else 17
    case = make_case(Recipe(dtype, family, 1, 1, 1, n, n, d, d, seed=0))
    why = kernel.supports(case, device)
    return None if why is None else f"{family} inputs are outside the contract here: {why}"


def run_or_fail(kernel: Any, case: Any, device: str, prop: str, call: Any) -> Any:
    """``call()``, or a saved case and a failure naming what the kernel did: raised inside its
    contract, returned something that is not an attention output, or did not return within
    the run's time limit (:mod:`.timeouts`)."""
    __tracebackhide__ = True
    from ..harness.adapters.adapter import KernelOutputError
    from .assertions import fail
    from .timeouts import run_limited

    if kernel.compile_keys and hasattr(case, "shape"):  # (a ragged case has no one shape)
        from types import SimpleNamespace

        from ..harness.adapters.palette import compile_key

        *_, nq, nk, d, dv = case.shape
        shape = SimpleNamespace(dtype=case.dtype, nq=nq, nk=nk, d=d, dv=dv, causal=case.causal)
        compile_notice(kernel, compile_key(kernel, shape))
    try:
        return run_limited(kernel, case, device, prop, call)
    except KernelOutputError as err:
        fail(
            case,
            kernel.name,
            device,
            prop,
            f"BAD-OUTPUT: {err}",
            {"verdict": "BAD-OUTPUT", "message": str(err)},
        )
    except Exception as err:
        why = f"{type(err).__name__}: {err}"
        fail(
            case,
            kernel.name,
            device,
            prop,
            f"the kernel raised inside its contract: {why}",
            {"verdict": "ERROR", "message": why},
        )
