"""Kernels of the ragged layouts (varlen, paged) and split-KV merges through flashcheck.check:
the contract, per-sequence verdicts, the merge bounds, case files and replay. The buggy kernels
of tests/user/user_layouts.py are real bug classes; each must fail with the sequence named and
replay to the same verdict, while the correct ones and the built-in kernels pass."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import flashcheck
from flashcheck.harness.adapters.builtin import project_kernels
from flashcheck.harness.adapters.probe import resolved
from flashcheck.harness.campaign.selection import default_kernels, resolve_kernels
from flashcheck.harness.cases.case import Case
from flashcheck.harness.cases.ragged import RaggedCase
from flashcheck.harness.cases.ragged_inputs import combine_case, paged_case, varlen_case
from flashcheck.harness.cases.ragged_store import load_ragged_case, save_ragged_case
from flashcheck.harness.checks.replay import replay
from flashcheck.harness.core.formats import BF16, FP16
from flashcheck.harness.judging.merge_bounds import merge_bounds
from flashcheck.harness.oracle.combine import combine_oracle
from flashcheck.kernels.split_kv import merge_partials

USER = Path(__file__).parent / "user"
KERNELS = project_kernels()


@pytest.fixture
def user(monkeypatch):
    monkeypatch.syspath_prepend(str(USER))
    import user_layouts

    return user_layouts


# A batch with a sequence of no query rows before one that has keys (its first row is the one
# a kernel writing for the empty sequence hits), one without keys, GQA heads, causal.
def _varlen(dtype="fp16"):
    return varlen_case([3, 0, 5, 17, 2], [4, 2, 7, 40, 0], causal=True, hq=4, hk=2, dtype=dtype)


def _paged(dtype="fp16", page_size=16):
    return paged_case([5, 33, 0, 130], nq=3, page_size=page_size, causal=True, dtype=dtype)


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_built_in_ragged_kernels_pass(dtype):
    for name, case in (
        ("recurrence-varlen", _varlen(dtype)),
        ("split-kv-paged", _paged(dtype, page_size=7)),  # 130 keys: three splits of 64
        ("split-kv-combine", combine_case(6, (3, 4), dtype=dtype, lse_spread=30.0)),
    ):
        res = flashcheck.check(name, case, save="never")
        assert res.passed, (name, res.reasons)
        if case.layout != "combine":
            judged = [r for r in res.sequences if r is not None]
            assert len(judged) == sum(case.lengths(b)[0] > 0 for b in range(case.sequences))
            assert max(r.verdict.det_util for r in judged if r.case.shape[4]) > 0


@pytest.mark.parametrize("page_size", [1, 16, 256])
def test_paged_kernel_passes_every_page_size(page_size):
    assert flashcheck.check("split-kv-paged", _paged(page_size=page_size), save="never").passed


def test_correct_user_kernels_pass(user):
    for kern, case in (
        (user.varlen_ok, _varlen()),
        (user.paged_ok, _paged()),
        (user.combine_ok, combine_case(5, dtype="fp16")),
    ):
        res = flashcheck.check(kern, case, save="never")
        assert res.passed, res.reasons


def test_a_passing_check_names_a_sequence_with_keys_the_worst(user):
    # A sequence without keys has no bound (NaN utilization): it used to rank first, and a
    # passing check printed it as "the worst", with a table of zeros.
    case = varlen_case([5, 3, 17], [7, 0, 17])
    res = flashcheck.check(user.varlen_ok, case, save="never")
    assert res.passed and res.worst_sequence in (0, 2), res.worst_sequence


def test_a_ragged_failure_names_each_failing_sequence_once(user):
    # Every reason line used to repeat its sequence's lengths and worst element: a five
    # sequence case printed twenty such lines. The reasons list keeps them all.
    case = varlen_case([15, 16, 17, 1, 33], [16, 17, 15, 32, 31])
    res = flashcheck.check(user.varlen_one_past, case, save="never")
    heads = [head for head, _ in res.reasons_by_sequence()]
    assert [h.split(" (")[0] for h in heads] == [
        "sequence 0",
        "sequence 1",
        "sequence 2",
        "sequence 3",
    ]
    text = str(res).split("(the worst), as a dense case")[0]
    for head in heads:
        assert text.count(head) == 1, (head, text)
    assert "more reasons)" in text  # the fourth sequence, on one line
    # The diagnosis of the worst sequence (the one shown as a dense case) is the first line
    # under its heading, not a bullet naming the sequence again.
    assert res.worst_sequence == 1
    assert res.diagnosis[0].startswith("sequence 1 (Nq=16, Nk=17) returns the attention")
    assert "sequence 1 (Nq=16, Nk=17) returns" not in text
    assert f"{heads[1]}:\n      returns the attention over its 17 keys and one more" in text
    assert len(res.reasons) == sum(len(rs) for _, rs in res.reasons_by_sequence()) > 4


BUGS = [
    # (kernel, case, the sequence or the words its failure names)
    ("varlen_one_past", _varlen, "sequence 0 (Nq=3, Nk=4)"),
    ("varlen_empty_writes", _varlen, "sequence 2 (Nq=5, Nk=7), worst element O[3, "),
    ("paged_whole_page", _paged, "NaN/Inf where the oracle is finite"),
    ("combine_nan_when_empty", lambda: combine_case(5), "fully masked rows give NaN"),
    (
        "paged_lse_heads_by_modulo",
        lambda: paged_case([40, 70], nq=2, hq=4, hk=2, page_size=16),
        "LSE exceeds its deterministic bound",
    ),
]


@pytest.mark.parametrize(("name", "make", "named"), BUGS, ids=[b[0] for b in BUGS])
def test_user_bug_classes_fail_and_replay(user, tmp_path, name, make, named):
    res = flashcheck.check(getattr(user, name), make(), case_dir=tmp_path)
    assert res.verdict == "FAIL-HARD"
    assert any(named in r for r in res.reasons), res.reasons
    assert res.case_id and res.replay == f"flashcheck replay {res.case_id} --dir {tmp_path}"
    assert repr(res) == (
        f"<{type(res).__name__} user_layouts:{name}: FAIL-HARD on {res.case.describe()}; "
        f"{res.replay}>"
    )
    lines = []
    _, verdict, record = replay(res.case_id, directory=tmp_path, echo=lines.append)
    assert record["kernel"] == f"user_layouts:{name}"
    assert "recorded verdict: FAIL-HARD; replayed: FAIL-HARD (same verdict)" in "\n".join(lines)
    # The correct built-in kernel on the same case passes: the replay judged the kernel.
    fixed = {"varlen": "recurrence-varlen", "paged": "split-kv-paged"}
    good = fixed.get(res.case.layout, "split-kv-combine")
    _, verdict, _ = replay(res.case_id, directory=tmp_path, kernel=good, echo=lines.append)
    assert verdict == "PASS"


def test_a_sequence_without_keys_left_unwritten_is_named_not_its_empty_neighbour(user):
    # A user's kernel left the rows of a sequence without keys as the buffer held them, and
    # was told that the empty-query sequence sitting at its first row had written there.
    case = varlen_case([5, 0, 17, 3], [7, 12, 0, 31], causal=True)
    res = flashcheck.check(user.varlen_skips_keyless, case, save="never")
    assert res.diagnosis == [
        "sequence 2 (Nq=17, Nk=0) has no keys, and none of its 17 query rows holds O = 0, "
        "LSE = −inf: consistent with a sequence without keys left unwritten (its rows keep "
        "what the output buffer held)"
    ]

    # NaN there is the unguarded 0/0 of a row with no keys as much as a stale buffer.
    def nan_rows(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        o, lse = user.varlen_skips_keyless.fn(
            q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0, causal=causal
        )
        return o.masked_fill(o == 0.5, float("nan")), lse

    res = flashcheck.check(flashcheck.kernel(nan_rows, layout="varlen"), case, save="never")
    assert res.diagnosis == [
        "sequence 2 (Nq=17, Nk=0) has no keys, and none of its 17 query rows holds O = 0, "
        "LSE = −inf: consistent with a sequence without keys normalized by its zero sum "
        "(O = acc / l with l = 0: 0/0 is NaN), or left unwritten"
    ]
    # An empty sequence that does write its neighbour's first row is still named, and
    # only that row is wrong.
    res = flashcheck.check(user.varlen_empty_writes, _varlen(), save="never")
    assert res.diagnosis == [
        "sequence 1 (Nq=0, Nk=2) has no query rows and sits at row 3, the first row of "
        "sequence 2, which is wrong there (the rest within their bounds): consistent with a "
        "zero-length sequence writing into its neighbour's rows"
    ]


def test_a_key_start_taken_from_cu_seqlens_q_is_named(user):
    # The form real kernels take (k_ptr + cu_seqlens_q[b]·stride, seqlen_k from
    # cu_seqlens_k) got no diagnosis: only the slice with both ends from cu_seqlens_q had one.
    res = flashcheck.check(
        user.varlen_key_start_by_q, varlen_case([4, 6, 3], [9, 5, 8]), save="never"
    )
    assert res.diagnosis == [
        f"sequence {b} (Nq={nq}, Nk={nk}) returns the attention over packed key rows {keys} "
        f"({nk} keys from its first query row's offset) instead of its own {own}: consistent "
        "with the key start taken from cu_seqlens_q instead of cu_seqlens_k (the key count "
        "from cu_seqlens_k)"
        for b, nq, nk, keys, own in ((1, 6, 5, "4..8", "9..13"), (2, 3, 8, "10..17", "14..21"))
    ]
    # Keys running past the packed ones are clipped (a user's sequence 3: rows 22..52 of 50);
    # a sequence without keys reads none either way and passes.
    case = varlen_case([5, 0, 17, 3], [7, 12, 0, 31], causal=True)
    res = flashcheck.check(user.varlen_key_start_by_q, case, save="never")
    assert res.diagnosis == [
        "sequence 3 (Nq=3, Nk=31) returns the attention over packed key rows 22..49 (31 keys "
        "from its first query row's offset, clipped to the packed keys) instead of its own "
        "19..49: consistent with the key start taken from cu_seqlens_q instead of "
        "cu_seqlens_k (the key count from cu_seqlens_k)"
    ]
    # Both ends from cu_seqlens_q keep their own words, and a sequence without keys given
    # some is not said to have "its own 19..18" (the worst sequence, diagnosed first).
    res = flashcheck.check(user.varlen_keys_by_q, case, save="never")
    assert res.failing_sequences() == [2, 0, 3]
    assert res.diagnosis[0] == (
        "sequence 2 (Nq=17, Nk=0) returns the attention over packed key rows 5..21 (its query "
        "rows' offsets) instead of none (it has no keys): consistent with the key range taken "
        "from cu_seqlens_q instead of cu_seqlens_k"
    )
    # Query offsets at or past the packed keys' end leave no keys to recompute against.
    for lq, lk in (([15, 1], [1, 1]), ([4, 3], [2, 2])):
        short = flashcheck.check(user.varlen_key_start_by_q, varlen_case(lq, lk), save="never")
        assert short.verdict.counted and short.diagnosis == []


def test_flashcheck_replay_command_replays_a_ragged_case(user, tmp_path):
    res = flashcheck.check(user.varlen_one_past, _varlen(), case_dir=tmp_path)
    (tmp_path / "user_layouts.py").write_text((USER / "user_layouts.py").read_text())
    exe = Path(sys.executable).with_name("flashcheck")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "flashcheck.harness.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASHCHECK_")}
    out = subprocess.run(
        [*cmd, "replay", res.case_id, "--dir", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    assert "sequence 0 (Nq=3, Nk=4)" in out.stdout
    assert "replayed: FAIL-HARD (same verdict)" in out.stdout


def test_a_ragged_case_file_rebuilds_the_case_bit_for_bit(tmp_path):
    for case in (_varlen("bf16"), _paged(), combine_case(3, dtype="bf16")):
        cid = save_ragged_case(case, kernel="k", device="cpu", directory=tmp_path)
        back, record = load_ragged_case(cid, tmp_path)
        assert record["layout"] == case.layout and back.describe() == case.describe()
        for name, x in case.tensors.items():
            assert back.tensors[name].dtype == x.dtype
            assert back.bits(name).tobytes() == case.bits(name).tobytes()
        for name, x in case.index.items():
            assert back.index[name].dtype == np.int32 and np.array_equal(back.index[name], x)
        assert json.loads((tmp_path / f"{cid}.json").read_text())["replay"].endswith(cid)


def test_generated_paged_inputs_hold_nan_in_every_slot_no_sequence_owns():
    case = _paged(page_size=16)
    owned = np.zeros(case.tensors["k_cache"].shape[:2], dtype=bool)
    for b in range(case.sequences):
        n = case.lengths(b)[1]
        for j in range(n):
            owned[case.index["block_table"][b, j // 16], j % 16] = True
    for name in ("k_cache", "v_cache"):
        x = case.tensors[name].astype(np.float32)
        assert np.isnan(x[~owned]).all() and not np.isnan(x[owned]).any()


def test_the_merge_bounds_dominate_the_numpy_merge_and_are_not_vacuous():
    # Spreads of the LSE from 1 to 300 and splits from 1 to 40, all-empty rows included.
    utils = []
    for seed, (splits, spread, dtype) in enumerate(
        [(1, 1.0, "fp32"), (7, 30.0, "fp32"), (40, 300.0, "fp32"), (13, 5.0, "fp16")]
    ):
        case = combine_case(splits, (4, 5), dtype=dtype, lse_spread=spread, seed=seed)
        o_p, lse_p = case.tensors["out_partial"], case.tensors["lse_partial"]
        ref = combine_oracle(o_p, lse_p)
        bounds = merge_bounds(o_p, lse_p, ref.lse.hi + ref.lse.lo, fmt=ref.fmt)
        o, lse = merge_partials(o_p, lse_p)
        o = o.astype(o_p.dtype).astype(np.float64)
        live = np.isfinite(ref.lse.hi)
        err_o = np.abs((o - ref.o.hi) - ref.o.lo)
        assert np.all(err_o <= bounds.o.det) and np.all(bounds.o.det[~live] <= FP16.min_subnormal)
        err_l = np.abs((lse[live] - ref.lse.hi[live]) - ref.lse.lo[live])
        assert np.all(err_l <= bounds.lse.det[live])
        assert np.all(np.isneginf(lse[~live])) and np.all(o[~live] == 0)
        utils.append(float((err_o / np.where(bounds.o.det > 0, bounds.o.det, 1)).max()))
    assert max(utils) > 0.05  # real rounding errors were measured against the bound


def _merge_from_lse(o_p, lse_p):
    """FlashAttention's combine, in fp32: the weights from the rounded merged LSE."""
    o32, l32 = o_p.astype(np.float32), lse_p.astype(np.float32)
    m = l32.max(axis=0)
    m = np.where(np.isfinite(m), m, np.float32(0))  # rows whose splits are all empty
    with np.errstate(divide="ignore"):
        lse = m + np.log(np.exp(l32 - m).sum(axis=0, dtype=np.float32))
    w = np.where(np.isfinite(lse), np.exp(l32 - np.where(np.isfinite(lse), lse, 0)), 0)
    o = (w[..., None] * np.where(np.isfinite(l32)[..., None], o32, 0)).sum(axis=0)
    return o.astype(np.float32), lse


def test_the_merge_bounds_cover_weights_taken_from_a_large_rounded_lse():
    # At |LSE| near 900 in fp32 the rounding of LSE alone moves every weight by ~1e-4.
    case = combine_case(7, (4, 5), dtype="fp32", lse_spread=30.0, seed=1)
    o_p = case.tensors["out_partial"]
    lse_p = (case.tensors["lse_partial"] + np.float32(700.0)).astype(np.float32)
    ref = combine_oracle(o_p, lse_p)
    bounds = merge_bounds(o_p, lse_p, ref.lse.hi + ref.lse.lo, fmt=ref.fmt)
    o, _ = _merge_from_lse(o_p, lse_p)
    err = np.abs((o.astype(np.float64) - ref.o.hi) - ref.o.lo)
    assert np.all(err <= bounds.o.det)
    assert (err / np.where(bounds.o.det > 0, bounds.o.det, 1)).max() > 0.1  # not vacuous
    # and it is the LSE's rounding that the form pays: the max-shifted merge errs far less
    o_max, _ = merge_partials(o_p, lse_p)
    err_max = np.abs((o_max.astype(np.float64) - ref.o.hi) - ref.o.lo)
    assert err.max() > 10 * err_max.max()


def test_kernel_declarations_of_layouts_say_how_to_fix_the_call(user):
    fn = user._varlen_ok
    with pytest.raises(ValueError, match=r"layout must be one of .*'varlen' for packed"):
        flashcheck.kernel(fn, layout="ragged")
    with pytest.raises(ValueError, match="op must be one of"):
        flashcheck.kernel(fn, op="merge")
    with pytest.raises(ValueError, match="op='combine' takes no masks"):
        flashcheck.kernel(user._combine_ok, op="combine", masks=["causal"])
    with pytest.raises(ValueError, match=r"op='combine' takes no arithmetic: .* merge's own"):
        flashcheck.kernel(user._combine_ok, op="combine", arithmetic="flash")
    limited = flashcheck.kernel(user._paged_ok, layout="paged", score_limit={"fp16": 3.0})
    with pytest.raises(ValueError, match=r"scores reach .* >= the kernel's limit 3"):
        flashcheck.check(limited, paged_case([3, 40], sigma=3.0), save="never")
    with pytest.raises(ValueError, match="op='combine' takes no layout"):
        flashcheck.kernel(user._combine_ok, op="combine", layout="paged")
    with pytest.raises(ValueError, match="not an explicit mask"):
        flashcheck.kernel(fn, layout="varlen", masks=["causal", "mask"])
    with pytest.raises(ValueError, match="paged decode kernels have no gradient checks"):
        flashcheck.kernel(user._paged_ok, layout="paged", backward="autograd")
    with pytest.raises(ValueError, match=re.escape("flashcheck.kernel(fn, layout='varlen')")):
        flashcheck.check(lambda q, k, v: q, _varlen())
    with pytest.raises(ValueError, match="takes varlen inputs, the case is paged"):
        flashcheck.check(user.varlen_ok, _paged())
    with pytest.raises(ValueError, match="a RaggedCase carries its own options"):
        flashcheck.check(user.varlen_ok, _varlen(), causal=True)
    dense = Case.from_arrays(*(np.ones((1, 1, 2, 4), np.float16),) * 3)
    assert "takes no dense" in user.varlen_ok.supports(dense)


def test_probing_a_ragged_kernel_finds_its_contract(user):

    def fp16_mha(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        if q.dtype != torch.float16 or q.shape[1] != k.shape[1]:
            raise ValueError("fp16 and as many k/v heads as q heads only")
        return user._varlen_ok(q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0, causal=causal)

    got = resolved(flashcheck.kernel(fp16_mha, layout="varlen"), "cpu")
    assert got.dtypes == ("fp16",) and not got.gqa and got.masks == {"causal"}
    assert got.head_dims is None and got.distinct_dv and not got.pending
    assert any("grouped-query" in what for what, _ in got.unsupported)
    assert "layout varlen" in got.contract_lines()[0]
    merge = resolved(user.combine_ok, "cpu")
    assert merge.dtypes == ("fp16", "bf16", "fp32") and merge.options == frozenset()
    paged = resolved(user.paged_ok, "cpu")
    assert paged.gqa and paged.masks == {"causal"} and paged.options == {"causal", "scale"}


def test_dense_campaigns_leave_ragged_kernels_out_and_refuse_them_by_name(
    tmp_path, monkeypatch, capsys
):
    from flashcheck.harness.cli import main

    ragged = {"recurrence-varlen", "split-kv-paged", "split-kv-combine", "triton-decode-paged"}
    ragged |= {"triton-combine"}
    assert ragged <= set(KERNELS) and not ragged & set(default_kernels())
    # A dense campaign does not take them (they run in a campaign of their own:
    # tests/test_ragged_campaign.py), nor does one report mix the two.
    with pytest.raises(ValueError, match=r"split-kv-paged is a paged kernel: .* of their own"):
        resolve_kernels(["split-kv-paged"])
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--kernel", "recurrence-varlen", "--kernel", "naive-numpy"]) == 2
    assert "not both: run two reports" in capsys.readouterr().err
    # (The property suite takes them: its ragged properties, tests/test_ragged_suite.py.)


def test_a_ragged_case_refuses_what_its_layout_does_not_hold():
    with pytest.raises(ValueError, match="a varlen case holds"):
        RaggedCase("varlen", {"q": np.zeros((1, 1, 4), np.float16)})
    with pytest.raises(ValueError, match="cu_seqlens_q must end at the packed length 2"):
        RaggedCase.from_arrays(
            "varlen",
            q=np.zeros((2, 1, 4), np.float16),
            k=np.zeros((2, 1, 4), np.float16),
            v=np.zeros((2, 1, 4), np.float16),
            cu_seqlens_q=np.array([0, 3], np.int32),
            cu_seqlens_k=np.array([0, 2], np.int32),
        )
    with pytest.raises(ValueError, match="takes no causal, window or scale"):
        RaggedCase("combine", dict(combine_case(2).tensors), causal=True)


def test_load_case_and_call_take_ragged_cases(user, tmp_path):
    case = _paged()
    res = flashcheck.check(user.paged_whole_page, case, case_dir=tmp_path)
    back = flashcheck.load_case(res.case_id, tmp_path)
    assert isinstance(back, RaggedCase) and back.describe() == case.describe()
    o, lse = flashcheck.call(user.paged_ok, back)
    assert tuple(o.shape) == (4, 3, 2, 16) and tuple(lse.shape) == (4, 2, 3)
    o, _ = flashcheck.call("split-kv-paged", back)
    assert isinstance(o, np.ndarray) and not np.isnan(o.astype(np.float32)).any()


@pytest.mark.parametrize("out", ["fp16", "bf16", "fp32"])
def test_a_merge_is_judged_in_the_format_it_writes(out):
    # fp32 partials merged into a narrower output, as FlashAttention's combine kernel does.
    def merge(out_partial, lse_partial):
        o, lse = merge_partials(out_partial, lse_partial)
        return o.astype(
            {"fp16": np.float16, "bf16": BF16.numpy_dtype, "fp32": np.float32}[out]
        ), lse

    kern = flashcheck.kernel(merge, op="combine", api="numpy")
    res = flashcheck.check(kern, combine_case(9, (3, 4), lse_spread=20.0), save="never")
    assert res.passed and res.ref.fmt.name == out
    # In fp32 the bound is mostly the class's allowance for weights taken from a rounded LSE
    # (FlashAttention's form), which this max-shifted merge does not pay; the test above shows
    # that term reached by the form that pays it.
    assert (0.01 if out == "fp32" else 0.05) < res.merge.det_util <= 1


def test_the_worst_failing_sequences_are_diagnosed_not_the_first(user):
    # Only the first two failing sequences were examined: two slightly-off sequences ahead of
    # a keyless one left unwritten hid the one bug that has a name.
    def fn(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal):
        o, lse = user.varlen_skips_keyless.fn(
            q, k, v, cu_seqlens_q, cu_seqlens_k, 0, 0, causal=causal
        )
        o[: int(cu_seqlens_q[2])] *= 1.01
        return o, lse

    case = varlen_case([5, 6, 4, 17], [7, 9, 12, 0], causal=True)
    res = flashcheck.check(flashcheck.kernel(fn, layout="varlen"), case, save="never")
    assert res.failing_sequences() == [3, 1, 0] and res.worst_sequence == 3
    assert res.diagnosis == [
        "sequence 3 (Nq=17, Nk=0) has no keys, and none of its 17 query rows holds O = 0, "
        "LSE = −inf: consistent with a sequence without keys left unwritten (its rows keep "
        "what the output buffer held)"
    ]


def test_a_merge_failure_names_its_worst_element_once(user):
    # Every reason of a failing merge began "worst element O[...]:", the LSE's among them.
    def off(out_partial, lse_partial):
        o, lse = user.combine_ok.fn(out_partial, lse_partial)
        return o * 1.001, lse + 1e-3

    res = flashcheck.check(flashcheck.kernel(off, op="combine"), combine_case(5), save="never")
    text = str(res)
    at, of_o, rest = res.merge_reasons()
    assert re.fullmatch(r"worst element O\[\d+, \d+, \d+\]", at) and text.count(at) == 1
    assert f"  - {at}:\n      {of_o[0]}\n      {of_o[1]}\n  - {rest[0]}" in text
    assert rest == ["FAIL-HARD: LSE exceeds its deterministic bound (max util 878)"]
    assert res.reasons == [f"{at}: {r}" for r in of_o] + rest  # one line each, for summaries
