"""How often the property suite asks the oracle a question it already asked: run property tests
in this one process (no pytest-xdist) with the oracle's memo unbounded, and print its hits
(repeated problems and dO, answered from memory), misses (computed) and the mean size of a kept
answer.

    python benchmarks/oracle_memo_hits.py [PYTEST ARGS]
    (default: properties/test_gradients.py -k within_bounds; run with the tox environment's
    variables, OPENBLAS_CORETYPE=Haswell TRITON_INTERPRET=1 PYTHONHASHSEED=0
    FLASHCHECK_PROFILE=ci)

Hits here count every repeat, wherever it came from; under tox a repeat is a hit only when it
reaches the worker that computed it first (hence each property module on one worker).
"""

from __future__ import annotations

import sys

import pytest


class _Counts:
    def pytest_configure(self, config):
        from flashcheck.harness.oracle import memo

        memo.memo_clear()
        memo.MEMO_BYTES = memo.ANSWER_BYTES = 2**40  # keep everything: count every repeat

    def pytest_unconfigure(self, config):
        from flashcheck.harness.oracle.memo import memo_counts

        c = memo_counts()
        mean = c["bytes"] / c["answers"] / 1024 if c["answers"] else 0.0
        print(
            f"\noracle calls {c['hits'] + c['misses']}: {c['hits']} repeated (hits), "
            f"{c['misses']} computed; {c['answers']} answers kept, {mean:.0f} KiB each on average"
        )


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        args = ["properties/test_gradients.py", "-k", "within_bounds"]
    return int(pytest.main(["-q", "-p", "no:cacheprovider", *args], plugins=[_Counts()]))


if __name__ == "__main__":
    raise SystemExit(main())
