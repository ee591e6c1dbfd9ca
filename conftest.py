"""Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (tox sets "ci" by default).

- ``ci``: derandomized (the same examples every run: they depend only on each test's source),
  no example database, a budget that fits the CI time limit; deadline off because oracle calls
  and kernel JIT compiles are slow.
- ``dev``: random seeds, default database, same budget: for local runs.
- ``thorough``: 1000 examples per property, lengths up to 1025, for a hand-run hunt.
- ``sweep``: 10000 examples per property, targeting on, no explain phase: an overnight search.

Every run picks (or takes from ``--hypothesis-seed``) one seed, prints it in the pytest header
and records it in saved case files; ``pytest --hypothesis-seed=<seed>`` re-runs the same
examples under the non-derandomized profiles.
"""

import os
import random

import pytest
from hypothesis import HealthCheck, Phase, settings

# Budgets: 40 examples per accuracy property (10 per structural one) keeps `tox` within its CI
# budget on 2 cores; too_slow is suppressed because the strict oracle (interval mpmath) is slow
# by design, and the deadline is off because oracle calls and Triton JIT compiles vary widely.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "dev", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.register_profile(
    "sweep",
    deadline=None,
    max_examples=10_000,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Runs before Hypothesis' own plugin reads --hypothesis-seed: choosing the seed here makes
    # every run reproducible from the seed printed in its header.
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32)
        config.option.hypothesis_seed = str(seed)
    config._flashcheck_seed = str(seed)
    try:
        from harness.assertions import RUN_CONTEXT
    except ImportError:  # the seed test copies this file into a bare directory
        return
    RUN_CONTEXT["hypothesis_seed"] = str(seed)
    RUN_CONTEXT["hypothesis_profile"] = settings.get_current_profile_name()


def pytest_report_header(config):
    name = settings.get_current_profile_name()
    seed = getattr(config, "_flashcheck_seed", "?")
    note = " (unused: this profile is derandomized)" if settings.default.derandomize else ""
    return f"hypothesis profile: {name}; hypothesis seed: {seed}{note}"
