"""Campaign throughput against the number of workers: wall time, results per second, and
whether every run wrote the same results bit for bit.

    python benchmarks/campaign_speed.py            # the default campaign, 1 and all cores
    python benchmarks/campaign_speed.py --runs 1 2 --preset smoke --kernel naive-numpy
    python benchmarks/campaign_speed.py --runs 16:1 16:2 --kernel mod:fn   # N:K, K kernel workers
    python benchmarks/campaign_speed.py --executor ray          # the same on a local Ray instance
    python benchmarks/campaign_speed.py --cold-caches ...       # every run compiles its kernels
    python benchmarks/campaign_speed.py --profile-phases ...    # and each run's phase timeline
    python benchmarks/campaign_speed.py --repeat 3 --runs 16:1 16:2 ...  # 1, 2, 1, 2, 1, 2
    python benchmarks/campaign_speed.py --compare A.jsonl B.jsonl ...  # saved runs side by side

Each run is a fresh ``flashcheck report`` (a new process, ``--fail-on never --no-render``) into
a temporary folder, with ``--workers N --kernel-workers K`` (a run ``N`` alone: ``K = N``); the
table gives the speedup over the first run and whether its results are the first run's, bit for
bit. Not a timed test: numbers depend on the machine (record them in RESULTS.md). With
``--profile-phases`` every run records its phase timeline (``flashcheck report
--profile-phases``); the table gains each run's serial share (no kernel worker busy) and the
timelines follow it, each with its kernel work per kernel.

``--repeat N`` runs the list N times over, alternating (``1:1 2:2 1:1 2:2 ...``), and adds a
table per configuration: its median, min and max wall over its N runs, the speedup as the ratio
of medians, and the min and max of the pairs' ratios (the j-th run of each configuration).
``--compare`` runs nothing: it reads saved results files (``--save``'s, of one call or of
several) and prints them side by side: phases, kernel work per kernel (files that recorded it),
the results' ``seconds`` summed per kernel, and the same per-configuration table over the
files' own walls (the campaign process's, from its phase timeline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flashcheck.harness.campaign.speed_runs import (
    SpeedRun,
    compare_lines,
    read_saved_run,
    run_order,
    summarize,
    summary_table,
)


def _results(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("type") == "result":
            out.append({k: v for k, v in rec.items() if k != "seconds"})
    return out


def _timeline(path: Path):
    from flashcheck.harness.campaign.phases import PhaseTimeline

    recs = [json.loads(line) for line in path.read_text().splitlines()]
    return PhaseTimeline.from_json([r for r in recs if r.get("type") == "phases"][-1])


def _print_table(rows: list[tuple], timelines: list[tuple[str, Any]]) -> None:
    """The runs' table, with each run's serial share if timelines were recorded."""
    serial = [f" {t.serial_share:.1%} |" for _, t in timelines] or [""] * len(rows)
    head = " serial share |" if timelines else ""
    cols = "workers | kernel workers | wall (s) | results | results/s | speedup | same results"
    print(f"\n| {cols} |{head}")
    print("|---|---|---|---|---|---|---|" + ("---|" if timelines else ""))
    for (n, k, wall, count, rate, speedup, same), extra in zip(rows, serial, strict=True):
        print(f"| {n} | {k} | {wall:.1f} | {count} | {rate:.2f} | {speedup:.2f}x | {same} |{extra}")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs",
        nargs="+",
        default=["1", str(os.cpu_count() or 1)],
        help="N or N:K per run (workers : kernel workers)",
    )
    ap.add_argument("--preset", default=None, help="campaign preset (default: the machine's)")
    ap.add_argument("--kernel", action="append", help="kernels (default: every built-in one)")
    ap.add_argument("--dtype", action="append", help="dtypes (default: all three)")
    ap.add_argument("--executor", choices=("local", "ray"), default="local")
    ap.add_argument(
        "--cold-caches",
        action="store_true",
        help="give every run empty Triton and TorchInductor caches, so that no run reuses the "
        "kernels an earlier run compiled",
    )
    ap.add_argument(
        "--save",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy each run's results file to DIR/run<i>.jsonl (compare runs of separate calls)",
    )
    ap.add_argument(
        "--profile-phases",
        action="store_true",
        help="record each run's phase timeline; print its serial share and its phase table",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the --runs list N times, alternating, and give each configuration's median",
    )
    ap.add_argument(
        "--compare",
        nargs="+",
        type=Path,
        default=None,
        metavar="FILE",
        help="run nothing: print these saved results files side by side",
    )
    return ap


def _command(args: argparse.Namespace, i: int, n: str, k: str, out: str) -> list[str]:
    """The ``flashcheck report`` command of run ``i``."""
    cmd = [sys.executable, "-m", "flashcheck.harness.cli", "report", "--name", f"run{i}"]
    cmd += ["--out", out, "--fail-on", "never", "--no-render", "--workers", n]
    cmd += ["--kernel-workers", k, "--executor", args.executor]
    if args.preset:
        cmd += ["--preset", args.preset]
    for spec in args.kernel or ():
        cmd += ["--kernel", spec]
    for dt in args.dtype or ():
        cmd += ["--dtype", dt]
    if args.profile_phases:
        cmd.append("--profile-phases")
    return cmd


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.compare:
        print("\n".join(compare_lines([read_saved_run(p) for p in args.compare])))
        return 0
    if args.repeat < 1:
        print(f"--repeat takes a count >= 1, got {args.repeat}", file=sys.stderr)
        return 2
    rows, first, timelines, runs = [], None, [], []
    with tempfile.TemporaryDirectory(prefix="campaign-speed-") as tmp:
        for i, run in enumerate(run_order(args.runs, repeat=args.repeat)):
            n, _, k = run.partition(":")
            k = k or n
            env = dict(os.environ)
            if args.cold_caches:
                env["TRITON_CACHE_DIR"] = str(Path(tmp) / f"triton-cache{i}")
                env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / f"inductor-cache{i}")
            t0 = time.perf_counter()
            cmd = _command(args, i, n, k, tmp)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            wall = time.perf_counter() - t0
            if proc.returncode != 0:
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                return proc.returncode
            results = Path(tmp) / f"run{i}" / "results.jsonl"
            res = _results(results)
            if args.save:
                args.save.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(results, args.save / f"run{i}.jsonl")
            if args.profile_phases:
                timelines.append((run, _timeline(results)))
                # Printed as each run ends: a later run cut off by a time limit loses only itself.
                print(f"\nrun {i} ({run}), phase timeline:\n" + "\n".join(timelines[-1][1].table()))
            first = first or (res, wall)
            same = "yes" if res == first[0] else "NO"
            rows.append((n, k, wall, len(res), len(res) / wall, first[1] / wall, same))
            runs.append(SpeedRun(f"{n}:{k}", wall, len(res), same == "yes"))
            print(f"run {i} ({run}): {wall:.1f} s, {len(res)} results", flush=True)
    _print_table(rows, timelines)
    if args.repeat > 1:
        print("\nper configuration, over its runs (speedup: over the first configuration):\n")
        print("\n".join(summary_table(summarize(runs))))
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
