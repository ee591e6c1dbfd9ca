"""The kernel under test runs inside its own contract.

A kernel whose contract was not declared is probed on tiny inputs; one that raised on every
probe cannot be judged at all, which is a failure of the kernel, not a reason to skip
the suite.
"""

import pytest

pytestmark = pytest.mark.layouts("dense", "varlen", "paged", "combine")


def test_kernel_runs_on_some_input(flashcheck_kernel):
    kern = flashcheck_kernel
    assert kern.dtypes, (
        f"{kern.name} ran on none of the probe inputs (every dtype, lengths 16-256, head dims "
        f"16-128): " + "; ".join(f"{what}: {why}" for what, why in kern.unsupported)
    )
