"""Repeated campaign speed runs (``benchmarks/campaign_speed.py --repeat`` and ``--compare``):
the alternating order, the medians and the pairs' spread on made-up walls, and the side-by-side
reading of saved results files, old (no kernel split) and new."""

import importlib.util
import json
from pathlib import Path

import pytest

from flashcheck.harness.campaign.phases import PhaseClock
from flashcheck.harness.campaign.speed_runs import (
    SpeedRun,
    compare_lines,
    read_saved_run,
    run_order,
    summarize,
    summary_table,
)

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_000.0


def test_runs_alternate_configurations():
    assert run_order(["1:1", "1:2"], repeat=3) == ["1:1", "1:2"] * 3
    with pytest.raises(ValueError, match="repeat must be >= 1"):
        run_order(["1:1"], repeat=0)


def test_each_configuration_gets_its_median_and_the_pairs_spread():
    # Tonight's four walls, then a third pair: 1 GPU 389.3, 326.3, 350; 2 GPUs 186.1, 210, 200.
    walls = [("32:1", 389.3), ("32:2", 186.1), ("32:1", 326.3), ("32:2", 210.0)]
    walls += [("32:1", 350.0), ("32:2", 200.0)]
    runs = [SpeedRun(c, w, 1405, True) for c, w in walls]
    one, two = summarize(runs)
    assert (one.config, one.runs, one.median, one.low, one.high) == ("32:1", 3, 350.0, 326.3, 389.3)
    assert one.speedup == 1.0 and one.pair_low is None and one.same
    assert (two.runs, two.median, two.low, two.high) == (3, 200.0, 186.1, 210.0)
    assert two.speedup == pytest.approx(350.0 / 200.0)  # the ratio of the medians
    # Pairs: 389.3 / 186.1, 326.3 / 210, 350 / 200.
    assert (two.pair_low, two.pair_high) == pytest.approx((326.3 / 210.0, 389.3 / 186.1))
    table = "\n".join(summary_table((one, two)))
    assert "| 32:2 | 3 | 200.0 | 186.1 | 210.0 | 1.75x | 1.55x-2.09x | yes |" in table
    # One run whose results differ marks its configuration.
    runs[3] = SpeedRun("32:2", 210.0, 1405, False)
    assert [s.same for s in summarize(runs)] == [True, False]
    with pytest.raises(ValueError, match="wall time must be > 0"):
        summarize([SpeedRun("1:1", 0.0, 1, True)])


def _saved(path: Path, *, kernel_workers: int, slow: float, split: bool) -> Path:
    """A small results file: a session with its command line, two results with timings, and
    a phase timeline whose one kernel call took ``slow`` seconds (with its kernel if
    ``split``; without: as recorded before the split)."""
    clock = PhaseClock(origin=T0)
    clock.add("start-up", T0, T0 + 1.0)
    inside = (T0 + 1.0, T0 + 1.0 + slow / 2)
    clock.add("kernel", T0 + 1.0, T0 + 1.0 + slow, worker=0, kernel="k", first=True, inside=inside)
    timeline = clock.timeline(end=T0 + 2.0 + slow, kernel_workers=kernel_workers).to_json()
    if not split:
        del timeline["kernels"]
    argv = f"report --workers 2 --kernel-workers {kernel_workers} --preset smoke"
    recs = [
        {"schema": "flashcheck-results/1", "type": "header", "config": {}},
        {"type": "session", "env": {"argv": argv}},
        {"type": "result", "kernel": "k", "status": "PASS", "seconds": {"oracle": 0.5}},
        {"type": "result", "kernel": "k", "status": "PASS", "seconds": {"wait": slow}},
        timeline,
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_compare_puts_saved_runs_side_by_side_old_and_new(tmp_path):
    old = read_saved_run(_saved(tmp_path / "a.jsonl", kernel_workers=1, slow=4.0, split=False))
    new = read_saved_run(_saved(tmp_path / "b.jsonl", kernel_workers=2, slow=2.0, split=True))
    assert (old.config, new.config) == ("2:1", "2:2")
    assert old.seconds == {"k": {"oracle": 0.5, "wait": 4.0}}
    text = "\n".join(compare_lines([old, new]))
    assert "(2:2): 2 results (same as A: yes)" in text
    assert "| kernel | 4.0 / 4.0 | 2.0 / 2.0 |" in text  # the phases, busy / exclusive
    assert "| k run | – | 2.0 / 2.0 / 1.0 / 1 |" in text  # no kernel split in the old file
    assert "| k | 4.0 | 2.0 |" in text and "`seconds.wait`" in text
    assert "| 2:2 | 1 | 4.0 | 4.0 | 4.0 | 1.50x | 1.50x-1.50x | yes |" in text  # walls 6 and 4


def test_the_script_compares_saved_files(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "campaign_speed", ROOT / "benchmarks/campaign_speed.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = _saved(tmp_path / "a.jsonl", kernel_workers=1, slow=1.0, split=True)
    assert script.main(["--compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("A: ") and "| k run | 1.0 / 1.0 / 0.5 / 1 | 1.0 / 1.0 / 0.5 / 1 |" in out
    assert script.main(["--repeat", "0"]) == 2
