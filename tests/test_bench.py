"""flashcheck bench, the parts that run without a GPU: the plan, timing helpers, the oracle
check of sampled outputs, the renderer (from a synthetic results file) and the CLI's errors."""

import json
from pathlib import Path

import numpy as np
import pytest
from bench_helpers import synthetic_results

from flashcheck.harness.bench.check import judge_rows, reference, sample_rows, sampled_output
from flashcheck.harness.bench.providers import PROVIDERS
from flashcheck.harness.bench.render import render_bench, summary_text
from flashcheck.harness.bench.suite import TOKENS, WIDTH, Shape, _gpu_slug, plan
from flashcheck.harness.bench.summary import bench_summary, load_results
from flashcheck.harness.bench.timing import (
    MAX_COPIES,
    ROTATE_BYTES,
    Timing,
    copies_for_l2,
    time_interleaved,
    time_round_robin,
)
from flashcheck.harness.cli import main

# The tests call torch; the modules they test import it only when they need it.
torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)


def test_grid_follows_the_flashattention_convention():
    items = plan(parts=("grid",))
    assert len(items) == 2 * 3 * 2 * 6  # dtypes × head dims × causal × N
    for shape, provs in items:
        assert shape.h * shape.d == WIDTH
        assert shape.b * shape.n == max(TOKENS, shape.n)  # B = 1 at N = 32K
        assert provs[0] == "triton" and "sdpa-cudnn" in provs
    first = items[0][0]
    assert (first.dtype, first.d, first.causal, first.n) == ("bf16", 128, False, 1024)
    assert len({s.key for s, _ in plan()}) == len(plan())  # keys are unique


def test_plan_parts_providers_and_errors():
    fp32 = plan(parts=("fp32",))
    assert {p for _, ps in fp32 for p in ps} >= {"triton", "triton-tf32"}
    assert all(s.dtype == "fp32" for s, _ in fp32)
    widths = sorted({s.h * s.d for s, _ in plan(parts=("width",))})
    assert widths == [1024, 2048, 4096, 8192]
    only = plan(parts=("grid",), quick=True, providers=("triton",))
    assert only and all(ps == ("triton",) for _, ps in only)
    with pytest.raises(ValueError, match="unknown part"):
        plan(parts=("speed",))
    with pytest.raises(ValueError, match="unknown provider"):
        plan(providers=("cudnn",))


def test_flops_convention():
    s = Shape("grid", "bf16", 2, 16, 4096, 128, False)
    assert s.flops == 4 * 2 * 16 * 4096**2 * 128
    assert Shape("grid", "bf16", 2, 16, 4096, 128, True).flops == s.flops / 2


def test_rotation_and_timing_statistics():
    assert copies_for_l2(ROTATE_BYTES) == 1
    assert copies_for_l2(ROTATE_BYTES // 4) == 4
    assert copies_for_l2(1) == MAX_COPIES
    with pytest.raises(ValueError):
        copies_for_l2(0)
    t = Timing(tuple(float(x) for x in range(1, 12)))
    assert t.median_ms == 6.0
    assert t.spread == pytest.approx((10 - 2) / 6)


class _Clock:
    """A stand-in for the GPU's event clock: each fake kernel call advances it by its cost."""

    now = 0.0

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = _Clock.now

        def elapsed_time(self, end):
            return end.t - self.t

        def synchronize(self):
            pass


def test_round_robin_takes_the_calls_in_turn_and_charges_each_its_own_time(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", _Clock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order = []

    def kernel(name, cost):
        def call(x):
            order.append((name, x))
            _Clock.now += cost

        return call

    fast, slow = kernel("fast", 1.0), kernel("slow", 3.0)
    got = time_round_robin([(fast, [(0,), (1,)]), (slow, [(0,), (1,), (2,)])], reps=5)
    assert [t.median_ms for t in got] == [1.0, 3.0]
    # About 150 ms a call: a round of two calls takes 4 ms, so 75 rounds.
    assert [len(t.runs_ms) for t in got] == [75, 75]
    timed = order[-150:]
    assert [n for n, _ in timed] == ["fast", "slow"] * 75
    assert [x for n, x in timed if n == "slow"][:4] == [1, 2, 0, 1]  # inputs rotate by round
    with pytest.raises(ValueError, match="at least one"):
        time_round_robin([(fast, [])])


def test_interleaved_timing_shuffles_each_round_and_charges_each_its_own_time(monkeypatch):
    # A fixed order (or one only rotated) let a kernel always run after the same neighbour; on
    # a GPU that biased its ratio to its own twin by up to 8 %.
    monkeypatch.setattr(torch.cuda, "Event", _Clock.Event)
    order = []

    def kernel(name, cost):
        def call():
            order.append(name)
            _Clock.now += cost

        return call

    fns = [kernel(n, c) for n, c in (("a", 1.0), ("b", 2.0), ("c", 3.0))]
    assert time_interleaved(fns, reps=12, warmup=1) == [1.0, 2.0, 3.0]
    rounds = [tuple(order[i : i + 3]) for i in range(3, len(order), 3)]
    assert len(rounds) == 12 and all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len(set(rounds)) > 2  # not one order, nor three rotations
    first = list(order)
    order.clear()
    time_interleaved(fns, reps=12, warmup=1)
    assert order == first  # seeded: the same orders again
    with pytest.raises(ValueError, match="at least one"):
        time_interleaved([], reps=1)


def test_round_robin_queues_before_ahead_of_each_call_and_does_not_time_it(monkeypatch):
    # The decode bench overwrites the L2 cache before every call: that work is queued before
    # the call's start event, so no call is charged for it.
    monkeypatch.setattr(torch.cuda, "Event", _Clock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    order = []

    def flush():
        order.append("flush")
        _Clock.now += 10.0

    def kernel(name, cost):
        def call():
            order.append(name)
            _Clock.now += cost

        return call

    got = time_round_robin(
        [(kernel("a", 1.0), [()]), (kernel("b", 2.0), [()])], warmup=1, reps=3, min_ms=3.0,
        before=flush,
    )  # fmt: skip
    assert [t.runs_ms for t in got] == [(1.0,) * 3, (2.0,) * 3]
    # warm-up unflushed, then the sizing round and three timed rounds, each call flushed first
    assert order == ["a", "b"] + ["flush", "a", "flush", "b"] * 4


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_a_shapes_providers_are_timed_together_and_the_slow_ones_alone(monkeypatch, pass_):
    # The GPU-only timing path on CPU tensors, with the stand-in clock: each call charges its
    # provider's cost (its multiple of a matmul's). Each record gets its own time, and says
    # how it was timed.
    from flashcheck.harness.bench.measure import _backward_timer, _forward_timer, _time_all

    monkeypatch.setattr(torch.cuda, "Event", _Clock.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def provider(cost):
        def fn(q, k, v):
            _Clock.now += cost
            o = (q @ k.transpose(-1, -2)).softmax(-1) @ v
            if o.requires_grad:  # its backward costs half its forward
                o.register_hook(lambda g: setattr(_Clock, "now", _Clock.now + cost / 2))
            return o

        return fn

    shape = Shape("grid", "bf16", 1, 2, 8, 4, False, pass_)
    costs = {"a": 1.0, "b": 2.0, "naive": 8.0}
    sets = [tuple(torch.randn(1, 2, 8, 4, requires_grad=pass_ == "bwd") for _ in range(3))]
    prepared = [({"provider": name}, provider(c)) for name, c in costs.items()]
    prepared.append(({"provider": "skipped", "status": "skipped"}, None))
    dos = [torch.randn(1, 2, 8, 4)]
    if pass_ == "bwd":
        prepared = [(r, fn and (fn, sets)) for r, fn in prepared]

    def timer(what, slow):
        if pass_ == "fwd":
            return _forward_timer(what, sets, slow=slow)
        return _backward_timer(what, dos, "bwd", slow=slow)

    _time_all(shape, prepared, lambda r: r["provider"] == "naive", timer)
    recs = {r["provider"]: r for r, _ in prepared}
    for name, cost in costs.items():
        rec = recs[name]
        assert rec["status"] == "ok"
        assert rec["timing"] == ("alone" if name == "naive" else "in turn")
        if pass_ == "fwd":
            assert rec["ms"] == cost
        else:  # the backward alone, on a graph built outside the timing; then both passes
            assert (rec["ms"], rec["fwd_ms"], rec["fwdbwd_ms"]) == (cost / 2, cost, 1.5 * cost)
    assert "ms" not in recs["skipped"]


def test_a_group_whose_timing_raises_is_timed_one_by_one():
    from flashcheck.harness.bench.measure import _time_together

    recs = [{"provider": "ok"}, {"provider": "raises"}, {"provider": "oom"}]

    def timer(idx):
        if idx == [2]:
            raise torch.OutOfMemoryError("CUDA out of memory")
        if len(idx) > 1 or idx == [1]:
            raise RuntimeError("no kernel for this input")
        return {"fwd": [Timing((2.0,)) for _ in idx]}

    got = _time_together(recs, timer)
    assert list(got) == [0] and got[0]["fwd"].median_ms == 2.0
    assert recs[1]["status"] == "error" and "no kernel for this input" in recs[1]["reason"]
    assert recs[2]["status"] == "skipped" and recs[2]["reason"].startswith("out of memory")
    assert "status" not in recs[0]


def test_providers_declare_what_they_take():
    assert PROVIDERS["sdpa-flash"].unsupported("fp32", 64) is not None
    assert PROVIDERS["triton"].unsupported("fp32", 256) is None
    assert PROVIDERS["triton-tf32"].unsupported("bf16", 64) is not None
    assert PROVIDERS["naive"].score_bytes(1, 2, 1024, 2) == 2 * 1024**2 * 8
    assert PROVIDERS["triton"].score_bytes(1, 2, 1024, 2) == 0


def test_sample_rows():
    r = sample_rows(1000, seed=3)
    assert r[0] == 0 and r[-1] == 999 and len(r) == 12 and np.all(np.diff(r) > 0)
    assert np.array_equal(r, sample_rows(1000, seed=3))
    assert np.array_equal(sample_rows(5), np.arange(5))
    with pytest.raises(ValueError):
        sample_rows(0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_check_passes_a_correct_output_and_fails_a_wrong_one(dtype, causal):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 64, 32, generator=g).to(dtype) for _ in range(3))
    rows = sample_rows(64, seed=1)
    ref = reference(q, k, v, causal=causal, rows=rows)
    # the same-precision torch computation of attention: a correct kernel
    keep = torch.ones(64, 64, dtype=torch.bool)
    if causal:
        keep = torch.tril(keep)
    s = (q.float() @ k.float().transpose(-1, -2)) / 32**0.5
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    good = (p @ v.float()).to(dtype)
    res = judge_rows(sampled_output(good, rows), ref, "unknown")
    assert res["verdict"] == "PASS", res
    bad = good.clone()
    bad[1, 2] = bad[1, 2] * 1.05  # the last head of the last batch entry: what the check samples
    res = judge_rows(sampled_output(bad, rows), ref, "flash")
    assert res["verdict"] in ("FAIL", "FAIL-HARD"), res
    assert res["rows"] == 12


def test_render_from_results_only(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res)
    md = render_bench(res).read_text()
    peers = (
        "- **Triton / SDPA flash** at 2 grid and width shapes: lowest **1.43×** at "
        "`grid/bf16/b16h16n1024d128/full`, median 1.43×, highest 1.43× at "
        "`grid/bf16/b4h16n4096d128/full`."
    )
    assert peers in md
    assert "- **Triton / SDPA cuDNN** at d = 128, N ≥ 4096: bf16 N=4096 full 0.83×." in md
    # measurements beside the peers' only: no pass/fail words about the project's own targets
    for word in ("Verdicts", "verdicts", "Floor", "Goal", "Stretch", " met", "not met"):
        assert word not in md.split("## Correctness checks")[0], word
    assert "| 4096 | 4 × 16 | 500 | 350 | 600 | – | 1.43 | 0.83 |" in md
    assert "Incomplete run" not in md
    # Records without a timing field predate timing in turn: the method says so.
    assert "Each provider was timed on its own" in md and "timed in turn" not in md
    memory = (
        "- **Memory** at N = 1024: Triton's peak extra memory is 2.0 MiB; O + LSE take 2.0 MiB "
        "(1.00×)."
    )
    assert memory in md
    assert "| session 1, start | 700 | 3.00 |" in md
    assert "| 1024 | 2.0 | 2.0 | 80.0 |" in md  # the memory table, MiB
    # One compiler row per distinct compiled kernel, with the N it served.
    assert "| bf16 | 128 | no | 1024 | 8 | 2 | 128 | 0 | 96 |" in md
    assert "| bf16 | 128 | no | 4096 | 16 | 2 | 128 | 0 | 96 |" in md
    for fig in ("tflops_vs_n", "memory_vs_n", "wallclock_vs_n"):
        assert (tmp_path / "fake" / f"{fig}.png").stat().st_size > 1000
    doc = json.loads((tmp_path / "fake" / "bench.json").read_text())
    assert doc["summary"]["vs_flash"][0][0] == pytest.approx(500 / 350)
    assert doc["summary"]["vs_cudnn"][0][0] == pytest.approx(500 / 600)
    assert "## Triton side by side with its peers" in summary_text(res)


@pytest.mark.parametrize("passes", ["fwd", "bwd", "fwd then bwd"])
def test_the_method_says_when_providers_were_timed_in_turn(tmp_path, passes):
    # "bwd": a backward-only run, whose forward view is empty (the method once read that view
    # only, and called a backward timed in turn one by one). "fwd then bwd": a forward from
    # before timing in turn, resumed with a backward timed in turn.
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res)
    recs = [json.loads(x) for x in res.read_text().splitlines()]
    out = []
    for r in recs:
        if r.get("type") == "speed":
            if passes != "fwd then bwd":
                r = {**r, "pass": passes, "timing": "in turn"}
            elif r["n"] == 4096:
                r = {**r, "pass": "bwd", "timing": "in turn"}
        out.append(json.dumps(r))
    res.write_text("\n".join(out) + "\n")
    md = render_bench(res, figures=False).read_text()
    if passes == "fwd then bwd":
        assert "before the bench timed in turn (fwd) were timed one provider after" in md
    else:
        assert "timed in turn, one call each, round after round" in md
        assert "timed on its own" not in md and "before the bench timed in turn" not in md


def test_a_failed_check_does_not_score(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res, complete=False, triton_verdict="FAIL")
    md = render_bench(res, figures=False).read_text()
    assert "500 ✗" in md and "Incomplete run" in md
    summ = bench_summary(load_results(res))
    assert summ.vs_flash == [] and len(summ.triton_unscored) == 2
    assert "Triton / SDPA flash" not in md  # nothing scored, nothing compared


def test_cli_without_gpu_and_render_only(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert main(["bench", "--out", str(tmp_path)]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err
    assert main(["bench", "--render-only", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--render-only", "--name", "none", "--out", str(tmp_path)]) == 2
    assert "no results" in capsys.readouterr().err
    synthetic_results(tmp_path / "fake" / "results.jsonl")
    assert main(["bench", "--render-only", "--name", "fake", "--out", str(tmp_path)]) == 0
    assert "Triton / SDPA flash" in capsys.readouterr().out


def test_gpu_slug():
    assert _gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert _gpu_slug("NVIDIA A100-SXM4-40GB") == "a100"
    assert _gpu_slug("Tesla V100") == "v100"


def _tool(path: Path) -> str:
    import json

    with path.open() as f:
        return json.loads(f.readline()).get("tool", "")


# The dense bench's committed results (the decode bench's records are of their own kind).
BENCH_RESULTS = sorted(
    p
    for p in (Path(__file__).resolve().parents[1] / "reports" / "bench").glob("*/results.jsonl")
    if _tool(p) == "flashcheck bench"
)


@pytest.mark.parametrize("path", BENCH_RESULTS, ids=lambda p: p.parent.name)
def test_committed_bench_records_round_trip(path):
    """Each speed and ceilings record reads into its type and writes back as the same JSON
    (records from before the backward passes gain ``pass: fwd``)."""
    from flashcheck.harness.bench.benchrecords import CeilingsRecord, SpeedRecord, load_bench
    from flashcheck.harness.core.resultlog import read_records

    n = 0
    for d in read_records(path):
        if d.get("type") == "speed":
            back = SpeedRecord.from_json(d).to_json()
            assert back == (d if "pass" in d else {**d, "pass": "fwd"})
            n += 1
        elif d.get("type") == "ceilings":
            assert CeilingsRecord.from_json(d).to_json() == d
    data = load_bench(path)
    assert n == sum(len(row) for row in data.shapes.values()) > 0
