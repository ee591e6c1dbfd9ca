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
  ``flashcheck_device`` is the device the kernel runs on. A test marked
  ``@pytest.mark.layouts("varlen", "paged", ...)`` runs only on kernels of those layouts
  (``dense``, ``varlen``, ``paged``, ``combine``); on another kernel it is skipped, saying why.
- ``--flashcheck-timeout SECONDS`` (default 300): in a run with kernels under test, each kernel
  call is stopped past it and its property fails with ``TIMEOUT``, the case saved
  (:mod:`~flashcheck.properties.timeouts`).
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

The hooks and fixtures are here; what they do is in the modules named for it: the profiles in
:mod:`~flashcheck.properties.profiles`, the options in :mod:`~flashcheck.properties.options`,
the kernels under test in :mod:`~flashcheck.properties.tested_kernels`, and what the run prints
in :mod:`~flashcheck.properties.run_output`. Their public names are importable from here too.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import pytest

from .options import add_options
from .profiles import PROFILES, RUN_CONTEXT, chosen_profile, final_example, profile_name
from .run_output import (
    compile_notice,
    header_lines,
    mark_session,
    note_measurement,
    use_terminal_of,
    write_measurements,
    write_untested,
)
from .tested_kernels import (
    KERNELS,
    PROBE_TIMEOUT,
    kernel_device,
    kernel_specs,
    palette_size,
    parametrize_kernels,
    preferred_device,
    resolve_all,
    set_palette_size,
)

__all__ = [
    "PROBE_TIMEOUT",
    "PROFILES",
    "RUN_CONTEXT",
    "compile_notice",
    "final_example",
    "kernel_device",
    "note_measurement",
    "palette_size",
    "profile_name",
]


# The run's limit on kernel calls, lifted when pytest ends.
_LIMIT = pytest.StashKey[contextlib.ExitStack]()


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Properties of another layout than a kernel's are not run for it: deselected, and
    counted as not applicable, with the reason, in the closing summary (a varlen kernel's run
    listed 32 skipped dense properties before the four that apply to it)."""
    gone = [i for i in items if i.get_closest_marker("flashcheck_other_layout")]
    if gone:
        items[:] = [i for i in items if not i.get_closest_marker("flashcheck_other_layout")]
        config.hook.pytest_deselected(items=gone)


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' plugin reads --hypothesis-seed
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "flashcheck: a test of the flashcheck property suite")
    # The suite marks its oracle-heavy properties; registered here too, so that a project whose
    # pytest runs with --strict-markers can collect the suite by --pyargs.
    config.addinivalue_line("markers", "slow: the oracle-heavy properties (-m 'not slow' skips)")
    config.addinivalue_line(
        "markers",
        "layouts(*names): the kernel layouts a property applies to (dense, varlen, paged, "
        "combine); on a kernel of another layout it is not run, and the summary says why",
    )
    config.addinivalue_line(
        "markers",
        "flashcheck_other_layout(reason): set by flashcheck on a property's item for a kernel "
        "of a layout it does not apply to (deselected)",
    )
    specs = kernel_specs(config)
    profile = chosen_profile(config, kernels_given=bool(specs))
    palette = config.getoption("flashcheck_palette")
    if palette is not None:
        set_palette_size(palette)
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
    device = preferred_device(config)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise pytest.UsageError("--flashcheck-device cuda: torch sees no CUDA device here")
    use_terminal_of(config)
    if specs:
        from .brief import Brief

        config.pluginmanager.register(Brief(), "flashcheck-brief")
    budget = config.getoption("flashcheck_budget")
    if budget is not None:
        if not budget > 0:
            raise pytest.UsageError(f"--flashcheck-budget takes seconds > 0, got {budget}")
        from .suite_budget import SuiteBudget

        config.pluginmanager.register(SuiteBudget(budget), "flashcheck-budget")
    config.stash[KERNELS] = resolve_all(
        specs,
        device,
        config.getoption("flashcheck_dtypes"),
        config.getoption("flashcheck_nan_inputs"),
        config.getoption("flashcheck_timeout"),
        arithmetic=config.getoption("flashcheck_arithmetic"),
    )
    if specs:  # every kernel call of the run, stopped at --flashcheck-timeout (.timeouts)
        from ..harness.adapters.call_limit import limit_calls
        from .timeouts import session_limit

        stack = contextlib.ExitStack()
        stack.enter_context(limit_calls(session_limit(config)))
        config.stash[_LIMIT] = stack


def pytest_unconfigure(config: pytest.Config) -> None:
    if _LIMIT in config.stash:
        config.stash[_LIMIT].close()


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    if KERNELS not in config.stash:
        return None
    return header_lines(config.stash[KERNELS])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write_measurements(terminalreporter)
    if KERNELS in terminalreporter.config.stash:
        write_untested(terminalreporter, terminalreporter.config.stash[KERNELS])


def pytest_runtest_logstart(nodeid: str, location: Any) -> None:
    mark_session(nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus != pytest.ExitCode.INTERRUPTED:  # (Ctrl-C: the test it stopped in stays)
        mark_session("finished")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_kernels(metafunc)


@pytest.fixture(scope="session")
def flashcheck_kernel(request: pytest.FixtureRequest) -> Any:
    """The kernel under test (from ``--flashcheck-kernel``), its contract known."""
    return request.config.stash[KERNELS][request.param]


@pytest.fixture(scope="session")
def flashcheck_device(request: pytest.FixtureRequest, flashcheck_kernel: Any) -> str:
    """The device ``flashcheck_kernel`` runs on in this session."""
    return kernel_device(flashcheck_kernel, preferred_device(request.config))


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
