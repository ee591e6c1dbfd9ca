"""Pinned regressions: every case file in properties/regressions/ must now PASS.

A case saved by a failing property (reports/cases/<id>.json + .npz) becomes a permanent test by
copying both files here. The replay does not depend on Hypothesis or its database: it rebuilds
the inputs from their bit patterns and re-runs the accuracy check plus the structural property
the case failed (harness.replay).
"""

from pathlib import Path

import pytest

from harness.adapters import resolve
from harness.casestore import load_case
from harness.replay import default_device, replay

HERE = Path(__file__).parent / "regressions"
CASES = sorted(p.stem for p in HERE.glob("*.json"))


@pytest.mark.parametrize("case_id", CASES)
def test_pinned_case_now_passes(case_id):
    _, record = load_case(case_id, HERE)
    adapter = resolve(record["kernel"])
    dev = default_device(adapter.devices, None)
    why = adapter.unavailable(record["dtype"], dev)
    if why:
        pytest.skip(why)
    lines = []
    _, verdict, _ = replay(case_id, directory=HERE, device=dev, echo=lines.append)
    assert verdict == "PASS", "\n".join(lines)
