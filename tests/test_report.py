"""The error report end to end: campaign, resume after a kill, third-party kernels (good, wrong,
hanging, wrong shape), entry points, rendering and exit codes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import pytest
from record_helpers import result_record as _res

from flashcheck.harness.campaign.gates import gate_exit_code, gate_findings
from flashcheck.harness.campaign.logrecords import (
    LimitationRecord,
    StoppedRecord,
)
from flashcheck.harness.campaign.report import ReportOptions, run_report
from flashcheck.harness.campaign.runner import PRESETS, plan_items
from flashcheck.harness.core.resultlog import read_records

# A kernel module that lives outside the package, as a user's would.
USER_KERNELS = textwrap.dedent(
    """
    import os
    import time

    import torch


    def _attn(q, k, v, causal, scale, factor=1.0):
        # fp32 softmax attention, rounded to the input dtype once at the end
        nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
        rep = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(rep, 1).float()
        v = v.repeat_interleave(rep, 1).float()
        s = (q.float() @ k.transpose(-1, -2)) * (d ** -0.5 if scale is None else scale) * factor
        if causal:
            i = torch.arange(nq)[:, None]
            j = torch.arange(nk)[None, :]
            s = s.masked_fill(j > i + (nk - nq), float("-inf"))
        p = torch.softmax(s, -1)
        if causal:  # a row that keeps no key is 0; NaN inputs still give NaN
            p = torch.where((j <= i + (nk - nq)).any(-1, keepdim=True), p, torch.zeros_like(p))
        return (p @ v).to(q.dtype)


    def good(q, k, v, *, causal=False, scale=None):
        return _attn(q, k, v, causal, scale)


    def wrong(q, k, v, *, causal=False, scale=None):
        # planted bug: the softmax scale is 1.25x too large
        return _attn(q, k, v, causal, scale, factor=1.25)


    def hangs(q, k, v, *, causal=False, scale=None):
        if q.shape[2] == 17:  # one length of the smoke sweep
            time.sleep(3600)
        return _attn(q, k, v, causal, scale)


    def bad_shape(q, k, v, *, causal=False, scale=None):
        return _attn(q, k, v, causal, scale)[..., :1]


    def slow(q, k, v, *, causal=False, scale=None):
        time.sleep(float(os.environ.get("SLOW_KERNEL_SECONDS", "0.15")))
        return _attn(q, k, v, causal, scale)
    """
)


def _cli(args, cwd, env_extra=None, timeout=600):
    env = dict(os.environ, **(env_extra or {}))
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "flashcheck.harness.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "userkern.py").write_text(USER_KERNELS)
    return tmp_path


def _results(path):
    return [r for r in read_records(path) if r["type"] == "result"]


def _numbers(results):
    """Everything of a result that must be reproducible (timings are not)."""
    return {r["key"]: {k: v for k, v in r.items() if k != "seconds"} for r in results}


SMOKE = ["report", "--preset", "smoke", "--dtype", "fp16"]


@pytest.mark.slow
def test_wrong_third_party_kernel_fails_with_a_replayable_worst_case(user_dir):
    out = _cli(
        [
            *SMOKE,
            "--name",
            "t",
            "--kernel",
            "userkern:good",
            "--kernel",
            "userkern:wrong",
            "--fail-on",
            "fail",
        ],
        cwd=user_dir,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    report = (user_dir / "reports/t/error-report.md").read_text()
    rows = {
        line.split("|")[1].strip(): line
        for line in report.splitlines()
        if line.startswith("| userkern:") and "| cpu |" in line
    }
    cols = [c.strip() for c in rows["userkern:wrong"].split("|")]
    # A 1.25x scale error is beyond the loosest bound of any known arithmetic: FAIL-HARD even
    # for a kernel of unknown arithmetic (SPEC 10).
    assert int(cols[7].strip("*")) > 0  # FAIL-HARD count of the wrong kernel
    cols = [c.strip() for c in rows["userkern:good"].split("|")]
    assert cols[6] == "0" and cols[7] == "0"  # the correct one neither FAILs nor FAIL-HARDs
    replays = [
        line
        for line in report.splitlines()
        if "| userkern:wrong |" in line and "flashcheck replay" in line
    ]
    assert replays and "| FAIL-HARD |" in replays[0]
    cmd = replays[0].split("`")[-2].split()
    assert cmd[:2] == ["flashcheck", "replay"]
    rep = _cli(["replay", *cmd[2:]], cwd=user_dir)
    assert rep.returncode == 1, rep.stdout + rep.stderr
    assert "replayed: FAIL-HARD (same verdict)" in rep.stdout
    # the default gate (FAIL-HARD) fails the same results; only the good kernel passes it
    again = _cli(
        [*SMOKE, "--name", "t", "--kernel", "userkern:good", "--kernel", "userkern:wrong"],
        cwd=user_dir,
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert "resuming:" in again.stdout
    good = _cli([*SMOKE, "--name", "g", "--kernel", "userkern:good"], cwd=user_dir)
    assert good.returncode == 0, good.stdout + good.stderr


@pytest.mark.slow
def test_hanging_and_wrong_shape_kernels_are_recorded_and_the_campaign_goes_on(user_dir):
    args = [
        "--name",
        "h",
        "--kernel",
        "userkern:hangs",
        "--kernel",
        "userkern:bad_shape",
        "--timeout",
        "5",
    ]
    out = _cli([*SMOKE, *args], cwd=user_dir)
    assert out.returncode == 1, out.stdout + out.stderr
    res = _results(user_dir / "reports/h/results.jsonl")
    hang = [r for r in res if r["kernel"] == "userkern:hangs"]
    timeouts = [r for r in hang if r["status"] == "TIMEOUT"]
    assert [r["shape"]["Nq"] for r in timeouts] == [17] * len(timeouts) and timeouts
    after = hang[hang.index(timeouts[0]) + 1 :]
    assert any(r["status"] == "PASS" for r in after)  # it went on after the timeout
    bad = [r for r in res if r["kernel"] == "userkern:bad_shape"]
    assert bad and all(r["status"] in ("BAD-OUTPUT", "SKIP") for r in bad)
    assert (
        "returned O of shape" in next(r for r in bad if r["status"] == "BAD-OUTPUT")["reasons"][0]
    )
    report = (user_dir / "reports/h/error-report.md").read_text()
    assert "TIMEOUT: no result within 5 s" in report


@pytest.mark.slow
def test_killed_campaign_resumes_without_recomputing(user_dir):
    args = [*SMOKE, "--name", "k", "--kernel", "userkern:slow", "--kernel", "naive-numpy"]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])
    )
    cmd = [sys.executable, "-m", "flashcheck.harness.cli", *args]
    proc = subprocess.Popen(
        cmd,
        cwd=user_dir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    path = user_dir / "reports/k/results.jsonl"
    deadline = time.monotonic() + 120
    n_before = 0
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists():
            n_before = sum(1 for line in path.read_text().splitlines() if '"result"' in line)
            if n_before >= 12:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the campaign finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)  # the campaign and its kernel process, mid-run
    proc.wait()
    killed = _results(path)
    assert len(killed) >= 12
    out = _cli(args, cwd=user_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"resuming: {len(killed)} results" in out.stdout
    final = _results(path)
    keys = [r["key"] for r in final]
    assert len(keys) == len(set(keys))  # nothing computed twice
    assert [r["key"] for r in final[: len(killed)]] == [r["key"] for r in killed]
    # ... and the resumed campaign ends with exactly the numbers of an uninterrupted one
    ref = _cli([*SMOKE, "--name", "k2", *args[len(SMOKE) + 2 :]], cwd=user_dir)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert _numbers(final) == _numbers(_results(user_dir / "reports/k2/results.jsonl"))


@pytest.mark.slow
def test_same_seed_same_numbers_and_render_reads_only_the_jsonl(tmp_path, capsys):
    def run(name, seed=0):
        opts = ReportOptions(
            name=name,
            preset="smoke",
            seed=seed,
            kernels=("naive-numpy", "recurrence-fa2"),
            dtypes=("bf16",),
            out=str(tmp_path),
            isolate=False,
        )
        assert run_report(opts, progress_stream=sys.stderr) == 0
        return tmp_path / name

    a, b, c = run("a"), run("b"), run("c", seed=1)
    ra, rb, rc = (_results(x / "results.jsonl") for x in (a, b, c))
    assert _numbers(ra) == _numbers(rb)
    assert _numbers(ra) != _numbers(rc)
    md = (a / "error-report.md").read_text()
    for section in (
        "## Verdicts by kernel and dtype",
        "## Worst cases",
        "## FlashAttention-3-style accuracy table",
        "## By input family",
        "## Limitations detected at run time",
        "## Environment",
    ):
        assert section in md
    assert "flashcheck report --name a --preset smoke --seed 0 --dtype bf16" in md
    assert "Incomplete campaign" not in md
    for fig in ("error_vs_n", "error_vs_logit", "ulp_histogram", "bound_utilization"):
        assert (a / f"{fig}.png").stat().st_size > 1000
    # rendering again from the JSONL alone, elsewhere, gives the same markdown
    from flashcheck.harness.campaign.render import render_report

    other = render_report(a / "results.jsonl", tmp_path / "elsewhere", figures=False)

    def body(text):  # without figures and the relative link to the results file
        return [ln for ln in text.splitlines() if ln and not ln.startswith(("![", "### ", "Raw"))]

    assert body(other.read_text()) == body(md)


def test_plan_is_deterministic_and_covers_every_family():
    p = PRESETS["cpu"]
    a, b = plan_items(p, ("fp16", "fp32"), 0), plan_items(p, ("fp16", "fp32"), 0)
    assert a == b and a != plan_items(p, ("fp16", "fp32"), 1)
    grid = {(it.recipe.dtype, it.recipe.family) for it in a if it.part == "grid"}
    assert {f for _, f in grid} == set(p.families)
    assert {it.part for it in a} == {"grid", "length", "edge", "logit", "fa3"}
    assert all(it.recipe.dtype != "fp32" for it in a if it.part == "fa3")


def test_gate_exit_codes():
    res = [_res(s) for s in ("PASS", "FAIL", "SKIP")]
    assert gate_exit_code(res, "fail-hard") == 0
    assert gate_exit_code(res, "fail") == 1
    for status in ("BAD-OUTPUT", "ERROR", "TIMEOUT", "FAIL-HARD"):
        assert gate_exit_code([_res(status)], "fail-hard") == 1, status
        assert gate_exit_code([_res(status)], "never") == 0, status
    # a failed structural property, a stopped kernel and one that could not run are gated too
    bad = _res("FAIL", part="structural")
    assert gate_exit_code([bad], "fail-hard") == 1
    found = gate_findings([bad], "fail-hard")
    assert found == ["structural property nan-rule failed: k fp16"]
    # options-applied names the option it found ignored, and only when it could tell
    unchanged = "softcap=4.034 did not change the output where it changes the exact answer"
    ignored = _res(
        "FAIL",
        part="structural",
        property="options-applied",
        reasons=(f"{unchanged} (by up to 0.8 in O): the kernel ignores the option there",),
    )
    assert gate_findings([ignored], "fail-hard") == [
        "structural property options-applied failed (softcap ignored): k fp16"
    ]
    other = replace(ignored, reasons=(ignored.reasons[0].replace("4.034", "7.808"),))
    assert gate_findings([ignored, other], "fail-hard") == [
        "2 structural property options-applied failed (softcap ignored): k fp16"
    ]
    untold = replace(ignored, reasons=(f"{unchanged}, and without it the output is wrong",))
    assert gate_findings([untold], "fail-hard") == [
        "structural property options-applied failed: k fp16"
    ]
    stopped = StoppedRecord("k", "fp16", "x", 5)
    assert gate_exit_code([stopped], "fail-hard") == 1
    no_run = LimitationRecord("k", "fp16", "x", "cpu", no_run=True)
    assert gate_exit_code([no_run], "fail-hard") == 1
    unavailable = replace(no_run, no_run=False)
    assert gate_exit_code([unavailable], "fail-hard") == 0
    # the message names what was found, and only that
    assert gate_findings([_res("FAIL-HARD"), _res("FAIL-HARD")], "fail") == ["2 FAIL-HARD: k fp16"]
    grad = [_res("FAIL", part="gradients"), _res("FAIL-HARD", part="gradients")]
    assert gate_findings(grad, "fail-hard") == ["gradients FAIL-HARD: k fp16"]
    assert gate_findings(grad, "fail") == ["gradients FAIL: k fp16", "gradients FAIL-HARD: k fp16"]
    # NOT-APPLICABLE says nothing about the kernel: no gate counts it
    assert gate_findings([_res("NOT-APPLICABLE", part="structural")], "fail") == []
    # a property inside which the kernel raised is named
    raised = _res("ERROR", part="structural")
    assert gate_findings([raised], "fail-hard") == ["structural property nan-rule ERROR: k fp16"]


@pytest.mark.slow
def test_report_usage_errors(tmp_path):
    out = _cli(["report", "--kernel", "no_such_module:fn", "--out", str(tmp_path)], tmp_path)
    assert out.returncode == 2 and "cannot import 'no_such_module'" in out.stderr
    out = _cli(["report", "--kernel", "nonsense"], tmp_path)
    assert out.returncode == 2 and "unknown kernel 'nonsense'" in out.stderr
    out = _cli(["render", str(tmp_path / "missing.jsonl")], tmp_path)
    assert out.returncode == 2 and "error" in out.stderr


def test_resuming_with_other_options_is_refused(tmp_path, monkeypatch):
    opts = ReportOptions(
        name="r",
        preset="smoke",
        kernels=("naive-numpy",),
        dtypes=("fp16",),
        out=str(tmp_path),
        isolate=False,
        render=False,
    )
    assert run_report(opts, echo=lambda *a, **k: None) == 0
    from dataclasses import replace

    from flashcheck.harness.campaign import report
    from flashcheck.harness.core.resultlog import ResultLogError

    def no_probe(*args, **kwargs):
        raise AssertionError("probed before the clash was found")

    # Said before the probe (it used to be after it: minutes for a kernel that compiles).
    with monkeypatch.context() as m, pytest.raises(ResultLogError, match="another configuration"):
        m.setattr(report, "_probe", no_probe)
        run_report(replace(opts, seed=3), echo=lambda *a, **k: None)
    assert run_report(replace(opts, seed=3, fresh=True), echo=lambda *a, **k: None) == 0


@pytest.mark.parametrize("cmd", [[], ["report"], ["render"], ["kernels"], ["replay"]])
def test_help_reads(cmd):
    from flashcheck.harness.cli import main

    with pytest.raises(SystemExit) as info:
        main([*cmd, "--help"])
    assert info.value.code == 0


def test_entry_point_kernels_resolve(tmp_path, monkeypatch):
    dist = tmp_path / "userkern_dist-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: userkern-dist\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[flashcheck.kernels]\nmykernel = userkern:good\n")
    (tmp_path / "userkern.py").write_text(USER_KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    from flashcheck.harness.adapters.registry import entry_point_kernels, resolve

    assert "mykernel" in entry_point_kernels()
    adapter = resolve("mykernel")
    assert adapter.arithmetic == "unknown"
    assert adapter.masks == frozenset({"causal"})  # what its signature takes
    assert adapter.options == frozenset({"causal", "scale"})


@pytest.mark.slow
def test_results_are_bitwise_identical_whatever_the_number_of_workers(user_dir):
    # One reference process and one kernel worker, against two of each (on 2 cores that is
    # every core): the same records, bit for bit, in the same order. A user kernel and a
    # built-in one, so that fitted cases, shared oracle calls and the structural part all run.
    kernels = ["--kernel", "userkern:good", "--kernel", "naive-torch"]
    one = _cli(
        [*SMOKE, "--name", "w1", *kernels, "--workers", "1", "--kernel-workers", "1"], cwd=user_dir
    )
    two = _cli(
        [*SMOKE, "--name", "w2", *kernels, "--workers", "2", "--kernel-workers", "2"], cwd=user_dir
    )
    assert one.returncode == two.returncode == 0, one.stdout + one.stderr + two.stdout
    a = _results(user_dir / "reports/w1/results.jsonl")
    b = _results(user_dir / "reports/w2/results.jsonl")
    assert [r["key"] for r in a] == [r["key"] for r in b]
    assert _numbers(a) == _numbers(b)
    assert {r["part"] for r in a} >= {"grid", "structural", "search"}


@pytest.mark.slow
def test_ray_executor_gives_the_same_results(user_dir):
    pytest.importorskip(
        "ray", reason="the ray extra is not installed (pip install 'flashcheck[ray]')"
    )
    kernels = ["--kernel", "userkern:good", "--kernel", "naive-numpy"]
    local = _cli([*SMOKE, "--name", "loc", *kernels], cwd=user_dir)
    # A Ray instance started on this machine (loopback): tasks and actors, same campaign.
    ray = _cli(
        [*SMOKE, "--name", "ray", *kernels, "--executor", "ray", "--profile-phases"],
        cwd=user_dir,
    )
    assert local.returncode == ray.returncode == 0, ray.stdout + ray.stderr
    a = _results(user_dir / "reports/loc/results.jsonl")
    b = _results(user_dir / "reports/ray/results.jsonl")
    assert a and _numbers(a) == _numbers(b)
    # Its timeline has the actors' kernel calls and the tasks' references (it once had
    # neither, and called the whole run serial).
    lines = (user_dir / "reports/ray/results.jsonl").read_text().splitlines()
    (phases,) = [r for r in map(json.loads, lines) if r.get("type") == "phases"]
    assert {k["kernel"] for k in phases["kernels"]} == {"userkern:good", "naive-numpy"}
    busy = {row["name"]: row["busy"] for row in phases["rows"]}
    assert busy["kernel"] > 0 and busy["reference"] > 0 and phases["serial"] < phases["wall"]


def test_a_kernel_error_keeps_the_exception_it_was_raised_from():
    # Triton's CompilationError shows only the source excerpt; the reason is in __cause__.
    from flashcheck.harness.adapters.outcome import with_causes as _with_causes

    try:
        try:
            raise ValueError("Mismatched type for keep")
        except ValueError as inner:
            raise RuntimeError("at 61:9: dq = _dq_keys(") from inner
    except RuntimeError as err:
        text = _with_causes(err)
    assert text == (
        "RuntimeError: at 61:9: dq = _dq_keys( <- caused by ValueError: Mismatched type for keep"
    )
