"""The kernels under test in a flashcheck run: their specs, the device each runs on, their
contracts (probed in a worker process where not declared), and the test items per kernel and
dtype that the plugin's fixtures hand to the property suite.

The contracts are kept in the pytest config's stash under :data:`KERNELS`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

__all__ = [
    "KERNELS",
    "PROBE_TIMEOUT",
    "kernel_device",
    "kernel_layout_of",
    "kernel_specs",
    "layouts_of_test",
    "palette_size",
    "parametrize_kernels",
    "preferred_device",
    "resolve_all",
    "set_palette_size",
]

PROBE_TIMEOUT = 120.0  # seconds one probe call may take (a first Triton compile included)
# The kernels under test by spec, their contracts known (filled at configure time).
KERNELS = pytest.StashKey[dict[str, Any]]()
# Compile keys per dtype of kernels that compile per shape: --flashcheck-palette, else the
# default of flashcheck.harness.adapters.palette (not imported here: the plugin loads lazily).
_PALETTE = [4]


def palette_size() -> int:
    """Compile keys per dtype for kernels that compile per shape (``--flashcheck-palette``)."""
    return _PALETTE[0]


def set_palette_size(size: int) -> None:
    """Set :func:`palette_size` for this run (``--flashcheck-palette N``, ``N >= 1``)."""
    if size < 1:
        raise pytest.UsageError(f"--flashcheck-palette takes N >= 1, got {size}")
    _PALETTE[0] = size


def kernel_specs(config: pytest.Config) -> list[str]:
    """The specs under test (``--flashcheck-kernel``, else the ini ``flashcheck_kernels``), each
    once, in order; ``builtin`` stands for the project's own suite kernels."""
    from ..harness.adapters.registry import SUITE_KERNELS

    given = config.getoption("flashcheck_kernels") or config.getini("flashcheck_kernels")
    out: list[str] = []
    for spec in given:
        out.extend(SUITE_KERNELS if spec == "builtin" else [spec])
    return list(dict.fromkeys(out))


def preferred_device(config: pytest.Config) -> str:
    """``--flashcheck-device``, else ``cuda`` where torch sees one, else ``cpu``."""
    dev = config.getoption("flashcheck_device")
    if dev:
        return dev
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def kernel_device(kernel: Any, preferred: str) -> str:
    """``preferred`` if the kernel runs there, else its first device."""
    return preferred if preferred in kernel.devices else kernel.devices[0]


def resolve_all(
    specs: list[str],
    device: str,
    dtypes: list[str] | None,
    nan_inputs: str | None = None,
    timeout: float = PROBE_TIMEOUT,
    *,
    arithmetic: str | None = None,
) -> dict[str, Any]:
    """The kernels under test with their contracts; a kernel that cannot run on this machine
    at all (not installed, no device: not the kernel's fault) is a usage error. Probes run in
    a separate process with a time limit: a kernel that hangs or kills its process on a probe
    input is then reported as such, not a silent end of the test session."""
    from dataclasses import replace
    from functools import partial

    from ..harness.adapters.call_limit import CallLimit, limit_calls
    from ..harness.adapters.fp8_contract import suite_refusal
    from ..harness.adapters.probe import resolved
    from ..harness.adapters.registry import resolve
    from ..harness.adapters.worker import KernelRef, KernelWorker

    out: dict[str, Any] = {}
    limit = min(timeout, PROBE_TIMEOUT)
    with KernelWorker(timeout=limit) as worker:
        for spec in specs:
            try:
                kern = resolve(spec)
            except ValueError as err:
                raise pytest.UsageError(f"--flashcheck-kernel {spec}: {err}") from None
            if (why := suite_refusal(spec, kern)) is not None:
                raise pytest.UsageError(why)
            if nan_inputs is not None and kern.nan_inputs == "propagate":
                kern = replace(kern, nan_inputs=nan_inputs)
            if arithmetic is not None and kern.arithmetic == "unknown":
                kern = replace(kern, arithmetic=arithmetic)
            dev = kernel_device(kern, device)
            if dtypes and "dtypes" in kern.pending:  # only the dtypes this run tests are probed
                kern = replace(kern, dtypes=tuple(dt for dt in kern.dtypes if dt in dtypes))
            if not kern.pending:
                try:
                    why = [kern.unavailable(dt, dev) for dt in (dtypes or kern.dtypes)]
                except Exception:  # a broken kernel's own canary: its tests show the failure
                    why = []
                if why and all(why) and (len(specs) == 1 or spec not in _builtin_suite()):
                    raise pytest.UsageError(f"{spec} cannot run here: {why[0]}")
            call = partial(worker.run, KernelRef.of(kern, spec), device=dev)
            runner = _noticed(call, spec, limit)
            alone = len(specs) == 1 or spec not in _builtin_suite()
            if "dtypes" not in kern.pending and alone:  # declared: refused before the probe
                _refuse_dtypes(spec, kern.dtypes, dtypes)
            if kern.pending:  # seconds to minutes for a kernel that compiles per shape
                print(f"flashcheck: probing the contract of {spec} on {dev} ...", flush=True)
            t0 = time.monotonic()
            # (a kernel of a ragged layout is probed in this process: under the same limit)
            with limit_calls(CallLimit(limit)):
                out[spec] = resolved(kern, dev, runner)
            if alone:
                _refuse_dtypes(spec, out[spec].dtypes, dtypes)
            if kern.pending:
                keys = out[spec].compile_keys
                what = f"; it compiles per {', '.join(keys)}" if keys else ""
                print(f"flashcheck: probed {spec} in {time.monotonic() - t0:.0f} s{what}")
    return out


def _refuse_dtypes(spec: str, have: Sequence[str], wanted: Sequence[str] | None) -> None:
    """A usage error where ``--dtype`` asks for none of the kernel's dtypes: every test would
    be skipped and the run exit 0 (``flashcheck report`` refuses the same request)."""
    if wanted and not set(have) & set(wanted):
        raise pytest.UsageError(
            f"{spec} runs none of --dtype {', '.join(wanted)}: its dtypes are "
            f"{', '.join(have) or 'none'} (declared, or found by the probe); ask for one of "
            "those, or leave --dtype out"
        )


# Seconds a probe call runs before the terminal says that it is still waiting for it.
PROBE_NOTICE = 20.0


def _noticed(runner: Any, spec: str, limit: float) -> Any:
    """``runner`` that says on the terminal when a call takes more than :data:`PROBE_NOTICE`
    seconds (once), and from then on when each slow call returns: a probe of a slow kernel
    would otherwise look like a hang."""
    import threading

    state = {"calls": 0, "said": False}

    def say() -> None:
        state["said"] = True
        print(
            f"flashcheck: {spec} has not returned a probe call after {PROBE_NOTICE:g} s (each "
            f"is stopped at {limit:g} s; the probe makes up to about 20) ...",
            flush=True,
        )

    def run(case: Any) -> Any:
        state["calls"] += 1
        timer = None if state["said"] else threading.Timer(PROBE_NOTICE, say)
        if timer is not None:
            timer.daemon = True
            timer.start()
        t0 = time.monotonic()
        try:
            return runner(case)
        finally:
            if timer is not None:
                timer.cancel()
            took = time.monotonic() - t0
            if state["said"] and took >= PROBE_NOTICE:
                print(f"  probe call {state['calls']} took {took:.0f} s", flush=True)

    return run


def _builtin_suite() -> tuple[str, ...]:
    from ..harness.adapters.registry import SUITE_KERNELS

    return SUITE_KERNELS


def kernel_layout_of(kernel: Any) -> str:
    """The inputs a kernel takes: ``"dense"``, ``"varlen"``, ``"paged"`` or ``"combine"`` (a
    split-KV merge)."""
    return "combine" if kernel.op == "combine" else kernel.layout


_LAYOUT_WORDS = {
    "dense": "dense (B, H, N, d) kernels",
    "varlen": "varlen kernels",
    "paged": "paged kernels",
    "combine": "split-KV merges",
}


def layouts_of_test(item: Any) -> tuple[str, ...] | None:
    """The kernel layouts a test applies to (``dense``, ``varlen``, ``paged``, ``combine``):
    its ``layouts`` marker's arguments; ``None`` (every layout) for a test without one."""
    mark = item.get_closest_marker("layouts")
    if mark is None:
        return None
    bad = [x for x in mark.args if x not in _LAYOUT_WORDS]
    if bad or not mark.args:
        raise pytest.UsageError(
            f"{item.name}: @pytest.mark.layouts takes one or more of "
            f"{', '.join(_LAYOUT_WORDS)}, got {mark.args!r}"
        )
    return tuple(mark.args)


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _other_layout(spec: str, kernel: Any, takes: tuple[str, ...]) -> str | None:
    """Why a property for ``takes`` layouts does not apply to ``kernel``, or ``None``."""
    layout = kernel_layout_of(kernel)
    if layout in takes:
        return None
    what = "a split-KV merge" if layout == "combine" else f"a {layout} kernel"
    return (
        f"{spec} is {what}: this test applies to "
        f"{_listed([_LAYOUT_WORDS.get(t, t) for t in takes])} only"
    )


def parametrize_kernels(metafunc: pytest.Metafunc) -> None:
    """Parametrize a test that requests ``flashcheck_kernel`` (and ``flashcheck_dtype``): one
    item per kernel under test (and dtype of its contract, narrowed by
    ``--flashcheck-dtype``); with none to run, one skipped item that says why."""
    if "flashcheck_kernel" not in metafunc.fixturenames:
        return
    kernels = metafunc.config.stash.get(KERNELS, {})
    with_dtype = "flashcheck_dtype" in metafunc.fixturenames
    wanted = metafunc.config.getoption("flashcheck_dtypes")
    takes = layouts_of_test(metafunc.definition)
    params = []
    for spec, kern in kernels.items():
        why = None if takes is None else _other_layout(spec, kern, takes)
        if why is not None:
            # The property does not apply: one item says why. The plugin deselects it (the
            # closing summary counts it as not applicable); run without that, it is skipped.
            marks = [pytest.mark.skip(reason=why), pytest.mark.flashcheck_other_layout(why)]
            param = (spec, None) if with_dtype else (spec,)
            params.append(pytest.param(*param, marks=marks, id=f"{spec}-n/a"))
            continue
        if not with_dtype:
            params.append(pytest.param(spec, id=spec))
            continue
        dtypes = [dt for dt in kern.dtypes if not wanted or dt in wanted]
        params += [pytest.param(spec, dt, id=f"{spec}-{dt}") for dt in dtypes]
        if not dtypes:  # nothing to run: one skipped item says why
            params.append(pytest.param(spec, None, id=f"{spec}-none"))
    if not params:
        why = "no kernel under test: pass --flashcheck-kernel SPEC"
        mark = pytest.mark.skip(reason=why)
        params = [
            pytest.param(None, None, marks=mark) if with_dtype else pytest.param(None, marks=mark)
        ]
    names = ["flashcheck_kernel", "flashcheck_dtype"] if with_dtype else ["flashcheck_kernel"]
    metafunc.parametrize(names, params, indirect=True)
