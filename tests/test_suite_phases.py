"""The suite's two phases (conftest.py at the project root, which tox runs as two pytest calls):
together they run every test once, and a phase left empty by the selection exits 0."""

import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
TESTS = """
import pytest

def test_a():
    pass

@pytest.mark.serial
def test_b():
    pass

@pytest.mark.serial
def test_c():
    pass
"""


@pytest.fixture
def project(pytester):
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    pytester.makeini("[pytest]\nmarkers =\n    serial: timed\n")
    pytester.makepyfile(test_x=TESTS)
    return pytester


@pytest.mark.parametrize(("phase", "ran"), [("all", 3), ("parallel", 1), ("serial", 2)], ids=str)
def test_the_phases_split_the_tests_by_the_serial_mark(project, phase, ran):
    res = project.runpytest("--phase", phase)
    res.assert_outcomes(passed=ran, deselected=3 - ran if ran < 3 else 0)


def test_a_phase_with_nothing_selected_exits_0_and_all_still_says_no_tests(project):
    assert project.runpytest("--phase", "parallel", "-k", "test_b").ret == 0
    assert project.runpytest("--phase", "all", "-k", "nothing").ret == 5


def test_each_property_module_is_one_xdist_group_in_the_parallel_phase(project):
    """The oracle's memo answers a module's shared cases once only if its tests share a
    worker: every test of ``properties/<module>`` gets that module's ``xdist_group``, the rest
    none."""
    group = """
def test_group(request):
    mark = request.node.get_closest_marker("xdist_group")
    assert (mark and mark.args) == {want!r}
"""
    (project.path / "properties").mkdir()
    (project.path / "properties" / "test_p.py").write_text(
        group.format(want=("properties/test_p.py",))
    )
    project.makepyfile(test_y=group.format(want=None))
    res = project.runpytest("--phase", "parallel", "-n", "2", "--dist", "loadgroup")
    res.assert_outcomes(passed=3)
