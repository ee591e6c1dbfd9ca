"""The Triton paged split-KV decode kernel and its merge, on a GPU or under the Triton
interpreter (tensors on the device the kernels run on here): judged
per sequence against the oracle on small paged batches (a zero-length sequence, pages of 1
and 7 slots, grouped heads, caches longer than one split), the merge's edge rows, batch
invariance with a planted batch-dependent split that the property catches, and the checks of
the public functions' arguments."""

from __future__ import annotations

import numpy as np
import pytest

import flashcheck
from flashcheck.harness.adapters.builtin import project_kernels
from flashcheck.harness.adapters.registry import as_kernel
from flashcheck.harness.campaign.ragged_records import load_ragged
from flashcheck.harness.campaign.ragged_report import run_ragged_report
from flashcheck.harness.campaign.report import ReportOptions
from flashcheck.harness.cases.ragged_inputs import combine_case, paged_case
from flashcheck.harness.checks.ragged_properties import (
    batch_invariance,
    page_independence,
    sequence_independence,
)

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
decode = pytest.importorskip("flashcheck.kernels.triton_decode")

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available()
    and __import__("os").environ.get("TRITON_INTERPRET", "0") in ("", "0"),
    reason="the Triton kernels need CUDA or TRITON_INTERPRET=1",
)

# Where the kernels run: a GPU when there is one and the interpreter is off (the calls below
# hand them tensors directly; CPU tensors fail on a GPU with "cannot be accessed from Triton").
DEV = (
    "cuda"
    if torch.cuda.is_available()
    and __import__("os").environ.get("TRITON_INTERPRET", "0") in ("", "0")
    else "cpu"
)


def _on(x):
    return torch.as_tensor(x, device=DEV)


# 0 keys; 150 keys: two splits of 128 (the second starts inside a page of 7); GQA 4 on 2.
LENGTHS = [5, 0, 150, 9]


def _case(page_size: int, dtype: str, *, causal: bool = False, nq: int = 3):
    return paged_case(
        LENGTHS, nq=nq, page_size=page_size, hq=4, hk=2, dtype=dtype, causal=causal, seed=page_size
    )


@pytest.mark.parametrize(("page_size", "dtype", "causal"), [(1, "fp16", True), (7, "fp32", False)])
def test_decode_kernel_passes_its_checks(page_size, dtype, causal):
    res = flashcheck.check(
        "triton-decode-paged", _case(page_size, dtype, causal=causal), save="never"
    )
    assert res.passed, res.reasons
    judged = [r for r in res.sequences if r is not None]
    assert len(judged) == len(LENGTHS)
    assert max(r.verdict.det_util for r in judged if r.case.shape[4]) > 0


def test_empty_sequence_gives_zero_and_minus_inf_and_nothing_leaks():
    case = _case(7, "fp32")
    t = {k: _on(v) for k, v in {**case.tensors, **case.index}.items()}
    o, lse = decode.flash_decode_paged(
        t["q"],
        t["k_cache"],
        t["v_cache"],
        cache_seqlens=t["cache_seqlens"].int(),
        block_table=t["block_table"].int(),
    )
    assert torch.isfinite(o).all()  # the pool's unowned slots are NaN: none was read
    assert (o[1] == 0).all() and torch.isneginf(lse[1]).all()
    assert torch.isfinite(lse[[0, 2, 3]]).all()


def test_decode_kernel_is_batch_invariant_and_a_batch_dependent_split_is_caught():
    case = _case(7, "fp32", nq=2)
    kern = project_kernels()["triton-decode-paged"]
    assert kern.batch_invariant
    assert batch_invariance(kern, case, DEV).status == "PASS"

    def splits_by_batch(q, k_cache, v_cache, *, cache_seqlens, block_table, causal, scale):
        # The planted bug: fewer keys per split for a small batch (to fill the machine).
        size = 16 if q.shape[0] == 1 else 64
        opts = {"cache_seqlens": cache_seqlens, "block_table": block_table, "scale": scale}
        return decode.flash_decode_paged(q, k_cache, v_cache, split_size=size, **opts)

    planted = flashcheck.kernel(
        splits_by_batch, layout="paged", arithmetic="flash", batch_invariant=True
    )
    res = batch_invariance(as_kernel(planted), case, DEV)
    assert res.status == "FAIL" and "alone" in res.message


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_combine_kernel_passes_its_checks(dtype):
    for case in (
        combine_case(6, (3, 4), dtype=dtype, lse_spread=300.0, all_empty_rows=2, seed=1),
        combine_case(1, (2, 5), dtype=dtype, empty=0.5, seed=2),
    ):
        res = flashcheck.check("triton-combine", case, save="never")
        assert res.passed, (dtype, res.reasons)


def test_combine_edge_rows_exact():
    o_p = _on([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [0.0, 0.0]]])
    lse = _on([[float("-inf"), 0.5], [float("-inf"), float("-inf")]])
    o, out_lse = decode.combine_partials(o_p, lse)
    assert (o[0] == 0).all() and torch.isneginf(out_lse[0])  # every split empty: no 0/0
    assert torch.equal(o[1], o_p[0, 1]) and out_lse[1] == 0.5  # one live split: itself
    # A trailing empty split changes no bit, not even the sign of a zero output.
    neg = torch.full((1, 1, 2), -0.0, device=DEV)
    one, _ = decode.combine_partials(neg, torch.zeros(1, 1, device=DEV))
    two, _ = decode.combine_partials(
        torch.cat([neg, torch.zeros(1, 1, 2, device=DEV)]), _on([[0.0], [float("-inf")]])
    )
    assert torch.equal(one, two) and torch.equal(torch.signbit(one), torch.signbit(two))
    o, out_lse = decode.combine_partials(
        torch.zeros(0, 3, 4, device=DEV), torch.zeros(0, 3, device=DEV)
    )
    assert (o == 0).all() and torch.isneginf(out_lse).all()  # no split at all: empty rows
    lse[1, 0] = float("nan")
    o, out_lse = decode.combine_partials(o_p, lse)
    assert torch.isnan(o[0]).all() and torch.isnan(out_lse[0])  # NaN is not hidden


def test_strided_queries_and_an_empty_batch():
    case = _case(7, "fp32", nq=2)
    t = {k: _on(v) for k, v in {**case.tensors, **case.index}.items()}
    opts = {"cache_seqlens": t["cache_seqlens"].int(), "block_table": t["block_table"].int()}
    strided = t["q"].transpose(1, 2).contiguous().transpose(1, 2)  # (B, Nq, Hq, d), Hq slowest
    assert not strided.is_contiguous()
    want = decode.flash_decode_paged(t["q"], t["k_cache"], t["v_cache"], **opts)
    got = decode.flash_decode_paged(strided, t["k_cache"], t["v_cache"], **opts)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    none = {k: v[:0] for k, v in opts.items()}
    o, lse = decode.flash_decode_paged(t["q"][:0], t["k_cache"], t["v_cache"], **none)
    assert o.shape == (0, 2, 4, 16) and lse.shape == (0, 4, 2)


def test_arguments_are_checked():
    case = _case(7, "fp16")
    t = {k: _on(v) for k, v in {**case.tensors, **case.index}.items()}
    good = {"cache_seqlens": t["cache_seqlens"].int(), "block_table": t["block_table"].int()}
    with pytest.raises(ValueError, match="int32"):
        decode.flash_decode_paged(
            t["q"],
            t["k_cache"],
            t["v_cache"],
            **{**good, "cache_seqlens": good["cache_seqlens"].long()},
        )
    if DEV == "cpu":  # (on a GPU the lengths are the caller's promise: no host sync a call)
        with pytest.raises(ValueError, match="widen the block table"):
            decode.flash_decode_paged(
                t["q"],
                t["k_cache"],
                t["v_cache"],
                **{**good, "block_table": good["block_table"][:, :2]},
            )
    with pytest.raises(ValueError, match="multiple of Hk"):
        decode.flash_decode_paged(t["q"][:, :, :3], t["k_cache"], t["v_cache"], **good)
    with pytest.raises(ValueError, match="split_size"):
        decode.flash_decode_paged(t["q"], t["k_cache"], t["v_cache"], split_size=8, **good)
    with pytest.raises(ValueError, match="same leading"):
        decode.combine_partials(torch.zeros(2, 3, 4, device=DEV), torch.zeros(2, 4, device=DEV))
    if __import__("os").environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        bf = {k: t[k].to(torch.bfloat16) for k in ("q", "k_cache", "v_cache")}
        with pytest.raises(NotImplementedError, match="11584"):
            decode.flash_decode_paged(bf["q"], bf["k_cache"], bf["v_cache"], **good)
    assert np.isfinite(decode.DEFAULT_SPLIT)


def test_paged_properties_hold():
    kern = project_kernels()["triton-decode-paged"]
    case = _case(16, "fp16", causal=True)
    for prop in (sequence_independence, page_independence):
        res = prop(kern, case, DEV)
        assert res.status == "PASS", (prop.__name__, res.message)


def test_the_campaign_of_the_merge_exits_zero(tmp_path):
    # (The paged kernel's campaign takes ~20 s of CPU here: `flashcheck report --kernel
    # triton-decode-paged --preset cpu` is run by hand; its checks are the tests above.)
    opts = ReportOptions(
        name="merge", kernels=("triton-combine",), dtypes=("fp32",), out=str(tmp_path)
    )
    lines: list[str] = []
    assert run_ragged_report(opts, echo=lines.append) == 0, lines
    data = load_ragged(tmp_path / "merge" / "results.jsonl")
    assert len(data.results) == 3 and all(r.status == "PASS" for r in data.results)
