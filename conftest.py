"""Hypothesis profiles, chosen with HYPOTHESIS_PROFILE (tox sets "ci" by default).

- ``ci``: derandomized (the same examples every run), no example database, fixed budget that
  fits the CI time limit; deadline off because oracle calls and kernel JIT compiles are slow.
- ``dev``: random seeds, default database, same budget: for local runs.
- ``thorough``: many more examples for a hand-run hunt.
Every run prints its profile and seed in the pytest header so a failure can be re-run with
``pytest --hypothesis-seed=<seed>``.
"""

import os

from hypothesis import HealthCheck, Phase, settings

# Budgets: 40 examples per property keeps the whole suite near 10 s on the 2-core CI machine;
# too_slow is suppressed because the strict oracle (interval mpmath) is slow by design, and the
# deadline is off because oracle calls and Triton JIT compiles vary widely in time.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=40,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=40)
settings.register_profile(
    "thorough",
    deadline=None,
    max_examples=1000,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_report_header(config):
    return f"hypothesis profile: {settings.get_current_profile_name()}"
