"""flashcheck bench's backward passes (--pass bwd, fwd+bwd) without a GPU: the plan and FLOPs
of the passes, the providers' backwards, the gradient check of sampled rows and keys, and the
backward sections of the report (from a synthetic results file)."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)
# E402 below: the imports need torch, so they follow the importorskip above.

from bench_helpers import synthetic_results  # noqa: E402

from flashcheck.harness.bench import grad_check  # noqa: E402
from flashcheck.harness.bench.check import sample_rows  # noqa: E402
from flashcheck.harness.bench.providers import PROVIDERS  # noqa: E402
from flashcheck.harness.bench.render import render_bench, summary_text  # noqa: E402
from flashcheck.harness.bench.suite import (  # noqa: E402
    FLOP_FACTOR,
    PASSES,
    TOKENS,
    Shape,
    plan,
)
from flashcheck.harness.bench.summary import bench_summary, load_results  # noqa: E402
from flashcheck.harness.bench.timing import Timing  # noqa: E402
from flashcheck.harness.cli import main  # noqa: E402
from flashcheck.harness.core.resultlog import ResultLog  # noqa: E402


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


def test_the_fused_backward_is_timed_in_the_backward_passes_beside_the_deterministic_one():
    both = plan(parts=("grid", "memory"), quick=True, passes=("fwd", "bwd", "fwd+bwd"))
    for shape, provs in both:
        # its forward is triton's: timed once, under triton's name
        assert ("triton-atomic" in provs) == (shape.pass_ != "fwd"), shape.key
        if shape.pass_ != "fwd":
            assert provs[:2] == ("triton", "triton-atomic")
    assert not plan(parts=("grid",), quick=True, providers=("triton-atomic",))
    fused = PROVIDERS["triton-atomic"]
    assert (
        fused.backward_arithmetic == "flash"
        and fused.grad_module == "flashcheck.kernels.triton_flash_bwd"
    )


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="runs the Triton backward on the CPU interpreter (TRITON_INTERPRET=1, tox sets it)",
)
def test_the_fused_and_deterministic_providers_differentiate_their_own_paths():
    # dK, dV: the same program, the same bits; dQ: the same terms summed in another order.
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(1, 2, 40, 16, generator=g).half() for _ in range(4))
    grads = {}
    for name in ("triton", "triton-atomic"):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        o = PROVIDERS[name].make_grad(*leaves, True)(*leaves)
        grads[name] = torch.autograd.grad(o, leaves, do)
    two, fused = grads["triton"], grads["triton-atomic"]
    assert torch.equal(two[1], fused[1]) and torch.equal(two[2], fused[2])
    assert torch.allclose(two[0].float(), fused[0].float(), rtol=0, atol=4e-3)


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


def _add_backward(path, *, triton_verdict="PASS", fused=False):
    """Backward records appended to a synthetic results file (made-up speeds)."""
    with ResultLog.open(path, json.loads(path.read_text().splitlines()[0])) as log:
        speeds = {"triton": 300.0, "sdpa-flash": 250.0, "sdpa-cudnn": 500.0}
        if fused:
            speeds["triton-atomic"] = 270.0
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
    synthetic_results(res)
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


def test_render_puts_the_fused_backward_beside_the_deterministic_one(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res)
    _add_backward(res, fused=True)
    md = render_bench(res, figures=False).read_text()
    head = "| N | B × H | triton | triton-atomic | sdpa-flash | sdpa-cudnn | triton / flash | "
    assert head + "triton / cuDNN | triton-atomic / triton |" in md
    assert "| 4096 | 4 × 16 | 300 | 270 | 250 | 500 | 1.20 | 0.60 | 0.90 |" in md
    assert "| triton-atomic | 2 | 0 | 0 | 0.6 / 0.7 / 0.5 |" in md  # its gradient checks
    assert "`triton-atomic` its fused path (`deterministic=False`" in md


def test_render_a_failed_gradient_check_does_not_score(tmp_path):
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res)
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
