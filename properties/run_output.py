"""What a flashcheck run tells its user besides test results: the header (Hypothesis profile
and seed, each kernel's contract), a notice before each compile that would look like a hang,
the closing summary of what was measured without being gated, and the session file in which
`flashcheck test` finds the test in progress if a kernel kills the test process.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest

from ..harness.checks.batch_invariance import held_text
from .profiles import RUN_CONTEXT

__all__ = [
    "compile_notice",
    "header_lines",
    "mark_session",
    "note_measurement",
    "say_live",
    "use_terminal_of",
    "write_measurements",
    "write_untested",
]

_TERMINAL: list[Any] = []  # the session's config, whose terminal reporter says what compiles
_SEEN_KEYS: set[tuple[str, tuple[Any, ...]]] = set()
# What the suite measured without gating it (batch invariance of an undeclared kernel), per
# (kernel, dtype, what): the number of cases and the first finding; printed at the end.
_MEASURED: dict[tuple[str, str, str], list[Any]] = {}


def use_terminal_of(config: pytest.Config) -> None:
    """Say compile notices on ``config``'s terminal (its reporter is registered after the
    plugin's configure hook, so it is looked up when a notice is due)."""
    _TERMINAL[:] = [config]


def header_lines(kernels: dict[str, Any]) -> list[str]:
    """The header of a flashcheck run: the Hypothesis profile and seed, then each kernel
    under test (``kernels``: by spec) with its contract, one item a line."""
    from hypothesis import settings

    note = " (unused: this profile is derandomized)" if settings.default.derandomize else ""
    lines = [
        f"hypothesis profile: {settings.get_current_profile_name()}; hypothesis seed: "
        f"{RUN_CONTEXT.get('hypothesis_seed', '?')}{note}"
    ]
    for spec, kern in kernels.items():
        lines.append(f"flashcheck kernel {spec}:")
        lines += [f"  {line}" for line in kern.contract_lines()]
    return lines


def compile_notice(kernel: Any, key: tuple[Any, ...]) -> None:
    """Say on the terminal that ``kernel`` is about to compile for ``key`` (the first call of a
    compile key in this session): a wait of seconds to minutes that would look like a hang."""
    if not key or (kernel.name, key) in _SEEN_KEYS:
        return
    _SEEN_KEYS.add((kernel.name, key))
    about = f" (about {kernel.compile_seconds:.0f} s)" if kernel.compile_seconds else ""
    from ..harness.adapters.palette import PALETTE_DIMS

    names = ("dtype", *(x for x in PALETTE_DIMS if x in kernel.compile_keys))
    dims = ", ".join(f"{k}={v}" for k, v in zip(names, key, strict=False))
    say_live(f"  compiling {kernel.name} for {dims}{about} ...")


def say_live(text: str) -> None:
    """Write ``text`` as a line on the terminal now, from inside a test too (pytest captures a
    test's output and shows it, if at all, after the test: a notice of a long wait must not
    wait with it). Without a pytest terminal: stdout."""
    config = _TERMINAL[0] if _TERMINAL else None
    reporter = config.pluginmanager.get_plugin("terminalreporter") if config else None
    if reporter is None:
        print(text, flush=True)
        return
    capman = config.pluginmanager.get_plugin("capturemanager")
    live = capman.global_and_fixture_disabled() if capman else contextlib.nullcontext()
    with live:
        reporter.write_line(text)
        reporter.flush()


def note_measurement(kernel: str, dtype: str, what: str, finding: str | None) -> None:
    """Count one case measured for ``what`` (``finding``: what differed, ``None`` if nothing
    did); the terminal summary lists, per kernel and dtype, the first finding or the count."""
    entry = _MEASURED.setdefault((kernel, dtype, what), [0, None])
    entry[0] += 1
    if entry[1] is None:
        entry[1] = finding


def write_measurements(terminalreporter: Any) -> None:
    """The closing section "flashcheck measurements", if anything was measured."""
    if not _MEASURED:
        return
    terminalreporter.section("flashcheck measurements")
    for (kernel, dtype, what), (n, finding) in _MEASURED.items():
        found = held_text(n, elsewhere="the cases drawn; other shapes may differ")
        if finding is not None:
            found = finding
        terminalreporter.line(f"{kernel} {dtype}: {what}: {found}")


def mark_session(text: str) -> None:
    """Leave ``text`` where `flashcheck test` looks after the run (if it asked): the test in
    progress, or "finished". A kernel that kills the test process leaves its test's name."""
    path = os.environ.get("FLASHCHECK_SESSION_FILE")
    if path:
        # Written aside and renamed: a Ctrl-C mid-write leaves the previous name, not nothing.
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def write_untested(terminalreporter: Any, kernels: dict[str, Any]) -> None:
    """The closing section "flashcheck: not tested": per kernel under test, the input classes
    its probe found it does not take (no case of those was drawn), so that a run that passed
    does not read as covering them."""
    rows = [(spec, k) for spec, k in kernels.items() if k.dtypes and k.unsupported]
    if not rows:
        return
    terminalreporter.section("flashcheck: not tested (outside the probed contract)")
    for spec, k in rows:
        for what, why in k.unsupported:
            terminalreporter.line(f"{spec}: {what} ({why})")
