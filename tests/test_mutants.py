"""The planted bugs of benchmarks/mutation_check.py still apply to the kernels: each edit must
match its kernel's source exactly once, or `tox -e mutation` stops at that mutant (it did once,
after a kernel change). And the mutation check still catches bugs: a few fast mutants run
through it here, each caught with a case file whose replay gives the same verdict."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _mutation_check():
    path = ROOT / "benchmarks" / "mutation_check.py"
    spec = importlib.util.spec_from_file_location("mutation_check", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports its neighbour source_tree
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return mod


def _mutants():
    return _mutation_check().MUTANTS


@pytest.mark.parametrize(("name", "mutant"), sorted(_mutants().items()))
def test_planted_bug_applies_exactly_once(name, mutant):
    _, path, edits, _ = mutant
    text = (ROOT / path).read_text()
    for old, _new in edits:
        assert text.count(old) == 1, f"{name}: {old!r} found {text.count(old)} times in {path}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(_mutation_check().FAST))
def test_the_mutation_check_catches_a_planted_bug(name):
    # About 15 s each on 2 cores: the mutant's tree, one narrow test selection, the replay.
    check = _mutation_check()
    result = check.run_mutant(name, 300, check.FAST[name])
    assert result["caught"], result
    assert result["case"] and result["replay"].endswith("-> same"), result
