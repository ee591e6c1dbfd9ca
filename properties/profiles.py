"""The Hypothesis profiles of a flashcheck run, and what the run records of them.

Registered under ``flashcheck-<name>`` when the plugin loads:

- ``ci``: derandomized (the same examples every run), no example database, a budget that fits
  a CI job; deadline off, because oracle calls and Triton compiles vary widely in time.
- ``dev``: random seeds, the default database, the same budget.
- ``thorough``: 1000 examples per property, lengths up to 1025.
- ``sweep``: 10000 examples per property, an overnight search.

:data:`RUN_CONTEXT` carries the profile and seed of the run into saved case files.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

__all__ = ["PROFILES", "RUN_CONTEXT", "chosen_profile", "final_example", "profile_name"]

PROFILES = ("ci", "dev", "thorough", "sweep")
# Filled at configure time: the Hypothesis profile and seed of this run, for case files.
RUN_CONTEXT: dict[str, Any] = {}


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


def chosen_profile(config: pytest.Config, *, kernels_given: bool) -> str | None:
    """The profile of this run, loaded into Hypothesis: ``--flashcheck-profile``, else
    ``$FLASHCHECK_PROFILE``, else the ini ``flashcheck_profile``, else ``ci`` when kernels are
    under test (``kernels_given``: the same run as `flashcheck test`); ``None`` loads nothing."""
    profile = (
        config.getoption("flashcheck_profile")
        or os.environ.get("FLASHCHECK_PROFILE")
        or config.getini("flashcheck_profile")
        or (
            "ci" if kernels_given else None
        )  # a kernel under test: the same run as `flashcheck test`
    )
    if profile:
        if profile not in PROFILES:
            raise pytest.UsageError(
                f"FLASHCHECK_PROFILE={profile!r} is not a flashcheck profile: use one of "
                f"{', '.join(PROFILES)}"
            )
        from hypothesis import settings

        settings.load_profile(f"flashcheck-{profile}")
    return profile
