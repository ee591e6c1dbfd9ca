"""The suite's two phases (tox runs both): ``--phase parallel`` keeps every test not marked
``serial``, for ``pytest -n auto`` (pytest-xdist); ``--phase serial`` keeps only those, run
alone after it, because they time the product (first output within seconds, a run within its
budget, an exit within seconds of Ctrl-C) and a second worker on a 2-core machine would be part
of what they time. Without ``--phase`` every test runs, as before. In the parallel phase each
module of the property suite is one ``xdist_group`` (for ``--dist loadgroup``)."""

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--phase",
        choices=("all", "parallel", "serial"),
        default="all",
        help="parallel: the tests not marked serial; serial: only those; all (default): both",
    )


def pytest_collection_modifyitems(config, items):
    phase = config.getoption("--phase")
    if phase == "all":
        return
    want_serial = phase == "serial"
    serial = [it.get_closest_marker("serial") is not None for it in items]
    keep = [it for it, s in zip(items, serial, strict=True) if s == want_serial]
    drop = [it for it, s in zip(items, serial, strict=True) if s != want_serial]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if not want_serial and config.pluginmanager.hasplugin("xdist"):
        # One pytest-xdist worker per module of the property suite (with --dist loadgroup):
        # its kernels are tested on the same derandomized cases, which the oracle's memo then
        # answers once per worker instead of once per kernel.
        for it in items:
            if it.nodeid.startswith("properties/"):
                it.add_marker(pytest.mark.xdist_group(it.nodeid.split("::")[0]))


def pytest_sessionfinish(session, exitstatus):
    # A phase the selection left empty (`tox -- tests/test_budget.py`: no parallel test) is
    # not a failure; pytest's "no tests collected" would stop tox before the other phase.
    empty = exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED
    if empty and session.config.getoption("--phase") != "all":
        session.exitstatus = pytest.ExitCode.OK
