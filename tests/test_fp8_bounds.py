"""The flash-fp8 class: its bounds dominate the exact emulation on every FP8 family, and the
planted FP8 bugs (P in e5m2, an accumulator below fp32, a descale applied twice) exceed them."""

import numpy as np
import pytest

from flashcheck.harness.cases.fp8_families import FP8_FAMILIES, Fp8Recipe, make_fp8_case
from flashcheck.harness.core.status import Status
from flashcheck.harness.judging.bounds import problem_bounds
from flashcheck.harness.judging.verdict import judge
from flashcheck.harness.oracle.evaluate import problem_oracle
from flashcheck.kernels.fp8_attention import flash_fp8_attention


def _recipe(family, seed, fmt="e4m3"):
    long = family == "fp8_uniform_long"
    return Fp8Recipe(
        family,
        fmt=fmt,
        nq=3 if long else 12,
        nk=1024 if long else 80,  # 80: a partial last key block of 64
        d=16,
        causal=bool(seed % 2) and not long,
        seed=seed,
    )


def _errors(case, ref, **planted):
    o, lse = flash_fp8_attention(
        case.q, case.k, case.v, causal=case.causal, **case.descales, **planted
    )
    return np.abs(o.astype(np.float64) - ref.o.hi), np.abs(lse - ref.lse.hi), o, lse


_CASES = [(f, s, fmt) for f in FP8_FAMILIES for s in (0, 1) for fmt in ("e4m3", "e5m2")]


@pytest.mark.parametrize(("family", "seed", "fmt"), _CASES)
def test_flash_fp8_bounds_dominate_the_exact_emulation(family, seed, fmt):
    case = make_fp8_case(_recipe(family, seed, fmt))
    ref = problem_oracle(case.problem)
    err, lse_err, _, _ = _errors(case, ref)
    for block in (64, None):
        b = problem_bounds(case.problem, arithmetic="flash-fp8", key_block=block)
        assert np.all(err <= b.o.det) and np.all(err <= b.o.prob)
        finite = np.isfinite(ref.lse.hi)
        assert np.all(lse_err[finite] <= b.lse.det[finite])
        assert np.all(b.o.prob <= b.o.det)
    # the e5m2-P emulation is dominated by its own (lower) class
    low = problem_bounds(case.problem, arithmetic="flash-fp8-p-e5m2", key_block=64)
    assert np.all(_errors(case, ref, p_format="e5m2")[0] <= low.o.det)


def test_flash_fp8_bound_is_used_not_idle():
    # On FA3's outlier inputs the emulation uses a fair share of the bound (it is not vacuous).
    case = make_fp8_case(_recipe("fp8_outliers", 0))
    ref = problem_oracle(case.problem)
    b = problem_bounds(case.problem, arithmetic="flash-fp8", key_block=64)
    assert (_errors(case, ref)[0] / b.o.det).max() > 0.15


@pytest.mark.parametrize(
    ("family", "planted", "why"),
    [
        ("fp8_p_ties", {"p_format": "e5m2"}, "precision below flash-fp8"),
        ("fp8_uniform_long", {"accum": "bf16"}, "deterministic bound"),
        ("fp8_uniform_long", {"accum": "fp16"}, "deterministic bound"),
        ("fp8_outliers", {"double_descale": "v"}, "deterministic bound"),
        ("fp8_outliers", {"double_descale": "q"}, "deterministic bound"),
        ("fp8_binades", {"double_descale": "k"}, "deterministic bound"),
    ],
)
def test_planted_fp8_bugs_fail_hard_undeclared(family, planted, why):
    case = make_fp8_case(_recipe(family, 0))
    ref = problem_oracle(case.problem)
    bounds = problem_bounds(case.problem, arithmetic="unknown")
    _, _, o, lse = _errors(case, ref, **planted)
    verdict = judge(o.astype(np.float64), lse.astype(np.float64), ref, bounds, naive_ulp=None)
    assert verdict.verdict == Status.FAIL_HARD
    assert any(why in r for r in verdict.reasons), verdict.reasons
    # and the correct emulation passes the same judge
    _, _, o, lse = _errors(case, ref)
    good = judge(o.astype(np.float64), lse.astype(np.float64), ref, bounds, naive_ulp=None)
    assert good.verdict == Status.PASS, good.reasons


def test_fp8_classes_apply_to_fp8_inputs_only():
    case = make_fp8_case(_recipe("fp8_outliers", 0))
    with pytest.raises(ValueError, match="does not apply"):
        problem_bounds(case.problem, arithmetic="flash")
    from flashcheck.harness.cases.case import Case

    wide = Case.from_arrays(*(np.zeros((1, 1, 2, 4), np.float16),) * 3)
    with pytest.raises(ValueError, match="does not apply"):
        problem_bounds(wide.problem, arithmetic="flash-fp8")


def test_flashcheck_check_takes_fp8_arrays_and_descales(tmp_path):
    import flashcheck
    from flashcheck.harness.campaign.fp8_table import FP8_EMULATION

    case = make_fp8_case(_recipe("fp8_binades", 1))
    res = flashcheck.check(
        FP8_EMULATION, case.q, case.k, case.v, causal=case.causal, **case.descales, save="never"
    )
    assert res.verdict.verdict == Status.PASS, res.verdict.reasons
    assert res.ref.fmt.name == "bf16" and res.bounds.arithmetic == "flash-fp8"


def test_fp8_kernel_is_handed_all_three_descales_where_the_case_sets_fewer():
    # A kernel written to docs/api.md takes three float32 (B, Hk) descales and never checks
    # for None; fp8_flush sets only descale_k, and a check without descales sets none.
    import flashcheck
    from flashcheck.harness.adapters.adapter import Kernel

    seen = []

    def docs_style(q, k, v, *, causal=False, descale_q, descale_k, descale_v):
        ds = (descale_q, descale_k, descale_v)
        seen.append([(d.dtype, d.shape) for d in ds])
        return flash_fp8_attention(
            q, k, v, causal=causal, descale_q=ds[0], descale_k=ds[1], descale_v=ds[2]
        )

    kernel = Kernel("docs-style", docs_style, arithmetic="flash-fp8", api="numpy",
                    dtypes=("e4m3",), masks=frozenset({"causal"}))  # fmt: skip
    case = make_fp8_case(_recipe("fp8_flush", 0))
    assert case.descale_q is None and case.descale_v is None
    for descales in (case.descales, {}):
        res = flashcheck.check(kernel, case.q, case.k, case.v, **descales, save="never")
        assert res.verdict.verdict == Status.PASS, res.verdict.reasons
    assert seen and all(s == [(np.float32, (1, 1))] * 3 for s in seen)


@pytest.mark.parametrize("family", ["fp8_outliers", "fp8_saturated", "fp8_binades"])
def test_q_and_k_descales_left_out_are_named_together(family):
    # Scores from the FP8 values while descale_v is applied: no single-descale reading fits
    # both O and the LSE, and O alone had drawn "descale_v applied twice" for one such kernel.
    import flashcheck
    from flashcheck.harness.adapters.adapter import Kernel

    def qk_undescaled(q, k, v, *, causal=False, descale_q, descale_k, descale_v):
        return flash_fp8_attention(q, k, v, causal=causal, descale_v=descale_v)

    kernel = Kernel("qk-undescaled", qk_undescaled, arithmetic="flash-fp8", api="numpy",
                    dtypes=("e4m3",), masks=frozenset({"causal"}))  # fmt: skip
    case = make_fp8_case(_recipe(family, 0))
    res = flashcheck.check(
        kernel, case.q, case.k, case.v, causal=case.causal, **case.descales, save="never"
    )
    named = [r for r in res.verdict.reasons if r.startswith("consistent with")]
    assert named and named[0].startswith("consistent with descale_q and descale_k left out")
    assert not any("applied twice" in r or "all three" in r for r in named), named
