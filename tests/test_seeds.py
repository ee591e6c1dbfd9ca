"""`pytest --hypothesis-seed=N` reproduces a run's failing example, and every flashcheck run
prints its seed in the header (the pytest plugin, flashcheck.properties.plugin)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest_plugins = ["pytester"]

FAILING = """
from hypothesis import Phase, given, settings, strategies as st

@settings(phases=[Phase.generate], max_examples=200, database=None, derandomize=False)
@given(st.integers(0, 10**9))
def test_planted(x):
    assert x % 7 != 3   # fails on roughly one draw in seven; no shrinking
"""


def _falsifying(result) -> str:
    text = result.stdout.str()
    m = re.search(r"^E\s+x=(\d+),", text, re.MULTILINE)
    assert m, text
    return m.group(1)


@pytest.mark.slow
def test_same_seed_same_failing_example(pytester):
    pytester.makepyfile(test_planted=FAILING)
    env = {"FLASHCHECK_PROFILE": "dev"}
    for key, val in env.items():
        pytester._monkeypatch.setenv(key, val)
    first = pytester.runpytest_subprocess("--hypothesis-seed=12345", "-p", "no:cacheprovider")
    again = pytester.runpytest_subprocess("--hypothesis-seed=12345", "-p", "no:cacheprovider")
    other = pytester.runpytest_subprocess("--hypothesis-seed=777", "-p", "no:cacheprovider")
    assert first.ret == again.ret == other.ret == pytest.ExitCode.TESTS_FAILED
    assert _falsifying(first) == _falsifying(again)
    assert "hypothesis seed: 12345" in first.stdout.str()
    # a random seed is printed when none is given, and reproduces that run
    free = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    seed = re.search(r"hypothesis seed: (\d+)", free.stdout.str()).group(1)
    rerun = pytester.runpytest_subprocess(f"--hypothesis-seed={seed}", "-p", "no:cacheprovider")
    assert _falsifying(free) == _falsifying(rerun)
