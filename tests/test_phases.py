"""The phase timeline of a campaign (``flashcheck report --profile-phases``): the arithmetic of
the spans, the typed record in the results file, and the flag on a tiny campaign."""

import time

import pytest

from flashcheck.harness.campaign.logrecords import load, parse_record
from flashcheck.harness.campaign.phases import OTHER, PHASES, PhaseClock, PhaseTimeline

T0 = 1_000.0  # an arbitrary origin: spans are wall-clock readings


def _clock() -> PhaseClock:
    """Two kernel workers busy 2-5 s and 4-8 s; references 1-6 s (1 s of it alone); a worker
    start 0.5-2 s; case files 8-9 s, rendering 9-10 s, a 10.5 s run."""
    clock = PhaseClock(origin=T0)
    for phase, a, b in [
        ("start-up", 0.0, 0.5),
        ("worker start", 0.5, 2.0),
        ("reference", 1.0, 6.0),
        ("kernel", 2.0, 5.0),
        ("kernel", 4.0, 8.0),
        ("case files", 8.0, 9.0),
        ("rendering", 9.0, 10.0),
    ]:
        clock.add(phase, T0 + a, T0 + b)
    return clock


def test_the_phases_sum_to_the_run_and_the_serial_part_is_what_no_kernel_covers():
    t = _clock().timeline(end=T0 + 10.5, workers=3, kernel_workers=2)
    assert t.wall == pytest.approx(10.5)
    assert sum(r.exclusive for r in t.rows) == pytest.approx(t.wall, abs=1e-3)
    assert t.row("kernel").busy == pytest.approx(6.0)  # the union of 2-5 and 4-8
    assert t.serial == pytest.approx(4.5) and t.serial_share == pytest.approx(4.5 / 10.5)
    ref = t.row("reference")
    assert (ref.busy, ref.overlap, ref.exclusive) == pytest.approx((5.0, 4.0, 1.0))
    # 1-2 s: the worker start and the references both run; reference work comes first.
    assert t.row("worker start").exclusive == pytest.approx(0.5)
    assert t.row(OTHER).exclusive == pytest.approx(0.5)  # 10-10.5 s: nothing recorded
    assert [(g.start, g.end) for g in t.gaps] == [(0.0, 2.0), (8.0, 10.5)]
    assert t.gaps[1].active == ("case files", "rendering")
    assert [r.name for r in t.rows] == [*PHASES, OTHER]


def test_a_span_outside_the_run_is_clipped_and_an_unknown_phase_refused():
    clock = PhaseClock(origin=T0)
    clock.add("kernel", T0 - 5, T0 + 1)
    assert clock.timeline(end=T0 + 2).row("kernel").busy == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown phase 'oracle'"):
        clock.add("oracle", T0, T0 + 1)


def test_kernel_work_is_counted_per_worker_and_while_all_were_busy():
    clock = PhaseClock(origin=T0)
    for w, a, b in [(0, 2.0, 5.0), (1, 4.0, 8.0), (0, 7.0, 7.5), (1, 9.0, 9.5)]:
        clock.add("kernel", T0 + a, T0 + b, worker=w)
    t = clock.timeline(end=T0 + 10.0, workers=1, kernel_workers=2)
    assert t.kernel_busy == pytest.approx((3.5, 4.5))
    assert t.all_busy == pytest.approx(1.5)  # 4-5 s and 7-7.5 s
    assert "all 2 busy at once 1.5 s" in "\n".join(t.table())
    assert parse_record(t.to_json()) == t
    with pytest.raises(ValueError, match="kernel work only"):
        clock.add("reference", T0, T0 + 1, worker=0)
    # A timeline recorded without workers (older results files) reads back without them.
    old = _clock().timeline(end=T0 + 10.5, workers=3, kernel_workers=2).to_json()
    del old["kernel_busy"], old["all_busy"]
    assert parse_record(old).kernel_busy == () and parse_record(old).all_busy is None


def test_the_timeline_record_round_trips():
    t = _clock().timeline(end=T0 + 10.5, workers=3, kernel_workers=2)
    back = parse_record(t.to_json())
    assert isinstance(back, PhaseTimeline) and back == t
    assert "| kernel |" in "\n".join(back.table())


def test_the_flag_records_the_timeline_and_a_resume_keeps_both(tmp_path, capsys):
    from flashcheck.harness.cli import main

    cmd = ["report", "--preset", "smoke", "--kernel", "naive-numpy", "--dtype", "fp32"]
    cmd += ["--part", "grid", "--out", str(tmp_path), "--name", "p", "--no-render"]
    cmd += ["--workers", "1", "--kernel-workers", "1", "--fail-on", "never"]
    cmd += ["--profile-phases"]
    assert main(cmd) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-2].startswith("wall ")  # the table is printed last
    # Resumed (in this process: nothing is left to run), with a second timeline.
    assert main([*cmd, "--no-isolate"]) == 0
    (first, again) = load(tmp_path / "p" / "results.jsonl").timelines
    assert first.row("kernel").spans > 0 and first.row("reference").spans > 0
    assert first.row("worker start").spans == 2  # making the executor, its one kernel worker
    # Every kernel span carries its kernel; each kind's first call of its group is marked.
    assert {r.kernel for r in first.kernels} == {"naive-numpy"}
    assert sum(r.calls for r in first.kernels) == first.row("kernel").spans
    assert [r.first_calls for r in first.kernels if r.call == "run"] == [1]
    # The worker process reports its own span of each call, inside the call's.
    assert all(0 < r.inside <= r.busy for r in first.kernels)
    assert "| naive-numpy | run |" in out
    assert sum(r.exclusive for r in first.rows) == pytest.approx(first.wall, abs=1e-2)
    assert 0 < first.serial < first.wall
    assert again.row("reference").spans == 0  # every result was on file


def test_search_generations_drawn_ahead_give_the_same_results_in_the_same_order(
    tmp_path, monkeypatch
):
    from dataclasses import replace

    from flashcheck.harness.campaign.plan import PRESETS
    from flashcheck.harness.campaign.report import ReportOptions, run_report
    from flashcheck.harness.campaign.scheduling import Scheduler
    from flashcheck.harness.core.resultlog import read_records

    # Three generations of two children: the later ones draw from the earlier ones' results.
    monkeypatch.setitem(PRESETS, "smoke", replace(PRESETS["smoke"], search_generations=3))

    opts = ReportOptions(
        preset="smoke",
        kernels=("naive-numpy", "recurrence-fa2"),
        dtypes=("fp16",),
        out=str(tmp_path),
        isolate=False,
        render=False,
        fail_on="never",
        parts=("grid", "structural", "search"),
    )
    drawn = []
    run_ahead = Scheduler._run_ahead
    monkeypatch.setattr(
        Scheduler, "_run_ahead", lambda self, pairs: drawn.extend(pairs) or run_ahead(self, pairs)
    )
    quiet = {"echo": lambda *a, **k: None}
    assert run_report(replace(opts, name="ahead"), **quiet) == 0
    assert {gen for _, _, gen in drawn} == {0, 1, 2}  # every generation, drawn ahead
    # The same campaign a generation at a time for every kernel together, as before.
    monkeypatch.setattr(Scheduler, "_plan_ahead", lambda self, work, gen: None)
    assert run_report(replace(opts, name="serial"), **quiet) == 0

    def results(name):
        recs = read_records(tmp_path / name / "results.jsonl")
        return [
            {k: v for k, v in r.items() if k != "seconds"} for r in recs if r["type"] == "result"
        ]

    ahead, serial = results("ahead"), results("serial")
    assert any(r["part"] == "search" for r in ahead)
    assert ahead == serial


def _calls_clock() -> PhaseClock:
    """Kernel "a" (forward) 1-4 s, its first call 1-3 s; "b" 2-3 s (first) on a second
    worker; "a" backward 5-6 s; a call of "b" from 9.5 s, past the run's end at 10 s. The
    worker process's own spans: 1.5-2.5 and 3-4 s for "a", 5-7 s for its backward (clipped to
    the call), none for "b"."""
    clock = PhaseClock(origin=T0)
    for w, kernel, call, a, b, first, inside in [
        (0, "a", "run", 1.0, 3.0, True, (1.5, 2.5)),
        (0, "a", "run", 3.0, 4.0, False, (3.0, 4.0)),
        (1, "b", "run", 2.0, 3.0, True, None),
        (0, "a", "backward", 5.0, 6.0, True, (5.0, 7.0)),
        (1, "b", "run", 9.5, 11.0, False, None),
    ]:
        span = None if inside is None else (T0 + inside[0], T0 + inside[1])
        clock.add(
            "kernel", T0 + a, T0 + b, worker=w, kernel=kernel, call=call, first=first, inside=span
        )
    return clock


def test_kernel_work_is_split_by_kernel_and_call_with_the_first_calls_apart():
    t = _calls_clock().timeline(end=T0 + 10.0, workers=1, kernel_workers=2)
    rows = {(r.kernel, r.call): r for r in t.kernels}
    a, b, back = rows["a", "run"], rows["b", "run"], rows["a", "backward"]
    assert (a.calls, a.busy, a.first_calls, a.first_busy) == (2, 3.0, 1, 2.0)
    assert (b.calls, b.busy, b.first_calls, b.first_busy) == (2, 1.5, 1, 1.0)  # clipped at 10 s
    assert (back.calls, back.busy, back.first_busy) == (1, 1.0, 1.0)
    assert (a.inside, b.inside, back.inside) == (2.0, None, 1.0)
    # Worker-seconds: 1-3 s on both workers counts twice; the shares add up to one.
    assert sum(r.busy for r in t.kernels) == pytest.approx(sum(t.kernel_busy))
    assert a.share == pytest.approx(3.0 / 5.5) and sum(r.share for r in t.kernels) == 1.0
    assert [r.kernel for r in t.kernels] == ["a", "b", "a"]  # the busiest first
    text = "\n".join(t.table())
    assert "| a | run | 2 | 3.0 | 2.0 | 1 | 2.0 | 54.5% |" in text
    assert "| b | run | 2 | 1.5 | – | 1 | 1.0 | 27.3% |" in text
    assert "| all | | 5 | 5.5 | 3.0 | 3 | 4.0 | 100.0% |" in text
    assert parse_record(t.to_json()) == t
    with pytest.raises(ValueError, match="unknown call kind 'forward'"):
        PhaseClock(origin=T0).add("kernel", T0, T0 + 1, kernel="a", call="forward")
    with pytest.raises(ValueError, match="kernel work only"):
        PhaseClock(origin=T0).add("reference", T0, T0 + 1, kernel="a")


def test_a_timeline_recorded_before_the_kernel_split_reads_back_without_it():
    old = _calls_clock().timeline(end=T0 + 10.0, workers=1, kernel_workers=2).to_json()
    del old["kernels"]
    back = PhaseTimeline.from_json(old)
    assert back.kernels == () and back.kernel_busy == pytest.approx((4.0, 1.5))
    assert "| kernel | call |" not in "\n".join(back.table())


def test_the_executor_marks_the_first_call_of_each_compile_group_on_its_worker():
    from types import SimpleNamespace

    from flashcheck.harness.campaign.executor import LocalExecutor

    restart = []  # non-empty: the next call (re)starts its worker, as after a timeout

    def call(*args):
        if restart:
            worker.starts.append((restart.pop(), time.time()))
        return "done"

    with LocalExecutor(workers=1, kernel_workers=1, isolate=False) as ex:
        ex.clock = PhaseClock()
        worker = ex._all[0]
        worker.run = worker.backward = worker.check = call
        k, m = SimpleNamespace(spec="k"), SimpleNamespace(spec="m")
        for ref, group in [(k, 5), (k, 5), (k, 7), (m, 5), (k, None), (k, None)]:
            assert ex.run(ref, None, "cpu", affinity=group).result() == "done"
        ex.backward(k, None, "cpu", affinity=5).result()  # a backward compiles its own kernel
        # A structural check calls the forward kernel, whose group 5 is compiled by now.
        ex.check("determinism", k, None, "cpu", 8, affinity=5).result()
        restart.append(time.time())
        ex.run(k, None, "cpu", affinity=5).result()  # a fresh process compiles group 5 again
        # The probe's calls (through group 0) are its own group, apart from the campaign's 0.
        probe = ex.runner(k, "cpu")
        assert [probe(None), probe(None)] == ["done", "done"]
        ex.run(k, None, "cpu", affinity=0).result()
        rows = {(r.kernel, r.call): (r.calls, r.first_calls) for r in ex.clock.timeline().kernels}
    # k run: groups 5, 7, None (its first call on the worker), 5 again after the restart, 0.
    assert rows == {
        ("k", "run"): (7, 5),
        ("k", "probe"): (2, 1),
        ("m", "run"): (1, 1),
        ("k", "backward"): (1, 1),
        ("k", "check"): (1, 0),
    }
