"""flashcheck's pytest plugin (entry point ``pytest11``): the property suite on any kernel.

Loaded by pytest wherever flashcheck is installed; it changes nothing in a run that does not ask
for it. What it adds:

- ``--flashcheck-kernel SPEC`` (repeatable; ini ``flashcheck_kernels``): the kernels under test,
  each a built-in name, ``builtin`` (the project's own kernels), an entry point of group
  ``flashcheck.kernels`` or ``package.module:function``. ``--flashcheck-dtype`` and
  ``--flashcheck-device`` narrow what runs.
- ``--flashcheck-profile {ci,dev,thorough,sweep}`` (else ``$FLASHCHECK_PROFILE``, else ini
  ``flashcheck_profile``): one of the Hypothesis profiles below, loaded for the run.
- Fixtures for any test: ``flashcheck_kernel`` (a
  :class:`~flashcheck.harness.adapters.adapter.Kernel` whose contract is known, probed if it was
  not declared) and ``flashcheck_dtype``; a test that requests them runs once per kernel under
  test and dtype of its contract, and is skipped, with the reason, where one cannot run here.
  ``flashcheck_device`` is the device the kernel runs on.
- The header of a flashcheck run prints the Hypothesis profile and seed and each kernel's
  contract; :data:`RUN_CONTEXT` carries the seed and profile into saved case files.

Hypothesis profiles (registered under ``flashcheck-<name>``):

- ``ci``: derandomized (the same examples every run), no example database, a budget that fits
  a CI job; deadline off, because oracle calls and Triton compiles vary widely in time.
- ``dev``: random seeds, the default database, the same budget.
- ``thorough``: 1000 examples per property, lengths up to 1025.
- ``sweep``: 10000 examples per property, an overnight search.

A flashcheck run picks one seed (or takes ``--hypothesis-seed``), prints it in the header and
records it in case files; ``--hypothesis-seed=<seed>`` re-runs the same examples under the
random profiles.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

import pytest

__all__ = [
    "PROFILES",
    "RUN_CONTEXT",
    "compile_notice",
    "final_example",
    "note_measurement",
    "profile_name",
]

PROFILES = ("ci", "dev", "thorough", "sweep")
PROBE_TIMEOUT = 120.0  # seconds one probe call may take (a first Triton compile included)
# Filled at configure time: the Hypothesis profile and seed of this run, for case files.
RUN_CONTEXT: dict[str, Any] = {}
_KERNELS = pytest.StashKey[dict[str, Any]]()
# What the suite measured without gating it (batch invariance of an undeclared kernel), per
# (kernel, dtype, what): the number of cases and the first finding; printed at the end.
_MEASURED: dict[tuple[str, str, str], list[Any]] = {}
# Compile keys per dtype of kernels that compile per shape: --flashcheck-palette, else the
# default of flashcheck.harness.adapters.palette (not imported here: the plugin loads lazily).
_PALETTE = [4]


def _register_profiles() -> None:
    from hypothesis import HealthCheck, Phase, settings

    # too_slow is suppressed: the strict oracle (interval mpmath) is slow by design. 40
    # examples per accuracy property (10 per structural one) fit `tox` in its CI budget.
    slow_ok = [HealthCheck.too_slow]
    every_phase = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
    # No explain phase and no blob: a failure is reproduced from its saved case file, and
    # the installed suite's source is not the user's to edit.
    settings.register_profile(
        "flashcheck-ci",
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=40,
        suppress_health_check=slow_ok,
        phases=every_phase,
    )
    settings.register_profile(
        "flashcheck-dev", deadline=None, max_examples=40, suppress_health_check=slow_ok
    )
    settings.register_profile(
        "flashcheck-thorough",
        deadline=None,
        max_examples=1000,
        suppress_health_check=slow_ok,
        phases=every_phase,
    )
    settings.register_profile(
        "flashcheck-sweep",
        deadline=None,
        max_examples=10_000,
        suppress_health_check=slow_ok,
        phases=every_phase,
    )


_register_profiles()


def profile_name() -> str:
    """The loaded Hypothesis profile without the ``flashcheck-`` prefix (``default`` if none
    of ours): the suite sizes its cases by it."""
    from hypothesis import settings

    return settings.get_current_profile_name().removeprefix("flashcheck-")


def palette_size() -> int:
    """Compile keys per dtype for kernels that compile per shape (``--flashcheck-palette``)."""
    return _PALETTE[0]


def final_example() -> bool:
    """True outside Hypothesis, or on the final (reported) run of a failing example: a failing
    property saves its case file only once, for the shrunk example Hypothesis reports."""
    from hypothesis.control import current_build_context
    from hypothesis.errors import InvalidArgument

    try:
        ctx = current_build_context()
    except InvalidArgument:  # not inside a Hypothesis test
        return True
    return bool(getattr(ctx, "is_final", True))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("flashcheck", "flashcheck: attention-kernel numerics")
    group.addoption(
        "--flashcheck-kernel",
        action="append",
        dest="flashcheck_kernels",
        metavar="SPEC",
        help="kernel under test: a built-in name, 'builtin' (the project's own kernels), an "
        "entry point of group flashcheck.kernels or package.module:function; repeatable",
    )
    group.addoption(
        "--flashcheck-dtype",
        action="append",
        dest="flashcheck_dtypes",
        choices=("fp16", "bf16", "fp32"),
        help="only this input format; repeatable (default: the kernel's)",
    )
    group.addoption(
        "--flashcheck-device",
        dest="flashcheck_device",
        choices=("cpu", "cuda"),
        help="device for kernels that run on several (default: cuda if available)",
    )
    group.addoption(
        "--flashcheck-nan-inputs",
        dest="flashcheck_nan_inputs",
        choices=("propagate", "any"),
        help="NaN policy of kernels declaring none: 'any' accepts finite outputs where a NaN "
        "input is involved as a convention (default: propagate)",
    )
    group.addoption(
        "--flashcheck-budget",
        dest="flashcheck_budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="a time budget: the properties that find bugs first run first; those not started "
        "when it is spent are skipped with that reason",
    )
    group.addoption(
        "--flashcheck-palette",
        dest="flashcheck_palette",
        type=int,
        default=None,
        metavar="N",
        help="compile keys per dtype for kernels that compile per shape: their lengths, head "
        "dims and causal flag come from N combinations (default 4)",
    )
    group.addoption(
        "--flashcheck-profile",
        dest="flashcheck_profile",
        choices=PROFILES,
        help="Hypothesis profile for the run (default: $FLASHCHECK_PROFILE, else Hypothesis' own)",
    )
    parser.addini(
        "flashcheck_kernels",
        type="args",
        default=[],
        help="kernels under test when --flashcheck-kernel is not given",
    )
    parser.addini(
        "flashcheck_profile",
        type="string",
        default="",
        help="Hypothesis profile when neither --flashcheck-profile nor "
        "$FLASHCHECK_PROFILE is given",
    )


def _specs(config: pytest.Config) -> list[str]:
    from ..harness.adapters.registry import SUITE_KERNELS

    given = config.getoption("flashcheck_kernels") or config.getini("flashcheck_kernels")
    out: list[str] = []
    for spec in given:
        out.extend(SUITE_KERNELS if spec == "builtin" else [spec])
    return list(dict.fromkeys(out))


def _device(config: pytest.Config) -> str:
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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "flashcheck: a test of the flashcheck property suite")
    # The suite marks its oracle-heavy properties; registered here too, so that a project whose
    # pytest runs with --strict-markers can collect the suite by --pyargs.
    config.addinivalue_line("markers", "slow: the oracle-heavy properties (-m 'not slow' skips)")
    specs = _specs(config)
    profile = (
        config.getoption("flashcheck_profile")
        or os.environ.get("FLASHCHECK_PROFILE")
        or config.getini("flashcheck_profile")
        or ("ci" if specs else None)  # a kernel under test: the same run as `flashcheck test`
    )
    if profile:
        if profile not in PROFILES:
            raise pytest.UsageError(
                f"FLASHCHECK_PROFILE={profile!r} is not a flashcheck profile: use one of "
                f"{', '.join(PROFILES)}"
            )
        from hypothesis import settings

        settings.load_profile(f"flashcheck-{profile}")
    palette = config.getoption("flashcheck_palette")
    if palette is not None:
        if palette < 1:
            raise pytest.UsageError(f"--flashcheck-palette takes N >= 1, got {palette}")
        _PALETTE[0] = palette
    if not (profile or specs):
        return  # not a flashcheck run: leave Hypothesis and the seed alone
    # Runs before Hypothesis' own plugin reads --hypothesis-seed: choosing the seed here makes
    # every run reproducible from the seed printed in its header.
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
        config.option.hypothesis_seed = str(seed)
    RUN_CONTEXT["hypothesis_seed"] = str(seed)
    RUN_CONTEXT["hypothesis_profile"] = profile_name()
    device = _device(config)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("--flashcheck-device cuda: torch sees no CUDA device here")
    _TERMINAL[:] = [config]  # (its terminal reporter is registered after this hook)
    if specs:
        from .brief import Brief

        config.pluginmanager.register(Brief(), "flashcheck-brief")
    budget = config.getoption("flashcheck_budget")
    if budget is not None:
        if not budget > 0:
            raise pytest.UsageError(f"--flashcheck-budget takes seconds > 0, got {budget}")
        from .suite_budget import SuiteBudget

        config.pluginmanager.register(SuiteBudget(budget), "flashcheck-budget")
    config.stash[_KERNELS] = _resolve_all(
        specs,
        device,
        config.getoption("flashcheck_dtypes"),
        config.getoption("flashcheck_nan_inputs"),
    )


def _resolve_all(
    specs: list[str], device: str, dtypes: list[str] | None, nan_inputs: str | None = None
) -> dict[str, Any]:
    """The kernels under test with their contracts; a kernel that cannot run on this machine
    at all (not installed, no device: not the kernel's fault) is a usage error. Probes run in
    a separate process with a time limit: a kernel that hangs or kills its process on a probe
    input is then reported as such, not a silent end of the test session."""
    from dataclasses import replace
    from functools import partial

    from ..harness.adapters.fp8_contract import suite_refusal
    from ..harness.adapters.probe import resolved
    from ..harness.adapters.registry import resolve
    from ..harness.adapters.worker import KernelRef, KernelWorker

    out: dict[str, Any] = {}
    with KernelWorker(timeout=PROBE_TIMEOUT) as worker:
        for spec in specs:
            try:
                kern = resolve(spec)
            except ValueError as err:
                raise pytest.UsageError(f"--flashcheck-kernel {spec}: {err}") from None
            if (why := suite_refusal(spec, kern)) is not None:
                raise pytest.UsageError(why)
            if nan_inputs is not None and kern.nan_inputs == "propagate":
                kern = replace(kern, nan_inputs=nan_inputs)
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
            runner = partial(worker.run, KernelRef.of(kern, spec), device=dev)
            if kern.pending:  # seconds to minutes for a kernel that compiles per shape
                print(f"flashcheck: probing the contract of {spec} on {dev} ...", flush=True)
            t0 = time.monotonic()
            out[spec] = resolved(kern, dev, runner)
            if kern.pending:
                keys = out[spec].compile_keys
                what = f"; it compiles per {', '.join(keys)}" if keys else ""
                print(f"flashcheck: probed {spec} in {time.monotonic() - t0:.0f} s{what}")
    return out


def _builtin_suite() -> tuple[str, ...]:
    from ..harness.adapters.registry import SUITE_KERNELS

    return SUITE_KERNELS


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if _KERNELS not in config.stash:
        return None
    from hypothesis import settings

    note = " (unused: this profile is derandomized)" if settings.default.derandomize else ""
    lines = [
        f"hypothesis profile: {settings.get_current_profile_name()}; hypothesis seed: "
        f"{RUN_CONTEXT.get('hypothesis_seed', '?')}{note}"
    ]
    for spec, kern in config.stash[_KERNELS].items():
        lines.append(f"flashcheck kernel {spec}:")
        lines += [f"  {line}" for line in kern.contract_lines()]
    return lines


_TERMINAL: list[Any] = []  # the session's config, whose terminal reporter says what compiles
_SEEN_KEYS: set[tuple[str, tuple[Any, ...]]] = set()


def compile_notice(kernel: Any, key: tuple[Any, ...]) -> None:
    """Say on the terminal that ``kernel`` is about to compile for ``key`` (the first call of a
    compile key in this session): a wait of seconds to minutes that would look like a hang."""
    if not key or (kernel.name, key) in _SEEN_KEYS:
        return
    _SEEN_KEYS.add((kernel.name, key))
    reporter = _TERMINAL[0].pluginmanager.get_plugin("terminalreporter") if _TERMINAL else None
    if reporter is not None:
        about = f" (about {kernel.compile_seconds:.0f} s)" if kernel.compile_seconds else ""
        from ..harness.adapters.palette import PALETTE_DIMS

        names = ("dtype", *(x for x in PALETTE_DIMS if x in kernel.compile_keys))
        dims = ", ".join(f"{k}={v}" for k, v in zip(names, key, strict=False))
        reporter.write_line(f"  compiling {kernel.name} for {dims}{about} ...")


def note_measurement(kernel: str, dtype: str, what: str, finding: str | None) -> None:
    """Count one case measured for ``what`` (``finding``: what differed, ``None`` if nothing
    did); the terminal summary lists, per kernel and dtype, the first finding or the count."""
    entry = _MEASURED.setdefault((kernel, dtype, what), [0, None])
    entry[0] += 1
    if entry[1] is None:
        entry[1] = finding


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _MEASURED:
        return
    terminalreporter.section("flashcheck measurements")
    for (kernel, dtype, what), (n, finding) in _MEASURED.items():
        found = f"yes, bitwise over {n} case{'s' * (n != 1)}" if finding is None else finding
        terminalreporter.line(f"{kernel} {dtype}: {what}: {found}")


def _mark(text: str) -> None:
    """Leave ``text`` where `flashcheck test` looks after the run (if it asked): the test in
    progress, or "finished". A kernel that kills the test process leaves its test's name."""
    path = os.environ.get("FLASHCHECK_SESSION_FILE")
    if path:
        # Written aside and renamed: a Ctrl-C mid-write leaves the previous name, not nothing.
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    _mark(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus != pytest.ExitCode.INTERRUPTED:  # (Ctrl-C: the test it stopped in stays)
        _mark("finished")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "flashcheck_kernel" not in metafunc.fixturenames:
        return
    kernels = metafunc.config.stash.get(_KERNELS, {})
    with_dtype = "flashcheck_dtype" in metafunc.fixturenames
    wanted = metafunc.config.getoption("flashcheck_dtypes")
    params = []
    for spec, kern in kernels.items():
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


@pytest.fixture(scope="session")
def flashcheck_kernel(request: pytest.FixtureRequest) -> Any:
    """The kernel under test (from ``--flashcheck-kernel``), its contract known."""
    return request.config.stash[_KERNELS][request.param]


@pytest.fixture(scope="session")
def flashcheck_device(request: pytest.FixtureRequest, flashcheck_kernel: Any) -> str:
    """The device ``flashcheck_kernel`` runs on in this session."""
    return kernel_device(flashcheck_kernel, _device(request.config))


@pytest.fixture(scope="session")
def flashcheck_dtype(
    request: pytest.FixtureRequest, flashcheck_kernel: Any, flashcheck_device: str
) -> str:
    """An input format of the kernel's contract; skips, saying why, where it cannot run."""
    dtype = request.param
    if dtype is None:
        pytest.skip(f"{flashcheck_kernel.name} runs on no dtype here (see its contract test)")
    why = flashcheck_kernel.unavailable(dtype, flashcheck_device)
    if why:
        pytest.skip(why)
    return dtype
