"""The kernel under test runs inside its own contract.

A kernel whose contract was not declared is probed on tiny inputs; one that raised on every
probe cannot be judged at all, which is a failure of the kernel, not a reason to skip
the suite.
"""

import pytest

pytestmark = pytest.mark.layouts("dense", "varlen", "paged", "combine")


def test_kernel_runs_on_some_input(flashcheck_kernel):
    kern = flashcheck_kernel
    if not kern.dtypes:
        # The reason alone, without a traceback into this file (the suite's, not the user's).
        pytest.fail(
            f"{kern.name} ran on none of the probe inputs (every dtype, lengths 16-256, head "
            "dims 16-128): " + "; ".join(f"{what}: {why}" for what, why in kern.unsupported),
            pytrace=False,
        )
