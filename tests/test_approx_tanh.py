"""A soft-capped kernel whose tanh is the GPU's approximation (``tanh.approx.f32``, as
FlashAttention's and FlashInfer's), declared with ``flashcheck.kernel(..., tanh="approx")``.

The kernels here compute in float64 with a tanh off by a chosen relative error, alternating in
sign over the keys (so no common factor cancels in the softmax): 2^-16.5 stands for the
approximation (measured at most 2^-16.456 over every fp32 argument on an H200), 2^-14 for a
tanh worse than any class admits. At a cap of 20 the error moves the fp32 LSE far beyond the
bounds of an accurate tanh."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
)

import flashcheck  # noqa: E402
from flashcheck.harness.judging.bounds import error_bounds  # noqa: E402
from flashcheck.harness.judging.roundoff import RHO_TANH, RHO_TANH_APPROX  # noqa: E402

CAP = 20.0


def _logits(q, k, *, causal, scale, softcap, rel):
    tau = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.double() @ k.double().transpose(-1, -2)) * tau
    if softcap:
        sign = 1 - 2 * (torch.arange(k.shape[-2], dtype=torch.float64) % 2)
        s = softcap * torch.tanh(s / softcap) * (1 + rel * sign)
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    return s


def _kernel(rel):
    """An attention forward returning (O, LSE) whose tanh is off by ``rel`` relative."""

    def fn(q, k, v, *, causal=False, scale=None, softcap=None):
        s = _logits(q, k, causal=causal, scale=scale, softcap=softcap, rel=rel)
        lse = torch.logsumexp(s, -1)
        o = torch.softmax(s, -1) @ v.double()
        return o.to(q.dtype), lse.float()

    return fn


def _inputs(seed, *, n=24, d=16):
    g = torch.Generator().manual_seed(seed)
    # Scores up to ~40, twice the cap: the tanh spans its range.
    return [torch.randn(1, 2, n, d, generator=g, dtype=torch.float32) * 3 for _ in range(3)]


APPROX = 2**-16.5
WORSE = 2**-14


def test_the_approximate_tanh_passes_declared_approx_and_fails_declared_accurate():
    q, k, v = _inputs(1)
    fn = _kernel(APPROX)
    approx = flashcheck.kernel(fn, name="approx", arithmetic="naive", tanh="approx")
    accurate = flashcheck.kernel(fn, name="accurate", arithmetic="naive")
    assert "softmax options softcap (tanh approx)" in approx.contract_lines()
    res = flashcheck.check(approx, q, k, v, softcap=CAP, save="never")
    assert res.passed, res.verdict.reasons
    res = flashcheck.check(accurate, q, k, v, softcap=CAP, save="never")
    assert res.verdict.verdict == "FAIL-HARD", res.verdict.reasons
    assert any('declare tanh="approx"' in r for r in res.verdict.reasons), res.verdict.reasons
    # Undeclared (class unknown), the fp32 errors also fit tf32 products: the tanh reading
    # replaces that one, which would send the author to declare tf32.
    undeclared = flashcheck.kernel(fn, name="undeclared")
    res = flashcheck.check(undeclared, q, k, v, softcap=CAP, save="never")
    assert any('declare tanh="approx"' in r for r in res.verdict.reasons), res.verdict.reasons
    assert not any("tf32" in r for r in res.verdict.reasons), res.verdict.reasons
    # Without a cap the declaration changes nothing.
    assert flashcheck.check(accurate, q, k, v, save="never").passed


def test_a_tanh_worse_than_the_approximation_fails_declared_approx():
    q, k, v = _inputs(2)
    worse = flashcheck.kernel(_kernel(WORSE), name="worse", arithmetic="naive", tanh="approx")
    res = flashcheck.check(worse, q, k, v, softcap=CAP, causal=True, save="never")
    assert res.verdict.verdict == "FAIL-HARD", res.verdict.reasons
    # declared accurate, it fails too, and no reading blames the approximation
    plain = flashcheck.kernel(_kernel(WORSE), name="worse", arithmetic="naive")
    res = flashcheck.check(plain, q, k, v, softcap=CAP, causal=True, save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert not any("tanh.approx" in r for r in res.verdict.reasons), res.verdict.reasons


def test_gradients_take_the_declared_tanh():
    q, k, v = _inputs(3, n=12, d=8)
    fn = _kernel(APPROX)

    def fwd(q, k, v, *, causal=False, scale=None, softcap=None):
        return fn(q, k, v, causal=causal, scale=scale, softcap=softcap)[0]

    kw = {"arithmetic": "naive", "backward": "autograd", "backward_arithmetic": "naive"}
    approx = flashcheck.kernel(fwd, name="approx", tanh="approx", **kw)
    accurate = flashcheck.kernel(fwd, name="accurate", **kw)
    assert flashcheck.check_gradients(approx, q, k, v, softcap=CAP, save="never").passed
    res = flashcheck.check_gradients(accurate, q, k, v, softcap=CAP, save="never")
    assert not res.passed


def test_the_bounds_grow_by_the_tanh_term_alone():
    q, k, v = (x.numpy() for x in _inputs(4, n=8, d=8))
    kw = {"arithmetic": "flash", "softcap": CAP}
    acc, app = error_bounds(q, k, v, **kw), error_bounds(q, k, v, tanh="approx", **kw)
    assert np.all(app.lse.det > acc.lse.det) and np.all(app.o.det >= acc.o.det)
    # |y| ≤ c: the LSE bound grows by at most (RHO_TANH_APPROX − RHO_TANH)·c plus second order
    grow = float(np.max(app.lse.det - acc.lse.det))
    assert grow <= 1.01 * (RHO_TANH_APPROX - RHO_TANH) * CAP
    plain = error_bounds(q, k, v, arithmetic="flash")
    assert np.array_equal(
        plain.o.det, error_bounds(q, k, v, arithmetic="flash", tanh="approx").o.det
    )
    assert math.log2(RHO_TANH_APPROX) == -16


def test_an_unknown_tanh_is_refused_with_the_choices():
    with pytest.raises(ValueError, match=r"'accurate'.*'approx'"):
        flashcheck.kernel(_kernel(0.0), tanh="fast")
    q, k, v = (x.numpy() for x in _inputs(5, n=4, d=4))
    with pytest.raises(ValueError, match="'approx'"):
        error_bounds(q, k, v, arithmetic="flash", softcap=CAP, tanh="approximate")


_CAPPED_FN = (
    "from test_approx_tanh import APPROX, _kernel\n"
    "def fn(q, k, v, *, causal=False, scale=None, softcap=None):\n"
    "    return _kernel(APPROX)(q, k, v, causal=causal, scale=scale, softcap=softcap)\n"
)


@pytest.mark.parametrize(
    "modules",
    [
        # flashcheck.kernel(fn, tanh="approx") keeps fn's name: the case file named the plain
        # function, and its replay judged it undeclared (FAIL-HARD where check() said PASS).
        {"capdecl": "import flashcheck\n" + _CAPPED_FN
         + "declared = flashcheck.kernel(fn, arithmetic='naive', tanh='approx')\n"},
        # The function in one module, the declaration in another: the case file named the
        # function's module, and the replay lost the declaration.
        {"capfn": _CAPPED_FN,
         "capdecl": "import flashcheck\nimport capfn\n"
         "declared = flashcheck.kernel(capfn.fn, arithmetic='naive', tanh='approx')\n"},
    ],
    ids=["same-module", "other-module"],
)  # fmt: skip
def test_a_case_saved_from_a_declared_kernel_replays_with_the_declaration(
    tmp_path, monkeypatch, modules
):
    import importlib

    from flashcheck.harness.checks.replay import replay

    for name, text in modules.items():
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    for name in modules:  # each parametrization imports its own modules
        monkeypatch.delitem(sys.modules, name, raising=False)
    declared = importlib.import_module("capdecl").declared

    q, k, v = _inputs(1)
    res = flashcheck.check(declared, q, k, v, softcap=CAP, save="always", case_dir=tmp_path)
    assert res.passed
    _, verdict, record = replay(res.case_id, directory=tmp_path, echo=lambda *a: None)
    assert record["kernel"] == "capdecl:declared" and verdict == "PASS", (record, verdict)
