"""flashcheck bench --kernel, the parts that run without a GPU: a user's kernel in the plan and
its skip reasons, its calling convention (on a fake function), the refused specs and names,
the render of a results file that holds one (its module gone), and the resume guard."""

import importlib.util
import json
import math

import pytest
from bench_helpers import synthetic_results

from flashcheck.harness.adapters.declare import kernel
from flashcheck.harness.adapters.registry import resolve
from flashcheck.harness.bench.figures import make_bench_figures
from flashcheck.harness.bench.kernel_providers import (
    kernel_call,
    kernel_grad_call,
    kernel_provider,
    kernel_providers,
)
from flashcheck.harness.bench.render import render_bench, summary_text
from flashcheck.harness.bench.suite import BenchOptions, bench_header, plan
from flashcheck.harness.bench.summary import load_results, only_pass
from flashcheck.harness.bench.tables import kernel_line
from flashcheck.harness.cli import main
from flashcheck.harness.core.resultlog import ResultLog, ResultLogError

# The tests call torch; the modules they test import it only when they need it.
torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)


MODULE = "bk_user_attention"  # written into a temporary folder by the tests that import it
SOURCE = """
import torch


def attention(q, k, v, *, causal=False):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
"""


def _plain(q, k, v, *, causal=False):
    return q


def test_plan_runs_a_user_kernel_beside_the_built_ins():
    half = kernel_provider(kernel(_plain, name="half:fn", dtypes=("fp16",), head_dims=(64, 128)))
    anyd = kernel_provider(kernel(_plain, name="any:fn"))  # dtypes undeclared: all of them
    items = plan(parts=("grid", "width", "memory", "fp32"), quick=True, kernels=(half, anyd))
    for shape, provs in items:
        assert ("half:fn" in provs) == (shape.part != "fp32"), (shape.key, provs)
        assert "any:fn" in provs and provs[0] == "triton"
    chosen = plan(parts=("grid",), quick=True, providers=("triton", "sdpa-cudnn"), kernels=(half,))
    assert chosen and all(p == ("triton", "sdpa-cudnn", "half:fn") for _, p in chosen)
    bwd = plan(parts=("grid",), quick=True, providers=("triton",), passes=("bwd",), kernels=(half,))
    assert all(p == ("triton", "half:fn") for _, p in bwd)
    # What it cannot run is recorded skipped, with the reason the built-ins give theirs.
    assert half.unsupported("bf16", 128) == "half:fn does not take bf16 (it takes fp16)"
    assert half.unsupported("fp16", 256) == "half:fn takes head dims 64, 128"
    assert half.unsupported("fp16", 128, causal=True) is None
    assert half.unsupported("fp16", 128, backward=True) == "no backward declared"
    nocausal = kernel_provider(kernel(lambda q, k, v: q, name="full:fn"))
    assert nocausal.unsupported("bf16", 64, causal=True) == "full:fn takes no causal mask"
    assert nocausal.unsupported("bf16", 64) is None
    with pytest.raises(ValueError, match="built-in provider"):
        plan(kernels=(kernel_provider(kernel(_plain, name="triton")),))


def test_call_convention_on_a_fake_kernel():
    seen = []

    def with_causal(q, k, v, *, causal=False):
        seen.append({"causal": causal})
        return q * 2, "lse"

    def with_scale(q, k, v, *, scale=None, causal=True):  # causal by default: pass False
        seen.append({"scale": scale, "causal": causal})
        return [q * 3]

    def bare(q, k, v):
        return q + 1

    x = torch.ones(1, 1, 4, 16)
    assert torch.equal(kernel_call(with_causal, {"causal"}, causal=True, d=16)(x, x, x), 2 * x)
    assert seen.pop() == {"causal": True}  # no scale: the contract's default is the bench's
    prov = kernel_provider(kernel(with_scale))
    assert torch.equal(prov.make(x, x, x, False)(x, x, x), 3 * x)
    assert seen.pop() == {"scale": 1 / math.sqrt(16), "causal": False}
    assert prov.arithmetic == "unknown" and prov.backward_arithmetic == "unknown"
    assert torch.equal(kernel_call(bare, frozenset(), causal=False, d=16)(x, x, x), x + 1)
    with pytest.raises(ValueError, match="no causal option"):
        kernel_call(bare, frozenset(), causal=True, d=16)
    flash = kernel_provider(kernel(with_causal, arithmetic="flash", backward_arithmetic="flash"))
    assert (flash.arithmetic, flash.backward_arithmetic, flash.has_backward) == (
        "flash",
        "flash",
        False,
    )


def test_backward_autograd_or_function():
    calls = []

    def fwd(q, k, v, *, causal=False):
        return q * k + v

    def bwd(q, k, v, do, *, causal=False):
        calls.append(causal)
        return q + 10, k + 20, v + 30

    q, k, v = (torch.randn(1, 1, 4, 8, requires_grad=True) for _ in range(3))
    do = torch.ones(1, 1, 4, 8)
    grads = torch.autograd.grad(
        kernel_grad_call(fwd, bwd, {"causal"}, causal=True, d=8)(q, k, v), (q, k, v), do
    )
    assert calls == [True]
    for g, want in zip(grads, (q + 10, k + 20, v + 30), strict=True):
        assert torch.equal(g, want.detach())
    auto = kernel_provider(kernel(fwd, backward="autograd"))
    assert auto.has_backward and auto.build_grad is None  # autograd through its forward
    dq, _, dv = torch.autograd.grad(auto.make_grad(q, k, v, False)(q, k, v), (q, k, v), do)
    assert torch.equal(dq, k.detach()) and torch.equal(dv, do)
    own = kernel_provider(kernel(fwd, backward=bwd))
    grads = torch.autograd.grad(own.make_grad(q, k, v, False)(q, k, v), (q, k, v), do)
    assert calls == [True, False] and torch.equal(grads[2], (v + 30).detach())


def test_specs_resolve_once_and_bad_ones_are_refused(tmp_path, monkeypatch):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{MODULE}:attention"
    (prov,) = kernel_providers((spec, spec))
    assert prov.name == spec and prov.kernel_spec == spec
    assert prov.takes_causal and prov.dtypes == ("fp16", "bf16", "fp32")
    with pytest.raises(ValueError, match="cannot import 'bk_no_such_module'"):
        kernel_providers(("bk_no_such_module:fn",))
    with pytest.raises(ValueError, match="is a built-in provider's; pass --provider flex"):
        kernel_providers(("flex",))
    with pytest.raises(ValueError, match="api='numpy'"):
        kernel_providers(("naive-numpy",))
    with pytest.raises(ValueError, match="dense attention"):
        kernel_providers(("triton-varlen",))


def test_cli_refuses_bad_kernels_before_looking_for_a_gpu(tmp_path, capsys, monkeypatch):
    spec = "bk_no_such_module:fn"
    with pytest.raises(ValueError) as registry:
        resolve(spec)
    assert main(["bench", "--kernel", spec, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"flashcheck bench: error: {registry.value}\n"
    assert main(["bench", "--kernel", "triton", "--out", str(tmp_path)]) == 2
    assert "'triton' is a built-in provider's" in capsys.readouterr().err
    assert main(["bench", "--decode", "--kernel", "x:y", "--out", str(tmp_path)]) == 2
    assert "--decode-provider only" in capsys.readouterr().err
    if not torch.cuda.is_available():  # a good spec gets as far as the GPU check
        (tmp_path / f"{MODULE}.py").write_text(SOURCE)
        monkeypatch.syspath_prepend(str(tmp_path))
        assert main(["bench", "--kernel", f"{MODULE}:attention", "--out", str(tmp_path)]) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


NAME = "bk_gone_module:attention"  # a kernel whose module the rendering machine lacks


def test_render_a_user_kernel_without_its_module(tmp_path, capsys):
    assert importlib.util.find_spec(NAME.split(":")[0]) is None
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res, kernels={NAME: (400.0, 600.0)})
    md = render_bench(res, figures=False).read_text()
    head = "| N | B × H | triton | sdpa-flash | sdpa-cudnn | sdpa-math | " + NAME
    assert head + " | triton / flash | triton / cuDNN | triton / " + NAME + " |" in md
    assert "| 1024 | 16 × 16 | 500 | 350 | 600 | – | 400 | 1.43 | 0.83 | 1.25 |" in md
    assert "| 4096 | 4 × 16 | 500 | 350 | 600 | – | 600 | 1.43 | 0.83 | 0.83 |" in md
    line = (
        f"- **Triton / {NAME}** at 2 grid and width shapes: lowest **0.83×** at "
        "`grid/bf16/b4h16n4096d128/full`, median 1.04×, highest 1.25× at "
        "`grid/bf16/b16h16n1024d128/full`; Triton is behind it at "
        "`grid/bf16/b4h16n4096d128/full` 0.83×."
    )
    assert line in md and line in summary_text(res)
    assert f"| {NAME} | 2 | 0 | 0 |" in md  # its checks in the tally
    assert f"--kernel {NAME}" in md  # the command that regenerates the run
    doc = json.loads((tmp_path / "fake" / "bench.json").read_text())
    assert doc["summary"]["vs_kernels"][NAME][0][0] == pytest.approx(500 / 600)
    assert main(["bench", "--render-only", "--name", "fake", "--out", str(tmp_path)]) == 0
    assert line in capsys.readouterr().out
    # A check Triton failed leaves nothing to compare: the line says so.
    synthetic_results(res, kernels={NAME: (400.0, 600.0)}, triton_verdict="FAIL")
    md = render_bench(res, figures=False).read_text()
    assert f"- **Triton / {NAME}**: no grid or width shape where both ran and passed" in md


def test_figures_draw_a_user_kernel(tmp_path, monkeypatch):
    import matplotlib.axes

    labels = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        labels.append(kwargs.get("label"))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    res = tmp_path / "fake" / "results.jsonl"
    synthetic_results(res, kernels={NAME: (400.0, 600.0)})
    made = make_bench_figures(only_pass(load_results(res), "fwd"), tmp_path)
    assert "tflops_vs_n" in made and NAME in labels and "triton" in labels


def test_kernel_line_when_triton_leads_everywhere():
    text = kernel_line("k:f", [(1.1, "a"), (1.3, "b")])
    assert "lowest **1.10×** at `a`, median 1.20×, highest 1.30× at `b`" in text
    assert text.endswith("Triton is not behind it at any.")


def test_resume_with_other_kernels_is_refused(tmp_path):
    path = tmp_path / "results.jsonl"
    mine = bench_header(BenchOptions(kernels=("a:f", "a:f")), "x")
    assert mine["config"]["kernels"] == ["a:f"]
    # Without --kernel the config is what it was, so earlier results files still resume.
    assert "kernels" not in bench_header(BenchOptions(), "x")["config"]
    ResultLog.open(path, mine).close()
    ResultLog.open(path, mine).close()  # the same kernels resume
    for other in (("b:f",), ()):
        with pytest.raises(ResultLogError, match="another configuration"):
            ResultLog.open(path, bench_header(BenchOptions(kernels=other), "x"))


def test_a_shape_the_kernel_does_not_take_is_recorded_skipped_before_any_gpu_work():
    from flashcheck.harness.bench.measure import _prepare, _prepare_backward
    from flashcheck.harness.bench.shapes import Shape

    full = kernel_provider(kernel(lambda q, k, v: q, name="full:fn"))
    causal = Shape("grid", "bf16", 4, 16, 4096, 128, True)
    rec, fn = _prepare(causal, full, [], None, memory=False)
    assert fn is None
    assert (rec["status"], rec["reason"], rec["provider"]) == (
        "skipped",
        "full:fn takes no causal mask",
        "full:fn",
    )
    plain = Shape("grid", "bf16", 4, 16, 4096, 128, False, "bwd")
    rec, ctx = _prepare_backward(plain, full, [], [], None, None, memory=False)
    assert ctx is None
    assert (rec["status"], rec["reason"]) == ("skipped", "no backward declared")
