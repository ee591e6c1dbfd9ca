"""flashcheck bench, the parts that run without a GPU: the plan, timing helpers, the oracle
check of sampled outputs, the renderer (from a synthetic results file) and the CLI's errors."""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is a tox dependency; bare envs may lack it")
# E402 below: the imports need torch, so they follow the importorskip above.

from flashcheck.harness.bench.check import judge_rows, reference, sample_rows, sampled_output  # noqa: E402
from flashcheck.harness.bench.providers import PROVIDERS  # noqa: E402
from flashcheck.harness.bench.render import render_bench, summary_text  # noqa: E402
from flashcheck.harness.bench.suite import TOKENS, WIDTH, Shape, _gpu_slug, plan  # noqa: E402
from flashcheck.harness.bench.summary import bench_summary, load_results  # noqa: E402
from flashcheck.harness.bench.timing import MAX_COPIES, ROTATE_BYTES, Timing, copies_for_l2  # noqa: E402
from flashcheck.harness.cli import main  # noqa: E402
from flashcheck.harness.core.resultlog import ResultLog  # noqa: E402


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


def _synthetic(path, *, complete=True, triton_verdict="PASS"):
    """A results file as flashcheck bench writes it, with made-up speeds."""
    header = {
        "tool": "flashcheck bench",
        "name": "fake",
        "config": {"parts": ["grid", "memory"], "quick": True, "seed": 0, "providers": None},
    }
    with ResultLog.open(path, header, fresh=True) as log:
        log.append({"type": "session", "env": {"gpu": "Fake GPU", "torch": "x"}})
        log.append(
            {
                "type": "ceilings",
                "matmul_bf16_tflops": 700.0,
                "matmul_n": 8192,
                "copy_tbs": 3.0,
                "copy_bytes": 2**30,
            }
        )
        speeds = {"triton": 500.0, "sdpa-flash": 350.0, "sdpa-cudnn": 600.0}
        compiled = {"stages": 2, "registers": 128, "spills": 0, "shared_bytes": 98304}
        for n in (1024, 4096):
            shape = Shape("grid", "bf16", TOKENS // n, 16, n, 128, False)
            for prov, tf in speeds.items():
                verdict = triton_verdict if prov == "triton" else "PASS"
                # The compiler's report, as on Hopper: short sequences take another tile.
                tile = {"warps": 8 if n <= 2048 else 16, **compiled}
                info = {"triton": tile} if prov == "triton" else {}
                log.append(
                    {
                        "type": "speed",
                        "key": shape.key,
                        "provider": prov,
                        **shape.as_dict(),
                        "status": "ok",
                        "ms": shape.flops / tf / 1e9,
                        "tflops": tf,
                        "runs": 20,
                        "spread": 0.01,
                        **info,
                        "check": {
                            "verdict": verdict,
                            "max_ulp": 0.5,
                            "naive_ulp": 0.5,
                            "det_util": 0.1,
                            "reasons": [],
                            "rows": 12,
                        },
                    }
                )
            log.append(
                {
                    "type": "speed",
                    "key": shape.key,
                    "provider": "sdpa-math",
                    **shape.as_dict(),
                    "status": "skipped",
                    "reason": "too big",
                }
            )
            log.append({"type": "shape-done", "key": shape.key})
        shape = Shape("memory", "bf16", 1, 8, 1024, 128, False)
        for prov, extra in (("triton", 2 * 2**20 + 32768), ("naive", 80 * 2**20)):
            log.append(
                {
                    "type": "speed",
                    "key": shape.key,
                    "provider": prov,
                    **shape.as_dict(),
                    "status": "ok",
                    "ms": 0.1,
                    "tflops": 10.0,
                    "runs": 20,
                    "spread": 0.0,
                    "peak_extra_bytes": extra,
                    "out_bytes": 2 * 2**20,
                    "lse_bytes": 32768,
                    "check": {
                        "verdict": "PASS",
                        "max_ulp": 0.5,
                        "naive_ulp": 0.5,
                        "det_util": 0.1,
                        "reasons": [],
                        "rows": 12,
                    },
                }
            )
        if complete:
            log.append({"type": "complete"})


def test_render_from_results_only(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    _synthetic(res)
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


def test_a_failed_check_does_not_score(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    _synthetic(res, complete=False, triton_verdict="FAIL")
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
    _synthetic(tmp_path / "fake" / "results.jsonl")
    assert main(["bench", "--render-only", "--name", "fake", "--out", str(tmp_path)]) == 0
    assert "Triton / SDPA flash" in capsys.readouterr().out


def test_gpu_slug():
    assert _gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert _gpu_slug("NVIDIA A100-SXM4-40GB") == "a100"
    assert _gpu_slug("Tesla V100") == "v100"


# ---------------------------------------------------------------------------------------------
# Backward passes (--pass bwd, fwd+bwd)

from dataclasses import replace  # noqa: E402

from flashcheck.harness.bench import grad_check  # noqa: E402
from flashcheck.harness.bench.suite import FLOP_FACTOR, PASSES  # noqa: E402


def test_plan_passes_and_shape_filters():
    fwd = plan(parts=("grid",))
    both = plan(parts=("grid",), passes=("fwd", "bwd"))
    assert [s.key for s, _ in both[: len(fwd)]] == [s.key for s, _ in fwd]  # unchanged keys
    bwd = [s for s, _ in both[len(fwd) :]]
    assert all(s.pass_ == "bwd" and s.key.endswith("/bwd") for s in bwd)
    assert len({s.key for s, _ in both}) == len(both)
    assert bwd[0].as_dict()["pass"] == "bwd" and fwd[0][0].as_dict()["pass"] == "fwd"
    sel = plan(
        parts=("grid",), passes=("bwd",), ns=(1024, 16384), head_dims=(128,), dtypes=("bf16",)
    )
    assert [(s.n, s.causal) for s, _ in sel] == [
        (1024, False),
        (16384, False),
        (1024, True),
        (16384, True),
    ]
    assert plan(parts=("memory",), passes=("bwd",), ns=(4096,))[0][0].key.endswith("/bwd")
    with pytest.raises(ValueError, match="passes"):
        plan(passes=("backward",))
    with pytest.raises(ValueError, match="passes"):
        plan(passes=())
    with pytest.raises(ValueError, match="dtypes"):
        plan(dtypes=("fp8",))
    with pytest.raises(ValueError, match="ns must be positive"):
        plan(ns=(0,))
    with pytest.raises(ValueError, match="unknown pass"):
        Shape("grid", "bf16", 1, 1, 8, 8, False, "bwd2")


def test_backward_flops():
    assert PASSES == ("fwd", "bwd", "fwd+bwd")
    f = Shape("grid", "bf16", 2, 16, 4096, 128, False)
    for p, factor in (("fwd", 1.0), ("bwd", 2.5), ("fwd+bwd", 3.5)):
        s = replace(f, pass_=p)
        assert FLOP_FACTOR[p] == factor and s.flops == factor * 4 * 2 * 16 * 4096**2 * 128
        assert replace(s, causal=True).flops == s.flops / 2
        assert s.forward_flops == f.flops


def test_backward_providers(monkeypatch):
    tri = PROVIDERS["triton"]
    assert (
        tri.backward_arithmetic == "flash"
        and PROVIDERS["sdpa-flash"].backward_arithmetic == "flash"
    )
    assert PROVIDERS["naive"].backward_arithmetic == "naive"
    assert PROVIDERS["sdpa-cudnn"].backward_arithmetic == "unknown"
    gone = replace(tri, grad_module="flashcheck.kernels.no_such_backward")
    assert gone.unsupported("bf16", 128, backward=True) == (
        "unsupported: Triton backward not available"
    )
    assert gone.unsupported("bf16", 128) is None  # the forward does not need it
    assert PROVIDERS["sdpa-flash"].unsupported("bf16", 128, backward=True) is None
    assert PROVIDERS["naive"].score_bytes(1, 2, 1024, 2, backward=True) == 2 * 2 * 1024**2 * 8
    # the forward's callable is what autograd differentiates, except for triton
    q = torch.randn(1, 1, 8, 4)
    assert PROVIDERS["naive"].make_grad(q, q, q, False)(q, q, q).shape == (1, 1, 8, 4)


def test_pass_figures_record_the_side_timings():
    from flashcheck.harness.bench.measure import _pass_figures

    s = Shape("grid", "bf16", 1, 1, 1024, 64, False, "bwd")
    rec = _pass_figures(
        s, {"fwd": Timing((1.0,) * 5), "bwd": Timing((2.0,) * 5), "fwd+bwd": Timing((3.5,) * 5)}
    )
    assert rec["ms"] == 2.0 and rec["tflops"] == pytest.approx(s.flops / 2.0 / 1e9)
    assert rec["diff_ms"] == 2.5 and rec["diff_tflops"] == pytest.approx(s.flops / 2.5 / 1e9)
    both = _pass_figures(replace(s, pass_="fwd+bwd"), {"fwd+bwd": Timing((3.5,) * 5)})
    assert both["ms"] == 3.5 and "diff_ms" not in both


def _grads(q, k, v, do, causal, dtype):
    """fp32 autograd of attention, rounded to ``dtype``: a correct backward."""
    leaves = [x.float().requires_grad_(True) for x in (q, k, v)]
    n = q.shape[2]
    keep = torch.ones(n, n, dtype=torch.bool)
    if causal:
        keep = torch.tril(keep)
    s = (leaves[0] @ leaves[1].transpose(-1, -2)) / q.shape[3] ** 0.5
    o = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ leaves[2]
    return [g.to(dtype) for g in torch.autograd.grad(o, leaves, do.float())]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("oracle_max_n", [1024, 0])  # dK/dV: certified oracle, float64
def test_gradient_check_passes_correct_and_fails_wrong(causal, oracle_max_n):
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 64, 32, generator=g).to(dtype) for _ in range(4))
    rows = sample_rows(64, seed=1)
    ref = grad_check.grad_reference(
        q, k, v, do, causal=causal, rows=rows, oracle_max_n=oracle_max_n
    )
    assert ref.kv_mode == ("oracle" if oracle_max_n else "fp64")
    assert ref.keys[0] == 0 and ref.keys[-1] == 63 and ref.keys.size == grad_check.SAMPLE_KEYS
    good = _grads(q, k, v, do, causal, dtype)
    for cls in ("flash", "unknown"):
        res = grad_check.judge_grads(grad_check.sampled_grads(*good, rows, ref.keys), ref, cls)
        assert res["verdict"] == "PASS", res
    assert res["rows"] == 12 and res["kv_mode"] == ref.kv_mode
    for i, name in enumerate(("dq", "dk", "dv")):
        bad = [x.clone() for x in good]
        bad[i][1, 2] *= 1.05  # the last head of the last batch entry: what is sampled
        res = grad_check.judge_grads(grad_check.sampled_grads(*bad, rows, ref.keys), ref, "flash")
        assert res["verdict"] in ("FAIL", "FAIL-HARD"), (name, res)
        assert res["max_ulp"][name] > 1, (name, res)
    nan = [x.clone() for x in good]
    nan[1][1, 2, ref.keys[3]] = float("nan")
    res = grad_check.judge_grads(grad_check.sampled_grads(*nan, rows, ref.keys), ref, "unknown")
    assert res["verdict"] == "FAIL-HARD"


def test_float64_key_gradients_agree_with_the_oracle():
    from flashcheck.harness.oracle.evaluate import oracle

    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 1, 48, 16, generator=g).to(torch.float16) for _ in range(4))
    keys = np.array([0, 7, 30, 47])
    ref = oracle(q, k, v, causal=True, do=do, rows=[0], keys=keys)
    f = grad_check.fp64_key_gradients(
        q[0, 0], k[0, 0], v[0, 0], do[0, 0], causal=True, keys=keys, chunk=10
    )
    for name in ("dk", "dv"):
        floor = ref[name].floor
        assert np.all(np.abs(f[name].hi - ref[name].hi) <= 1e-12 * floor)
        assert np.allclose(f[name].floor, floor, rtol=1e-12)
    with pytest.raises(ValueError, match="chunk"):
        grad_check.fp64_key_gradients(
            q[0, 0], k[0, 0], v[0, 0], do[0, 0], causal=False, keys=keys, chunk=0
        )


def _check(verdict="PASS", mode="fp64"):
    return {
        "verdict": verdict,
        "reasons": [] if verdict == "PASS" else ["FAIL: made up"],
        "max_ulp": {"dq": 0.6, "dk": 0.7, "dv": 0.5},
        "naive_ulp": {"dq": 1, "dk": 1, "dv": 1},
        "det_util": {"dq": 0.1, "dk": 0.1, "dv": 0.1},
        "rows": 12,
        "keys": 12,
        "kv_mode": mode,
    }


def _add_backward(path, *, triton_verdict="PASS"):
    """Backward records appended to a synthetic results file (made-up speeds)."""
    with ResultLog.open(path, json.loads(path.read_text().splitlines()[0])) as log:
        speeds = {"triton": 300.0, "sdpa-flash": 250.0, "sdpa-cudnn": 500.0}
        for n in (1024, 4096):
            shape = Shape("grid", "bf16", TOKENS // n, 16, n, 128, False, "bwd")
            for prov, tf in speeds.items():
                verdict = triton_verdict if prov == "triton" else "PASS"
                log.append(
                    {
                        "type": "speed",
                        "key": shape.key,
                        "provider": prov,
                        **shape.as_dict(),
                        "status": "ok",
                        "ms": shape.flops / tf / 1e9,
                        "tflops": tf,
                        "runs": 20,
                        "spread": 0.01,
                        "fwd_ms": 1.0,
                        "fwdbwd_ms": 3.0,
                        "diff_ms": 2.0,
                        "diff_tflops": tf * 0.9,
                        "check": _check(verdict),
                    }
                )
            log.append({"type": "shape-done", "key": shape.key})
        for n, extra in ((1024, 9 * 2**20), (4096, 36 * 2**20)):
            shape = Shape("memory", "bf16", 1, 8, n, 128, False, "bwd")
            log.append(
                {
                    "type": "speed",
                    "key": shape.key,
                    "provider": "triton",
                    **shape.as_dict(),
                    "status": "ok",
                    "ms": 0.1,
                    "tflops": 10.0,
                    "runs": 20,
                    "spread": 0.0,
                    "bwd_peak_extra_bytes": extra,
                    "saved_bytes": 2**20,
                    "grad_bytes": 3 * n * 1024 * 2,
                    "check": _check("PASS", "oracle"),
                }
            )


def test_render_backward_sections_never_mix_passes(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    _synthetic(res)
    _add_backward(res)
    md = render_bench(res, figures=False).read_text()
    # the forward's ratios are what they were without the backward records
    assert "lowest **1.43×**" in md and "bf16 N=4096 full 0.83×" in md
    assert "## Backward (`--pass bwd`): side by side with its peers" in md
    assert "lowest **1.20×** at `grid/bf16/b16h16n1024d128/full/bwd`" in md
    assert "- **Triton / SDPA cuDNN** at d = 128, N ≥ 4096: bf16 N=4096 full 0.60×." in md
    assert "## Backward, bf16, d = 128, non-causal: TFLOP/s" in md
    assert "| 4096 | 4 × 16 | 300 | 250 | 500 | 1.20 | 0.60 |" in md
    assert "| bf16 | 128 | no | 4096 | 270 | 225 | 450 |" in md  # fwd+bwd − fwd
    assert "**Backward memory**" in md and "is 1.50× at N = 1024 and 1.50× at N = 4096" in md
    assert "## Backward: gradient checks" in md and "| triton | 4 | 0 | 0 | 0.6 / 0.7 / 0.5 |" in md
    assert "fp64 (6 checks), oracle (2 checks)" in md
    doc = json.loads((tmp_path / "fake" / "bench.json").read_text())
    assert doc["summary"]["vs_flash"][0][0] == pytest.approx(500 / 350)
    assert doc["summary_by_pass"]["bwd"]["vs_flash"][0][0] == pytest.approx(300 / 250)
    text = summary_text(res)
    assert "## Triton side by side with its peers" in text
    assert "## Backward (`--pass bwd`): side by side with its peers" in text
    assert "## Backward, bf16, d = 128, non-causal" in text


def test_render_a_failed_gradient_check_does_not_score(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    _synthetic(res)
    _add_backward(res, triton_verdict="FAIL")
    md = render_bench(res, figures=False).read_text()
    assert "| 4096 | 4 × 16 | 300 ✗ | 250 | 500 |  |  |" in md
    assert "- `grid/bf16/b4h16n4096d128/full/bwd` triton: FAIL: FAIL: made up" in md
    summ = bench_summary(load_results(res))  # all passes: every key is distinct
    assert len(summ.triton_unscored) == 2


def test_cli_backward_options(tmp_path, capsys):
    if not torch.cuda.is_available():
        assert (
            main(
                [
                    "bench",
                    "--pass",
                    "bwd",
                    "--n",
                    "1024",
                    "--d",
                    "128",
                    "--dtype",
                    "bf16",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 2
        )
        assert "no CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--pass", "backward"])


BENCH_RESULTS = sorted(
    (Path(__file__).resolve().parents[1] / "reports" / "bench").glob("*/results.jsonl")
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
