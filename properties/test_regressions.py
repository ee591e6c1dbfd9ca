"""Pinned regressions: every case file in properties/regressions/ must PASS on the kernel under
test, wherever the case lies inside its contract.

A case saved by a failing property (reports/cases/<id>.json + .npz) becomes a permanent test by
copying both files here. The replay does not depend on Hypothesis or its database: it rebuilds
the inputs from their bit patterns and re-runs the accuracy check plus the structural property
the case failed (flashcheck.harness.checks.replay).
"""

from pathlib import Path

import pytest

from flashcheck.harness.cases.store import load_case
from flashcheck.harness.checks.replay import replay
from flashcheck.properties.assertions import fail

# Dense (B, H, N, d) inputs: on a kernel of another layout each is skipped, saying why.
pytestmark = pytest.mark.layouts("dense")

HERE = Path(__file__).parent / "regressions"
CASES = sorted(p.stem for p in HERE.glob("*.json"))


@pytest.mark.parametrize("case_id", CASES)
def test_pinned_case_passes(flashcheck_kernel, flashcheck_device, case_id, request):
    case, record = load_case(case_id, HERE)
    kern, dev = flashcheck_kernel, flashcheck_device
    pinned = f"pinned case {case_id} ({record.get('description', case.dtype)})"
    chosen = request.config.getoption("flashcheck_dtypes", None)
    if chosen and case.dtype not in chosen:
        pytest.skip(f"{pinned}: this run tests {', '.join(chosen)} only")
    why = kern.unavailable(case.dtype, dev) or kern.supports(case, dev)
    if why:
        pytest.skip(f"{pinned} lies outside {kern.name}'s contract: {why}")
    lines = []
    _, verdict, _ = replay(case_id, directory=HERE, device=dev, kernel=kern, echo=lines.append)
    if verdict != "PASS":
        prop = (record.get("context") or {}).get("property", "accuracy")
        message = "\n".join(lines[1:])  # (the first line names the pinned file)
        text = f"{verdict} on {pinned}\n{message}"
        fail(case, kern.name, dev, prop, text, {"verdict": verdict})
