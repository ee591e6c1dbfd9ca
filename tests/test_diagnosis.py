"""A failing output is diagnosed: the common mistake it matches within the kernel's bound is
named in its reasons (kernels written outside the package, tests/user/user_kernels.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.cases.families import Recipe, make_case
from flashcheck.harness.core.semantics import make_problem
from flashcheck.harness.judging.diagnosis import CONSISTENT, diagnose

HERE = Path(__file__).parent / "user"


@pytest.fixture(scope="module")
def uk():
    sys.path.insert(0, str(HERE))
    try:
        import user_kernels

        yield user_kernels
    finally:
        sys.path.remove(str(HERE))


def _case(**kw):
    dtype = kw.pop("dtype", "fp16")
    r = Recipe(dtype, "randn", 1, 2, 2, kw.pop("nq", 24), kw.pop("nk", 16), 16, 16, seed=0, **kw)
    return make_case(r)


@pytest.mark.parametrize(
    ("name", "options", "cause"),
    [
        ("top_left_causal", {"causal": True}, "a causal mask aligned top-left"),
        ("forgets_default_scale", {}, "the scale left out (scale 1)"),
    ],
)
@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_outside_kernels_get_the_cause_named(uk, name, options, cause, dtype):
    # (fp32 top-left with Nq > Nk once went unnamed: the rows the true mask empties had a
    # tolerance of one ulp, below the kernel's own rounding there)
    res = flashcheck.check(getattr(uk, name), _case(dtype=dtype, **options), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    named = [r for r in res.verdict.reasons if r.startswith(CONSISTENT)]
    assert named and named[0].startswith(CONSISTENT + cause), res.verdict.reasons


def test_masks_this_input_cannot_tell_apart_are_named_together(uk):
    # At Nq = 2, Nk = 1 the true causal mask (bottom-right) leaves row 0 no key; aligned
    # top-left, off by +1 and ignored, it keeps key 0 in both rows: one answer, three mistakes.
    # (A user's trial saw `flashcheck test` shrink an off-by-one kernel to such a case and name
    # the top-left alignment alone.)
    res = flashcheck.check(uk.top_left_causal, _case(nq=2, nk=1, causal=True), save="never")
    assert res.verdict.diagnosis == [
        CONSISTENT + "a causal mask aligned top-left (query i keeps keys j <= i; flashcheck, as "
        "FlashAttention, aligns it bottom-right: j <= i + Nk - Nq): the output matches exact "
        "attention under that reading within the kernel's bound (on this input the causal "
        "diagonal off by +1 and causal=True ignored give the same answer)"
    ], res.verdict.reasons


def test_mistakes_of_different_kinds_this_input_cannot_tell_apart_are_named_together():
    # At Nq = Nk = 1 a softmax over the queries and a sink left out both give O = V. A user's
    # trial saw `flashcheck test` shrink a kernel that ignores its sinks to such a case and
    # name the softmax's axis alone.
    import torch

    def sinks_ignored(q, k, v, *, causal=False, scale=None, sinks=None):
        s = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
        return (s.softmax(-1) @ v.float()).to(q.dtype)

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 1, 4, generator=g) for _ in range(3))
    res = flashcheck.check(sinks_ignored, q, k, v, sinks=np.array([-3.0, 1.0]), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert res.verdict.diagnosis == [
        CONSISTENT + "the softmax taken over the queries instead of the keys: the output "
        "matches exact attention under that reading within the kernel's bound (on this input "
        "sinks ignored gives the same answer)"
    ], res.verdict.reasons


def test_readings_that_fit_the_same_output_say_that_they_are_alternatives():
    # One key whose logit lies far below the sink: a sink multiplied by the scale and a scale
    # left out both push the key's weight to about 0, with answers that differ but within the
    # bound. A user's trial read the two reasons as two bugs; each now names the other.
    import torch

    def logits(q, k, sinks):
        c = q.shape[-1] ** -0.5
        s = (q.float() @ k.float().transpose(-1, -2)) * c
        sink = torch.as_tensor(sinks, dtype=torch.float32).view(1, -1, 1, 1) * c
        return torch.cat([s, sink.expand(*s.shape[:-1], 1)], -1)

    def sink_scaled(q, k, v, *, causal=False, scale=None, sinks=None):
        w = logits(q, k, sinks).softmax(-1)[..., :-1]
        return (w @ v.float()).to(q.dtype)

    def sink_scaled_with_lse(q, k, v, *, causal=False, scale=None, sinks=None):
        x = logits(q, k, sinks)
        return (x.softmax(-1)[..., :-1] @ v.float()).to(q.dtype), torch.logsumexp(x, -1)

    q = torch.full((1, 1, 1, 4), 6.0)
    k = torch.full((1, 1, 1, 4), -6.0)  # s·scale = -72
    v = torch.arange(1.0, 5.0).view(1, 1, 1, 4)
    res = flashcheck.check(sink_scaled, q, k, v, sinks=np.array([-60.0]), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    scaled = "the sinks multiplied by the scale (a sink is a logit, not scaled)"
    unscaled = "the scale left out (scale 1)"
    assert res.verdict.diagnosis == [
        f"{CONSISTENT}{a}: the output matches exact attention under that reading within the "
        f"kernel's bound; {b} fits too: this input cannot tell which"
        for a, b in ((unscaled, scaled), (scaled, unscaled))
    ], res.verdict.reasons
    # Returning its LSE (-30: the scaled sink's; the scale left out gives -60), the kernel is
    # told apart: the reading whose LSE fits too is the one named (a user's re-check).
    res = flashcheck.check(sink_scaled_with_lse, q, k, v, sinks=np.array([-60.0]), save="never")
    assert res.verdict.diagnosis == [
        f"{CONSISTENT}{scaled}: the output matches exact attention under that reading within "
        "the kernel's bound"
    ], res.verdict.reasons


def test_a_reading_only_the_lse_tells_apart_is_named_by_it():
    # One key: O = V under every reading, so only the LSE can tell a wrong soft-cap. The
    # property suite shrank a user's kernel that caps the unscaled product to this case (its
    # bits) and named nothing; the LSE names it now, and says that it did.
    import torch

    def cap_unscaled(q, k, v, *, causal=False, scale=None, softcap=None):
        s = softcap * torch.tanh((q.float() @ k.float().transpose(-1, -2)) / softcap) * scale
        return (s.softmax(-1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)

    q, k, v = (
        torch.tensor(x, dtype=torch.float16).view(1, 1, 1, 1)
        for x in (0.125732421875, -0.132080078125, 0.640625)
    )
    res = flashcheck.check(cap_unscaled, q, k, v, scale=0.125, softcap=2**-10, save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert len(res.verdict.diagnosis) == 1, res.verdict.reasons
    why = res.verdict.diagnosis[0]
    assert why.startswith(CONSISTENT + "the soft-cap taken of the unscaled product"), why
    assert why.endswith(
        "(its LSE tells it: O is the same under that reading and the true one here)"
    ), why


_SINK_Q = "3006 b03a 3920 2eb7 b849 35c9 3d37 3b94 b9a1 bd10 b8fc 294a c0a6 b300 bcfc b9dc"
_SINK_Q += " b85b b510 3696 3c2c b01d 3d77 b952 35a0 3b3a 2e04 b9f3 bb60 b753 330c bc0a b2b2"
_SINK_K = "b118 3854 32de 35b0 b93b b026 3a46 3df9 bd09 3e0e 3d62 3a40 343b b506 3dd5 3fd7"
_SINK_K += " 3f35 3d43 35b8 bcd5 9c90 3940 bd27 3652 36e1 3991 bcbd b94b b6fc bcae 3ef5 b7ef"


def _fp16_bits(text, shape):
    import torch

    bits = np.array([int(x, 16) for x in text.split()], np.uint16)
    return torch.from_numpy(bits.view(np.float16).reshape(shape).copy())


def test_a_reading_within_an_ulp_of_the_truth_is_named_where_it_explains_the_break():
    # A user's sink-scaled kernel, shrunk by the property suite to one key and a sink of -40
    # (these bits): O missed its fp16 bound by 2 ulp, within 0.01 ulp of the scaled-sink
    # reading, but that reading lies within the bound plus an ulp of the truth, and nothing was
    # named. Named now, because it accounts for the one element that breaks the bound.
    sys.path.insert(0, str(HERE))
    try:
        import user_softcap
    finally:
        sys.path.remove(str(HERE))
    q, k = _fp16_bits(_SINK_Q, (1, 1, 1, 32)), _fp16_bits(_SINK_K, (1, 1, 1, 32))
    v = _fp16_bits("3543", (1, 1, 1, 1))
    sinks = np.array([-40.0], np.float32)
    res = flashcheck.check(user_softcap.sink_scaled, q, k, v, sinks=sinks, save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert res.verdict.diagnosis == [
        CONSISTENT + "the sinks multiplied by the scale (a sink is a logit, not scaled): the "
        "output matches exact attention under that reading within the kernel's bound"
    ], res.verdict.reasons
    ok = flashcheck.check(user_softcap.correct, q, k, v, sinks=sinks, save="never")
    assert ok.passed and not ok.verdict.diagnosis
    # An output past its bound on the far side of the truth from the reading names nothing.
    p = make_problem(q.numpy(), k.numpy(), v.numpy(), sinks=sinks)
    exact = flashcheck.oracle(q, k, v, sinks=sinks).o.hi
    det = np.full_like(exact, 3.2e-4)
    assert diagnose(p, exact + 4.9e-4, exact, det) == []
    assert diagnose(p, exact - 4.9e-4, exact, det) != []


def test_a_reading_is_matched_at_its_own_scale_where_the_truth_is_tiny():
    # Sinks of +45 leave the true O near 1e-19 and its bound smaller still; a kernel that
    # scales the sinks computes an O near 1e-4 with rounding errors at that scale. A user's
    # report named nothing on its worst such case; the reading is matched at its own scale now.
    sys.path.insert(0, str(HERE))
    try:
        import user_softcap
    finally:
        sys.path.remove(str(HERE))
    case = make_case(Recipe("fp32", "randn", 1, 2, 2, 12, 12, 16, 16, seed=0))
    sinks = np.array([45.0, 44.0], np.float32)
    res = flashcheck.check(
        user_softcap.sink_scaled, case.q, case.k, case.v, sinks=sinks, save="never"
    )
    assert res.verdict.verdict == "FAIL-HARD"
    prefix = CONSISTENT + "the sinks multiplied by the scale ("
    assert [d[: len(prefix)] for d in res.verdict.diagnosis] == [prefix], res.verdict.reasons
    ok = flashcheck.check(user_softcap.correct, case.q, case.k, case.v, sinks=sinks, save="never")
    assert ok.passed and not ok.verdict.diagnosis


def test_a_correct_or_unrelated_failure_names_no_cause(uk):
    case = _case(causal=True)
    ok = flashcheck.check(uk.textbook, case, save="never")
    assert ok.passed and not ok.verdict.diagnosis
    p = make_problem(case.q, case.k, case.v, causal=True)
    noise = flashcheck.oracle(case.q, case.k, case.v, causal=True).o.hi + 0.05
    assert diagnose(p, noise, noise - 0.05, np.full_like(noise, 1e-3)) == []


def _huge(dtype, family, magnitude):
    r = Recipe(dtype, family, 1, 2, 2, 24, 16, 16, 16, seed=1, magnitude=magnitude)
    return make_case(r)


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_exp_without_the_row_maximum_is_named_where_it_overflows(uk, dtype):
    res = flashcheck.check(uk.no_max_subtraction, _huge(dtype, "huge_logits", 1e3), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert res.verdict.diagnosis == [
        CONSISTENT + "exp(s) taken without subtracting the row maximum (exp(s) / Σ exp(s) is inf"
        " / inf = NaN once a score passes 88.72, exp's limit in fp32): the output matches exact "
        "attention under that reading within the kernel's bound"
    ]


def test_a_running_maximum_from_a_finite_value_is_named_with_exp_alone_where_both_fit(uk):
    """On rows whose every score lies far below exp's underflow, a sentinel maximum (-1e6 for
    -inf) and the maximum left out give the same NaN: the name covers both. Where the scores
    are merely below -1e6 + 103 for some rows and not others, no reading fits."""
    for name in ("sentinel_max", "no_max_subtraction"):
        res = flashcheck.check(
            getattr(uk, name), _huge("fp32", "negative_rows", 1e12), save="never"
        )
        assert len(res.verdict.diagnosis) == 1, (name, res.verdict.reasons)
        assert res.verdict.diagnosis[0].startswith(
            CONSISTENT + "a row maximum never below a finite value (the maximum not "
            "subtracted, or a running maximum started at -1e4 or the like instead of -inf)"
        )
    # the maximum left out, on rows all below -103: NaN; the sentinel of -1e6 there: exact
    res = flashcheck.check(uk.sentinel_max, _huge("fp32", "negative_rows", 1e3), save="never")
    assert res.passed
    res = flashcheck.check(uk.no_max_subtraction, _huge("fp32", "negative_rows", 1e3), save="never")
    assert res.verdict.diagnosis and "row maximum" in res.verdict.diagnosis[0]


def test_a_guarded_running_maximum_from_a_finite_value_is_named(uk):
    """Rows whose scores all lie below -1e4 - 104 come out 0, not NaN, behind a guard."""
    res = flashcheck.check(
        uk.sentinel_max_guarded, _huge("fp32", "negative_rows", 1e5), save="never"
    )
    assert res.verdict.diagnosis and res.verdict.diagnosis[0].startswith(
        CONSISTENT + "a row maximum never below a finite value, and a row whose sum is 0 "
        "written as 0"
    ), res.verdict.reasons


def test_an_lse_in_base_2_is_named(uk):
    import math

    from flashcheck.kernels.naive import naive_numpy

    def lse_base2(q, k, v, *, causal=False, scale=None):
        o, lse = naive_numpy(q, k, v, causal=causal, scale=scale)
        return o, (np.asarray(lse, np.float64) / math.log(2)).astype(np.float32)

    def lse_natural(q, k, v, *, causal=False, scale=None):
        return naive_numpy(q, k, v, causal=causal, scale=scale)

    case = _case(causal=True)
    res = flashcheck.check(flashcheck.kernel(lse_base2, api="numpy"), case, save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    assert res.verdict.diagnosis == [
        CONSISTENT + "LSE in base 2 (log2 Σ exp(s) = LSE / ln 2, as a kernel working in exp2 "
        "keeps it): the LSE matches that within its bound; return LSE · ln 2"
    ]
    ok = flashcheck.check(flashcheck.kernel(lse_natural, api="numpy"), case, save="never")
    assert ok.passed and not ok.verdict.diagnosis


def test_a_soft_cap_applied_after_the_causal_mask_is_named():
    # tanh(−inf) = −1: the masked keys get the score −c and leak into every row's softmax.
    import torch

    def cap_after_mask(q, k, v, *, causal=False, scale=None, softcap=None):
        q, k, v = (torch.as_tensor(x).double() for x in (q, k, v))
        k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
        s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
        if causal:
            nq, nk = s.shape[-2:]
            drop = torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + (nk - nq)
            s = s.masked_fill(drop, float("-inf"))
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        return (torch.softmax(s, -1) @ v).float().numpy()

    r = Recipe("fp32", "randn", 1, 2, 2, 16, 16, 16, 16, seed=0, causal=True, cap_factor=0.3)
    kern = flashcheck.kernel(cap_after_mask, api="numpy", dtypes=("fp32",))
    res = flashcheck.check(kern, make_case(r), save="never")
    assert res.verdict.verdict == "FAIL-HARD"
    named = res.verdict.diagnosis
    assert named and named[0].startswith(CONSISTENT + "the soft-cap applied after the mask"), named


def _weights_from_rounded_lse(q, k, v, *, causal=False, scale=None):
    """fp32 attention with P = exp(S − LSE), LSE rounded to fp32 (torch references and
    FlashAttention's backward form P so); O = P·V."""
    import torch

    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    lse = torch.logsumexp(s, -1, keepdim=True)
    return (torch.exp(s - lse) @ v.float()).to(q.dtype), lse.squeeze(-1)


def _weights_from_row_max(q, k, v, *, causal=False, scale=None):
    import torch

    s = (q.float() @ k.float().transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    lse = (m + torch.log(p.sum(-1, keepdim=True))).squeeze(-1)
    return ((p @ v.float()) / p.sum(-1, keepdim=True)).to(q.dtype), lse


def test_weights_normalized_by_a_rounded_lse_are_named_not_tf32():
    # LSEs up to 4e4: an fp32 ulp of the LSE is 0.004, and exp(S − LSE) scales each row by
    # up to that much. A user's such kernel was told "precision below fp32: the errors fit
    # the bounds of tf32 matmuls", though it used none.
    pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    # (the shrunk case of that user's property test)
    case = make_case(Recipe("fp32", "huge_logits", 2, 2, 1, 15, 40, 16, 16, seed=0, magnitude=6e4))
    q, k, v = case.q, case.k, case.v
    opts = {"dtypes": ("fp32",), "masks": ()}
    bad = flashcheck.kernel(_weights_from_rounded_lse, name="rounded_lse", **opts)
    res = flashcheck.check(bad, q, k, v, save="never")
    assert res.verdict.verdict == "FAIL-HARD", res.verdict.reasons
    (why,) = res.verdict.diagnosis
    assert why.startswith(CONSISTENT + "weights formed as exp(s − LSE) with the LSE rounded")
    assert not any("tf32" in r for r in res.verdict.reasons), res.verdict.reasons
    good = flashcheck.kernel(_weights_from_row_max, name="row_max", **opts)
    assert flashcheck.check(good, q, k, v, save="never").passed
    # Rows whose other errors leave a least-squares factor 1.9 bounds off somewhere, though a
    # factor that fits every element exists (a search case of the report, LSE near −5.5e4).
    case = make_case(
        Recipe("fp32", "negative_rows", 2, 2, 2, 64, 32, 111, 111, seed=3604468274, magnitude=7e4)
    )
    res = flashcheck.check(bad, case.q, case.k, case.v, save="never")
    assert res.verdict.verdict == "FAIL-HARD" and len(res.verdict.diagnosis) == 1
    assert "LSE rounded to fp32" in res.verdict.diagnosis[0]


def _bf16_products(q, k, v, *, causal=False, scale=None):
    """An fp32 kernel whose q and k are rounded to bf16 before QKᵀ."""
    import torch

    q, k = (x.to(torch.bfloat16).float() for x in (q, k))
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def test_no_misreading_named_for_a_kernel_whose_o_is_right_or_whose_lse_breaks_its_bound():
    # A user's fp32 kernel with bf16 products: where its O was within its bound and only its
    # LSE off, huge logits matched "the softmax taken over the queries" (whose tolerance grew
    # with its weights); where its near one-hot rows each took a factor, the LSE-rounding
    # reading, though its LSE broke its bound by 147 times. The softmax code was right.
    pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    kern = flashcheck.kernel(_bf16_products, name="bf16_products", dtypes=("fp32",), masks=())
    right_o = Recipe("fp32", "huge_logits", 1, 2, 2, 32, 129, 8, 8, seed=2486643840, magnitude=9e29)
    res = flashcheck.check(kern, make_case(right_o), save="never")
    assert res.verdict["o"].det_util <= 1 < res.verdict["lse"].det_util
    assert res.verdict.diagnosis == []
    rows = Recipe(
        "fp32", "huge_logits", 1, 2, 2, 64, 128, 64, 64, seed=2136548983, scale=0.3, magnitude=6e4
    )
    res = flashcheck.check(kern, make_case(rows), save="never")
    assert res.verdict["o"].det_util > 1 and res.verdict["lse"].det_util > 1
    assert res.verdict.diagnosis == []


def _reads_bshd(q, k, v, *, causal=False, scale=None):
    """Written against flash_attn_func's (B, N, H, d): the heads taken for the sequence."""
    import torch

    q, k, v = (x.transpose(1, 2).float() for x in (q, k, v))
    k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], 1) for x in (k, v))
    s = (q @ k.transpose(-1, -2)) * (scale or q.shape[-1] ** -0.5)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + nk - nq, -1e30)
    return (torch.softmax(s, -1) @ v).transpose(1, 2).half()


def test_inputs_read_in_flash_attn_funcs_layout_are_named():
    # A user's kernel written for (B, N, H, d) returns O in the shape it was given, so no shape
    # check fired: 36 failures, none naming the layout.
    pytest.importorskip(
        "torch", reason="torch is an optional dependency (flashcheck[torch]); tox installs it"
    )
    rng = np.random.default_rng(0)
    for hk, nq, causal in ((4, 16, True), (2, 16, False), (4, 32, False)):
        q = rng.standard_normal((2, 4, nq, 32)).astype(np.float16)
        k, v = (rng.standard_normal((2, hk, 16, 32)).astype(np.float16) for _ in range(2))
        res = flashcheck.check(_reads_bshd, q, k, v, causal=causal, save="never")
        assert res.verdict.verdict == "FAIL-HARD"
        (why,) = res.verdict.diagnosis
        assert why.startswith(CONSISTENT + "q, k, v read as (B, N, H, d), flash_attn_func's")
